"""An OpenAI-compatible gateway that records every sampled token, and ``env=external``: train any agent program
through it (docs/gateway.md).

- :mod:`agent_rl.gateway.app`: the HTTP surface (chat completions, completions, the Responses API, models, reward,
  env steps) and its security model; its routes and errors in :mod:`agent_rl.gateway.routes`, the sessions and
  their per-client scoping in :mod:`agent_rl.gateway.sessions`, request bounds in :mod:`agent_rl.gateway.limits`,
  a reply's cuts and log-probs in :mod:`agent_rl.gateway.shaping`, server-sent events in
  :mod:`agent_rl.gateway.streaming`;
- :mod:`agent_rl.gateway.fields`: what each request field does (honoured, refused with a 400 naming it, or the
  trainer's sampling, said in the reply);
- :mod:`agent_rl.gateway.responses`: the Responses API as chat calls;
- :mod:`agent_rl.gateway.recorder`: per-episode recording (exact ids, message-level prefix matching, segments);
- :mod:`agent_rl.gateway.external`: :class:`ProgramEpisode`, the episode runner of agent programs, and
  :func:`external_player`, the group player of ``env=external`` (``ExternalRollout``: its former name);
- ``python -m agent_rl.gateway --checkpoint DIR --port P``: the gateway alone in front of a checkpoint.
"""

from agent_rl.gateway.app import Gateway, GatewayLimits
from agent_rl.gateway.config import ExternalConfig
from agent_rl.gateway.external import ExternalRollout, ProgramEpisode, external_player, load_program, read_reward
from agent_rl.gateway.recorder import GatewaySession, PromptBuilder, RequestError

__all__ = ["ExternalConfig", "ExternalRollout", "Gateway", "GatewayLimits", "GatewaySession", "ProgramEpisode",
           "PromptBuilder", "RequestError", "external_player", "load_program", "read_reward"]
