"""The one data root: argument > $AGENT_RL_DATA > cache > ../shared/data."""

from __future__ import annotations

from pathlib import Path

import pytest

from envs import data


def test_explicit_root_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    other = tmp_path / "other"
    other.mkdir()
    monkeypatch.setenv("AGENT_RL_DATA", str(other))
    assert data.data_root(tmp_path) == tmp_path.resolve()
    assert data.data_root() == other.resolve()


def test_missing_explicit_root_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_RL_DATA", str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        data.data_root()


def test_cache_then_shared_fallback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENT_RL_DATA", raising=False)
    monkeypatch.setenv("AGENT_RL_CACHE", str(tmp_path / "cache"))
    shared = tmp_path / "shared"
    (shared / "alfworld").mkdir(parents=True)
    monkeypatch.setattr(data, "SHARED_DATA", shared)
    # Empty cache: falls back to the shared data.
    assert data.data_root() == shared
    # A real user's fetched data in the cache takes precedence.
    (tmp_path / "cache" / "data" / "alfworld").mkdir(parents=True)
    assert data.data_root() == tmp_path / "cache" / "data"
    assert data.dataset_dir("alfworld") == tmp_path / "cache" / "data" / "alfworld"
    with pytest.raises(FileNotFoundError, match="envs.fetch"):
        data.dataset_dir("webshop")


def test_default_finds_workplace_data(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("AGENT_RL_DATA", raising=False)
    monkeypatch.setenv("AGENT_RL_CACHE", str(tmp_path))
    assert data.SHARED_DATA.is_dir(), (f"the workplace data root {data.SHARED_DATA} (../shared/data beside this "
                                       "checkout) is missing; the suite's data is always present in CI")
    assert (data.data_root() / "alfworld").is_dir()
