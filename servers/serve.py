"""Command line entry point of the env server (what the tests, the Dockerfiles and docker-compose run).

    python -m servers.serve --env agent_rl/ALFWorld-v0 --host 127.0.0.1 --port 8001
    AGENT_RL_SERVER_TOKEN=... python -m servers.serve --import mypkg.myenv --env mypkg/MyEnv-v0 --host 0.0.0.0
    python -m servers.serve --env agent_rl/Code-v0 --token-file tokens.txt   # one "name: token" a line

Serves our session API and, for each env, OpenEnv (HTTP and ``WS /ws``) and MCP under ``/envs/<env id>`` (``GET
/envs`` lists the paths; a one-env server answers them at its root too). Binds 127.0.0.1 unless ``--host`` says
otherwise; a non-loopback ``--host`` needs a token. Tokens (``servers.access``): ``$AGENT_RL_SERVER_TOKEN`` or
``--token`` (one client; the variable keeps it out of ``ps``), or ``--token-file`` (named clients, each owning its
sessions); an empty token exits with status 2 and a message. The variable is removed from the server's environment
before any env worker starts (env code never sees it). ``--exit-with-parent PID`` (what ``servers.launch`` passes):
the server shuts itself down when its launcher dies. ``GET /health`` answers 200 once the server is ready: every
served env has made and reset one session with its defaults; if one cannot (missing or empty data), the server
exits with status 3 and one last line naming the env, the resolved data path and the counts found.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

from servers.launch import TOKEN_ENV, watch_parent
from servers.tokens import is_loopback_bind, read_token_file

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The CLI's parser (``tests/test_compose.py`` parses docker-compose commands with it)."""
    p = argparse.ArgumentParser(prog="python -m servers.serve", description="Serve gymnasium text envs over HTTP.")
    p.add_argument("--env", action="append", required=True, dest="env_ids", metavar="ENV_ID",
                   help="gymnasium id to serve (repeatable), e.g. agent_rl/ALFWorld-v0")
    p.add_argument("--import", action="append", default=[], dest="imports", metavar="MODULE",
                   help="module to import first, e.g. one that calls gymnasium.register (repeatable)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--token", default=None,
                   help="token of one client, required on every route but the health checks, on every surface "
                        "(Authorization: Bearer <token>, or Basic with it as password; default "
                        f"${TOKEN_ENV}, which keeps it off the command line). Without a token the server serves "
                        "loopback only")
    p.add_argument("--token-file", default=None, metavar="FILE",
                   help="clients told apart by their tokens: one 'name: token' a line ('#' comments); each client "
                        "reaches only the sessions it opened")
    p.add_argument("--allow-origin", action="append", default=[], dest="allowed_origins", metavar="ORIGIN",
                   help="a browser origin allowed to call (repeatable, e.g. http://localhost:3000; '*': any); "
                        "requests with any other Origin but the server's own are refused (403)")
    p.add_argument("--max-sessions", type=int, default=64, help="live sessions at most (503 beyond)")
    p.add_argument("--workers", type=int, default=None,
                   help="env worker processes at most (default: max-sessions, one process per session)")
    p.add_argument("--ttl", type=float, default=600.0, help="idle session time-to-live, seconds")
    p.add_argument("--max-snapshots", type=int, default=256,
                   help="env-state snapshots kept at most (forked groups by state copy; 503 beyond)")
    p.add_argument("--client-max-sessions", type=int, default=None, metavar="N",
                   help="live sessions one client (a --token-file name) holds at most (503 quota_exceeded beyond; "
                        "default: --max-sessions over the number of clients, at least 1)")
    p.add_argument("--client-max-snapshots", type=int, default=None, metavar="N",
                   help="snapshots one client keeps at most (503 quota_exceeded beyond; default: --max-snapshots "
                        "over the number of clients, at least 1)")
    p.add_argument("--client-max-workers", type=int, default=None, metavar="N",
                   help="worker processes one client holds at most by its sessions and snapshots (a snapshot keeps "
                        "its worker); beyond, its sessions share its own workers, else 503 quota_exceeded "
                        "(default: --workers over the number of clients, at least 1)")
    p.add_argument("--client-max-new-tasks", type=int, default=256, metavar="N",
                   help="tasks one client's resets may generate within --new-tasks-window (envs that make tasks on "
                        "demand: TextWorld's games, 1-90 CPU-s each); beyond, a reset that would generate one is 503 "
                        "quota_exceeded before any work, resets of generated tasks go on (default 256; -1: no bound)")
    p.add_argument("--new-tasks-window", type=float, default=3600.0, metavar="SECONDS",
                   help="the sliding window of --client-max-new-tasks (default 3600)")
    p.add_argument("--textworld-max-index", type=int, default=None, metavar="N",
                   help="TextWorld games of index >= N are not generated on demand, only played when already "
                        "generated (422 beyond; default 10000, or $AGENT_RL_TEXTWORLD_MAX_INDEX)")
    p.add_argument("--max-mcp-sessions", type=int, default=None, metavar="N",
                   help="MCP transport sessions (Mcp-Session-Id) of each env's MCP surface at most (503 beyond), each "
                        "client at most this over the number of clients (503 quota_exceeded; default: --max-sessions)")
    p.add_argument("--max-action-bytes", type=int, default=64 * 1024)
    p.add_argument("--prestart-workers", type=int, default=1, help="workers started before /health is up")
    p.add_argument("--env-timeout", type=float, default=600.0, help="seconds one env call may take")
    p.add_argument("--reset-nice", type=int, default=10,
                   help="run resets this many nice levels below steps (needs CAP_SYS_NICE; 0: off)")
    p.add_argument("--sandbox-limits", default=None, metavar="KEY=VALUE,...",
                   help="caps of the code sandbox, per run (e.g. memory_mb=512,nproc=16,cpu_s=10,wall_s=20; or a "
                        "JSON object): client env_kwargs may tighten a limit, never exceed its cap (4xx naming it); "
                        "default: the sandbox's defaults (envs.code.sandbox.SandboxLimits), or "
                        "$AGENT_RL_SANDBOX_LIMITS")
    p.add_argument("--header-timeout", type=float, default=10.0,
                   help="seconds a connection may take to send a whole request head (then it is closed)")
    p.add_argument("--body-timeout", type=float, default=30.0,
                   help="seconds a connection may take to send a whole request body after its head (then it is "
                        "closed)")
    p.add_argument("--log-level", default="info")
    p.add_argument("--exit-with-parent", type=int, default=None, metavar="PID",
                   help="shut down when the process PID (the launcher, this server's parent) is gone")
    return p


def main(argv: Sequence[str] | None = None) -> None:
    """Parse ``argv``, build the app with :func:`servers.app.create_app` and run it with uvicorn."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # the token: --token, else $AGENT_RL_SERVER_TOKEN (removed from the environment: env workers never inherit it)
    from_env = os.environ.pop(TOKEN_ENV, None)
    token = args.token if args.token is not None else (from_env if args.token_file is None else None)
    if token is not None and not token.strip():
        parser.error(f"an empty token ({'--token' if args.token is not None else '$' + TOKEN_ENV} is set but "
                     "empty) would let an empty credential in: give a token, or none for a loopback-only server")
    if token is not None and args.token_file is not None:
        parser.error("--token and --token-file: give one of them")
    try:  # a token file or bind that cannot serve: one line and exit code 2, before anything heavy is imported
        tokens = read_token_file(args.token_file) if args.token_file is not None else None
    except ValueError as exc:
        parser.error(str(exc))
    if token is None and tokens is None and not is_loopback_bind(args.host):
        parser.error(f"--host {args.host} without a token: a server without a token serves only loopback "
                     f"(127.0.0.1, ::1); set ${TOKEN_ENV}, --token or --token-file to bind another address")
    import uvicorn

    from servers.app import create_app

    try:  # a bad --import, --env or setting: one line and exit code 2, not a traceback
        if args.sandbox_limits is not None:  # before any worker starts: they inherit it
            from envs.code.sandbox import SANDBOX_LIMITS_ENV, parse_sandbox_limits

            os.environ[SANDBOX_LIMITS_ENV] = json.dumps(parse_sandbox_limits(args.sandbox_limits))
        if args.textworld_max_index is not None:  # before any worker starts: they inherit it
            from envs.generation import TEXTWORLD_MAX_INDEX_ENV

            os.environ[TEXTWORLD_MAX_INDEX_ENV] = str(args.textworld_max_index)
        for name in args.imports:
            importlib.import_module(name)
        app = create_app(args.env_ids, max_sessions=args.max_sessions, session_ttl_s=args.ttl, workers=args.workers,
                         token=token, tokens=tokens, allowed_origins=[o.rstrip("/") for o in args.allowed_origins],
                         max_action_bytes=args.max_action_bytes, imports=args.imports,
                         prestart_workers=args.prestart_workers, env_timeout_s=args.env_timeout,
                         reset_nice=args.reset_nice, max_snapshots=args.max_snapshots,
                         client_max_sessions=args.client_max_sessions,
                         client_max_snapshots=args.client_max_snapshots,
                         client_max_workers=args.client_max_workers, max_mcp_sessions=args.max_mcp_sessions,
                         client_max_new_tasks=None if args.client_max_new_tasks < 0 else args.client_max_new_tasks,
                         new_tasks_window_s=args.new_tasks_window)
    except (ImportError, ValueError) as exc:
        parser.error(str(exc))
    from servers.protocol import header_timeout_protocol

    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                           access_log=False, timeout_graceful_shutdown=30,
                                           http=header_timeout_protocol(args.header_timeout, args.body_timeout),
                                           ws_max_size=4 * app.state.settings.max_body_bytes))  # beyond: 1009
    if args.exit_with_parent is not None:
        watch_parent(args.exit_with_parent, lambda: _launcher_gone(server, args.exit_with_parent))
    try:
        server.run()
    except SystemExit:  # uvicorn exits 3 itself when the startup fails
        if server.started:
            raise
    if not server.started:  # startup failed: an env that cannot serve (EnvNotReady) or a port in use
        reason = getattr(app.state, "startup_error", None) or "see the log above"
        print(f"env server did not start: {reason}", file=sys.stderr)
        sys.exit(3)


def _launcher_gone(server: Any, pid: int) -> None:
    """The launcher died without stopping this server: shut down as on SIGTERM (sessions closed, workers stopped);
    SIGKILL this process if that has not finished within 60 s."""
    print(f"env server: its launcher (pid {pid}) is gone; shutting down", file=sys.stderr, flush=True)
    server.should_exit = True
    threading.Timer(60.0, os.kill, (os.getpid(), signal.SIGKILL)).start()


if __name__ == "__main__":
    main()
