#!/usr/bin/env bash
# Slurm: a Ray cluster over the job's nodes (head on the first), then the usual training command with
# trainer.backend=ray trainer.ray_address=auto on the head; `ray stop` on every node at the end (docs/scaling.md).
#   sbatch scripts/slurm_ray.sh            (edit the #SBATCH lines and TRAIN_ARGS first)
#SBATCH --job-name=agent-rl-ray
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=96
#SBATCH --time=24:00:00
set -euo pipefail
cd "${SLURM_SUBMIT_DIR:-$(dirname "$0")/..}"
PY="${PYTHON:-.venv/bin/python}"
RAY="$(dirname "$PY")/ray"
PORT="${RAY_PORT:-6379}"
TRAIN_ARGS="${TRAIN_ARGS:-env=alfworld model=qwen2.5-1.5b algo=tgrl trainer.num_learners=4 trainer.learner_gpus=1 \
rollout.num_workers=12 rollout.worker_gpus=1 env_server.replicas=4 env_server.replica_cpus=16 \
trainer.output_dir=$PWD/runs/slurm-${SLURM_JOB_ID:-0}}"
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-token}" PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
HEAD="${NODES[0]}"
HEAD_IP="$(srun --overlap --nodes=1 --ntasks=1 -w "$HEAD" hostname -I | awk '{print $1}')"
cleanup() { srun --overlap --nodes="${#NODES[@]}" --ntasks-per-node=1 "$RAY" stop --force >/dev/null 2>&1 || true; }
trap cleanup EXIT

# the token of ~/.ray/auth_token must be readable on every node (a shared home, or RAY_AUTH_TOKEN exported)
srun --overlap --nodes=1 --ntasks=1 -w "$HEAD" "$RAY" start --head --node-ip-address="$HEAD_IP" --port="$PORT" \
  --num-cpus="$SLURM_CPUS_PER_TASK" --num-gpus="${SLURM_GPUS_PER_NODE:-0}" --include-dashboard=false --block &
sleep 20
for node in "${NODES[@]:1}"; do
  srun --overlap --nodes=1 --ntasks=1 -w "$node" "$RAY" start --address="$HEAD_IP:$PORT" \
    --num-cpus="$SLURM_CPUS_PER_TASK" --num-gpus="${SLURM_GPUS_PER_NODE:-0}" --block &
done
sleep 20
# shellcheck disable=SC2086
RAY_ADDRESS="$HEAD_IP:$PORT" "$PY" -m agent_rl.train $TRAIN_ARGS trainer.backend=ray trainer.ray_address=auto
