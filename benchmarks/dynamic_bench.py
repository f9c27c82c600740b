"""Dynamic shapes benchmark: one package converted with dynamic dims, timed at several sizes against a static
package converted at each size, torch.jit (traced at one size, run at all) and torch.compile(dynamic=True).

All in one process, same inputs; every path's output is checked against eager first. Median of many runs after
warm-up (CUDA: synchronised). Prints a table of milliseconds and ratios, and writes JSON.

    python benchmarks/dynamic_bench.py [--device cpu|cuda] [--quick] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
import jit2triton  # noqa: E402
from workloads import EncoderLayer, MLPBlock  # noqa: E402

# name -> (model builder, dims (name, min, max), example sizes, sizes to time)
CASES = {
    "BERT-like layer (B, S, 768)": (lambda: EncoderLayer(768, 12), [("B", 1, 32), ("S", 8, 512)], (2, 16),
                                    [(1, 16), (2, 16), (4, 64), (8, 128)]),
    "MLP+LayerNorm (B, S, 1024)": (lambda: MLPBlock(1024), [("B", 1, 32), ("S", 1, 512)], (2, 16),
                                   [(1, 8), (2, 16), (4, 128), (8, 256)]),
}
QUICK_SIZES = 2


def timeit(fn, inputs, device: str, min_runs: int = 10, min_seconds: float = 0.5) -> float:
    for _ in range(3):
        fn(*inputs)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    times = []
    start = time.perf_counter()
    while len(times) < min_runs or time.perf_counter() - start < min_seconds:
        if device == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            fn(*inputs)
            end.record()
            end.synchronize()
            times.append(begin.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn(*inputs)
            times.append((time.perf_counter() - t0) * 1e3)
        if len(times) >= 500:
            break
    return statistics.median(times)


def convert_saved(model, inputs, folder: str, name: str, device: str, **options):
    path = os.path.join(folder, f"{name}.pt")
    torch.jit.save(torch.jit.trace(model, inputs), path)
    package = os.path.join(folder, f"{name}.j2t")
    jit2triton.convert(path, example_inputs=inputs, device=device, **options).save(package)
    return jit2triton.load(package)


def run_case(name: str, device: str, quick: bool) -> list[dict]:
    build, dims, example, sizes = CASES[name]
    if quick:
        sizes = sizes[:QUICK_SIZES]
    torch.manual_seed(0)
    model = build().to(device).eval()
    draw = lambda b, s: (torch.randn(b, s, model.norm1.normalized_shape[0] if hasattr(model, "norm1")  # noqa: E731
                                     else model.norm.normalized_shape[0], device=device),)
    rows = []
    with torch.no_grad(), tempfile.TemporaryDirectory() as folder:
        B, S = (jit2triton.Dim(n, min=lo, max=hi) for n, lo, hi in dims)
        started = time.perf_counter()
        dynamic = convert_saved(model, draw(*example), folder, "dynamic", device, dynamic_shapes={"x": {0: B, 1: S}})
        dynamic_convert = time.perf_counter() - started
        traced = torch.jit.freeze(torch.jit.trace(model, draw(*example)))
        compiled = torch.compile(model, dynamic=True)
        for b, s in sizes:
            inputs = draw(b, s)
            expected = model(*inputs)
            static = convert_saved(model, inputs, folder, f"static_{b}_{s}", device)
            paths = {"static package": static, "dynamic package": dynamic, "torch.jit": traced,
                     "torch.compile(dynamic)": compiled}
            for label, fn in paths.items():
                torch.testing.assert_close(fn(*inputs), expected, rtol=2e-3, atol=2e-3, msg=lambda m: f"{label}: {m}")
            times = {label: timeit(fn, inputs, device) for label, fn in paths.items()}
            rows.append({"case": name, "size": f"B={b}, S={s}", "example": (b, s) == tuple(example),
                         "ms": times, "dynamic_convert_s": round(dynamic_convert, 2)})
            print_row(rows[-1])
    return rows


HEADER = f"{'case':30s} {'size':14s} {'static':>9s} {'dynamic':>9s} {'jit':>9s} {'compile':>9s}  " \
         f"{'dyn/static':>10s} {'compile/dyn':>11s} {'jit/dyn':>8s}"


def print_row(row: dict) -> None:
    t = row["ms"]
    dyn = t["dynamic package"]
    mark = "*" if row["example"] else " "
    print(f"{row['case']:30s} {row['size'] + mark:14s} {t['static package']:9.3f} {dyn:9.3f} {t['torch.jit']:9.3f} "
          f"{t['torch.compile(dynamic)']:9.3f}  {dyn / t['static package']:10.2f} "
          f"{t['torch.compile(dynamic)'] / dyn:11.2f} {t['torch.jit'] / dyn:8.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--quick", action="store_true", help=f"only the first {QUICK_SIZES} sizes of each case")
    parser.add_argument("--only", help="run one case (a prefix of its name)")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, device {args.device}, {torch.get_num_threads()} threads; ms, median; "
          "* = the dynamic package's example size; ratios > 1 favour the dynamic package except dyn/static")
    print(HEADER)
    rows = []
    for name in CASES:
        if args.only and not name.startswith(args.only):
            continue
        rows += run_case(name, args.device, args.quick)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
