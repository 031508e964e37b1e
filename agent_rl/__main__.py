"""``python -m agent_rl ...`` is ``python -m agent_rl.train ...``."""

from agent_rl.train import cli

if __name__ == "__main__":
    cli()
