"""ALFWorld env on the real games (``agent_rl/ALFWorld-v0``): selection, expert, walkthroughs, wrappers, caches.

The games are unpacked on first use into the project's cache (``cache_dir()/alfworld``, about 3 s, 376 MB, once per
machine; ``test_unpack_is_idempotent_and_safe_when_racing`` checks the unpacking on a small archive). Each game's
first load in a process translates its PDDL (0.5-5 s), so the tests reuse six games.
"""

from __future__ import annotations

import json
import os
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import alfworld  # noqa: F401  (installed by scripts/setup.sh's .[all]: absent is a broken install, not a skip)
import textworld  # noqa: F401

import gymnasium  # noqa: E402

import envs  # noqa: E402,F401  (registers the ids)
from envs.alfworld import data as alf_data  # noqa: E402

ENV_ID = "agent_rl/ALFWorld-v0"


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")
        yield


def first_game_per_type(split: str = "valid_unseen") -> dict[str, int]:
    """``{task_type: index of its first game in split}`` (games sorted by path). The tests reuse these six games
    (valid_unseen) where they can: a game's first load in a process costs seconds, later loads hit the caches."""
    first: dict[str, int] = {}
    for i, game in enumerate(alf_data.list_games(split)):
        first.setdefault(alf_data.task_type_of(game), i)
    return first


FIRST = {"split": "valid_unseen", "index": 0}  # the first look_at_obj_in_light game of valid_unseen


# --------------------------------------------------------------------------------------------------------------
# data: names, unpacking, listing
# --------------------------------------------------------------------------------------------------------------
def test_traj_data_from_dirname() -> None:
    # Hand-derived from the folder-name rule in docs/alfworld.md.
    assert alf_data.traj_data_from_dirname("pick_cool_then_place_in_recep-Apple-None-Microwave-19") == {
        "task_type": "pick_cool_then_place_in_recep",
        "pddl_params": {"object_target": "Apple", "parent_target": "Microwave", "mrecep_target": "",
                        "toggle_target": "", "object_sliced": False},
    }
    assert alf_data.traj_data_from_dirname("look_at_obj_in_light-Book-None-DeskLamp-308")["pddl_params"] == {
        "object_target": "Book", "parent_target": "", "mrecep_target": "", "toggle_target": "DeskLamp",
        "object_sliced": False,
    }
    params = alf_data.traj_data_from_dirname("pick_and_place_simple-Pencil-Mug-Desk-301")["pddl_params"]
    assert (params["mrecep_target"], params["parent_target"]) == ("Mug", "Desk")
    with pytest.raises(ValueError, match="not an ALFWorld game folder"):
        alf_data.traj_data_from_dirname("pick_and_place_with_movable_recep-A-B-C-1")


def test_split_sizes_match_the_paper() -> None:
    # README of the data: train 3553, valid_seen 140, valid_unseen 134, valid_train 200.
    sizes = {split: len(alf_data.list_games(split)) for split in alf_data.SPLITS}
    assert sizes == {"train": 3553, "valid_seen": 140, "valid_unseen": 134, "valid_train": 200}
    per_type = {t: len(alf_data.list_games("valid_unseen", [t])) for t in alf_data.TASK_TYPES}
    assert per_type == {"pick_and_place_simple": 24, "look_at_obj_in_light": 18,
                        "pick_clean_then_place_in_recep": 31, "pick_heat_then_place_in_recep": 23,
                        "pick_cool_then_place_in_recep": 21, "pick_two_obj_and_place": 17}
    games = alf_data.list_games("valid_unseen")
    assert games == sorted(games)
    assert all(Path(g).with_name("traj_data.json").is_file() for g in games)
    with pytest.raises(ValueError, match="unknown ALFWorld split"):
        alf_data.list_games("test")


def test_unpack_is_idempotent_and_safe_when_racing(tmp_path: Path) -> None:
    # A tiny archive in the release layout, made from two unpacked games.
    games = alf_data.list_games("valid_seen")[:2]
    archive = tmp_path / "mini.tar.xz"
    with tarfile.open(archive, "w:xz") as tar:
        for game in games:
            tar.add(game, arcname=str(Path("json_2.1.1") / alf_data.task_id_of(game) / "game.tw-pddl"))
    home = tmp_path / "home"
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(alf_data.unpack_archive(archive, home)))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 4 and len(set(results)) == 1
    unpacked = sorted(p.relative_to(home) for p in home.rglob("*") if p.is_file())
    expected = sorted(Path("json_2.1.1") / alf_data.task_id_of(g) / name for g in games
                      for name in ("game.tw-pddl", "traj_data.json")) + [Path("json_2.1.1/.agent_rl_unpacked")]
    assert unpacked == sorted(expected)  # no temporary folders left behind, nothing twice
    mtime = (home / "json_2.1.1" / ".agent_rl_unpacked").stat().st_mtime_ns
    assert alf_data.unpack_archive(archive, home) == results[0]  # second call: no work
    assert (home / "json_2.1.1" / ".agent_rl_unpacked").stat().st_mtime_ns == mtime
    traj = json.loads((home / "json_2.1.1" / alf_data.task_id_of(games[0]) / "traj_data.json").read_text())
    assert traj["task_type"] == alf_data.task_type_of(games[0])


# --------------------------------------------------------------------------------------------------------------
# the env
# --------------------------------------------------------------------------------------------------------------
def test_expert_wins_one_game_per_task_type() -> None:
    env = gymnasium.make(ENV_ID, expert=True)
    assert env.spec is not None and env.spec.max_episode_steps == 50
    try:
        for task_type, index in sorted(first_game_per_type("valid_unseen").items()):
            obs, info = env.reset(seed=index, options={"split": "valid_unseen", "index": index})
            assert info["task_type"] == task_type and "Your task is to:" in obs
            assert info["expert_action"] == "look"  # ALFWorld's expert opens with "look"
            done, steps = False, 0
            while not done:
                assert info["expert_action"] in info["admissible_actions"]
                obs, reward, terminated, truncated, info = env.step(info["expert_action"])
                steps += 1
                done = terminated or truncated
            # A win on the 50th step is also truncated by the TimeLimit: a win all the same.
            assert info["won"] and terminated and reward == 1.0, (task_type, steps)
            assert truncated == (steps == 50)
    finally:
        env.close()


def test_expert_is_reproducible_from_the_seed() -> None:
    env = gymnasium.make(ENV_ID, expert=True, max_episode_steps=12)
    index = first_game_per_type("valid_unseen")["pick_two_obj_and_place"]
    runs = []
    for _ in range(2):
        _, info = env.reset(seed=7, options={"split": "valid_unseen", "index": index})
        actions, done = [], False
        while not done:
            actions.append(info["expert_action"])
            _, _, terminated, truncated, info = env.step(actions[-1])
            done = terminated or truncated
        runs.append(actions)
    env.close()
    assert runs[0] == runs[1] and len(runs[0]) == 12


def test_expert_fixes() -> None:
    from envs.alfworld.expert import _move_as_put

    assert _move_as_put("move cd 3 to safe 1") == "put cd 3 in/on safe 1"
    assert _move_as_put("go to safe 1") == "go to safe 1"
    # A mug is also a receptacle class: ALFWorld's expert searched all 12 drawers first (lost at 50 steps); fixed,
    # it goes by its object priors: countertop 2 (14 steps).
    env = gymnasium.make(ENV_ID, expert=True)

    def play(task_id: str) -> tuple[bool, list[str]]:
        _, info = env.reset(seed=0, options={"task_id": task_id})
        actions, terminated = [], False
        while not terminated and len(actions) < 50:
            actions.append(info["expert_action"])
            _, _, terminated, _, info = env.step(actions[-1])
        return info["won"], actions

    won, actions = play("valid_seen/pick_cool_then_place_in_recep-Mug-None-CoffeeMachine-16/trial_T20190908_184242_348366")
    assert won and len(actions) == 14 and "take mug 1 from countertop 2" in actions
    # pick_two: the second search no longer starts over (ALFWorld's expert: lost at 50 steps; fixed: 31 steps).
    won, actions = play("valid_seen/pick_two_obj_and_place-Book-None-Desk-313/trial_T20190908_125930_920681")
    assert won and len(actions) == 31
    env.close()


def test_walkthrough_replay_wins_and_reward_scales_with_a_wrapper() -> None:
    env = gymnasium.wrappers.TransformReward(gymnasium.make(ENV_ID), lambda r: 10.0 * r)
    try:
        for task_type, index in sorted(first_game_per_type().items()):
            _, info = env.reset(options={"split": "valid_unseen", "index": index})
            walkthrough = info["walkthrough"]
            assert walkthrough == env.unwrapped.walkthrough and 3 <= len(walkthrough) <= 10
            rewards, terminated = [], False
            for t, action in enumerate(walkthrough):
                assert not terminated, "won before the end of the stored walkthrough"
                assert action in info["admissible_actions"]
                _, reward, terminated, truncated, info = env.step(action)
                rewards.append(reward)
                assert info["invalid_action"] is False
            assert terminated and not truncated and info["won"], task_type
            assert rewards == [0.0] * (len(walkthrough) - 1) + [10.0]  # 1.0 on the win, scaled by 10
    finally:
        env.close()


def test_invalid_action_is_flagged_and_answered_as_the_game_does() -> None:
    env = gymnasium.make(ENV_ID)
    _, info = env.reset(options=FIRST)
    obs, reward, terminated, truncated, info = env.step("fly to the moon")
    assert obs == "Nothing happens." and info["invalid_action"] is True
    assert (reward, terminated, truncated, info["won"]) == (0.0, False, False, False)
    obs, _, _, _, info = env.step("look")
    assert info["invalid_action"] is False and obs.startswith("You are ")
    env.close()


def test_time_limit_truncates() -> None:
    env = gymnasium.make(ENV_ID, max_episode_steps=3)
    env.reset(options=FIRST)
    flags = [env.step("look")[2:4] for _ in range(3)]
    assert flags == [(False, False), (False, False), (False, True)]  # (terminated, truncated)
    env.close()


def test_task_type_filter_and_selection_options() -> None:
    heat = "pick_heat_then_place_in_recep"
    env = gymnasium.make(ENV_ID, task_types=[heat], split="valid_unseen")
    heat_games = alf_data.list_games("valid_unseen", [heat])
    _, info = env.reset(options={"split": "valid_unseen", "index": 0})
    assert info["gamefile"] == heat_games[0] and info["task_type"] == heat
    _, a = env.reset(seed=5, options={"split": "valid_unseen"})  # a random draw stays inside the filter ...
    _, b = env.reset(seed=5)  # ... and is reproducible (the env's default split here is valid_unseen)
    assert a["task_type"] == heat and a["task_id"] == b["task_id"]
    task_id = alf_data.task_id_of(heat_games[0])
    assert task_id.startswith("valid_unseen/pick_heat_then_place_in_recep-")
    assert env.reset(options={"task_id": task_id})[1]["gamefile"] == heat_games[0]
    env.reset(options=FIRST | {"index": 1})
    assert env.reset(options={"split": "valid_unseen", "task_id": task_id.split("/", 1)[1]})[1]["task_id"] == task_id
    env.reset(options=FIRST | {"index": 1})
    assert env.reset(options={"gamefile": heat_games[0]})[1]["task_id"] == task_id
    assert env.reset(options={"gamefile": str(Path(heat_games[0]).parent)})[1]["task_id"] == task_id  # the folder
    # only game files: an arbitrary path is neither read nor reported as existing (served envs take client options)
    for probe in ("/etc/passwd", "/etc/hostname", "/nonexistent"):
        with pytest.raises(ValueError, match="game.tw-pddl does not exist"):
            env.reset(options={"gamefile": probe})
    with pytest.raises(ValueError, match="out of range"):
        env.reset(options={"split": "valid_unseen", "index": len(heat_games)})
    with pytest.raises(ValueError, match="unknown ALFWorld task_id"):
        env.reset(options={"task_id": "valid_unseen/../../etc"})
    with pytest.raises(ValueError, match="unknown ALFWorld reset options"):
        env.reset(options={"split": "valid_unseen", "level": 3})
    env.close()
    with pytest.raises(ValueError, match="unknown ALFWorld task types"):
        gymnasium.make(ENV_ID, task_types=["pick_banana"])
    # one type given as a plain string (env.kwargs.task_types=... on the command line) is that one type,
    # not its characters
    one = gymnasium.make(ENV_ID, task_types=heat, split="valid_unseen")
    assert one.reset(options={"split": "valid_unseen", "index": 0})[1]["gamefile"] == heat_games[0]
    for bad in (1.7, True, "1.5"):  # never silently game 1
        with pytest.raises(ValueError, match="index must be an integer|invalid literal"):
            one.reset(options={"split": "valid_unseen", "index": bad})
    assert one.reset(options={"split": "valid_unseen", "index": "1"})[1]["gamefile"] == heat_games[1]
    one.close()


def test_info_is_json_serialisable_and_complete() -> None:
    env = gymnasium.make(ENV_ID, expert=True)
    obs, info = env.reset(options=FIRST)
    keys = {"admissible_actions", "won", "task_type", "task_id", "gamefile", "expert_action", "walkthrough"}
    assert set(info) == keys
    assert json.loads(json.dumps(info)) == info
    assert info["task_type"] in alf_data.TASK_TYPES and isinstance(obs, str)
    assert all(isinstance(a, str) for a in info["admissible_actions"])
    _, _, _, _, info = env.step(info["expert_action"])
    assert set(info) == keys - {"walkthrough"} | {"invalid_action"}
    assert json.loads(json.dumps(info)) == info
    env.close()
    plain = gymnasium.make(ENV_ID)
    assert "expert_action" not in plain.reset(options=FIRST)[1]
    plain.close()


def test_second_load_of_a_game_hits_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    from envs.alfworld import speedups
    from envs.alfworld.env import ALFWorldEnv

    monkeypatch.setenv("AGENT_RL_ALFWORLD_SAS_DISK", "0")  # count the in-memory cache only
    speedups.SAS_CACHE.clear()
    options = FIRST
    first = ALFWorldEnv()
    first.reset(options=options)
    stats = ALFWorldEnv.cache_stats()["sas"]
    assert stats["misses"] == 2  # one translation for the game state, one optimised for the planner
    first.reset(options=options)  # same env, same game: no reload, only the reset's two look-ups (hits)
    assert ALFWorldEnv.cache_stats()["sas"] == {"hits": stats["hits"] + 2, "misses": 2, "size": 2}
    group = [ALFWorldEnv() for _ in range(3)]  # a group of episodes of the same game in other envs
    observations = {env.reset(options=options)[0] for env in group + [first]}
    assert ALFWorldEnv.cache_stats()["sas"]["misses"] == 2
    assert len(observations) == 1
    for env in group + [first]:
        env.close()


def test_disk_cache_serves_another_process(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from envs.alfworld import speedups
    from envs.alfworld.env import ALFWorldEnv

    game = alf_data.list_games("valid_unseen")[0]
    monkeypatch.setenv("AGENT_RL_CACHE", str(tmp_path))  # an empty disk cache (games stay where they are)
    speedups.SAS_CACHE.clear()
    env = ALFWorldEnv()
    env.reset(options={"gamefile": game})
    assert len(list((tmp_path / "alfworld" / "sas").glob("*.pkl"))) == 2
    speedups.SAS_CACHE.clear()  # a fresh process has an empty memory cache
    before = dict(speedups.SAS_DISK_STATS)
    other = ALFWorldEnv()
    other.reset(options={"gamefile": game})
    assert speedups.SAS_DISK_STATS["hits"] == before["hits"] + 2
    env.close()
    other.close()


def test_patches_keep_observations_identical() -> None:
    from envs.alfworld import patches
    from envs.alfworld.env import ALFWorldEnv

    def play() -> list[tuple[str, list[str]]]:
        env = ALFWorldEnv()
        obs, info = env.reset(options=FIRST)
        trace = [(obs, info["admissible_actions"])]
        for action in ["look", "inventory", "fly"] + info["walkthrough"]:
            obs, _, _, _, info = env.step(action)
            trace.append((obs, info["admissible_actions"]))
        env.close()
        return trace

    patched = play()
    patches.uninstall()
    try:
        original = play()
    finally:
        patches.install()
    assert original == patched


def test_close_frees_the_game_and_pools_the_planner_library() -> None:
    from envs.alfworld import speedups
    from envs.alfworld.env import ALFWorldEnv

    env = ALFWorldEnv()
    lib = env._pddl.downward_lib
    env.reset(options=FIRST)
    free = speedups.free_lib_count()
    env.close()
    env.close()  # idempotent
    assert env._pddl.downward_lib is None and "_pddl_state" not in env._pddl.__dict__
    assert speedups.free_lib_count() == free + 1  # handed back, not unloaded (dlclose + dlopen can crash)
    with pytest.raises(RuntimeError, match="closed"):
        env.reset(options=FIRST)
    other = ALFWorldEnv()  # the next env reuses that copy and plays the same game identically
    assert other._pddl.downward_lib is lib
    assert other.reset(options=FIRST)[0] == ALFWorldEnv().reset(options=FIRST)[0]
    other.close()


def test_alfworld_data_points_at_the_cache() -> None:
    from envs.alfworld import patches

    patches.install()
    assert os.environ["ALFWORLD_DATA"]
    import alfworld.info

    assert alfworld.info.ALFWORLD_DATA == os.environ["ALFWORLD_DATA"]


def test_uninstall_undoes_every_side_effect() -> None:
    """Importing ``patches`` changes nothing; ``install`` makes every change (the expert's RNG shim, TextWorld's
    memoised functions) and ``uninstall`` undoes each of them."""
    import random

    import textworld.envs.pddl.logic as pddl_logic
    from alfworld.agents.expert import handcoded_expert

    from envs.alfworld import patches, speedups

    patches.install()
    assert handcoded_expert.random is not random and pddl_logic.fast_downward is not speedups.fast_downward
    patches.uninstall()
    try:
        assert handcoded_expert.random is random
        assert pddl_logic.fast_downward is speedups.fast_downward
        for module, name, _ in speedups._PARSE_TARGETS:
            assert getattr(module, name) is speedups._ORIGINAL_PARSERS[module.__name__]
    finally:
        patches.install()
