#!/usr/bin/env bash
# Learning on a laptop, in minutes: a policy gets better at a multi-turn task, held-out success before and after
# GRPO plotted in OUT/rl/curves.png (docs/learning.md: the same task and recipe, 3 seeds there).
#
#   bash scripts/learn_demo.sh [OUT]        # default OUT=runs/demo; needs .venv (bash scripts/setup.sh)
#
# 1. TextWorld coin collector level 5 games, generated once into the cache (train 0..95, test 0..49).
# 2. Behaviour cloning of the tiny 2-layer policy on 96 walkthrough episodes (lr 1e-3; the start is BC step
#    200 of 210, 6.7 epochs: docs/learning.md's start policy, 60% greedy there, not expert-level).
# 3. GRPO for 24 RL steps from that start (8 tasks x 4 episodes a step, 4 optimiser steps each), the held-out
#    panel (50 test games, greedy) before step 1 and every 6 steps -> OUT/rl/curves.png, OUT/rl/results.json.
# The tiny model is used because SmolLM2-135M's runs take hours here (docs/learning.md, "SmolLM2 learns").
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${1:-runs/demo}
export PYTHONPATH=$PWD OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
ENV=(env.kwargs.family=coin_collector env.kwargs.level=5)
t0=$(date +%s)
"$PY" -m envs.textworld.games --family coin_collector --level 5 --split train --num 96
"$PY" -m envs.textworld.games --family coin_collector --level 5 --split test --num 50
"$PY" -m agent_rl.sft env=textworld "${ENV[@]}" env.sampler.num_tasks=96 sft.num_episodes=96 model=tiny \
    env_server.mode=local optim.lr=1e-3 sft.epochs=7 trainer.output_dir="$OUT/bc" trainer.save_every=200 \
    trainer.progress=false
BC=$OUT/bc/checkpoints/step_200  # 6.7 epochs: 60% greedy on docs/learning.md's 50-game panel
"$PY" benchmarks/bench_learning.py --env textworld --env-kwargs '{"family": "coin_collector", "level": 5}' \
    --model tiny --algos grpo+algo.num_mini_batches=4 --seeds 0 --steps 24 --eval-every 6 --panel 50 \
    --out "$OUT/rl" --train model.path="$BC" env.sampler.num_tasks=96 rollout.max_turns=10 \
    engine.max_new_tokens=16 trainer.tasks_per_step=8 optim.warmup=0 optim.lr=1e-4
echo "learn_demo: done in $(( $(date +%s) - t0 )) s; curves: $OUT/rl/curves.png"
