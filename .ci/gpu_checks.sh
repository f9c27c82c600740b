#!/usr/bin/env bash
# The GPU checks run on the GPU machine before an issue touching the GPU path is resolved (not part of CI, which
# has no GPU): install, build the C++ runtime with CUDA, run the GPU tests, time the runtimes. Logs go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_checks}; mkdir -p "$OUT"
export PYTHONPATH=$PWD MAX_JOBS=16
pip install --no-deps --no-build-isolation -q -e . > "$OUT/install.log" 2>&1
start=$(date +%s)
timeout 300 python -c "from jit2triton.deploy.cpp_runtime import extension; extension()" > "$OUT/ext_build.log" 2>&1
echo "extension build: $? in $(( $(date +%s) - start )) s" | tee -a "$OUT/summary.txt"
for suite in "$@"; do
  name=$(basename "$suite" .py)
  timeout 420 python -m pytest -q -p no:cacheprovider "$suite" > "$OUT/$name.log" 2>&1
  echo "$suite: $(tail -1 "$OUT/$name.log")" | tee -a "$OUT/summary.txt"
done
