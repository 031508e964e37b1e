"""The run's config, one module per job (import each from its module: this package's root imports nothing):

- :mod:`agent_rl.config.schema`: the root dataclass tree (:class:`~agent_rl.config.schema.Config`) Hydra composes
  from ``configs/``, the backends' declared capabilities (``BACKENDS``), ``ConfigError``;
- :mod:`agent_rl.config.compose`: ``load_config(overrides)``, Hydra's compose API onto the schema;
- :mod:`agent_rl.config.trainable`: ``check_trainable(cfg)``, what cannot train refused at load time;
- :mod:`agent_rl.config.eval`: the ``eval.*`` keys (a leaf, so the schema never imports :mod:`agent_rl.eval`).

The other packages' own config dataclasses stay with them (``engines/config.py``, ``learner/config.py``,
``rollout/config.py``, ``gateway/config.py``), and :mod:`agent_rl.resume_rules`, the vocabulary with which each of
their fields declares its resume rule, stays a leaf below them all: inside this package, every one of them would
import up into it.
"""
