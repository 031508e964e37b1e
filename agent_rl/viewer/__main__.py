"""``python -m agent_rl.viewer RUN_DIR [--host 127.0.0.1] [--port 8000]``: serve the viewer with uvicorn."""

from __future__ import annotations

import argparse
import sys

import uvicorn

from agent_rl.viewer.app import create_app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m agent_rl.viewer",
                                     description="Read-only web viewer of a training run or eval output directory: "
                                                 "curves, groups, episodes with per-token credit heatmaps.")
    parser.add_argument("run_dir", help="run directory (trainer.output_dir) or eval output directory")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default 127.0.0.1: this machine only; the viewer has no login)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)

    try:
        app = create_app(args.run_dir)
    except FileNotFoundError as exc:
        parser.error(str(exc))
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: binding {args.host}: anyone who can reach this address can read the run "
              "(the viewer has no authentication)", file=sys.stderr)
    print(f"viewer of {app.state.reader.run_dir} at http://{args.host}:{args.port}/", file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)


if __name__ == "__main__":
    main()
