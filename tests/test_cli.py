"""Issue 34: the three command lines (``agent_rl.train``, ``agent_rl.sft``, ``agent_rl.eval``) report a config error
in one format (``agent_rl.cli``): one stderr line ``config error: <message>``, exit code 2, no traceback; a run that
cannot go on is ``error: <message>``, exit code 1."""

from __future__ import annotations

import sys

import pytest

from agent_rl import sft, train
from agent_rl.cli import run_cli
from agent_rl.config.schema import ConfigError
from agent_rl.eval import runner


@pytest.mark.parametrize("cli", [train.cli, sft.cli, runner.cli], ids=["train", "sft", "eval"])
def test_a_bad_key_is_one_config_error_line_and_exit_2(cli, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["prog", "env=choose_item", "trainer.total_step=2"])
    with pytest.raises(SystemExit) as done:
        cli()
    assert done.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(lines) == 1 and lines[0].startswith("config error: unknown config key 'trainer.total_step'")


def test_run_cli_puts_a_multi_line_message_on_one_line_and_maps_run_errors(capsys):
    def bad_config() -> None:
        raise ConfigError("first\n  second")

    def cannot_go_on() -> None:
        raise RuntimeError("every episode\nfailed")

    with pytest.raises(SystemExit) as done:
        run_cli(bad_config)
    assert done.value.code == 2 and capsys.readouterr().err == "config error: first second\n"
    with pytest.raises(SystemExit) as done:
        run_cli(cannot_go_on, run_errors=(RuntimeError,))
    assert done.value.code == 1 and capsys.readouterr().err == "error: every episode failed\n"
    with pytest.raises(KeyError):  # anything else is a bug: its traceback is kept
        run_cli(lambda: {}["x"])
