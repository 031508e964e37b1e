"""The one way an env says "could not judge": :class:`EnvInfraError`.

Rule (``docs/env_errors.md``): a reward is a judgement of the agent's action. When the env cannot make that
judgement because something outside the agent's control failed (the code sandbox could not start, the math
verifier process crashed or cannot answer a trivial check, a game engine or catalog raised internally), the env
raises :class:`EnvInfraError` from ``reset``/``step`` instead of returning a reward. Never return 0.0 for it: a
trainer would learn from a failure that says nothing about the action.

Who sees it how:

- env server: HTTP 500 with ``code="env_infra_error"`` (the session is closed, as for any env exception);
- ``agent_rl.envclient.LocalEnvPool`` / ``HTTPEnvPool``: :class:`agent_rl.envclient.EnvServerError` with the same
  ``code``;
- rollout orchestrator: like any HTTP 5xx, the episode is re-run from its task (``rollout.episode_retries``), then
  its whole group is dropped and counted in ``rollout/dropped_groups``.

The other loud failure is :class:`EnvDataError`: an env whose data is missing or empty at the resolved path says
so, with the path and the counts it found, when it is built (the env server builds one before ``/health`` is
up, so a server that cannot reset never reports ready).

This module imports nothing of ``agent_rl`` (data flows one way).
"""

from __future__ import annotations

__all__ = ["ENV_INFRA_ERROR_CODE", "EnvDataError", "EnvInfraError"]

ENV_INFRA_ERROR_CODE = "env_infra_error"
"""Machine-readable error code of an :class:`EnvInfraError` over HTTP and in ``EnvServerError.code``."""


class EnvInfraError(RuntimeError):
    """The env could not judge the action (an infrastructure failure, not a wrong answer).

    Args:
        message: what failed and where (paths, exit codes), for the person who has to fix it.
        component: short name of the part that failed (``"sandbox"``, ``"verifier"``, ``"alfworld"``, ...).
    """

    def __init__(self, message: str, *, component: str = "env") -> None:
        super().__init__(message)
        self.component = component

    def __reduce__(self) -> tuple:  # keep ``component`` across pickling (worker processes)
        return (_rebuild, (str(self), self.component))


def _rebuild(message: str, component: str) -> EnvInfraError:
    return EnvInfraError(message, component=component)


class EnvDataError(FileNotFoundError):
    """The env's data is missing, empty or unusable at the resolved path (a deployment problem, never the
    request's: over HTTP a 500, not a 422). The message names the path and the counts found."""
