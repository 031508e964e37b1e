"""Shared pytest setup: GPU tests skip cleanly without CUDA (hardware a machine may lack); the data sets the suite
needs are always there, so a missing one fails with the path it was looked for at (:func:`require_dataset`)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _vllm_installed() -> bool:
    from agent_rl.engines.vllm import vllm_build

    return vllm_build() is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not _vllm_installed():  # `vllm`-marked tests run where vLLM is (.venv-vllm: scripts/setup_vllm.sh)
        skip_vllm = pytest.mark.skip(reason="needs vLLM (bash scripts/setup_vllm.sh makes .venv-vllm)")
        for item in items:
            if item.get_closest_marker("vllm") is not None:
                item.add_marker(skip_vllm)
    if _cuda_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


def missing_data(what: str, exc: Exception) -> None:
    """Fail the test for a data set the suite needs that is not there, naming the path looked for (the data root
    of ``envs.data.data_root``: ``$AGENT_RL_DATA``, the cache, then ``../shared/data``; the error ``exc`` names it)."""
    pytest.fail(f"{what} data missing ({exc}); the suite's data is always present in CI: point $AGENT_RL_DATA at the "
                "data root or run `python -m envs.fetch all`", pytrace=False)


@pytest.fixture(scope="session")
def require_dataset() -> Callable[[str], Path]:
    """``require_dataset(name)`` -> ``envs.data.dataset_dir(name)``; fails (never skips) naming the path looked for
    when it is missing."""
    from envs.data import dataset_dir

    def _require(name: str) -> Path:
        try:
            return dataset_dir(name)
        except FileNotFoundError as exc:
            missing_data(name, exc)
            raise  # not reached: pytest.fail raises

    return _require


@pytest.fixture()
def require_alfworld() -> None:
    """The ALFWorld games (``list_games``): a missing data root or games folder fails naming the folder looked for."""
    from envs.alfworld import list_games

    try:
        list_games("valid_unseen")
    except FileNotFoundError as exc:
        missing_data("ALFWorld", exc)
