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
# on the host (AGENT_RL_DATA_HOST, default ../shared/data). Each run has its own compose project (agent_rl_check_PID,
# with its own cache volume, removed at the end, so the start is a cold one) and two free loopback ports picked at
# start (AGENT_RL_ALFWORLD_PORT / AGENT_RL_WEBSHOP_PORT in docker-compose.yml; set them to choose), so a second run
# or a busy 8001/8002 cannot break it; projects left by a killed run (a PID no longer alive) are removed first. Any
# failure or signal tears the project down (trap). Images stay in the engine's store (the build cache of the next
# run, or of the next CI stage); NO_CACHE=1 rebuilds.
# Why the wait is ours: podman 4.3 ignores `depends_on: condition: service_healthy` and runs no HEALTHCHECK timers,
# so the script polls /health itself (python -m servers.wait) and runs the compose `envs` target the portable way
# (`compose run --rm envs`, which waits inside the compose network).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
t_start=$(date +%s)
export COMPOSE_PROJECT_NAME=${COMPOSE_PROJECT_NAME:-agent_rl_check_$$}
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
# two free loopback ports (the kernel's choice), unless given; a given port must be free
if [ -z "${AGENT_RL_ALFWORLD_PORT:-}" ] || [ -z "${AGENT_RL_WEBSHOP_PORT:-}" ]; then
  read -r free_a free_w < <("$PY" -c "
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks:
    s.bind(('127.0.0.1', 0))
print(*(s.getsockname()[1] for s in socks))")
  export AGENT_RL_ALFWORLD_PORT=${AGENT_RL_ALFWORLD_PORT:-$free_a} AGENT_RL_WEBSHOP_PORT=${AGENT_RL_WEBSHOP_PORT:-$free_w}
fi
for port in "$AGENT_RL_ALFWORLD_PORT" "$AGENT_RL_WEBSHOP_PORT"; do
  if "$PY" -c "import socket, sys; s = socket.socket(); sys.exit(s.connect_ex(('127.0.0.1', $port)) != 0)"; then
    die "127.0.0.1:$port is in use (another env server or compose stack?): choose another port"
  fi
done
alf_url=http://127.0.0.1:$AGENT_RL_ALFWORLD_PORT
ws_url=http://127.0.0.1:$AGENT_RL_WEBSHOP_PORT
work=$(mktemp -d "${TMPDIR:-/tmp}/check_compose.XXXXXX")
down() { "${compose[@]}" down -v --remove-orphans >>"$work/down.log" 2>&1 || true; }
exec 3>&1 4>&2  # the console: a trap that fires inside a step's redirection still reports there
cleanup() { rc=$?; exec 1>&3 2>&4; trap - EXIT INT TERM HUP; step "compose down"; down; \
  [ $rc = 0 ] || tail -n 40 "$work"/*.log >&2 2>/dev/null || true; echo "logs: $work"; exit $rc; }
trap cleanup EXIT
# long steps run through `run`: in the background as their own process group (set -m), then `wait`, so a signal
# stops the step and everything it started at once, not after it
set -m
child=
run() { "$@" & child=$!; local rc=0; wait "$child" || rc=$?; child=; return "$rc"; }
on_signal() { [ -z "$child" ] || { kill -TERM -- "-$child" 2>/dev/null; wait "$child" 2>/dev/null || true; }
  exit "$1"; }
trap 'on_signal 130' INT
trap 'on_signal 143' TERM
trap 'on_signal 129' HUP
echo "engine: ${compose[*]} ($($engine --version)); python: $PY; project: $COMPOSE_PROJECT_NAME;" \
  "ports: $AGENT_RL_ALFWORLD_PORT (alfworld), $AGENT_RL_WEBSHOP_PORT (webshop); logs: $work"
# projects of earlier runs killed before their trap ran (agent_rl_check_PID, PID gone): containers and cache volume
for project in $({ $engine ps -a --format '{{ index .Labels "com.docker.compose.project" }}' 2>/dev/null
                   $engine volume ls --format '{{.Name}}' 2>/dev/null | sed -n 's/^\(agent_rl_check_[0-9]*\)_.*/\1/p'; } |
                 grep -E '^agent_rl_check_[0-9]+$' | sort -u); do
  pid=${project##*_}
  if [ "$project" != "$COMPOSE_PROJECT_NAME" ] && ! kill -0 "$pid" 2>/dev/null; then
    echo "removing project $project left by an earlier run"
    COMPOSE_PROJECT_NAME=$project "${compose[@]}" down -v --remove-orphans >>"$work/down.log" 2>&1 || true
    for volume in $($engine volume ls --format '{{.Name}}' 2>/dev/null | grep "^${project}_" || true); do
      $engine volume rm -f "$volume" >>"$work/down.log" 2>&1 || true
    done
  fi
done
# the servers' token (required by docker-compose.yml); the trainer and the eval scripts send it from the environment
export AGENT_RL_SERVER_TOKEN="${AGENT_RL_SERVER_TOKEN:-$("$PY" -c 'import secrets; print(secrets.token_urlsafe(32))')}"
down  # a clean start: no container or cache volume of this project left from an earlier run

# ---------------------------------------------------------------- build
declare -A build_s size_mb
build_flags=()
[ -n "${NO_CACHE:-}" ] && build_flags+=(--no-cache)
for svc in alfworld webshop; do
  step "build $svc"
  t0=$(date +%s%N)
  run nice "${compose[@]}" build "${build_flags[@]}" "$svc" >"$work/build_$svc.log" 2>&1 \
    || die "build of $svc (log: $work/build_$svc.log)"
  build_s[$svc]=$(( ($(date +%s%N) - t0) / 1000000000 ))
  bytes=$($engine image inspect "agent_rl/$svc-server:latest" --format '{{.Size}}')
  size_mb[$svc]=$((bytes / 1000000))
  echo "$svc: built in ${build_s[$svc]} s, image agent_rl/$svc-server:latest ${size_mb[$svc]} MB"
done

# ---------------------------------------------------------------- up + health
step "compose up -d alfworld webshop (cold: empty cache volume)"
t0=$(date +%s%N)
run "${compose[@]}" up -d alfworld webshop >"$work/up.log" 2>&1 || die "compose up (log: $work/up.log)"
run "$PY" -m servers.wait "$alf_url" "$ws_url" --timeout 600 --interval 0.5 \
  || die "env servers not healthy on $alf_url, $ws_url"
cold_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
cold_s=$((cold_ms / 1000)).$(( (cold_ms % 1000) / 100 ))
echo "cold start to healthy (both, from compose up): $cold_s s"
step "compose run --rm envs (the portable 'wait until every env server serves' target)"
run "${compose[@]}" run --rm envs >"$work/envs.log" 2>&1 || die "compose run --rm envs (log: $work/envs.log)"
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
run "$PY" scripts/eval_alfworld_expert.py --split valid_unseen --limit "$ALFWORLD_GAMES" --url "$alf_url" \
  --concurrency 4 >"$work/alfworld_expert.log" 2>&1 || die "ALFWorld expert panel (log: $work/alfworld_expert.log)"
alf_summary=$(tail -n 1 "$work/alfworld_expert.log")
alf_won=$("$PY" -c "import json, sys; d = json.loads(sys.argv[1]); print(f\"{d['won']}/{d['games']}\")" "$alf_summary")
echo "expert won $alf_won"
[ "${alf_won%/*}" = "${alf_won#*/}" ] || die "the expert lost games through the container: $alf_summary"
step "WebShop oracle, first $WEBSHOP_GOALS val goals, through the container"
run "$PY" scripts/eval_webshop_oracle.py --url "$ws_url" --limit "$WEBSHOP_GOALS" --min-score 0.99 \
  --min-success 0.95 >"$work/webshop_oracle.log" 2>&1 || die "WebShop oracle panel (log: $work/webshop_oracle.log)"
ws_all=$(grep -E '^all ' "$work/webshop_oracle.log" | awk '{print "score " $3 ", success " $4}')
echo "oracle $ws_all"

# ---------------------------------------------------------------- training
# the CLI as a user runs it (on a machine without a GPU it adds the CPU preset: an eval panel before step 1 and
# after the last); metrics.jsonl is read by kind (agent_rl.logging.read_metrics, docs/training.md)
declare -A trained
for env in alfworld webshop; do
  url=$([ $env = alfworld ] && echo "$alf_url" || echo "$ws_url")
  step "2 training steps (model=tiny) against the $env container"
  run nice "$PY" -m agent_rl.train env=$env model=tiny "env_server.urls=[$url]" trainer.total_steps=2 \
    trainer.tasks_per_step=1 rollout.max_turns=3 engine.max_new_tokens=16 trainer.device=cpu trainer.progress=false \
    "trainer.loggers=[jsonl]" "trainer.output_dir=$work/train_$env" >"$work/train_$env.log" 2>&1 \
    || die "training against $env (log: $work/train_$env.log)"
  trained[$env]=$("$PY" -c "
import sys
from agent_rl.logging import read_metrics
train, evals = read_metrics(sys.argv[1], 'train'), read_metrics(sys.argv[1], 'eval')
assert [r['step'] for r in train] == [1, 2], train
assert all((r.get('batch/rows') or 0) > 0 for r in train), 'a step trained on no rows'
assert {r['step'] for r in evals} <= {0, 1, 2}, evals
success = ', '.join(f\"{k.split('/')[1]} {v:.2f} at step {r['step']}\" for r in evals for k, v in r.items()
                    if k.startswith('eval/') and k.endswith('/success') and k.count('/') == 2 and v is not None)
print(f\"{int(sum(r['batch/rows'] for r in train))} rows; eval: {success or 'none'}\")" \
    "$work/train_$env/metrics.jsonl") || die "metrics of the $env run (log: $work/train_$env.log)"
  echo "$env: steps 1-2 trained (${trained[$env]})"
done

# ---------------------------------------------------------------- no session left
step "sessions left on the servers"
"$PY" - <<'EOF' || die "sessions left open on a server"
import os
import httpx
key = {"Authorization": f"Bearer {os.environ['AGENT_RL_SERVER_TOKEN']}"}  # /health's load fields need the token
for name in ("AGENT_RL_ALFWORLD_PORT", "AGENT_RL_WEBSHOP_PORT"):
    port = os.environ[name]
    h = httpx.get(f"http://127.0.0.1:{port}/health", headers=key, timeout=10).json()
    print(f":{port} sessions={h['sessions']} workers={h['workers']}")
    assert h["sessions"] == 0, h
EOF

trap - EXIT INT TERM HUP
step "compose down"
down
total_s=$(( $(date +%s) - t_start ))
printf '\n%-10s %10s %10s\n' image "size MB" "build s"
for svc in alfworld webshop; do printf '%-10s %10s %10s\n' "$svc" "${size_mb[$svc]}" "${build_s[$svc]}"; done
echo "compose ok: ${compose[*]}; alfworld ${size_mb[alfworld]} MB built ${build_s[alfworld]} s, webshop" \
  "${size_mb[webshop]} MB built ${build_s[webshop]} s; cold start to healthy $cold_s s; expert $alf_won;" \
  "oracle $ws_all; trained 2+2 steps; total $total_s s"
