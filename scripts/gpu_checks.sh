#!/usr/bin/env bash
# GPU checks in one run (for a lent GPU machine with torch + transformers but no internet): the CUDA tests
# (`pytest -m gpu`) and the GPU learner benchmark. Optional local inputs, carried by the caller:
#   .whl/       wheels of packages the GPU image lacks (gymnasium, farama-notifications), installed to /tmp/site
#   .gpucache/  an AGENT_RL_CACHE holding models/smollm2-tokenizer (the tiny test model's tokenizer)
# Output: $OUT/gpu_tests.log and $OUT/gpu_bench.log when OUT is set, else ./gpu_*.log.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-.}"
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
[ -d .gpucache ] && export AGENT_RL_CACHE="${AGENT_RL_CACHE:-$PWD/.gpucache}"
export PYTHONUNBUFFERED=1
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, '| transformers', transformers.__version__)"
  timeout 300 python3 -m pytest -m gpu -q -rA -s -p no:cacheprovider tests/learner tests/engines
  # issue 36: engine=vllm_server on a GPU (the servers run with this python: it needs vLLM; weight_transfer=reload,
  # then nccl and ipc: the gap before/after two syncs and their seconds; lora_sync=adapter; long prompts keep chunked
  # prefill on CUDA)
  if python3 -c "import vllm" 2>/dev/null; then
    timeout 900 python3 -m pytest -m vllm -q -rA -s -p no:cacheprovider tests/engines/test_vllm_server_engine.py \
      tests/engines/test_vllm_transfer.py \
      -k "per_row or sync_gap or affinity or lora_adapter or long_seeded or transfer"
  else
    echo "vllm_server: vLLM is not installed in this image, skipped"
  fi
} 2>&1 | tee "$OUT/gpu_tests.log"
tests_rc=${PIPESTATUS[0]}
{
  timeout 240 python3 benchmarks/bench_gpu_learner.py --shape qwen2.5-0.5b --rows 64
  timeout 200 python3 benchmarks/bench_gpu_learner.py --shape qwen2.5-1.5b --rows 32 --micro 8
  # issue 24: memory-bound learners (LoRA needs peft: carry its wheel in .whl/ when the image lacks it)
  timeout 300 python3 benchmarks/bench_gpu_learner.py --shape qwen2.5-7b --lora-rank 16 --rows 16 --micro 4
  timeout 300 python3 benchmarks/bench_gpu_learner.py --shape qwen2.5-1.5b --strategy fsdp --offload --rows 32 --micro 8
} 2>&1 | tee "$OUT/gpu_bench.log"
echo "gpu checks: tests rc=$tests_rc"
exit "$tests_rc"
