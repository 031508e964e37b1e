"""``python -m agent_rl ...`` is ``python -m agent_rl.train ...``."""

from agent_rl.train import main

if __name__ == "__main__":
    main()
