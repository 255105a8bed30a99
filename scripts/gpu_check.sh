#!/usr/bin/env bash
# The checks that need a CUDA GPU, in one go (a lent GPU machine is short-lived):
#   1. bench/rollout.py on the GPU (embedded engine vs Hugging Face generate), alone on the machine;
#   2. two longer quickstart runs in the background (the default tiny model with 5x the RL steps,
#      and a 256-wide 4-layer model), each with held-out evaluations every 50 steps;
#   3. meanwhile the `gpu` tests (tests/gpu: engine, bf16 step, checkpoints, a smoke run on CUDA).
# Everything it produces goes to $OUT (default /tmp/gpu-check). Wheels in .whl/ (packages the GPU
# image lacks, for its Python) are installed to /tmp/site first when present.
#
#     OUT=/tmp/gpu-check bash scripts/gpu_check.sh [seconds per experiment, default 330]
set -u
OUT=${OUT:-/tmp/gpu-check}
EXPERIMENT_S=${1:-330}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "wheel install failed"; exit 1; }
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

{
    nvidia-smi -L
    echo "bwrap: $(command -v bwrap || echo missing)"
    nproc
    python3 -c "import torch, transformers, pydantic; print('torch', torch.__version__, 'transformers', transformers.__version__, 'pydantic', pydantic.__version__, torch.cuda.get_device_name(0))"
} 2>&1 | tee "$OUT/env.log"

SANDBOX=()
command -v bwrap >/dev/null || SANDBOX=("reward.sandbox.backend=unsafe_local")

echo "== rollout bench on the GPU"
cp bench/RESULTS.md "$OUT/RESULTS.md"
timeout 120 python3 bench/rollout.py --device cuda --prompts 64 --results "$OUT/RESULTS.md" 2>&1 | tee "$OUT/bench_rollout.log"

experiment() {  # name, overrides...
    local name=$1
    shift
    timeout "$EXPERIMENT_S" python3 - "$name" "$@" <<'EOF' >"$OUT/exp_$name.log" 2>&1
import sys
from pathlib import Path
from tidal.pipeline.quickstart import find_config, run_quickstart
name, overrides = sys.argv[1], sys.argv[2:]
print(run_quickstart(find_config("quickstart"), overrides, Path("/tmp/exp"), name))
EOF
    echo "exit $?" >>"$OUT/exp_$name.log"
}
COMMON=("model.device=cuda" "trainer.steps=200" "trainer.checkpoint_every=50" "eval.every=50" "eval.samples_per_task=8"
        "reward.sandbox.workers=6" "run.progress=false" "${SANDBOX[@]}")
experiment tiny "${COMMON[@]}" &
A=$!
experiment wide "${COMMON[@]}" "model.tiny.hidden_size=256" "model.tiny.num_layers=4" "model.tiny.intermediate_size=768" \
    "warm_start.lr=1.0e-3" &
B=$!

echo "== gpu tests"
timeout 200 python3 -m pytest -q -m gpu tests/gpu -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log"

wait $A $B
for name in tiny wide; do
    if [ -d "/tmp/exp/$name" ]; then
        tar -czf "$OUT/exp_$name.tgz" -C /tmp/exp --exclude=checkpoints "$name"
    fi
    tail -5 "$OUT/exp_$name.log"
done
ls -la "$OUT"
