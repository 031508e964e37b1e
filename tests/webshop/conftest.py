"""Fixtures of the WebShop tests: the shared data directory (a missing one fails, naming the path looked for) and
envs."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

import envs  # noqa: F401  (registers agent_rl/WebShop-v0)


@pytest.fixture(scope="session")
def webshop_dir(require_dataset) -> Path:
    return require_dataset("webshop")


@pytest.fixture(scope="session")
def fixtures_dir(webshop_dir: Path) -> Path:
    return webshop_dir / "fixtures"


@pytest.fixture(scope="session")
def catalog(webshop_dir: Path):
    from envs.webshop.catalog import get_catalog

    return get_catalog()


def read_json(path: Path) -> Any:
    """JSON (or gzipped JSON) file contents."""
    if path.suffix == ".gz":
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return json.load(f)
    with open(path, encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="session")
def load_json():
    return read_json


@pytest.fixture()
def make_env(webshop_dir: Path):
    """``make_env(**kwargs)`` -> a registered WebShop env (closed at teardown)."""
    made: list[gym.Env] = []

    def _make(**kwargs: Any) -> gym.Env:
        env = gym.make("agent_rl/WebShop-v0", **kwargs)
        made.append(env)
        return env

    yield _make
    for env in made:
        env.close()
