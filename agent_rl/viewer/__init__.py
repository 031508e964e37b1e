"""Web viewer of a run's episodes and credit: ``python -m agent_rl.viewer RUN_DIR [--host 127.0.0.1] [--port 8000]``.

See :mod:`agent_rl.viewer.app` for the pages and docs/viewer.md for a tour; the data comes from
:mod:`agent_rl.episodes` (``RUN_DIR/episodes/step_N.jsonl``), ``metrics.jsonl``, ``config.yaml`` and ``eval/*.json``.
"""

from agent_rl.viewer.app import create_app

__all__ = ["create_app"]
