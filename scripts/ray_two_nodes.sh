#!/usr/bin/env bash
# Two Ray "nodes" on one machine (a head and a second `ray start --address` with its own CPUs), then the usual
# training command attached with trainer.ray_address: 2 learner ranks packed on one node, 2 env-server replicas
# spread over both, 2 rollout workers. Checks metrics.jsonl (2 steps), checkpoints/step_2 and that the cluster had
# two nodes. Not run in CI (about 2-3 minutes on 2 cores). Stops the Ray processes it started (`ray stop`) at exit.
#   bash scripts/ray_two_nodes.sh [OUTPUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
RAY="$(dirname "$PY")/ray"
PORT="${RAY_PORT:-6390}"
OUT="${1:-$(mktemp -d)/run}"
# token authentication (Ray >= 2.5x default for `ray start --head`): every process below uses ~/.ray/auth_token
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-token}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
cleanup() { "$RAY" stop --force >/dev/null 2>&1 || true; }
trap cleanup EXIT
"$RAY" start --head --port="$PORT" --num-cpus=2 --include-dashboard=false --disable-usage-stats >/dev/null
"$RAY" start --address="127.0.0.1:$PORT" --num-cpus=2 --disable-usage-stats >/dev/null
"$PY" -c "import ray; ray.init(address='127.0.0.1:$PORT'); n = [x for x in ray.nodes() if x['Alive']];
print('nodes:', len(n), [x['Resources'].get('CPU') for x in n]); assert len(n) == 2"
"$PY" -m agent_rl.train env=choose_item model=tiny algo=tgrl trainer.backend=ray trainer.ray_address="127.0.0.1:$PORT" \
  trainer.num_learners=2 rollout.num_workers=2 env_server.replicas=2 env_server.replica_cpus=0.5 \
  trainer.learner_cpus=1 rollout.worker_cpus=0.5 trainer.total_steps=2 trainer.tasks_per_step=2 \
  trainer.progress=false engine.max_new_tokens=16 trainer.output_dir="$OUT" 2> "$OUT.log" || { tail -40 "$OUT.log"; exit 1; }
grep -E "env-server replicas|learner rank" "$OUT.log"
test -f "$OUT/checkpoints/step_2/model.safetensors"
"$PY" -c "
import sys
from agent_rl.logging import read_metrics
rows = read_metrics(sys.argv[1], 'train')  # the training steps' rows (docs/training.md)
assert [r['step'] for r in rows] == [1, 2], rows
for r in rows:
    print({k: r[k] for k in ('step', 'reward/mean', 'actor/pg_loss', 'rollout/weight_version', 'time/rollout_s',
                             'time/update_s')})" "$OUT/metrics.jsonl"
echo "two-node run OK: $OUT"
