"""Learning test: GRPO and TGRL with the tiny random model raise the success rate on ChooseItem within 20 steps.

Set-up (why it is reliable on CPU): one-token answers (``engine.max_new_tokens=1``, ``rollout.max_turns=1``), so an
episode is a single sampled token, and the env's initial-letter rule makes the task "pick the sock" a bandit in
which the tokens starting with "s" win. Sampling is restricted to the model's 100 most likely tokens
(``engine.top_k=100``; log-probs stay those of the full distribution), so each candidate token is drawn about once
per step and its reward signal accumulates; over the full 49k vocabulary a random model would need thousands of
steps. 16 groups x 4 episodes per step, lr 1e-2. Measured (seeded, 2 busy cores, ~45 s each): GRPO 0.08 -> 1.00,
TGRL (JS credit from step 1) 0.08 -> ~0.5 (its T0 row reaches 1.0). The test compares the mean success of the
first 4 steps with that of the last 4 (a wrong advantage sign makes it fall instead).
"""

from __future__ import annotations

import json

import pytest

from agent_rl.train import main

LEARN = ["env=choose_item", "model=tiny", "env_server.mode=local", "trainer.total_steps=20", "engine.top_k=100",
         "trainer.tasks_per_step=16", "rollout.max_turns=1", "engine.max_new_tokens=1", "optim.lr=1e-2",
         "trainer.save_every=1000", "trainer.progress=false", "trainer.tensorboard=false", "env.kwargs.targets=[sock]"]


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["grpo", "tgrl"])
def test_success_rate_increases(tmp_path, algo):
    extra = ["algo.warmup_steps=0"] if algo == "tgrl" else []  # TGRL's two temperatures and JS credit from step 1
    main([*LEARN, f"algo={algo}", f"trainer.output_dir={tmp_path}", *extra])
    recs = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    success = [r["success/rate"] for r in recs]
    first, last = sum(success[:4]) / 4, sum(success[-4:]) / 4
    assert last >= first + 0.15, f"{algo}: success per step {success}"
