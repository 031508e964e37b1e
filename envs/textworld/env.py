"""TextWorld game families (coin collector, treasure hunter, cooking) as a ``gymnasium.Env[str, str]``, in-process.

One game at a time, played by TextWorld's own Z-machine interpreter (``textworld.start`` on the generated ``.z8``),
with the game's ``.json`` for the walkthrough and TextWorld's quest tracker (admissible commands, score, the
optimal ``policy_commands`` from the current state). Games come from :mod:`envs.textworld.games` (generated from
fixed seeds into the cache on first use). The step limit is gymnasium's ``TimeLimit`` registered with the id.
"""

from __future__ import annotations

import copy
import re
import warnings
from typing import Any

import gymnasium

from envs.spaces import TextSpace, check_action
from envs.tools import ToolCallError, check_action_format, command_tool, invalid_call_text, require_call
from envs.textworld.games import (
    FAMILIES,
    SPLITS,
    TEXTWORLD_LOCK,
    check_family_level,
    ensure_game,
    task_type_of,
    verify_game,
)

import textworld  # noqa: E402  (the TextWorld package, not this one: absolute import)

MAX_TEXT = 1 << 16
REWARDS = ("win", "score")
# The longest command the interpreter reads (jericho's ``INPUT_BUFFER_SIZE`` is 198 bytes; a longer one is cut there).
MAX_COMMAND = 190
# What the Z-machine may be sent: printable ASCII but the backslash (dumb-frotz's escape to its own meta-commands).
_NOT_SENDABLE = re.compile(r"[^\x20-\x5b\x5d-\x7e]")

# The "TEXT WORLD" ASCII-art banner of the intro: non-blank lines made only of these characters.
_BANNER_LINE = re.compile(r"^\s*[_|\\/$<>][\s_|\\/$<>]*$")
# The interpreter's question after the end of the game.
_RESTART = re.compile(r"\n\s*Would you like to RESTART.*$", re.DOTALL)
# The Z-machine's prompt and status line at the end of every reply: "\n>   ...   -= Kitchen =-3/7".
_STATUS_TAIL = re.compile(r"\n\s*>\s*(?:-=.*?=-)?\s*(?:-?\d+/\d+)?\s*$", re.DOTALL)


def interpreter_command(action: str) -> str:
    """The command line the Z-machine is sent for ``action``: what any agent text may safely become.

    Runs of whitespace become one space; characters outside printable ASCII are dropped (the game's input alphabet
    is ZSCII, and jericho cuts a UTF-8 encoding at 198 bytes, possibly inside a character); the backslash is dropped
    (dumb-frotz reads ``\\x``-style escapes as commands to the interpreter itself, not the game, and some of them
    crash the process: a segfault took down the test run that sampled random actions); the result is cut to
    :data:`MAX_COMMAND` characters. Example: ``"go\\tnorth\\\\help ü"`` -> ``"go northhelp"``.
    """
    return _NOT_SENDABLE.sub("", " ".join(str(action).split()))[:MAX_COMMAND].strip()


def clean_feedback(text: str) -> str:
    """Game text without the intro banner, the trailing ``>`` prompt and status line, and runs of blank lines.

    Example: ``"\\nYou can't go that way.\\n\\n\\n>      -= Bedchamber =-0/2"`` -> ``"You can't go that way."``.
    """
    lines = [line.strip() for line in str(text).splitlines() if not _BANNER_LINE.match(line)]
    text = _STATUS_TAIL.sub("", _RESTART.sub("", "\n".join(lines)))
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip()


TEXTWORLD_TOOLS = [command_tool("Type one command in the game, e.g. \"go north\", \"take coin\", \"open door\"; it "
                                 "should be one of the admissible commands.")]
"""The tools of ``action_format="tools"``."""


class TextWorldEnv(gymnasium.Env[str, str]):
    """One TextWorld game of a family and level at a time. Observations and actions are ``str``.

    ``reset(*, seed=None, options=None) -> (observation, info)``; ``options``:

    - ``{"split": s, "index": i}``: game ``i`` of split ``s`` (``train``/``valid``/``test``; seed
      ``SPLIT_SEED_BASE[s] + i``, see :mod:`envs.textworld.games`), generated into the cache on first use;
    - ``{"split": s}`` or nothing: game ``np_random.integers(num_games)`` of split ``s`` (default: the constructor's
      ``split``), ``num_games`` the constructor's.

    ``step(action) -> (observation, reward, terminated, truncated, info)``: ``terminated`` on a win or a loss
    (cooking: e.g. burning an ingredient); ``truncated`` is always False here (``TimeLimit`` does it). Reward:
    ``reward="win"`` (default, as ALFWorld) 1.0 on the winning step else 0.0; ``reward="score"`` the game's score
    increase divided by ``max_score`` (so an episode's return is its final score / max_score, 1.0 on a win).
    An action that is not admissible is still played (the game answers it) and flagged ``info["invalid_action"]``.

    ``info`` (JSON-serialisable): ``admissible_actions`` (list[str], sorted), ``won``, ``lost`` (bool), ``score``,
    ``max_score`` (int points), ``task_type`` (``"<family>_level<L>"``), ``task_id``
    (``"<family>/level_<L>/<split>/<index>"``), ``objective`` (str), ``walkthrough`` (list[str], on reset: the
    generator's solution), ``expert_action`` (str, with ``expert=True``: the walkthrough's next command while the
    agent has followed it, else the first command of TextWorld's optimal policy from the current state; ``"look"``
    when the game has none, e.g. after a loss), ``invalid_action`` (bool, on step).

    Args:
        family: ``coin_collector`` | ``treasure_hunter`` | ``cooking``.
        level: difficulty (coin collector 1-100, treasure hunter 1-30, cooking 1-8: see
            :data:`envs.textworld.games.COOKING_LEVELS`).
        expert: compute ``info["expert_action"]`` (asks TextWorld for the policy each step).
        reward: ``win`` | ``score``.
        split: default split for ``reset`` without options.
        num_games: games per split drawn from by a reset without ``index`` (the generated pool's size).
        render_mode: ``None`` or ``"ansi"``.
        action_format: ``text`` (a command per step) or ``tools`` (docs/tools.md): the one tool
            :data:`TEXTWORLD_TOOLS` ``act(command)`` in ``self.tools`` and reset's ``info["tools"]``; a reply without
            a call, an unknown tool or wrong arguments is not played: the observation is ``Invalid tool call:
            <reason>`` and ``info["invalid_action"]`` is True.

    Raises:
        ValueError: unknown family, level, split, reward, reset options, or an index out of range.
    """

    metadata = {"render_modes": ["ansi"]}

    def __init__(self, family: str = "coin_collector", level: int = 1, expert: bool = False, reward: str = "win",
                 split: str = "train", num_games: int = 100, render_mode: str | None = None,
                 action_format: str = "text") -> None:
        self.action_format = check_action_format(action_format)
        self.tools = list(TEXTWORLD_TOOLS) if action_format == "tools" else []
        if isinstance(level, str) and level.strip().isdigit():  # env.kwargs.level=5 from a command line
            level = int(level)
        check_family_level(family, level)
        if reward not in REWARDS:
            raise ValueError(f"reward must be one of {REWARDS}, got {reward!r}")
        if split not in SPLITS:
            raise ValueError(f"unknown TextWorld split {split!r}; valid: {', '.join(SPLITS)}")
        if int(num_games) < 1:
            raise ValueError(f"num_games must be >= 1, got {num_games}")
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        self.family, self.level, self.expert, self.reward_mode = family, int(level), bool(expert), reward
        self.split, self.num_games, self.render_mode = split, int(num_games), render_mode
        self.task_type = task_type_of(family, self.level)
        self.observation_space = TextSpace(MAX_TEXT)
        self.action_space = TextSpace(MAX_TEXT)
        self._infos = textworld.EnvInfos(admissible_commands=True, won=True, lost=True, score=True,
                                         max_score=True, objective=True, policy_commands=self.expert,
                                         extras=["walkthrough"])
        self._tw: Any = None
        self._gamefile: str | None = None
        self._verified: set[str] = set()
        self._state: Any = None
        self._closed = False
        self.task_id: str | None = None
        self.walkthrough: list[str] = []
        self._played: list[str] = []
        self._on_walkthrough = True
        self.last_observation = ""

    # ---------------------------------------------------------------------------------------------------------
    def _select(self, options: dict[str, Any]) -> tuple[str, int]:
        unknown = sorted(set(options) - {"split", "index"})
        if unknown:
            raise ValueError(f"unknown TextWorld reset options {unknown}; expected split, index")
        split = options.get("split") or self.split
        if split not in SPLITS:
            raise ValueError(f"unknown TextWorld split {split!r}; valid: {', '.join(SPLITS)}")
        raw = options.get("index")
        if raw is None:
            return split, int(self.np_random.integers(self.num_games))
        try:
            index = int(raw)
        except (TypeError, ValueError):
            raise ValueError(f"index must be an integer, got {raw!r}") from None
        if isinstance(raw, bool) or (index != raw and str(index) != str(raw).strip()):
            raise ValueError(f"index must be an integer, got {raw!r}")
        return split, index

    def _load(self, split: str, index: int) -> None:
        record = ensure_game(self.family, self.level, split, index)
        path = str(record.path)
        if path not in self._verified:
            verify_game(record)
            self._verified.add(path)
        if path != self._gamefile:
            self._gamefile = None
            with warnings.catch_warnings():  # jericho: "not fully supported ... score detection disabled": TextWorld
                warnings.simplefilter("ignore")  # tracks the score itself from the game's .json
                # a new interpreter per game: textworld's ``load`` of another game into a running env keeps
                # ~0.4 MB per load (RSS 68 -> 160 MB over 200 loads); close + start costs the same and keeps none
                if self._tw is not None:
                    self._tw.close()
                    self._tw = None
                self._tw = textworld.start(path, self._infos)
            self._gamefile = path
            self.task_id = f"{self.family}/level_{self.level}/{split}/{index}"

    def _info(self) -> dict[str, Any]:
        s = self._state
        info: dict[str, Any] = {
            "admissible_actions": sorted(str(a) for a in (s["admissible_commands"] or [])),
            "won": bool(s["won"]),
            "lost": bool(s["lost"]),
            "score": int(s["score"] or 0),
            "max_score": int(s["max_score"] or 0),
            "task_type": self.task_type,
            "task_id": self.task_id,
        }
        if self.expert:
            info["expert_action"] = self._expert_action()
        return info

    def _expert_action(self) -> str:
        k = len(self._played)
        if self._on_walkthrough and k < len(self.walkthrough):
            return self.walkthrough[k]
        policy = self._state["policy_commands"] or []
        return str(policy[0]) if policy else "look"

    # ---------------------------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start the game selected by ``options`` (see the class docstring); returns ``(intro text, info)``."""
        if self._closed:
            raise RuntimeError("reset() on a closed TextWorldEnv")
        super().reset(seed=seed)
        split, index = self._select(dict(options or {}))
        with TEXTWORLD_LOCK:
            self._load(split, index)
            self._state = self._tw.reset()
        self.walkthrough = [str(a) for a in (self._state["extra.walkthrough"] or [])]
        self._played, self._on_walkthrough = [], True
        self.last_observation = clean_feedback(self._state["feedback"])
        info = self._info()
        info["objective"] = str(self._state["objective"] or "")
        info["walkthrough"] = list(self.walkthrough)
        if self.action_format == "tools":
            info["tools"] = self.tools
        return self.last_observation, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Play ``action`` (e.g. ``"go north"``); see the class docstring for the return."""
        action = check_action(self, action)  # TypeError for a non-str (HTTP: 422), before the episode is used up
        if self._state is None:
            raise RuntimeError("step() before reset()")
        if self._state["won"] or self._state["lost"]:
            # a client's mistake, not an env failure (the server answers 422)
            raise ValueError("step() after the game ended (won or lost); call reset()")
        if self.action_format == "tools":
            try:
                action = require_call(action, self.tools).arguments["command"]
            except ToolCallError as exc:  # not played: the game state is unchanged
                return invalid_call_text(exc), 0.0, False, False, {**self._info(), "invalid_action": True,
                                                                   "tool_error": str(exc)}
        action = interpreter_command(action)
        invalid = action.lower() not in {a.lower() for a in self._state["admissible_commands"] or []}
        k = len(self._played)
        if self._on_walkthrough and (k >= len(self.walkthrough) or action.lower() != self.walkthrough[k].lower()):
            self._on_walkthrough = False
        self._played.append(action)
        old_score = int(self._state["score"] or 0)
        with TEXTWORLD_LOCK:
            self._state, _score, _done = self._tw.step(action)
        self.last_observation = clean_feedback(self._state["feedback"])
        info = self._info()
        info["invalid_action"] = invalid
        won, lost = info["won"], info["lost"]
        if self.reward_mode == "win":
            reward = 1.0 if won else 0.0
        else:
            reward = (info["score"] - old_score) / max(info["max_score"], 1)
        return self.last_observation, float(reward), won or lost, False, info

    def clone_state(self) -> dict[str, Any]:
        """The running game's state (forked groups by state copy, ``rollout.fork.restore=state``): TextWorld's own
        ``copy()`` of the game (a new interpreter at the same memory, and copies of its quest trackers) and this
        env's episode fields. It costs about 30 replayed steps (``benchmarks/bench_fork_restore.py``), so replay
        (the default) is the cheaper fork here; this is for the state route's users and tests."""
        if self._state is None:
            raise RuntimeError("clone_state() before reset()")
        with TEXTWORLD_LOCK:
            game = self._tw.copy()
        return {"game": game, "state": copy.copy(self._state), "played": list(self._played),
                "on_walkthrough": self._on_walkthrough, "walkthrough": list(self.walkthrough),
                "last_observation": self.last_observation, "gamefile": self._gamefile, "task_id": self.task_id}

    def set_state(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`clone_state` of the same game (after a reset with the same options); ``state`` is
        not changed (its game is copied again), so one state can start many sessions."""
        with TEXTWORLD_LOCK:
            game = state["game"].copy()
            if self._tw is not None:
                self._tw.close()
            self._tw = game
        self._state = copy.copy(state["state"])
        self._played, self._on_walkthrough = list(state["played"]), bool(state["on_walkthrough"])
        self.walkthrough, self.last_observation = list(state["walkthrough"]), str(state["last_observation"])
        # the game that runs now (the reset before may have loaded another: an unseeded task draws its game)
        self._gamefile, self.task_id = state["gamefile"], state["task_id"]

    def render(self) -> str | None:
        return self.last_observation if self.render_mode == "ansi" else None

    def close(self) -> None:
        """Stop the interpreter (idempotent; the env is unusable after)."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        self._state = None
        if self._tw is not None:
            self._tw.close()
            self._tw = None
        super().close()

    @property
    def gamefile(self) -> str | None:
        """Path of the loaded ``game.z8``."""
        return self._gamefile


__all__ = ["FAMILIES", "TextWorldEnv", "clean_feedback"]
