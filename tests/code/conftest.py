"""Sandbox isolation requirements of the code tests.

A test marked ``@pytest.mark.sandbox("full")`` needs the strongest isolation (root: per-run uid, minimal root
filesystem, no network, own PID namespace); ``@pytest.mark.sandbox("namespaces")`` needs any namespace isolation
(``full`` or ``userns``). Where this machine has less, the test is skipped with the level it found, unless
``AGENT_RL_SANDBOX_REQUIRE=full`` is set (CI): then anything less than ``full`` fails the test instead, so a
machine whose kernel refuses a namespace cannot pass the suite by skipping its sandbox tests.
"""

from __future__ import annotations

import os

import pytest

from envs.code.sandbox import isolation_level

_NEEDS = {"full": ("full",), "namespaces": ("full", "userns")}


def required_level() -> str:
    """``$AGENT_RL_SANDBOX_REQUIRE``: ``""`` (skip what this machine cannot run) or ``"full"``.

    Raises:
        pytest.UsageError: any other value.
    """
    value = os.environ.get("AGENT_RL_SANDBOX_REQUIRE", "")
    if value not in ("", "full"):
        raise pytest.UsageError(f"AGENT_RL_SANDBOX_REQUIRE must be 'full' or unset, got {value!r}")
    return value


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "sandbox(level): needs code-sandbox isolation 'full' or 'namespaces' "
                                       "(skipped below it; a failure with AGENT_RL_SANDBOX_REQUIRE=full)")
    required_level()


def _shortfall(item: pytest.Item) -> str | None:
    """Why this machine's isolation is below what ``item`` needs, or None."""
    for mark in item.iter_markers("sandbox"):
        need = mark.args[0]
        if need not in _NEEDS:
            raise pytest.UsageError(f"{item.nodeid}: sandbox level must be one of {sorted(_NEEDS)}, got {need!r}")
        level = isolation_level()
        if level not in _NEEDS[need]:
            return f"needs code-sandbox isolation {need!r}, this machine gives {level!r}"
    return None


_SHORTFALL = pytest.StashKey[str]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # judged before any fixture runs (a control test may itself lower the level for its own run)
    message = _shortfall(item)
    if message is None:
        return
    if required_level() != "full":
        pytest.skip(message)
    item.stash[_SHORTFALL] = message


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    message = item.stash.get(_SHORTFALL, None)  # only under AGENT_RL_SANDBOX_REQUIRE=full: a failure, not a skip
    if message is not None:
        pytest.fail(f"{message} (AGENT_RL_SANDBOX_REQUIRE=full)", pytrace=False)
