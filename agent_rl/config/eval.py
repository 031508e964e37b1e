"""``eval.*`` config (composed into the root config, :mod:`agent_rl.config`): a leaf module, so the config never
imports the evaluation package (:mod:`agent_rl.eval`, which reads the config)."""

from __future__ import annotations

from dataclasses import dataclass

POLICIES = ("model", "random", "expert", "oracle")


@dataclass
class EvalConfig:
    """What ``python -m agent_rl.eval`` measures (``eval.*``), and how the in-training panel decodes."""

    policy: str = "model"
    """model (the ``model=`` policy through the engine) | random (uniform over admissible actions; lower bound) |
    expert (ALFWorld's fixed handcoded expert) | oracle (WebShop's scripted oracle); ``policy=X`` on the command
    line is short for ``eval.policy=X``."""
    split: str = ""
    """Agent panels: ALFWorld valid_seen | valid_unseen (default); WebShop test (= val, goals 0..499; default)."""
    dataset: str = ""
    """Math/code panels: a dataset name, or several comma-separated (math default math500, code humanevalplus)."""
    tasks: str = ""
    """A task file as the panel (any env): its rows, mapped by ``env.task_fields``, are the panel's tasks
    (reset options), read by :func:`agent_rl.task_files.load_tasks`; the panel is named ``<env.name>_<file stem>``.
    "" = the env's own panels (``eval.split`` / ``eval.dataset``)."""
    task_split: str = ""
    """Split of ``eval.tasks`` ("" = train, or the one split of a saved dataset)."""
    num_tasks: int = 0
    """Tasks of the panel (0 = all); a subset is spread evenly over the split: indices ``i * N // num_tasks``."""
    samples: int = 1
    """Episodes per task n (pass@k for k = 1..n, Chen et al. 2021 unbiased estimator)."""
    temperature: float = 0.0
    """Sampling temperature (0 = greedy, the papers' agent tables)."""
    max_turns: int = 0
    """Turn budget per episode (0 = the env's ``rollout.max_turns``)."""
    max_new_tokens: int = 0
    """Tokens per turn (0 = ``engine.max_new_tokens``)."""
    concurrency: int = 16
    """Episodes in flight at once (their generations are batched together)."""
    seed: int = 0
    """Seed of env resets (task i gets seed + i), the random policy and sampling; fixed = reproducible."""
    output_dir: str = ""
    """Results go to ``<output_dir>/eval/<panel>.json|.png`` (empty = ``runs/eval-<env>-<time>``)."""
    plot: bool = True
    """Write the bar chart ``<panel>.png``."""

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"eval.policy={self.policy!r} is not valid; valid values: {', '.join(POLICIES)}")
        if self.num_tasks < 0 or self.samples < 1 or self.temperature < 0 or self.max_turns < 0:
            raise ValueError("eval.num_tasks >= 0, eval.samples >= 1, eval.temperature >= 0, eval.max_turns >= 0")
