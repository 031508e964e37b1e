"""ALFWorld, issue 10 section 6: the expert never crashes the game (the two reported action sequences, then a
seeded property test with random admissible actions), data problems fail fast naming the resolved path and the
counts, and the archive unpacks on interpreters without ``tarfile``'s ``filter=`` (PEP 706)."""

from __future__ import annotations

import io
import os
import random
import subprocess
import sys
import tarfile
import textwrap
import warnings
from pathlib import Path

import pytest

from envs.alfworld import data as alf_data
from envs.errors import EnvDataError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def expert_env():
    from envs.alfworld.env import ALFWorldEnv  # alfworld / textworld: .[all] dependencies, never skipped

    env = ALFWorldEnv(expert=True)
    yield env
    env.close()


def game(split: str, folder: str, trial: int = 0) -> str:
    return [g for g in alf_data.list_games(split) if f"/{folder}/" in g][trial]


def play_checked(env, actions: list[str]) -> list[str]:
    """Step through ``actions``; every step's expert action must be admissible or ``look``."""
    experts = []
    for action in actions:
        _, _, _, _, info = env.step(action)
        assert info["expert_action"] == "look" or info["expert_action"] in info["admissible_actions"]
        experts.append(info["expert_action"])
    return experts


# --- the expert never crashes the game ----------------------------------------------------------------------------
def test_expert_after_moving_the_pot_back_does_not_crash(expert_env):
    # Issue input (train, seed 0): IndexError "Cannot choose from an empty sequence" out of env.step on the last
    # action (the cool-task policy has no pot left to pick). Right: the step works and the expert says "look".
    gamefile = game("train", "pick_cool_then_place_in_recep-Pot-None-StoveBurner-25")
    expert_env.reset(seed=0, options={"gamefile": gamefile})
    failures = expert_env._tw.expert_failures
    experts = play_checked(expert_env, ["go to stoveburner 1", "take pot 1 from stoveburner 1",
                                        "move pot 1 to stoveburner 1", "examine stoveburner 1",
                                        "examine stoveburner 1", "examine garbagecan 1"])
    assert experts[-1] == "look" and expert_env._tw.expert_failures == failures + 1


def test_expert_after_searching_drawers_does_not_crash(expert_env):
    # Issue input (valid_seen): drawers 1..7 opened, keychain 4 taken, back and forth, then the lamp.
    gamefile = game("valid_seen", "look_at_obj_in_light-KeyChain-None-DeskLamp-327")
    expert_env.reset(seed=0, options={"gamefile": gamefile})
    drawers = [a for i in range(1, 8) for a in (f"go to drawer {i}", f"open drawer {i}")]
    play_checked(expert_env, drawers + ["take keychain 4 from drawer 7", "go to dresser 1", "go to shelf 1",
                                        "go to dresser 1", "use desklamp 1"])


def test_random_admissible_play_never_crashes_the_expert(expert_env):
    # Property: on four games (three task types, plus the reported pot game), 20 random admissible actions with
    # the expert on never raise, and the expert's action is always admissible or "look". Seeded: reproducible.
    rng = random.Random(0)
    first = {}
    for gamefile in alf_data.list_games("valid_unseen"):
        first.setdefault(alf_data.task_type_of(gamefile), gamefile)
    games = sorted(first.values())[:3] + [game("train", "pick_cool_then_place_in_recep-Pot-None-StoveBurner-25")]
    steps = 0
    for gamefile in games:
        _, info = expert_env.reset(seed=rng.randrange(2**31), options={"gamefile": gamefile})
        for _ in range(20):
            _, _, terminated, _, info = expert_env.step(rng.choice(info["admissible_actions"]))
            assert info["expert_action"] == "look" or info["expert_action"] in info["admissible_actions"]
            steps += 1
            if terminated:
                break
    assert steps >= 4 * 10


def test_game_engine_failure_is_could_not_judge(expert_env, monkeypatch):
    # Issue 10: the game engine raising inside step is EnvInfraError (500 env_infra_error over HTTP), with the game.
    from envs.errors import EnvInfraError

    gamefile = game("valid_seen", "look_at_obj_in_light-KeyChain-None-DeskLamp-327")
    expert_env.reset(seed=0, options={"gamefile": gamefile})

    def broken(command):
        raise OSError("libdownward: planner died")

    monkeypatch.setattr(expert_env._tw, "step", broken)
    with pytest.raises(EnvInfraError, match="look_at_obj_in_light-KeyChain-None-DeskLamp-327.*'look'.*planner died"):
        expert_env.step("look")


# --- data problems fail fast, naming the path and the counts -----------------------------------------------------
def test_empty_data_root_and_cache_name_both_paths(tmp_path, monkeypatch):
    # Issue input: an empty data root and an empty cache. Used to fail on the first reset only.
    (tmp_path / "data").mkdir()
    monkeypatch.setenv("AGENT_RL_CACHE", str(tmp_path / "cache"))
    with pytest.raises(EnvDataError) as info:
        alf_data.list_games("train", root=str(tmp_path / "data"))
    message = str(info.value)
    assert str(tmp_path / "data" / "alfworld" / "json_2.1.1") in message
    assert str(tmp_path / "data" / "alfworld" / alf_data.ARCHIVE_NAME) in message
    assert isinstance(info.value, FileNotFoundError)  # callers catching FileNotFoundError still do


def test_empty_games_folder_names_path_and_counts(tmp_path):
    # Issue input: an empty json_2.1.1/ (used to be a 422 "no ALFWorld games in split" without the path).
    (tmp_path / "alfworld" / "json_2.1.1").mkdir(parents=True)
    with pytest.raises(EnvDataError) as info:
        alf_data.list_games("train", root=str(tmp_path))
    message = str(info.value)
    assert str((tmp_path / "alfworld" / "json_2.1.1").resolve()) in message
    assert "{'train': 0, 'valid_seen': 0, 'valid_unseen': 0, 'valid_train': 0}" in message


def test_partial_download_names_the_split_that_is_missing(tmp_path):
    # One valid_seen game copied, nothing in train: train fails naming the counts; valid_seen works.
    src = Path(game("valid_seen", "look_at_obj_in_light-KeyChain-None-DeskLamp-327"))
    dst = tmp_path / "alfworld" / "json_2.1.1" / alf_data.task_id_of(src) / src.name
    dst.parent.mkdir(parents=True)
    dst.write_bytes(src.read_bytes())
    assert alf_data.list_games("valid_seen", root=str(tmp_path)) == [str(dst)]
    with pytest.raises(EnvDataError, match=r"split 'train' .*'train': 0, 'valid_seen': 1"):
        alf_data.list_games("train", root=str(tmp_path))


# --- unpacking without tarfile's filter= ---------------------------------------------------------------------------
def _archive(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w") as tar:
        for info, payload in members:
            tar.addfile(info, io.BytesIO(payload) if payload is not None else None)
    return path


def _file(name: str, data: bytes = b"x", mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    return info, data


def _special(name: str, kind: bytes, linkname: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    return info, None


BAD_MEMBERS = {
    "parent": [_file("../evil")],
    "symlink_absolute": [_special("json_2.1.1/link", tarfile.SYMTYPE, "/etc/passwd")],
    "symlink_outside": [_special("json_2.1.1/link", tarfile.SYMTYPE, "../../outside")],
    "hardlink_outside": [_special("json_2.1.1/hard", tarfile.LNKTYPE, "../outside")],
    "fifo": [_special("json_2.1.1/fifo", tarfile.FIFOTYPE)],
}


@pytest.fixture(params=["native", "fallback"])
def extract_mode(request, monkeypatch):
    if request.param == "fallback":  # what CPython 3.10.0-3.10.11 / 3.11.0-3.11.3 have: no PEP 706 filters
        monkeypatch.delattr(tarfile, "data_filter")
    elif not hasattr(tarfile, "data_filter"):
        pytest.skip("this interpreter has no tarfile.data_filter")
    return request.param


@pytest.mark.parametrize("case", sorted(BAD_MEMBERS))
def test_unsafe_members_are_refused_with_or_without_filter(tmp_path, extract_mode, case):
    archive = _archive(tmp_path / "bad.tar", BAD_MEMBERS[case])
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(tarfile.TarError), tarfile.open(archive) as tar:
        alf_data.safe_extractall(tar, dest)
    assert not (tmp_path / "evil").exists()


def test_absolute_names_land_inside_dest(tmp_path, extract_mode):
    # The data filter strips leading slashes ("/tmp/x" -> dest/tmp/x) rather than refusing.
    archive = _archive(tmp_path / "abs.tar", [_file(f"{tmp_path}/outside/evil")])
    dest = tmp_path / "dest"
    dest.mkdir()
    with tarfile.open(archive) as tar:
        alf_data.safe_extractall(tar, dest)
    assert (dest / str(tmp_path).lstrip("/") / "outside" / "evil").read_bytes() == b"x"
    assert not (tmp_path / "outside").exists()


def test_modes_match_the_data_filter(tmp_path, extract_mode):
    # Set-uid and group/other-write bits dropped, owner read/write added, exec kept only if the owner had it:
    # 0o4777 -> 0o755; 0o444 -> 0o644; 0o070 -> 0o050 (no group write) -> 0o040 (no owner exec) -> 0o640.
    archive = _archive(tmp_path / "ok.tar", [_file("json_2.1.1/a", mode=0o4777), _file("json_2.1.1/b", mode=0o444),
                                             _file("json_2.1.1/c", mode=0o070)])
    dest = tmp_path / "dest"
    dest.mkdir()
    with tarfile.open(archive) as tar:
        alf_data.safe_extractall(tar, dest)
    modes = {n: (dest / "json_2.1.1" / n).stat().st_mode & 0o7777 for n in "abc"}
    assert modes == {"a": 0o755, "b": 0o644, "c": 0o640}


def test_unpack_archive_without_filter(tmp_path, monkeypatch):
    monkeypatch.delattr(tarfile, "data_filter")
    src = Path(game("valid_seen", "look_at_obj_in_light-KeyChain-None-DeskLamp-327"))
    archive = tmp_path / alf_data.ARCHIVE_NAME
    with tarfile.open(archive, "w:xz") as tar:
        tar.add(src, arcname=f"json_2.1.1/{alf_data.task_id_of(src)}/{src.name}")
    target = alf_data.unpack_archive(archive, tmp_path / "home")
    assert (target / alf_data.task_id_of(src) / src.name).read_bytes() == src.read_bytes()
    assert (target / alf_data.task_id_of(src) / "traj_data.json").is_file()


def _oldest_supported_pyenv_python() -> str | None:
    """The oldest CPython >= 3.10 among pyenv's builds (``requires-python = ">=3.10"``), or None."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found = []
    for folder in root.glob("3.*"):
        parts = folder.name.split(".")
        if len(parts) == 3 and all(p.isdigit() for p in parts) and (folder / "bin" / "python3").is_file():
            version = tuple(int(p) for p in parts)
            if version >= (3, 10):
                found.append((version, str(folder / "bin" / "python3")))
    return min(found)[1] if found else None


def test_unpack_under_the_oldest_supported_interpreter(tmp_path):
    # envs/alfworld/data.py needs only the standard library: run unpack_archive under the oldest pyenv CPython that
    # requires-python admits, with its native filter and with the fallback (filter removed), on a real game.
    python = _oldest_supported_pyenv_python()
    if python is None:
        pytest.skip("no pyenv CPython >= 3.10 on this machine")
    src = Path(game("valid_seen", "look_at_obj_in_light-KeyChain-None-DeskLamp-327"))
    archive = tmp_path / alf_data.ARCHIVE_NAME
    with tarfile.open(archive, "w:xz") as tar:
        tar.add(src, arcname=f"json_2.1.1/{alf_data.task_id_of(src)}/{src.name}")
    script = textwrap.dedent(f"""
        import sys, tarfile, types
        pkg = types.ModuleType("envs"); pkg.__path__ = [{str(REPO / "envs")!r}]; sys.modules["envs"] = pkg
        from envs.alfworld import data  # noqa: E402  (envs/__init__ needs gymnasium: bypassed)
        from pathlib import Path
        for mode in ("native", "fallback"):
            if mode == "fallback" and hasattr(tarfile, "data_filter"):
                del tarfile.data_filter
            target = data.unpack_archive(Path({str(archive)!r}), Path({str(tmp_path)!r}) / mode)
            print(mode, sys.version.split()[0], len(list(target.rglob("game.tw-pddl"))))
    """)
    done = subprocess.run([python, "-I", "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split("\n")
    assert lines[0].startswith("native 3.10") or lines[0].startswith("native 3.1"), done.stdout
    assert [line.split()[0::2] for line in lines if line] == [["native", "1"], ["fallback", "1"]]


def test_concurrent_resets_in_threads(require_alfworld):
    """TextWorld's parsers are not thread-safe: two ALFWorld envs reset and stepped from two threads at once (what
    LocalEnvPool's thread mode does) must both work (envs.locks.TEXTWORLD_LOCK)."""
    from concurrent.futures import ThreadPoolExecutor

    import gymnasium

    def play(index: int) -> bool:
        env = gymnasium.make("agent_rl/ALFWorld-v0")
        try:
            _, info = env.reset(options={"split": "valid_unseen", "index": index})
            for action in info["admissible_actions"][:3]:
                env.step(action)
            return True
        finally:
            env.close()

    with ThreadPoolExecutor(2) as pool:
        assert list(pool.map(play, [0, 1, 0, 1])) == [True] * 4
