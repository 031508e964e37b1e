"""TextWorld game families (coin collector, treasure hunter, cooking) as ``agent_rl/TextWorld-v0``.

See :mod:`envs.textworld.games` (families, difficulty levels, seeds, the cache and its manifest) and
:class:`envs.textworld.env.TextWorldEnv` (the gymnasium env).
"""

from envs.textworld.env import TextWorldEnv, clean_feedback
from envs.textworld.games import COOKING_LEVELS, FAMILIES, SPLITS, ensure_game, game_seed, manifest

__all__ = ["COOKING_LEVELS", "FAMILIES", "SPLITS", "TextWorldEnv", "clean_feedback", "ensure_game", "game_seed",
           "manifest"]
