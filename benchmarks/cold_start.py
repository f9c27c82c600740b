"""Cold start: in a fresh process, load + first output of our package against torch.jit.load + first output.

    python benchmarks/cold_start.py MODEL.pt MODEL.j2t INPUTS.pt [--runs 3]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

CHILD = r"""
import sys, time, torch
kind, path, inputs_path = sys.argv[1:4]
inputs = torch.load(inputs_path)
start = time.perf_counter()
if kind == "jit2triton":
    import jit2triton
    model = jit2triton.load(path)
else:
    model = torch.jit.load(path).eval()
model(*inputs)
if torch.cuda.is_available():
    torch.cuda.synchronize()
print((time.perf_counter() - start) * 1e3)
"""


def cold_start_ms(kind: str, path: str, inputs_path: str) -> float:
    out = subprocess.run([sys.executable, "-c", CHILD, kind, path, inputs_path], capture_output=True, text=True,
                         check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("torchscript")
    parser.add_argument("package")
    parser.add_argument("inputs")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    for kind, path in (("jit2triton", args.package), ("torch.jit", args.torchscript)):
        times = [cold_start_ms(kind, path, args.inputs) for _ in range(args.runs)]
        print(f"{kind}: load + first output {statistics.median(times):.0f} ms (median of {args.runs} fresh processes)")


if __name__ == "__main__":
    main()
