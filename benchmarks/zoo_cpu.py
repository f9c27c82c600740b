"""Every zoo model (tests/models.py) on the CPU: torch.jit against a package loaded the default way (the C++
runtime) and with the Python runtime, in one process, on the same inputs; median of interleaved calls after
warm-up. Prints a table and the geometric means of the speed-ups over torch.jit.

    python benchmarks/zoo_cpu.py [--calls 200] [--only NAME,NAME]
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
import warnings

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
import jit2triton  # noqa: E402
from models import MODELS  # noqa: E402



def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--only", default="")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    only = set(filter(None, args.only.split(",")))
    folder = tempfile.mkdtemp()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; ms per call, median of {args.calls}")
    print(f"{'model':28s} {'torch.jit':>10s} {'default':>10s} {'python':>10s} {'jit/default':>12s} {'jit/python':>11s}")
    ratios = {"default": [], "python": []}
    for spec in MODELS:
        if only and spec.name not in only:
            continue
        torch.manual_seed(0)
        model, example = spec.build()
        path = os.path.join(folder, f"{spec.name}.j2t")
        jit2triton.convert(model, example_inputs=example).save(path)
        paths = {"torch.jit": model, "default": jit2triton.load(path),
                 "python": jit2triton.load(path, runtime="python")}
        call = spec.fresh_inputs()[0]
        times = {label: [] for label in paths}
        with torch.no_grad():
            for _ in range(10):
                for fn in paths.values():
                    fn(*call)
            for _ in range(args.calls):
                for label, fn in paths.items():
                    start = time.perf_counter()
                    fn(*call)
                    times[label].append(time.perf_counter() - start)
        ms = {label: statistics.median(t) * 1e3 for label, t in times.items()}
        for label in ratios:
            ratios[label].append(ms["torch.jit"] / ms[label])
        print(f"{spec.name:28s} {ms['torch.jit']:10.4f} {ms['default']:10.4f} {ms['python']:10.4f} "
              f"{ms['torch.jit'] / ms['default']:11.2f}x {ms['torch.jit'] / ms['python']:10.2f}x", flush=True)
    for label, values in ratios.items():
        geomean = math.exp(sum(map(math.log, values)) / len(values))
        print(f"geomean speed-up over torch.jit, {label}: {geomean:.2f}x (min {min(values):.2f}x)")


if __name__ == "__main__":
    main()
