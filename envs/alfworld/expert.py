"""The fix of ALFWorld 0.4.2's handcoded expert: :class:`FixedHandCodedTWAgent` (its policies get
:class:`_PolicyFixes`) and :class:`FixedAlfredExpert`. Behaviour changes, unlike :mod:`envs.alfworld.speedups`:

a. it tracks its own placements by looking for ``put`` in the last command, but the games' command is
   ``move X to Y``: after the first placement it loops (2/17 ``pick_two_obj`` games won). A last action starting
   with ``"move "`` is shown to the policy's state tracker as ``"put ..."`` (the same fault is reported upstream
   in an open pull request on alfworld/alfworld);
b. asked to find a mug (bowl, pot, pan, plate, cup, box: object classes that are also receptacle classes) it
   ignored its object priors and searched the whole room in reverse order; it now searches as for any object;
c. when it searches again for an object class (the second object of ``pick_two``) it no longer starts over in
   the same order: receptacles it has seen without that class are searched last;
d. when it says ``go to R`` while standing at a receptacle that shares R's spot (not admissible; ALFWorld's
   wrapper then wastes a ``look`` and then a random command), it plays ``examine R`` (the same "On the R, you
   see ..." text) and its tracker is told ``go to R``;
e. it breaks ties with its own seeded RNG instead of the global ``random`` (reproducible expert episodes): the
   ``random`` module inside ``handcoded_expert`` is replaced by a shim while installed (:func:`install`);
f. an expert that gives up or fails (``HandCodedAgentFailed``, timeout, a policy's own ``IndexError``) answers
   ``look`` instead of raising out of ``step``; the task parameters come from the game folder name when
   ``traj_data.json`` is missing.

Import this module only after ``$ALFWORLD_DATA`` is set (``patches.install`` does it in that order).
"""

from __future__ import annotations

import contextvars
import json
import os
import tempfile
import random
import threading
from pathlib import Path
from typing import Any

from alfworld.agents.environment.alfred_tw_env import AlfredExpert
from alfworld.agents.expert import HandCodedTWAgent
from alfworld.agents.expert import handcoded_expert as _handcoded_expert

from envs.alfworld.data import traj_data_from_dirname

_LOCK = threading.RLock()
_INSTALLED = False


def _move_as_put(action: str) -> str:
    """``"move apple 1 to fridge 1"`` -> ``"put apple 1 in/on fridge 1"``; other actions unchanged."""
    if action.startswith("move "):
        obj, _, recep = action[len("move ") :].rpartition(" to ")
        return f"put {obj} in/on {recep}"
    return action


class _PolicyFixes:
    """Mixin for the handcoded expert's task policies (module doc, 4a-c)."""

    def update_state_tracking(self, game_state: Any, last_action: str) -> None:
        # Feed the state tracker the ``put`` command it was written for.
        super().update_state_tracking(game_state, _move_as_put(last_action))  # type: ignore[misc]
        # Remember what each receptacle showed (used by get_list_of_receptacles_to_search_for_object_cls).
        seen = self.__dict__.setdefault("_contents_seen", {})
        obs = game_state["feedback"]
        for verb in ("go to ", "open ", "examine "):
            if last_action.startswith(verb) and "you see" in obs:
                seen[last_action[len(verb) :]] = obs

    def get_list_of_receptacles_to_search_for_object_cls(self, obj_cls: str) -> list[str]:
        # The policy searches receptacles from the end of this list. When it searches again (the second object of
        # pick_two, or after a wrong pick), it used to start over in the same order, revisiting receptacles it has
        # seen without any object of the class. Those now come first in the list, i.e. are searched last.
        priors = super().get_list_of_receptacles_to_search_for_object_cls(obj_cls)  # type: ignore[misc]
        seen = self.__dict__.get("_contents_seen", {})
        seen_without = [r for r in priors if r in seen and f" {obj_cls} " not in seen[r]]
        return seen_without + [r for r in priors if r not in seen_without]

    def get_list_of_receptacles_of_type(self, recep_cls: str) -> list[str]:
        # Mug, bowl, pot, pan, plate, cup, box ... are object classes *and* receptacle classes. To find a mug the
        # policy asks for "receptacles of type mug", gets none (mugs are not among the room's receptacles) and then
        # searches every receptacle in reverse room order, ignoring its object priors (a mug on countertop 2 is
        # found after 12 drawers). Search for such a class as an object instead, as for any other object.
        found = super().get_list_of_receptacles_of_type(recep_cls)  # type: ignore[misc]
        if found or recep_cls not in self.OBJECT_TO_VAL_RECEPTACLE:  # type: ignore[attr-defined]
            return found
        priors = self.get_list_of_receptacles_to_search_for_object_cls(recep_cls)  # type: ignore[attr-defined]
        return [r for r in self.receptacles if r not in priors] + priors  # type: ignore[attr-defined]


# The expert breaks ties with ``random.choice`` from the global ``random`` module (e.g. it plays a random admissible
# command when its own choice repeats the last one). Inside ``handcoded_expert`` only, ``random`` is replaced by a
# shim whose ``choice`` uses the RNG of the agent that is acting, so an expert episode is reproducible from the env's
# seed and envs do not disturb each other (or the user's global ``random``).
_ACTING_RNG: contextvars.ContextVar[random.Random | None] = contextvars.ContextVar("alfworld_expert_rng", default=None)


class _ExpertRandom:
    """Stands in for the ``random`` module inside ``alfworld.agents.expert.handcoded_expert``."""

    def choice(self, seq: Any) -> Any:
        rng = _ACTING_RNG.get()
        return (rng or random).choice(seq)

    def __getattr__(self, name: str) -> Any:
        return getattr(random, name)


def install() -> None:
    """Put the seeded-RNG shim in place of ``random`` inside ``handcoded_expert`` (fix e; idempotent)."""
    global _INSTALLED
    with _LOCK:
        if not _INSTALLED:
            _handcoded_expert.random = _ExpertRandom()
            _INSTALLED = True


def uninstall() -> None:
    """Give ``handcoded_expert`` back the ``random`` module."""
    global _INSTALLED
    with _LOCK:
        _handcoded_expert.random = random
        _INSTALLED = False


class FixedHandCodedTWAgent(HandCodedTWAgent):
    """ALFWorld's ``HandCodedTWAgent`` with the ``move``/``put`` state-tracking fix and its own RNG (``self.rng``,
    see :meth:`seed`); needs no ``traj_data.json``."""

    _fixed_policies: dict[type, type] = {}

    def __init__(self, max_steps: int = 150) -> None:
        super().__init__(max_steps=max_steps)
        self.rng = random.Random()
        self._played_for: dict[str, str] = {}

    def seed(self, seed: int | None) -> None:
        """Seed the expert's tie-breaking RNG."""
        self.rng.seed(seed)

    def reset(self, game: str = "INVALID") -> None:
        self._played_for = {}
        self._reset_policy(game)

    def act(self, game_state: Any, reward: Any, done: Any, last_action: str = "") -> str:
        # The state tracker sees the command the policy asked for (``go to R``) when we played a stand-in for it.
        tracked = self._played_for.get(last_action, last_action)
        self._played_for = {}
        token = _ACTING_RNG.set(self.rng)
        try:
            action = super().act(game_state, reward, done, tracked)
        finally:
            _ACTING_RNG.reset(token)
        # Co-located receptacles ("You are facing the drawer 3, and drawer 2"): ``go to drawer 3`` is not admissible
        # from drawer 2, ALFWorld's wrapper then says ``look`` and the policy asks again, and then plays a random
        # command. ``examine drawer 3`` shows the same "On the drawer 3, you see ..." as arriving there would.
        admissible = game_state["admissible_commands"]
        if action.startswith("go to ") and action not in admissible:
            examine = "examine " + action[len("go to ") :]
            if examine in admissible:
                self._played_for = {examine: action}
                return examine
        return action

    def get_task_policy(self, task_param: dict) -> type:
        base = super().get_task_policy(task_param)
        fixed = self._fixed_policies.get(base)
        if fixed is None:
            fixed = type(base.__name__ + "Fixed", (_PolicyFixes, base), {})
            self._fixed_policies[base] = fixed
        return fixed

    def _reset_policy(self, game: str) -> None:
        traj_path = os.path.join(os.path.dirname(game), "traj_data.json")
        if os.path.exists(traj_path):
            return super().reset(game)
        # A read-only download without traj_data.json: derive the same fields from the folder name.
        traj = traj_data_from_dirname(Path(game).parent.parent.name)
        with tempfile.TemporaryDirectory() as tmp:
            Path(tmp, "traj_data.json").write_text(json.dumps(traj))
            return super().reset(os.path.join(tmp, "game.tw-pddl"))


class FixedAlfredExpert(AlfredExpert):
    """``AlfredExpert`` (handcoded) using :class:`FixedHandCodedTWAgent`; an expert that gives up or fails says
    ``look``.

    ALFWorld's wrapper lets the expert's exceptions escape from ``step`` (``HandCodedAgentFailed``, its timeout, and
    bugs of its policies such as ``IndexError: Cannot choose from an empty sequence`` when a policy has no object of
    interest left, e.g. after the agent moved the pot of ``pick_cool_then_place_in_recep-Pot-None-StoveBurner-25``
    back). The game has already stepped when the expert runs, so here any expert failure makes the plan
    ``["look"]`` (what ALFWorld itself uses when the expert's action is not admissible): the game never crashes
    because of the expert. ``expert_failures`` counts them.
    """

    expert_failures = 0

    def load(self, gamefile: str) -> None:
        super().load(gamefile)
        self._handcoded_expert = FixedHandCodedTWAgent(max_steps=200)
        self._handcoded_expert.seed(getattr(self, "_expert_seed", None))

    def seed_expert(self, seed: int | None) -> None:
        """Seed the expert's tie-breaking RNG (applies now and to games loaded later)."""
        self._expert_seed = seed
        if hasattr(self, "_handcoded_expert"):
            self._handcoded_expert.seed(seed)

    def _gather_infos(self) -> None:
        # AlfredExpert._gather_infos runs only the expert (the inner wrappers built the state already), so an
        # exception here is the expert's own: HandCodedAgentFailed, Exception("Timeout") (its HandCodedAgentTimeout),
        # or a bug of a policy (IndexError from random.choice([])).
        try:
            super()._gather_infos()
        except Exception:  # noqa: BLE001 (see above: never the game's failure)
            self.expert_failures += 1
            self.state["extra.expert_plan"] = ["look"]
