"""The one error format of the command lines (``python -m agent_rl.train``, ``agent_rl.sft``, ``agent_rl.eval``):
a config error is one line ``config error: what, where, the valid choices`` (exit code 2), a run that cannot go on
one line ``error: ...`` (exit code 1); no traceback for either (anything else is a bug and keeps its traceback)."""

from __future__ import annotations

import sys
from typing import Any, Callable

from agent_rl.config.schema import ConfigError


def one_line(exc: BaseException) -> str:
    """The exception's message on one line (whitespace runs, newlines included, become one space)."""
    return " ".join(str(exc).split())


def run_cli(main: Callable[[], Any], *, config_errors: tuple[type[BaseException], ...] = (ConfigError,),
            run_errors: tuple[type[BaseException], ...] = ()) -> None:
    """Call ``main()``; ``config_errors`` are printed as ``config error: <message>`` (exit 2), ``run_errors`` as
    ``error: <message>`` (exit 1), each on one line of stderr."""
    try:
        main()
    except config_errors as exc:
        print(f"config error: {one_line(exc)}", file=sys.stderr)
        raise SystemExit(2) from None
    except run_errors as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        raise SystemExit(1) from None
