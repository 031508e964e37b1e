"""A user's env that declares tools, as a user would write one (plain gymnasium, nothing of ours): ``tools`` on the
env is a list of OpenAI-style function schemas, and a step takes one call as JSON text ``{"name", "arguments"}``.

``say(text)`` answers ``"you said <text>"``; ``finish(answer)`` ends the episode with reward 1 when ``answer`` is
``"42"`` (else 0). Anything else (not a call, an unknown tool) is an invalid action, never an exception.
Registered as ``user/ToolEcho-v0``; serve it with ``--import tool_env_module``.
"""

from __future__ import annotations

import json

import gymnasium
from gymnasium import spaces

TOOLS = [
    {"type": "function", "function": {
        "name": "say", "description": "Say something; the env repeats it.",
        "parameters": {"type": "object", "properties": {"text": {"type": "string", "description": "what to say"}},
                       "required": ["text"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "finish", "description": "Give the final answer (the answer is 42).",
        "parameters": {"type": "object", "properties": {"answer": {"type": "string"}},
                       "required": ["answer"], "additionalProperties": False}}},
]


class ToolEchoEnv(gymnasium.Env):
    def __init__(self) -> None:
        self.observation_space = spaces.Text(4096)
        self.action_space = spaces.Text(4096)
        self.tools = TOOLS

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "Say something, then finish with the answer.", {"tools": self.tools}

    def step(self, action):
        try:
            call = json.loads(action)
            name, arguments = call["name"], call.get("arguments", {})
        except (ValueError, TypeError, KeyError):
            return f"not a tool call: {action!r}", 0.0, False, False, {"invalid_action": True}
        if name == "say":
            return f"you said {arguments.get('text')}", 0.0, False, False, {"invalid_action": False}
        if name == "finish":
            won = arguments.get("answer") == "42"
            return ("right" if won else "wrong"), float(won), True, False, {"won": won, "invalid_action": False}
        return f"unknown tool {name!r}", 0.0, False, False, {"invalid_action": True}


gymnasium.register(id="user/ToolEcho-v0", entry_point=ToolEchoEnv, max_episode_steps=10)
