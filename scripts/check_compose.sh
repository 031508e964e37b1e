#!/usr/bin/env bash
# End-to-end check of docker-compose.yml as a user runs it: build both env-server images, start them, wait for their
# health, play a small expert/oracle panel through each container, train 2 steps against them, check the images' user
# and mounts, tear everything down. Prints image sizes, build times and cold start to healthy; the last line starts
# `compose ok:` (exit 0), anything else exits non-zero with the failing step named.
#
#   bash scripts/check_compose.sh                 # docker compose (v2) if it works, else podman-compose
#   COMPOSE="podman-compose" bash scripts/check_compose.sh
#   PYTHON=/path/to/venv/bin/python bash scripts/check_compose.sh   # the trainer's Python (default .venv/bin/python)
#   ALFWORLD_GAMES=134 WEBSHOP_GOALS=500 bash scripts/check_compose.sh   # a bigger panel (default 12 / 50)
#   NO_CACHE=1 bash scripts/check_compose.sh      # build without the layer cache (cold build times)
#
# Needs a container engine (on these machines: `bash ../shared/tools/container-engine.sh` as root) and the data root
# on the host (AGENT_RL_DATA_HOST, default ../shared/data). Uses its own compose project (agent_rl_check, with its
# own cache volume, removed at the end, so the start is a cold one) and only 127.0.0.1:8001/8002, which must be free.
# Why the wait is ours: podman 4.3 ignores `depends_on: condition: service_healthy` and runs no HEALTHCHECK timers,
# so the script polls /health itself (python -m servers.wait) and runs the compose `envs` target the portable way
# (`compose run --rm envs`, which waits inside the compose network).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
export COMPOSE_PROJECT_NAME=${COMPOSE_PROJECT_NAME:-agent_rl_check}
ALFWORLD_GAMES=${ALFWORLD_GAMES:-12}
WEBSHOP_GOALS=${WEBSHOP_GOALS:-50}
PY=${PYTHON:-$repo/.venv/bin/python}
[ -x "$PY" ] || PY=$(command -v python3)
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
step() { printf '\n== %s\n' "$*"; }
die() { echo "check_compose: FAILED: $*" >&2; exit 1; }

# ---------------------------------------------------------------- engine
if [ -n "${COMPOSE:-}" ]; then
  read -r -a compose <<<"$COMPOSE"
elif docker compose version >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
  compose=(docker compose)
elif command -v podman-compose >/dev/null 2>&1 && podman info >/dev/null 2>&1; then
  compose=(podman-compose)
else
  die "no working container engine: need 'docker compose' (v2) with a running Docker daemon, or podman + podman-compose"
fi
case "${compose[0]}" in
  podman-compose|podman) engine=podman ;;
  *) engine=docker ;;
esac
# podman writes OCI images by default, which drop HEALTHCHECK: keep the Docker format so the image's check exists
export BUILDAH_FORMAT=docker
"$PY" -c "import agent_rl.train, httpx" 2>/dev/null || die "$PY cannot import agent_rl.train (set PYTHON=)"
for port in 8001 8002; do
  if "$PY" -c "import socket, sys; s = socket.socket(); sys.exit(s.connect_ex(('127.0.0.1', $port)) != 0)"; then
    die "127.0.0.1:$port is in use (another env server or compose stack?): stop it first"
  fi
done
work=$(mktemp -d "${TMPDIR:-/tmp}/check_compose.XXXXXX")
down() { "${compose[@]}" down -v --remove-orphans >"$work/down.log" 2>&1 || true; }
cleanup() { rc=$?; step "compose down"; down; [ $rc = 0 ] || tail -n 40 "$work"/*.log >&2 2>/dev/null || true; \
  echo "logs: $work"; exit $rc; }
trap cleanup EXIT
echo "engine: ${compose[*]} ($($engine --version)); python: $PY; project: $COMPOSE_PROJECT_NAME; logs: $work"
down  # a clean start: no container or cache volume left from an earlier run

# ---------------------------------------------------------------- build
declare -A build_s size_mb
build_flags=()
[ -n "${NO_CACHE:-}" ] && build_flags+=(--no-cache)
for svc in alfworld webshop; do
  step "build $svc"
  t0=$(date +%s%N)
  nice "${compose[@]}" build "${build_flags[@]}" "$svc" >"$work/build_$svc.log" 2>&1 \
    || die "build of $svc (log: $work/build_$svc.log)"
  build_s[$svc]=$(( ($(date +%s%N) - t0) / 1000000000 ))
  bytes=$($engine image inspect "agent_rl/$svc-server:latest" --format '{{.Size}}')
  size_mb[$svc]=$((bytes / 1000000))
  echo "$svc: built in ${build_s[$svc]} s, image agent_rl/$svc-server:latest ${size_mb[$svc]} MB"
done

# ---------------------------------------------------------------- up + health
step "compose up -d alfworld webshop (cold: empty cache volume)"
t0=$(date +%s%N)
"${compose[@]}" up -d alfworld webshop >"$work/up.log" 2>&1 || die "compose up (log: $work/up.log)"
"$PY" -m servers.wait http://127.0.0.1:8001 http://127.0.0.1:8002 --timeout 600 --interval 0.5 \
  || die "env servers not healthy on 127.0.0.1:8001/8002"
cold_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
cold_s=$((cold_ms / 1000)).$(( (cold_ms % 1000) / 100 ))
echo "cold start to healthy (both, from compose up): $cold_s s"
step "compose run --rm envs (the portable 'wait until every env server serves' target)"
"${compose[@]}" run --rm envs >"$work/envs.log" 2>&1 || die "compose run --rm envs (log: $work/envs.log)"
grep "env servers healthy" "$work/envs.log"

# ---------------------------------------------------------------- user, mounts
step "non-root user, read-only data and root file system, writable cache"
for svc in alfworld webshop; do
  out=$("${compose[@]}" exec -T "$svc" sh -c '
    echo "uid=$(id -u)"
    touch /data/.w 2>/dev/null && echo "data=writable" || echo "data=read-only"
    touch /opt/venv/.w 2>/dev/null && echo "root=writable" || echo "root=read-only"
    touch /cache/.w 2>/dev/null && rm -f /cache/.w && echo "cache=writable" || echo "cache=read-only"' 2>&1) \
    || die "exec in $svc: $out"
  echo "$svc:" $out
  case "$out" in *uid=0*) die "$svc runs as root" ;; esac
  [[ "$out" == *data=read-only* && "$out" == *root=read-only* && "$out" == *cache=writable* ]] \
    || die "$svc: expected data and root file system read-only, cache writable; got: $out"
done

# ---------------------------------------------------------------- panels
step "ALFWorld handcoded expert, first $ALFWORLD_GAMES valid_unseen games, through the container"
"$PY" scripts/eval_alfworld_expert.py --split valid_unseen --limit "$ALFWORLD_GAMES" --url http://127.0.0.1:8001 \
  --concurrency 4 >"$work/alfworld_expert.log" 2>&1 || die "ALFWorld expert panel (log: $work/alfworld_expert.log)"
alf_summary=$(tail -n 1 "$work/alfworld_expert.log")
alf_won=$("$PY" -c "import json, sys; d = json.loads(sys.argv[1]); print(f\"{d['won']}/{d['games']}\")" "$alf_summary")
echo "expert won $alf_won"
[ "${alf_won%/*}" = "${alf_won#*/}" ] || die "the expert lost games through the container: $alf_summary"
step "WebShop oracle, first $WEBSHOP_GOALS val goals, through the container"
"$PY" scripts/eval_webshop_oracle.py --url http://127.0.0.1:8002 --limit "$WEBSHOP_GOALS" --min-score 0.99 \
  --min-success 0.95 >"$work/webshop_oracle.log" 2>&1 || die "WebShop oracle panel (log: $work/webshop_oracle.log)"
ws_all=$(grep -E '^all ' "$work/webshop_oracle.log" | awk '{print "score " $3 ", success " $4}')
echo "oracle $ws_all"

# ---------------------------------------------------------------- training
declare -A trained
for env in alfworld webshop; do
  port=$([ $env = alfworld ] && echo 8001 || echo 8002)
  step "2 training steps (model=tiny) against the $env container"
  nice "$PY" -m agent_rl.train env=$env model=tiny "env_server.urls=[http://127.0.0.1:$port]" trainer.total_steps=2 \
    trainer.tasks_per_step=1 rollout.max_turns=3 engine.max_new_tokens=16 trainer.device=cpu trainer.progress=false \
    trainer.tensorboard=false "trainer.output_dir=$work/train_$env" >"$work/train_$env.log" 2>&1 \
    || die "training against $env (log: $work/train_$env.log)"
  trained[$env]=$("$PY" -c "
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
assert [r['step'] for r in rows] == [1, 2], rows
assert all(r.get('batch/rows', 0) > 0 for r in rows), 'a step trained on no rows'
print(int(sum(r['batch/rows'] for r in rows)))" "$work/train_$env/metrics.jsonl") || die "metrics of the $env run"
  echo "$env: steps 1-2 trained (${trained[$env]} rows)"
done

# ---------------------------------------------------------------- no session left
step "sessions left on the servers"
"$PY" - <<'EOF' || die "sessions left open on a server"
import httpx
for port in (8001, 8002):
    h = httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).json()
    print(f":{port} sessions={h['sessions']} workers={h['workers']}")
    assert h["sessions"] == 0, h
EOF

trap - EXIT
step "compose down"
down
printf '\n%-10s %10s %10s\n' image "size MB" "build s"
for svc in alfworld webshop; do printf '%-10s %10s %10s\n' "$svc" "${size_mb[$svc]}" "${build_s[$svc]}"; done
echo "compose ok: ${compose[*]}; alfworld ${size_mb[alfworld]} MB built ${build_s[alfworld]} s, webshop" \
  "${size_mb[webshop]} MB built ${build_s[webshop]} s; cold start to healthy $cold_s s; expert $alf_won;" \
  "oracle $ws_all; trained 2+2 steps"
