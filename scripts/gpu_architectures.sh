#!/usr/bin/env bash
# The "any checkpoint" checks on a lent GPU machine, in one go (≤ 8 minutes on an H100/H200):
#   1. tests/gpu/test_architectures_cuda.py: every architecture of the CPU matrix on CUDA (fp32
#      log-probs equal teacher-forced ones, greedy equals HF generate; bf16 differences printed);
#   2. the CPU matrix's engine tests (tests/unit/rollout/test_architectures.py) as they are;
#   3. bench/rollout.py on the GPU in bf16: the engine against HF generate and generate_batch, on
#      SmolLM2 when it is on the machine (SMOLLM2) and a random Qwen3 of its size.
# Each step has its own time limit. Results go to $OUT (logs, and the updated bench/RESULTS.md).
#
#     OUT=/tmp/gpu-arch bash scripts/gpu_architectures.sh
set -u
OUT=${OUT:-/tmp/gpu-arch}
SMOLLM2=${SMOLLM2:-$HOME/.cache/tidal/models/smollm2}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
MODELS=(qwen3-random)
[ -f "$SMOLLM2/config.json" ] && MODELS+=("$SMOLLM2")
{
    nvidia-smi -L
    python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name(0))"
} 2>&1 | tee "$OUT/env.log"
status=0
timeout 180 python3 -m pytest -m gpu tests/gpu/test_architectures_cuda.py -q -s -p no:cacheprovider \
    > "$OUT/gpu_architectures.log" 2>&1 || status=1
grep -E "max \|logprob|passed|failed" "$OUT/gpu_architectures.log" | tail -25
timeout 120 python3 -m pytest tests/unit/rollout/test_architectures.py -q -p no:cacheprovider \
    > "$OUT/cpu_matrix.log" 2>&1 || status=1
tail -2 "$OUT/cpu_matrix.log"
timeout 180 python3 bench/rollout.py --device cuda --prompts 64 --repeats 3 --model "${MODELS[@]}" \
    > "$OUT/rollout.log" 2>&1 || status=1
tail -6 "$OUT/rollout.log"
cp bench/RESULTS.md "$OUT/RESULTS.md"
exit $status
