#!/usr/bin/env bash
# On the GPU machine: trace resnet18 (torchvision) and BERT-base (transformers) to TorchScript, convert them with
# the CLI as a user would, and `jit2triton bench --profile --against` each. The README's bench excerpt and the
# closing notes' GPU profiles come from here. Output goes to $OUT (default /tmp/gpu_profiles).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_profiles}; mkdir -p "$OUT"
python -c "import click" 2>/dev/null || pip install -q --no-deps .wheels/click-*.whl  # the GPU machine has no network
work=$(mktemp -d)
python - "$work" <<'PY'
import sys, torch
sys.path.insert(0, "benchmarks")
from dynamic_bench import bert_base, resnet18
work = sys.argv[1]
with torch.no_grad():
    torch.jit.save(torch.jit.trace(resnet18("cpu"), torch.randn(16, 3, 224, 224)), f"{work}/resnet18.pt")
    # traced on the GPU: transformers' masking bakes the tracing device into a constant, so a CPU trace of BERT
    # does not run on CUDA under torch.jit (jit2triton retargets such constants; --against needs TorchScript to run)
    ids = torch.randint(0, 30522, (8, 128), device="cuda")
    torch.jit.save(torch.jit.trace(bert_base("cuda"), (ids, torch.ones_like(ids))), f"{work}/bert.pt")
PY
python -m jit2triton.cli convert "$work/resnet18.pt" --input 16x3x224x224:float32 --device cuda --quiet -o "$work/resnet18.j2t"
python -m jit2triton.cli convert "$work/bert.pt" --input 8x128:int64:0-30522 --input 8x128:int64:1-2 --device cuda --quiet \
  -o "$work/bert.j2t"
for name in resnet18 bert; do
  python -m jit2triton.cli bench "$work/$name.j2t" --against "$work/$name.pt" --duration-s 3 --json "$OUT/$name.json" \
    > "$OUT/$name-bench.txt" 2>&1
  python -m jit2triton.cli bench "$work/$name.j2t" --profile --duration-s 2 > "$OUT/$name-profile.txt" 2>&1
done
