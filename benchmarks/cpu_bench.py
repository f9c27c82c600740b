"""CPU benchmark: our package (C++ backend, loaded from disk) against eager, torch.jit and torch.compile.

All in one process, same inputs; every path's output is checked against eager first. Median of many runs after
warm-up. Prints a table of milliseconds and ratios, and writes JSON.

    python benchmarks/cpu_bench.py [--quick] [--only NAME] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
import jit2triton  # noqa: E402
from workloads import WORKLOADS  # noqa: E402

CPU_SET = ["sin2+cos2 16M", "numpy_fn 1024x640", "MLP+LayerNorm 8x512x1024", "attention 8x256x768",
           "BERT-like layer 8x128x768", "BERT base 1x9", "resnet18 1x224"]


def timeit(fn, inputs, min_runs: int, min_seconds: float) -> float:
    for _ in range(2):
        fn(*inputs)
    times = []
    start = time.perf_counter()
    while len(times) < min_runs or time.perf_counter() - start < min_seconds:
        t0 = time.perf_counter()
        fn(*inputs)
        times.append(time.perf_counter() - t0)
        if len(times) >= 1000:
            break
    return statistics.median(times) * 1e3


def run(name: str, args) -> dict:
    torch.manual_seed(0)
    model, inputs = WORKLOADS[name].build("cpu", torch.float32)
    model.eval()
    with torch.no_grad():
        expected = model(*inputs)
        traced = torch.jit.freeze(torch.jit.trace(model, inputs))
        compiled = torch.compile(model)
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "model.pt")
            torch.jit.save(torch.jit.trace(model, inputs), path)
            started = time.perf_counter()
            converted = jit2triton.convert(path, example_inputs=inputs)
            convert_s = time.perf_counter() - started
            converted.save(os.path.join(folder, "model.j2t"))
            ours = jit2triton.load(os.path.join(folder, "model.j2t"))
        paths = {"eager": model, "torch.jit": traced, "torch.compile": compiled, "jit2triton": ours}
        row = {"workload": name, "convert_s": convert_s, "kernels": len(ours.summary()["kernels"]),
               "fallbacks": ours.summary()["fallback_nodes"]}
        for label, fn in paths.items():
            got = fn(*inputs)
            error = (got.float() - expected.float()).abs().max().item()
            scale = expected.float().abs().max().item() + 1e-6
            if not error <= 1e-3 * scale + 1e-4:
                raise AssertionError(f"{name}: {label} differs from eager by {error}")
            row[label] = timeit(fn, inputs, args.runs, args.seconds)
            row[f"{label} error"] = error
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", action="append")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rows = [run(name, args) for name in (args.only or CPU_SET)]
    threads = torch.get_num_threads()
    print(f"\nCPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, {threads} threads; "
          f"torch {torch.__version__}; {time.strftime('%Y-%m-%d')}")
    header = f"| {'workload':28s} | eager ms | torch.jit ms | torch.compile ms | jit2triton ms | vs jit | vs compile | kernels |"
    print(header)
    print("|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|")
    for r in rows:
        print(f"| {r['workload']:28s} | {r['eager']:8.3f} | {r['torch.jit']:12.3f} | {r['torch.compile']:16.3f} | "
              f"{r['jit2triton']:13.3f} | {r['torch.jit'] / r['jit2triton']:5.2f}x | "
              f"{r['torch.compile'] / r['jit2triton']:9.2f}x | {r['kernels']:7d} |")
    geo_jit = math.exp(statistics.mean(math.log(r["torch.jit"] / r["jit2triton"]) for r in rows))
    geo_compile = math.exp(statistics.mean(math.log(r["torch.compile"] / r["jit2triton"]) for r in rows))
    print(f"geometric mean speed-up: {geo_jit:.2f}x vs torch.jit, {geo_compile:.2f}x vs torch.compile")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "geomean_vs_jit": geo_jit, "geomean_vs_compile": geo_compile}, f, indent=1)


if __name__ == "__main__":
    main()
