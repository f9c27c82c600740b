"""Peak memory per call: how much memory one call allocates at its worst moment, above what was held before it
(weights and the module itself excluded; the call's outputs included), for torch.jit against a package loaded the
default way (the C++ runtime), and with its arena stripped, as packages were before it; and the arena itself, which a loaded package holds between calls (one per thread calling it). Then
the time per call of the default load with and without its arena, interleaved.

    python benchmarks/peak_memory.py [--set zoo|real|all] [--only NAME,NAME] [--device cpu|cuda]

On the CPU, torch's profiler reports every allocation and free of torch's CPU allocator; the peak is the running
sum's maximum over one call. On CUDA, `torch.cuda.max_memory_allocated` after `reset_peak_memory_stats`, less what
was allocated before the call. Each path is called a few times first, so caches (CUDA graphs, workspaces) are warm.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
import jit2triton  # noqa: E402
from zoo_cpu import _real, _zoo  # noqa: E402


def peak_cpu(fn, inputs) -> int:
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn(*inputs)
    del out
    running = peak = 0
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    for event in sorted(events, key=lambda e: e.start_ns()):
        running += event.nbytes()
        peak = max(peak, running)
    return peak


def peak_cuda(fn, inputs) -> int:
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn(*inputs)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del out
    return peak


def _on(device, value):
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(_on(device, v) for v in value)
    return value


def _without_arena(manifest: dict) -> None:
    manifest["plan"].pop("arena", None)
    for step in manifest["plan"]["steps"]:
        step.pop("arena", None)


def _median_ms(fns: dict, inputs, calls: int = 100) -> dict:
    times = {label: [] for label in fns}
    for _ in range(calls):
        for label, fn in fns.items():
            start = time.perf_counter()
            fn(*inputs)
            times[label].append(time.perf_counter() - start)
    return {label: statistics.median(t) * 1e3 for label, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default="")
    parser.add_argument("--set", choices=["zoo", "real", "all"], default="zoo")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    only = set(filter(None, args.only.split(",")))
    measure = peak_cuda if args.device == "cuda" else peak_cpu
    folder = tempfile.mkdtemp()
    labels = ["torch.jit", "default", "default, no arena"]
    print(f"torch {torch.__version__}, {args.device}; KiB allocated at the peak of one call, above what was held; "
          "the arena's KiB (held between calls); ms per call of the default load with and without its arena")
    print(f"{'model':36s} " + " ".join(f"{label:>17s}" for label in labels) + f" {'arena':>9s} {'ms':>8s} "
          f"{'ms, no arena':>13s}")
    totals = dict.fromkeys(labels + ["arena"], 0.0)
    rows = {"zoo": [_zoo], "real": [_real], "all": [_zoo, _real]}[args.set]
    for name, model, example, call in (row for source in rows for row in source()):
        if only and name not in only:
            continue
        torch.manual_seed(0)
        model, example, call = _on(args.device, model), _on(args.device, example), _on(args.device, call)
        converted = jit2triton.convert(model, example_inputs=example)
        arena_kib = converted.manifest["plan"].get("arena", {}).get("bytes", 0) / 1024
        converted.save(os.path.join(folder, "model.j2t"))
        _without_arena(converted.manifest)
        converted.save(os.path.join(folder, "bare.j2t"))
        paths = {"torch.jit": model}
        for suffix, file in (("", "model.j2t"), (", no arena", "bare.j2t")):
            paths["default" + suffix] = jit2triton.load(os.path.join(folder, file))
        kib = {}
        with torch.no_grad():
            for label in labels:
                for _ in range(3):
                    paths[label](*call)
                kib[label] = measure(paths[label], call) / 1024
            ms = _median_ms({"arena": paths["default"], "none": paths["default, no arena"]}, call)
        for label in labels:
            totals[label] += kib[label]
        totals["arena"] += arena_kib
        print(f"{name:36s} " + " ".join(f"{kib[label]:17.1f}" for label in labels) +
              f" {arena_kib:9.1f} {ms['arena']:8.4f} {ms['none']:13.4f}", flush=True)
    print(f"{'total':36s} " + " ".join(f"{totals[label]:17.1f}" for label in labels) + f" {totals['arena']:9.1f}")


if __name__ == "__main__":
    main()
