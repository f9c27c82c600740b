"""Quantized models on the CPU: our package (the C++ runtime) against TorchScript, in one process.

Workloads (tests/quantized_models.py, wider): a dynamic-quantized MLP (quantize_dynamic over nn.Linear), a
dynamic-quantized two-layer LSTM, and a static-quantized conv net (fused conv-bn-relu, quantized add and cat,
pooling, linear; x86 qconfig). TorchScript runs the traced module as saved and loaded back (what a user holds), and
frozen. Every path's output is checked against TorchScript's first; then, under torch.inference_mode and after a
warm-up (TorchScript's profiling executor needs a few calls), the paths take turns call by call, so drift on a
shared machine spreads evenly over them, and the median wall time per call is reported.

    python benchmarks/quantized_bench.py [--runs 200] [--threads 1] [--only mlp] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
import jit2triton  # noqa: E402
from quantized_models import dynamic_mlp, dynamic_rnn, static_convnet  # noqa: E402

WORKLOADS = {  # name -> (the quantized model, its inputs)
    "dynamic MLP 16x512": (lambda: dynamic_mlp(512), lambda: (torch.randn(16, 512),)),
    "dynamic LSTM 4x32x256": (lambda: dynamic_rnn(nn.LSTM, 256), lambda: (torch.randn(4, 32, 256),)),
    "static conv net 4x3x64x64": (lambda: static_convnet(32, 64), lambda: (torch.randn(4, 3, 64, 64),)),
}


def interleaved_ms(paths: dict, inputs: tuple, runs: int) -> dict[str, float]:
    """Median wall time of one call per path, in milliseconds, the paths taking turns run by run."""
    times: dict[str, list[float]] = {label: [] for label in paths}
    for fn in paths.values():
        for _ in range(5):
            fn(*inputs)
    for _ in range(runs):
        for label, fn in paths.items():
            started = time.perf_counter()
            fn(*inputs)
            times[label].append(time.perf_counter() - started)
    return {label: statistics.median(t) * 1e3 for label, t in times.items()}


def run(name: str, runs: int) -> dict:
    build, make_inputs = WORKLOADS[name]
    torch.manual_seed(0)
    model, inputs = build(), make_inputs()
    folder = tempfile.mkdtemp()
    script_path, package = os.path.join(folder, "model.pt"), os.path.join(folder, "model.j2t")
    torch.jit.save(torch.jit.trace(model, inputs), script_path)
    script = torch.jit.load(script_path)
    frozen = torch.jit.freeze(torch.jit.load(script_path))
    jit2triton.convert(script_path, example_inputs=inputs).save(package)
    paths = {"torch.jit": script, "torch.jit frozen": frozen,
             "j2t cpp": jit2triton.load(package, runtime="cpp")}
    summary = paths["j2t cpp"].summary()
    with torch.inference_mode():
        expected = script(*inputs)
        errors = {label: (fn(*inputs) - expected).abs().max().item() for label, fn in paths.items()}
        times = interleaved_ms(paths, inputs, runs)
    return {"workload": name, "ms": times, "max error": errors, "kernels": len(summary["kernels"]),
            "extern": summary["extern_nodes"], "fallback": summary["fallback_nodes"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", action="append", help="a workload name's start (mlp, lstm, conv)")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--threads", type=int, default=None, help="torch's intra-op threads (default: torch's)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    names = [n for n in WORKLOADS if not args.only or any(o.lower() in n.lower() for o in args.only)]
    rows = [run(name, args.runs) for name in names]
    print(f"\nCPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} "
          f"threads; torch {torch.__version__}, quantized engine {torch.backends.quantized.engine}; "
          f"load average {os.getloadavg()[0]:.1f}; {time.strftime('%Y-%m-%d')}; median of {args.runs} interleaved "
          "calls under torch.inference_mode")
    header = ("| workload                   | torch.jit ms | frozen ms | j2t cpp ms | vs torch.jit "
              "| vs frozen | kernels / extern / fallback | max error |")
    print(header)
    print("|" + "|".join("-" * len(c) for c in header.split("|")[1:-1]) + "|")
    for r in rows:
        t = r["ms"]
        print(f"| {r['workload']:26s} | {t['torch.jit']:12.3f} | {t['torch.jit frozen']:9.3f} | {t['j2t cpp']:10.3f} "
              f"| {t['torch.jit'] / t['j2t cpp']:11.2f}x "
              f"| {t['torch.jit frozen'] / t['j2t cpp']:8.2f}x "
              f"| {r['kernels']:>9d} / {r['extern']} / {r['fallback']:<8d} | {max(r['max error'].values()):9.2e} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
