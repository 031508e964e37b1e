"""WebShop (Yao et al., NeurIPS 2022): a faithful offline reproduction of the 1000-product text shop.

``gymnasium.make("agent_rl/WebShop-v0", observation_mode="text")``; see ``envs/webshop/env.py`` for the contract and
``docs/webshop_env.md`` for fidelity notes. Pure Python: no Java, pyserini, spaCy or Flask at run time.
"""

from envs.webshop.env import OBSERVATION_MODES, WebShopEnv, parse_action
from envs.webshop.oracle import OraclePolicy, run_oracle

__all__ = ["OBSERVATION_MODES", "OraclePolicy", "WebShopEnv", "parse_action", "run_oracle"]
