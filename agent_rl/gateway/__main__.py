"""``python -m agent_rl.gateway --checkpoint DIR --port P``: the gateway alone in front of a checkpoint, so an agent
program can be evaluated or debugged against the policy with the same recording as in training.

Sessions are named by the client (``X-Session-ID``, or ``/sessions/<id>/v1``; none: ``default``) and sampled at
``--temperature``; the token is ``$AGENT_RL_GATEWAY_TOKEN`` or one made at start and printed once. An episode ends
when its reward is posted (``POST /sessions/<id>/reward``); it is then written to
``--out/episodes/step_000000.jsonl`` (``source: gateway``; ``python -m agent_rl.viewer OUT`` shows it), and so are the
sessions still open at exit (with ``failure: no reward posted``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch

from agent_rl.engines import get_engine
from agent_rl.episodes import write_episodes
from agent_rl.gateway.config import ExternalConfig
from agent_rl.gateway.external import ProgramEpisode, external_player
from agent_rl.gateway.recorder import GatewaySession
from agent_rl.learner.config import ModelConfig
from agent_rl.models import load_policy
from agent_rl.rollout import RolloutConfig
from agent_rl.types import Episode, Task
from servers.launch import new_token

TOKEN_ENV = "AGENT_RL_GATEWAY_TOKEN"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m agent_rl.gateway", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="a checkpoint folder (DIR/checkpoints/step_N) or HF model dir")
    p.add_argument("--port", type=int, default=8400)
    p.add_argument("--host", default="127.0.0.1", help="bind address (loopback unless --allow-remote)")
    p.add_argument("--allow-remote", action="store_true", help="allow a non-loopback --host (the token still rules)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature of every call (default 0)")
    p.add_argument("--max-new-tokens", type=int, default=256, help="the cap of every call's max_tokens")
    p.add_argument("--max-prompt-tokens", type=int, default=4096)
    p.add_argument("--tool-call-format", default=None, help="default: the checkpoint run's model.tool_call_format")
    p.add_argument("--out", default="gateway_runs", help="where episodes are stored (OUT/episodes/)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    return p.parse_args(argv)


def run_config(checkpoint: Path) -> dict[str, Any]:
    """The config the checkpoint was trained under (its ``extra.json``), or {} for a plain model folder."""
    extra = checkpoint / "extra.json"
    if extra.is_file():
        return dict(json.loads(extra.read_text()).get("config") or {})
    return {}


def episode_of(session: GatewaySession, failure: str | None = None) -> Episode:
    """A finished session as an :class:`Episode` (its task names the session; ``won`` only when the program said
    so: a reward alone is not a success)."""
    reward = session.reward if session.reward is not None else 0.0
    won = session.reward_info.get("won")
    return Episode(task=Task(env_id="gateway", options={"session_id": session.session_id}),
                   temperature=session.temperature, is_high=False, turns=list(session.turns), reward=float(reward),
                   won=bool(won) if won is not None else False, failure=failure)


async def serve(args: argparse.Namespace) -> None:
    ckpt = Path(args.checkpoint).expanduser().resolve()
    if not ckpt.is_dir():
        raise SystemExit(f"--checkpoint {ckpt} is not a folder")
    model_cfg = run_config(ckpt).get("model") or {}
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_policy(ModelConfig(name=str(model_cfg.get("name", "checkpoint")), path=str(ckpt),
                                               dtype=str(model_cfg.get("dtype", "float32"))))
    engine = get_engine("hf", model.eval(), tokenizer, seed=args.seed)
    out = Path(args.out)
    token = os.environ.get(TOKEN_ENV) or new_token()
    state: dict[str, Any] = {}

    def store(session: GatewaySession, failure: str | None = None) -> None:
        if session.turns:
            write_episodes(out, 0, [episode_of(session, failure)], tokenizer=tokenizer, source="gateway",
                           append=True)
        state["rollout"].gateway.close_session(session.session_id)

    rollout = external_player(None, engine, RolloutConfig(max_prompt_tokens=args.max_prompt_tokens),
                              ExternalConfig(), max_new_tokens=args.max_new_tokens, seed=args.seed,
                              tool_call_format=args.tool_call_format or model_cfg.get("tool_call_format", "hermes"),
                              model_name=str(model_cfg.get("name", ckpt.name)), host=args.host, port=args.port,
                              token=token, auto_sessions=True, allow_remote=args.allow_remote)
    gateway_runner = rollout.runner
    assert isinstance(gateway_runner, ProgramEpisode)
    state["rollout"] = gateway_runner
    gateway_runner.gateway.on_reward = store
    gateway_runner.gateway.session_defaults = {"temperature": float(args.temperature)}
    await gateway_runner.start()
    await rollout.open_stream(seed_key=args.seed)
    print(f"gateway for {ckpt} at {gateway_runner.base_url}/v1 (episodes: {out}/episodes/)", file=sys.stderr)
    if not os.environ.get(TOKEN_ENV):
        print(f"token (set ${TOKEN_ENV} to choose it): {token}", file=sys.stderr)
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)  # stored on SIGTERM too
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        pass
    finally:
        for session in list(gateway_runner.gateway.sessions.values()):
            store(session, "no reward posted")
        await rollout.close_stream()
        await rollout.aclose()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        asyncio.run(serve(args))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
