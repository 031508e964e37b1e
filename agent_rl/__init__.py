"""agent_rl: reinforcement learning for LLM agents on interactive text environments."""

__version__ = "0.1.0"
