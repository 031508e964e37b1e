"""ALFWorld (Shridhar et al., ICLR 2021) text games as a ``gymnasium.Env[str, str]``, in-process, one game at a time.

Per env: TextWorld's ``PddlEnv`` wrapped by ALFWorld's ``AlfredDemangler(shuffle=False)`` and ``AlfredInfos``, plus
the fixed handcoded expert (:class:`envs.alfworld.expert.FixedAlfredExpert`) when ``expert=True``. No batch env,
no subprocesses. The 50-step limit is gymnasium's ``TimeLimit`` (registered with the id), reward scaling is
``gymnasium.wrappers.TransformReward``: neither is a flag here.

Cost (2 busy cores): the first start of a game in a process translates PDDL to SAS (~0.5-5 CPU-s); later starts of
the same game, in this env or another env of the process or (through the on-disk cache) another process, reuse the
translation and parsed grammar (see :mod:`envs.alfworld.speedups`), ~0.05 s. Restarting the game that is already
loaded skips the load altogether.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium

from envs.alfworld import patches

patches.install()  # $ALFWORLD_DATA first, then the speed-ups and the expert fixes: before the alfworld imports below
from envs.alfworld.data import (
    GAME_FILENAME,
    GAMES_DIRNAME,
    check_selection,
    games_home,
    list_games,
    task_id_of,
    task_type_of,
)
from envs.errors import EnvInfraError
from envs.locks import TEXTWORLD_LOCK
from envs.spaces import TextSpace, check_action
from envs.tools import ToolCallError, check_action_format, command_tool, invalid_call_text, require_call

import textworld  # noqa: E402
from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos  # noqa: E402
from textworld.envs.pddl import PddlEnv  # noqa: E402

from envs.alfworld import speedups  # noqa: E402
from envs.alfworld.expert import FixedAlfredExpert  # noqa: E402


NOTHING_HAPPENS = "Nothing happens."
MAX_TEXT = 1 << 16


ALFWORLD_TOOLS = [command_tool("Take one action in the household, e.g. \"go to desk 1\", \"take mug 1 from desk 1\", "
                               "\"open fridge 1\"; it must be one of the admissible actions.")]
"""The tools of ``action_format="tools"``."""


class _PooledPddlEnv(PddlEnv):
    """TextWorld's ``PddlEnv`` taking its fast-downward library copy from the process pool
    (:func:`envs.alfworld.speedups.acquire_downward_lib`) instead of loading a new copy per env."""

    def __init__(self, infos: textworld.EnvInfos | None = None) -> None:
        textworld.Environment.__init__(self, infos)  # PddlEnv.__init__ minus its fast_downward.load_lib()
        self.downward_lib = speedups.acquire_downward_lib()


class ALFWorldEnv(gymnasium.Env[str, str]):
    """One ALFWorld text game at a time. Observations and actions are ``str`` (``spaces.Text``).

    ``reset(*, seed=None, options=None) -> (observation, info)`` where ``options`` selects the game (first match):

    - ``{"gamefile": path}``: that ``game.tw-pddl``;
    - ``{"task_id": id}`` (optionally with ``"split"``): the game whose :attr:`task_id` is ``id``
      (``"<split>/<task_type>-<Obj>-<MRecep>-<Recep>-<scene>/<trial>"``);
    - ``{"split": s, "index": i}``: game ``i`` of split ``s`` sorted by path (after the ``task_types`` filter);
    - ``{"split": s}`` or nothing: a game drawn with ``self.np_random`` (seeded by ``seed``) from split ``s``
      (default: the constructor's ``split``).

    ``step(action) -> (observation, reward, terminated, truncated, info)``: reward is 1.0 when the goal holds after
    the action, else 0.0; ``terminated`` is True on a win; ``truncated`` is always False here (the turn limit is the
    ``TimeLimit`` wrapper). An action that is not admissible is still sent to the game, which answers it as it does
    (``"Nothing happens."``), and ``info["invalid_action"]`` is True.

    ``info`` (JSON-serialisable): ``admissible_actions`` (list[str], sorted), ``won`` (bool), ``task_type`` (one of
    :data:`TASK_TYPES`), ``task_id`` (str), ``gamefile`` (str), ``expert_action`` (str, only with ``expert=True``:
    the fixed handcoded expert's next action, ``"look"`` when it has none), ``walkthrough`` (list[str], on reset:
    the game's stored optimal solution), ``invalid_action`` (bool, on step).

    Args:
        expert: compute ``info["expert_action"]`` (costs the expert's bookkeeping and the game's facts each step).
        task_types: only these ALFWorld task types (a list, or one type as a string) are selectable by ``index`` /
            random draw (``None``: all six).
        data_root: data root override (the ``data.root`` config key); ``None`` uses ``envs.data.data_root()``.
        split: default split when ``options`` has none (one of ``train``, ``valid_seen``, ``valid_unseen``,
            ``valid_train``).
        render_mode: ``None`` or ``"ansi"`` (``render()`` returns the last observation).
        action_format: ``text`` (a command per step) or ``tools`` (docs/tools.md): the one tool
            :data:`ALFWORLD_TOOLS` ``act(command)`` in ``self.tools`` and reset's ``info["tools"]``; a step takes an
            ``envs.tools`` call; a reply without a call, an unknown tool or wrong arguments is not sent to the game:
            the observation is ``Invalid tool call: <reason>`` and ``info["invalid_action"]`` is True.

    Raises:
        ValueError: unknown split / task type, or options that select no game.
        FileNotFoundError: no ALFWorld data under the data root (run ``python -m envs.fetch alfworld``).
    """

    # worker_cache: games loaded in a process are cached there, so a group of one game shares a worker
    # (envs.hosting.placement)
    metadata = {"render_modes": ["ansi"], "worker_cache": True}

    def __init__(
        self,
        expert: bool = False,
        task_types: str | list[str] | tuple[str, ...] | None = None,
        data_root: str | None = None,
        split: str = "train",
        render_mode: str | None = None,
        action_format: str = "text",
    ) -> None:
        self.action_format = check_action_format(action_format)
        self.tools = list(ALFWORLD_TOOLS) if action_format == "tools" else []
        if isinstance(task_types, str):  # one type, e.g. from the command line: env.kwargs.task_types=pick_...
            task_types = (task_types,)
        task_types = None if task_types is None else tuple(task_types)
        check_selection(split, task_types)
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        self.expert = bool(expert)
        self.task_types = task_types
        self.data_root = data_root
        self.split = split
        self.render_mode = render_mode
        self.observation_space = TextSpace(MAX_TEXT)
        self.action_space = TextSpace(MAX_TEXT)

        # The game: PddlEnv -> AlfredDemangler -> AlfredInfos (-> FixedAlfredExpert). Facts only feed the expert.
        infos = textworld.EnvInfos(admissible_commands=True, won=True, facts=self.expert, extras=["gamefile"])
        self._pddl = _PooledPddlEnv(infos)
        tw: textworld.core.Wrapper = AlfredInfos(AlfredDemangler(self._pddl, shuffle=False))
        if self.expert:
            tw = FixedAlfredExpert(tw)
        self._tw = tw
        self._gamefile: str | None = None  # the game currently loaded in ``self._tw``
        self._state: Any = None
        self._closed = False
        self.walkthrough: list[str] = []
        self.task_id: str | None = None
        self.task_type: str | None = None
        self.last_observation: str = ""

    # ---------------------------------------------------------------------------------------------------------
    def _select_game(self, options: dict[str, Any]) -> str:
        """Absolute path of the ``game.tw-pddl`` that ``options`` selects (see the class docstring)."""
        unknown = sorted(set(options) - {"gamefile", "task_id", "split", "index"})
        if unknown:
            raise ValueError(f"unknown ALFWorld reset options {unknown}; expected gamefile, task_id, split, index")
        if options.get("gamefile"):
            path = Path(str(options["gamefile"])).expanduser()
            if path.name != GAME_FILENAME:  # checked before touching the disk: a client of a server can't probe or
                path = path / GAME_FILENAME  # read arbitrary files through this option, only game folders
            if not path.is_file():
                raise ValueError(f"ALFWorld game file {path} does not exist")
            return str(path.resolve())
        split = options.get("split") or self.split
        if options.get("task_id"):
            task_id = str(options["task_id"]).strip("/")
            if options.get("split") and not task_id.startswith(f"{split}/"):
                task_id = f"{split}/{task_id}"
            path = games_home(self.data_root) / GAMES_DIRNAME / task_id / GAME_FILENAME
            if ".." in Path(task_id).parts or not path.is_file():
                raise ValueError(f"unknown ALFWorld task_id {options['task_id']!r} (split {split!r})")
            return str(path)
        games = list_games(split, self.task_types, root=self.data_root)
        if not games:
            raise ValueError(f"no ALFWorld games in split {split!r} for task types {self.task_types}")
        if options.get("index") is not None:
            raw = options["index"]
            index = int(raw)
            if isinstance(raw, bool) or index != raw and str(index) != str(raw).strip():  # no 1.7 -> game 1
                raise ValueError(f"index must be an integer, got {raw!r}")
            if not 0 <= index < len(games):
                raise ValueError(f"index {index} out of range: split {split!r} has {len(games)} games")
            return games[index]
        return games[int(self.np_random.integers(len(games)))]

    def _info(self) -> dict[str, Any]:
        state = self._state
        info: dict[str, Any] = {
            "admissible_actions": list(state["admissible_commands"]),
            "won": bool(state["won"]),
            "task_type": self.task_type,
            "task_id": self.task_id,
            "gamefile": self._gamefile,
        }
        if self.expert:
            plan = state.get("extra.expert_plan") or ["look"]
            info["expert_action"] = str(plan[0])
        return info

    # ---------------------------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start the game selected by ``options`` (see the class docstring); returns ``(intro text, info)``."""
        if self._closed:
            raise RuntimeError("reset() on a closed ALFWorldEnv")
        super().reset(seed=seed)
        gamefile = self._select_game(dict(options or {}))
        if gamefile != self._gamefile:
            self._gamefile = None  # stays None if load fails
            with TEXTWORLD_LOCK:  # TextWorld's parsers are not thread-safe (envs.locks)
                self._tw.load(gamefile)
            self._gamefile = gamefile
            self.walkthrough = [str(a) for a in (self._pddl.walkthrough or [])]
            self.task_id = task_id_of(gamefile)
            self.task_type = task_type_of(gamefile)
        if self.expert:  # the expert's tie-breaking RNG follows the env's seed
            self._tw.seed_expert(int(self.np_random.integers(2**31)))
        with TEXTWORLD_LOCK:
            self._state = self._tw.reset()
        self.last_observation = str(self._state["feedback"])
        info = self._info()
        info["walkthrough"] = list(self.walkthrough)
        if self.action_format == "tools":
            info["tools"] = self.tools
        return self.last_observation, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Play ``action`` (a command such as ``"go to fridge 1"``); see the class docstring for the return."""
        action = check_action(self, action)  # TypeError for a non-str (HTTP: 422)
        if self._state is None:
            raise RuntimeError("step() before reset()")
        if self.action_format == "tools":
            try:
                action = require_call(action, self.tools).arguments["command"]
            except ToolCallError as exc:  # not played: the game state is unchanged
                return invalid_call_text(exc), 0.0, False, False, {**self._info(), "invalid_action": True,
                                                                   "tool_error": str(exc)}
        invalid = action.strip() not in self._state["admissible_commands"]
        try:
            with TEXTWORLD_LOCK:
                self._state, _score, _done = self._tw.step(action)
        except Exception as exc:  # the game engine failed (any action is a valid command): could not judge
            raise EnvInfraError(f"the ALFWorld game {self.task_id} failed on {action!r}: {type(exc).__name__}: "
                                f"{exc}", component="alfworld") from exc
        self.last_observation = str(self._state["feedback"])
        info = self._info()
        info["invalid_action"] = invalid
        won = info["won"]
        return self.last_observation, 1.0 if won else 0.0, won, False, info

    def render(self) -> str | None:
        """The last observation when ``render_mode == "ansi"``, else ``None``."""
        return self.last_observation if self.render_mode == "ansi" else None

    def close(self) -> None:
        """Free the game and hand this env's fast-downward library copy back to the process pool (idempotent; the
        env is unusable after)."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        self._state = None
        lib = getattr(self._pddl, "downward_lib", None)
        try:
            self._tw.close()
        finally:
            for name in ("_pddl_state", "state", "prev_state", "_game_data", "_logic", "_entity_infos"):
                self._pddl.__dict__.pop(name, None)
            if lib is not None:
                self._pddl.downward_lib = None
                speedups.release_downward_lib(lib)
        super().close()

    def __del__(self) -> None:
        # An env dropped without close() would otherwise keep its copy of libdownward loaded.
        try:
            self.close()
        except Exception:  # noqa: BLE001 (interpreter shutdown: modules may already be gone)
            pass

    @staticmethod
    def cache_stats() -> dict[str, dict[str, int]]:
        """Process-wide cache counters: ``{"sas": {...}, "sas_disk": {...}, "<module>": {"hits", "misses"}}``."""
        stats = {"sas": {"hits": speedups.SAS_CACHE.hits, "misses": speedups.SAS_CACHE.misses,
                         "size": len(speedups.SAS_CACHE)},
                 "sas_disk": dict(speedups.SAS_DISK_STATS),
                 "downward_lib": dict(speedups.LIB_STATS, free=speedups.free_lib_count())}
        for name, cache in speedups.PARSE_CACHES.items():
            stats[name] = {"hits": cache.hits, "misses": cache.misses, "size": len(cache)}
        return stats
