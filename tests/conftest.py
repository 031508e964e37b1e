"""Shared pytest setup: GPU tests skip cleanly without CUDA."""

from __future__ import annotations

import pytest


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _cuda_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture()
def require_alfworld() -> None:
    """Skip when the ALFWorld games are not on this machine (a named absence: no data), and only then: an import error
    of the project's own modules, or any other failure, fails the test."""
    from envs.alfworld import list_games

    try:
        list_games("valid_unseen")
    except FileNotFoundError as exc:
        pytest.skip(f"ALFWorld data not available: {exc}")
