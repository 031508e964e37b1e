"""A user's own env module, registered with plain ``gymnasium.register`` (of ours it imports only
``envs.errors.EnvInfraError``, the documented way to say "could not judge").

Served in the tests with ``python -m servers.serve --import user_env_module --env user/Echo-v0``.
"""

from __future__ import annotations

import builtins
import itertools
import os
import string
import subprocess
import sys
import time

import gymnasium
import numpy as np
from gymnasium import spaces

from envs.errors import EnvDataError, EnvInfraError


_INSTANCES = itertools.count()

#: lone surrogates (high, low) and a pair stored as two code points: what a buggy env (a bad decode, a truncated
#: UTF-16 buffer) can emit. The server sends ``"high \ufffd low \ufffd pair \U0001f600"`` (docs/servers.md, "Text").
SURROGATE_TEXT = "high \ud800 low \udfff pair \ud83d\ude00"


class EchoEnv(gymnasium.Env):
    """Echoes the action; ``"stop"`` terminates with reward 1. ``"raise"`` makes the env raise, ``"exit"`` kills
    its process, ``"sleep:<s>"`` sleeps (a slow step), ``"wait:<path>"`` waits until the file ``path`` exists (a step
    that lasts until the test lets it end), ``"spawn"`` starts a helper process and leaves it running (its pid in
    ``info["child"]``), ``"spawn:<path>"`` writes that pid to ``path`` and hangs, ``"reward:<x>"`` answers the reward
    ``float(x)`` (``nan``, ``inf``, ``1e308``: an env whose reward breaks the rule). ``reset(options={"sleep": s})``
    sleeps too (a slow reset), and ``reset(options={"wait": path})`` waits for the file;
    ``reset(options={"raise": "IndexError"})`` raises that builtin exception; ``reset(options={"generate": name})``
    generates a task on demand (:mod:`envs.generation`: refused past the client's quota of new tasks); ``"infra"`` as an action or a
    ``raise`` option raises ``EnvInfraError`` (the env could not judge). Text that is not valid Unicode:
    ``reset(options={"surrogate": True})`` and the action ``"surrogate"`` answer with :data:`SURROGATE_TEXT` in the
    observation and in ``info`` (values and a key); the action ``"raise-surrogate"`` raises with it in the message.
    ``info`` carries numpy values on purpose (the server must send them as JSON numbers)."""

    def __init__(self, prefix: str = "echo") -> None:
        self.observation_space = spaces.Text(256, charset=string.printable)
        self.action_space = spaces.Text(256, charset=string.printable)
        self.prefix = prefix
        self.t = 0
        self.instance = f"{os.getpid()}-{next(_INSTANCES)}"  # unique, unlike id() which is reused after free

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        options = options or {}
        time.sleep(float(options.get("sleep", 0.0)))
        if "wait" in options:
            _wait_for_file(options["wait"])
        if options.get("generate"):  # a task generated on demand, as TextWorld's games (envs.generation)
            from envs.generation import check_new_task, note_new_task

            check_new_task(f"echo task {options['generate']}")
            note_new_task()
        if options.get("raise") == "infra":
            raise EnvInfraError("reset could not reach its backend on purpose", component="echo")
        if "raise" in options:  # {"raise": "IndexError"}: reset raises that builtin exception
            raise getattr(builtins, options["raise"])("reset raised on purpose")
        self.t = 0
        if options.get("surrogate"):
            return f"{self.prefix}: ready {SURROGATE_TEXT}", {"note": SURROGATE_TEXT, "options": options}
        return f"{self.prefix}: ready", {"pid": os.getpid(), "t": np.int64(0), "options": options,
                                         "nice": os.getpriority(os.PRIO_PROCESS, 0),
                                         "instance": self.instance}

    def step(self, action):
        self.t += 1
        if action == "raise":
            raise RuntimeError("boom on purpose")
        if action == "infra":
            raise EnvInfraError("could not judge on purpose", component="echo")
        if action == "raise-surrogate":
            raise RuntimeError(f"boom on purpose: {SURROGATE_TEXT}")
        if action == "surrogate":
            info = {"note": SURROGATE_TEXT, "list": [SURROGATE_TEXT], "key \udc80": 1, "t": self.t}
            return f"{self.prefix}: {SURROGATE_TEXT}", 0.0, False, False, info
        if action == "exit":
            os._exit(3)
        if action.startswith("spawn"):  # "spawn[:path]": a helper process left running (its pid in info / path)
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
            if ":" in action:  # then hang: the step times out
                with open(action.split(":", 1)[1], "w") as f:
                    f.write(str(child.pid))
                time.sleep(600)
            return f"{self.prefix}: spawned", 0.0, False, False, {"child": child.pid}
        if action.startswith("sleep:"):
            time.sleep(float(action.split(":", 1)[1]))
        if action.startswith("reward:"):  # the reward as written ("reward:nan", "reward:1e308"), episode goes on
            return f"{self.prefix}: {action}", float(action.split(":", 1)[1]), False, False, {"t": self.t}
        if action.startswith("wait:"):
            _wait_for_file(action.split(":", 1)[1])
        terminated = action == "stop"
        info = {"t": np.int64(self.t), "score": np.float32(0.5) * self.t, "pid": os.getpid(),
                "nice": os.getpriority(os.PRIO_PROCESS, 0)}
        return f"{self.prefix}: {action}", float(terminated), terminated, False, info


def _wait_for_file(path: str, ceiling_s: float = 600.0) -> None:
    """Return once ``path`` exists; the ceiling only ends a wait whose test never creates it (then raises)."""
    deadline = time.monotonic() + ceiling_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} was never created")
        time.sleep(0.01)


gymnasium.register(id="user/Echo-v0", entry_point=EchoEnv, max_episode_steps=20)


class NoDataEnv(EchoEnv):
    """An env whose data is missing unless ``data="ok"``: its default reset raises ``EnvDataError``."""

    def __init__(self, data: str = "/nowhere/user-data") -> None:
        super().__init__()
        self.data = data

    def reset(self, *, seed=None, options=None):
        if self.data != "ok":
            raise EnvDataError(f"no items in {self.data} (0 found, 1000 expected)")
        return super().reset(seed=seed, options=options)


gymnasium.register(id="user/NoData-v0", entry_point=NoDataEnv, max_episode_steps=20)


class CachedEchoEnv(EchoEnv):
    """:class:`EchoEnv` declaring a per-process task cache (``metadata["worker_cache"]``, as ALFWorld does): the
    server may place one client's sessions of one task on one worker (``envs.hosting.placement``)."""

    metadata = {"render_modes": [], "worker_cache": True}


gymnasium.register(id="user/CachedEcho-v0", entry_point=CachedEchoEnv, max_episode_steps=20)


class DriftEnv(gymnasium.Env):
    """A walk whose observations carry noise the reset seed does not fix (the env's own generator, seeded from the
    OS at construction), so replaying its actions never reproduces an episode, but it can copy its state:
    ``clone_state()``/``set_state(state)`` (forked groups by state copy). Actions ``left``/``right`` move by one;
    reaching position 3 terminates with reward 1. ``TimeLimit``: 6 steps. ``clone_s``: seconds a ``clone_state``
    takes (a slow copy, for the cancellation and close-meanwhile tests); ``clones_started``/``clones_finished``
    count the copies begun and ended in this process (what a test run in threads waits on)."""

    clones_started = 0
    clones_finished = 0

    def __init__(self, clone_s: float = 0.0) -> None:
        self.clone_s = float(clone_s)
        self.observation_space = spaces.Text(256, charset=string.printable)
        self.action_space = spaces.Text(256, charset=string.printable)
        self.rng = np.random.default_rng()  # unseeded on purpose
        self.pos = 0

    def _obs(self) -> str:
        return f"pos {self.pos} noise {int(self.rng.integers(10**9))}"

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = 0
        return self._obs(), {"admissible_actions": ["left", "right"], "pos": self.pos}

    def step(self, action):
        self.pos += {"left": -1, "right": 1}.get(action, 0)
        won = self.pos >= 3
        return self._obs(), float(won), won, False, {"admissible_actions": ["left", "right"], "pos": self.pos,
                                                     "won": won}

    def clone_state(self):
        DriftEnv.clones_started += 1
        time.sleep(self.clone_s)
        DriftEnv.clones_finished += 1
        return {"pos": self.pos, "rng": self.rng.bit_generator.state}

    def set_state(self, state):
        self.pos = int(state["pos"])
        self.rng.bit_generator.state = dict(state["rng"])


gymnasium.register(id="user/Drift-v0", entry_point=DriftEnv, max_episode_steps=6)
