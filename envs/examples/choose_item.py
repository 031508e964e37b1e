"""ChooseItem: the smallest deterministic text env with a learnable signal (id ``agent_rl/ChooseItem-v0``).

The task names one item ("Your task is to: pick the sock."); the admissible actions are ``pick <item>`` for a few
items with distinct initial letters. The episode ends at the first action that names an item: reward 1.0 when it is
the task's item, else 0.0. An action that names no item is answered "Nothing happens." (``invalid_action=True``) and
the episode goes on (the registered TimeLimit ends it after 4 steps).

An action *names* an item when, lower-cased and stripped of an optional leading ``pick``, it equals the item or starts
with the item's initial letter (the terse-command convention of text adventures, like ``n`` for ``north``). The
initial-letter rule gives a randomly initialised test model a real chance (about 1/25 per sampled token) to hit the
right item, so RL tests can show learning in a few CPU minutes; a real model simply answers ``pick sock``.

Tool interface (``action_format="tools"``, docs/tools.md): one tool, ``pick(item)`` (``item`` one of the items, a
JSON-schema enum), declared as ``env.tools`` and in reset's ``info["tools"]``; a call ``pick(item=x)`` plays
``pick x``. A reply without a call, an unknown tool or an item not in the list is answered ``Invalid tool call:
<reason>`` (``invalid_action=True``) and the episode goes on.

Task selection: ``reset(seed=s)`` draws the target and the order of the admissible items from the env's np_random;
``options={"index": i}`` selects target ``items[i % len(items)]`` deterministically instead.
"""

from __future__ import annotations

from typing import Any

import gymnasium

from envs.spaces import TextSpace, check_action
from envs.tools import ToolCallError, check_action_format, function_tool, invalid_call_text, require_call

DEFAULT_ITEMS = ("sock", "cup", "pen", "mug")


class ChooseItemEnv(gymnasium.Env[str, str]):
    """Pick the item the task names. Info: ``admissible_actions`` (list[str]), ``won`` (bool), ``task_type`` (the
    target item), ``task_id`` (str), ``invalid_action`` (bool, on step).

    Args:
        items: candidate items; their initial letters must be distinct (raises ``ValueError`` otherwise).
        targets: the items a task may ask for (default: all ``items``); a single target makes a bandit.
        action_format: ``text`` (``pick <item>``) or ``tools`` (the ``pick`` tool, see the module docstring).
    """

    metadata = {"render_modes": []}

    def __init__(self, items: list[str] | tuple[str, ...] = DEFAULT_ITEMS, targets: list[str] | None = None,
                 action_format: str = "text") -> None:
        self.action_format = check_action_format(action_format)
        self.items = [str(it).lower() for it in items]
        initials = [it[0] for it in self.items]
        if len(set(initials)) != len(initials) or not all(it.isalpha() for it in initials):
            raise ValueError(f"items must start with distinct letters, got {self.items}")
        self.targets = [str(t).lower() for t in (targets or self.items)]
        unknown = sorted(set(self.targets) - set(self.items))
        if unknown:
            raise ValueError(f"targets {unknown} are not among items {self.items}")
        self.tools = [function_tool("pick", "Pick one of the items you see; this ends the episode.",
                                    {"item": {"type": "string", "enum": list(self.items),
                                              "description": "the item to pick"}})] if action_format == "tools" else []
        self.observation_space = TextSpace(4096)
        self.action_space = TextSpace(4096)
        self._target = self.targets[0]
        self._order: list[str] = list(self.items)
        self._done = True

    def _info(self) -> dict[str, Any]:
        return {
            "admissible_actions": [f"pick {it}" for it in self._order],
            "won": False,
            "task_type": self._target,
            "task_id": f"choose_item/{self._target}",
        }

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        options = options or {}
        if "index" in options:
            self._target = self.targets[int(options["index"]) % len(self.targets)]
            self._order = list(self.items)
        else:
            self._target = self.targets[int(self.np_random.integers(len(self.targets)))]
            self._order = [self.items[i] for i in self.np_random.permutation(len(self.items))]
        self._done = False
        listing = ", ".join(self._order)
        obs = f"You see: {listing}.\n\nYour task is to: pick the {self._target}."
        return obs, ({**self._info(), "tools": self.tools} if self.action_format == "tools" else self._info())

    def _resolve(self, action: str) -> str | None:
        """The item an action names, or None (see the module docstring)."""
        text = action.strip().lower()
        if text.startswith("pick "):
            text = text[5:].strip()
        if text in self.items:
            return text
        for item in self.items:
            if text[:1] == item[0]:
                return item
        return None

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        action = check_action(self, action)  # TypeError for a non-str (HTTP: 422)
        if self._done:
            raise RuntimeError("step() called after the episode ended; call reset()")
        info = self._info()
        if self.action_format == "tools":
            try:
                action = "pick " + require_call(action, self.tools).arguments["item"]
            except ToolCallError as exc:
                return invalid_call_text(exc), 0.0, False, False, {**info, "invalid_action": True,
                                                                   "tool_error": str(exc)}
        item = self._resolve(action)
        if item is None:
            info["invalid_action"] = True
            return "Nothing happens.", 0.0, False, False, info
        self._done = True
        won = item == self._target
        info.update(invalid_action=False, won=won)
        obs = f"You pick the {item}. " + ("That is the right item." if won else "That is not the item you wanted.")
        return obs, float(won), True, False, info
