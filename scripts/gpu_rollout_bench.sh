#!/usr/bin/env bash
# The rollout engine's GPU checks in one go (≤ 8 minutes on an H100/H200), for a lent GPU machine:
#   1. the `gpu` tests of the engine (tests/gpu/test_gpu_decode_graphs.py, tests/gpu/test_cuda_paths.py);
#   2. bench/rollout.py on the GPU (embedded engine vs HF generate, GRPO groups) -> "Rollout on a GPU";
#   3. bench/rollout_graphs.py (CUDA graphs vs the dynamic forward) -> "Rollout: CUDA graphs for decode steps".
# Each step has its own time limit, so one that hangs cannot eat the others' time. The real
# checkpoint is benched too when it is on the machine (SMOLLM2, default ~/.cache/tidal/models/smollm2).
# Results go to $OUT (default /tmp/gpu-rollout): logs, and the updated bench/RESULTS.md.
#
#     OUT=/tmp/gpu-rollout bash scripts/gpu_rollout_bench.sh
set -u
OUT=${OUT:-/tmp/gpu-rollout}
SMOLLM2=${SMOLLM2:-$HOME/.cache/tidal/models/smollm2}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "wheel install failed"; exit 1; }
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
MODELS=(tiny)
[ -f "$SMOLLM2/config.json" ] && MODELS+=("$SMOLLM2")

{
    nvidia-smi -L
    python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name(0))"
    echo "models: ${MODELS[*]}"
} 2>&1 | tee "$OUT/env.log"

status=0
timeout 150 python3 -m pytest -m gpu tests/gpu/test_gpu_decode_graphs.py tests/gpu/test_cuda_paths.py -x -q -p no:cacheprovider \
    > "$OUT/gpu_tests.log" 2>&1 || status=1
tail -3 "$OUT/gpu_tests.log"
timeout 150 python3 bench/rollout.py --device cuda --prompts 64 --repeats 3 --model "${MODELS[@]}" \
    > "$OUT/rollout.log" 2>&1 || status=1
tail -4 "$OUT/rollout.log"
timeout 150 python3 bench/rollout_graphs.py --device cuda --model "${MODELS[@]}" \
    > "$OUT/rollout_graphs.log" 2>&1 || status=1
tail -8 "$OUT/rollout_graphs.log"
cp bench/RESULTS.md "$OUT/RESULTS.md"
echo "exit status $status (0: every step passed); logs and RESULTS.md in $OUT"
exit $status
