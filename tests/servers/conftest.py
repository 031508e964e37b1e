"""Fixtures of the server tests: one real ALFWorld and one real WebShop server per test session
(:mod:`served_envs`), with a token, shared by the tests that play them through the OpenEnv and MCP surfaces."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from served_envs import start_server


def _serve(tmp_path_factory, name: str, env_ids: list[str], extra: list[str]) -> Iterator[str]:
    proc, url = start_server(env_ids, extra, tmp_path_factory.mktemp(name) / "server.log")
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(60)


@pytest.fixture(scope="session")
def webshop_url(tmp_path_factory, require_dataset) -> Iterator[str]:
    """A WebShop server (token :data:`TOKEN`, 2 workers, catalog built in the forkserver)."""
    require_dataset("webshop")
    yield from _serve(tmp_path_factory, "webshop", ["agent_rl/WebShop-v0"],
                      ["--workers", "2", "--max-sessions", "8", "--import", "envs.webshop.preload"])


@pytest.fixture(scope="session")
def alfworld_url(tmp_path_factory) -> Iterator[str]:
    """An ALFWorld server (token :data:`TOKEN`, 2 workers); missing games fail naming the folder looked for."""
    from envs.alfworld import list_games

    try:
        list_games("valid_unseen")
    except FileNotFoundError as exc:
        pytest.fail(f"ALFWorld data missing ({exc}): point $AGENT_RL_DATA at the data root or run "
                    "`python -m envs.fetch all`", pytrace=False)
    yield from _serve(tmp_path_factory, "alfworld", ["agent_rl/ALFWorld-v0"], ["--workers", "2", "--max-sessions", "8"])
