"""Conversions side by side on one machine: torchvision's DenseNet-121 converted by several processes at once, each
timed (issue 44: 24.5 s alone on an H200, and not done in 240 s with four conversions sharing the GPU machine).
The goal: each of four at most 60 s. Measured on the H100 machine (16 cores, one GPU), four at once, cold: 37.7,
38.0, 38.2 and 39.1 s, each 121 kernels and verified, about 28 s of each in compiling kernels (16 compile slots
shared by the four).

    python benchmarks/parallel_conversions.py [--processes 4] [--solo] [--model densenet121] [--device cuda]

Each process builds and traces its model first; the conversions start together (a barrier) and each is timed from
there to its package. All of a run's processes share the jit2triton cache (JIT2TRITON_CACHE, so its compile slots,
as conversions on one machine do) and a fresh Triton cache; `--cold` first removes the jit2triton cache's compiled
kernels and tuning choices (its `triton` and `tuning` folders; the C++ runtime's build stays), so that every run
compiles and tunes everything. `--solo` converts once alone first, for comparison. Prints one line per conversion
(seconds, its slowest stages, the compile slots, timed choices the machine was too busy for) and a JSON summary as
the last line.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import queue
import shutil
import statistics
import tempfile
import time

GOAL_S = 60.0


def _model(name: str):
    import torch
    if name == "densenet121":
        import torchvision
        return torchvision.models.densenet121(weights=None).eval(), (torch.randn(1, 3, 224, 224),)
    layers = [torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
              torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
              torch.nn.Flatten(), torch.nn.Linear(16, 10)]
    return torch.nn.Sequential(*layers).eval(), (torch.randn(1, 3, 32, 32),)  # "small": to try the script anywhere


def _convert(index: int, name: str, device: str, start, results) -> None:
    import torch
    import jit2triton
    from jit2triton.emitters.jobs import job_slots
    torch.manual_seed(index)
    model, example = _model(name)
    example = tuple(x.to(device) for x in example)
    traced = torch.jit.trace(model.to(device), example)
    start.wait()
    began = time.perf_counter()
    try:
        converted = jit2triton.convert(traced, example, device=device, timeout=600)
    except Exception as err:  # noqa: BLE001 - reported as this conversion's outcome
        results.put({"index": index, "seconds": time.perf_counter() - began, "error": f"{type(err).__name__}: {err}"})
        return
    seconds = time.perf_counter() - began
    summary = converted.summary()
    choices = summary.get("timed_choices", [])
    results.put({"index": index, "seconds": round(seconds, 1), "slots": job_slots(),
                 "kernels": len(converted.manifest["kernels"]),
                 "verification": summary["verification"]["status"],
                 "stages": dict(sorted(summary["pass_seconds"].items(), key=lambda kv: -kv[1])[:4]),
                 "timed_choices": len(choices),
                 "busy": [c["what"] for c in choices if c.get("busy")]})  # fixed answers: the machine was busy


def _results(workers: list, results) -> list[dict]:
    """Each worker's result; one that died without giving one (a crash) is reported as such."""
    done: dict[int, dict] = {}
    while len(done) < len(workers):
        try:
            result = results.get(timeout=1)
            done[result["index"]] = result
        except queue.Empty:
            for i, w in enumerate(workers):
                if i not in done and w.exitcode is not None and results.empty():
                    done[i] = {"index": i, "seconds": None, "error": f"the process died (exit code {w.exitcode})"}
    return list(done.values())


def run(processes: int, name: str, device: str, cold: bool) -> list[dict]:
    """Start `processes` conversions at once, sharing the caches; -> each one's result."""
    if cold:
        from jit2triton.emitters.cache import cache_root
        for kind in ("triton", "tuning"):
            shutil.rmtree(os.path.join(cache_root(), kind), ignore_errors=True)
    context = multiprocessing.get_context("spawn")  # CUDA in each child
    with tempfile.TemporaryDirectory() as triton_cache:
        os.environ["TRITON_CACHE_DIR"] = triton_cache
        start, results = context.Barrier(processes + 1), context.Queue()
        workers = [context.Process(target=_convert, args=(i, name, device, start, results))
                   for i in range(processes)]
        for w in workers:
            w.start()
        start.wait()
        began = time.perf_counter()
        done = _results(workers, results)
        wall = time.perf_counter() - began
        for w in workers:
            w.join()
    for result in sorted(done, key=lambda r: r["index"]):
        print(f"  conversion {result['index']}: {result['seconds']} s"
              + (f" FAILED {result['error']}" if "error" in result else
                 f", {result['kernels']} kernels, verification {result['verification']}, {result['slots']} "
                 f"compile slots, slowest stages {result['stages']}, {result['timed_choices']} timed choices"
                 + (f", busy: {result['busy']}" if result["busy"] else "")), flush=True)
    print(f"  all {processes} done {wall:.1f} s after they started", flush=True)
    return done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--model", default="densenet121", choices=("densenet121", "small"))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--solo", action="store_true", help="convert once alone first, for comparison")
    parser.add_argument("--cold", action="store_true",
                        help="remove the jit2triton cache's compiled kernels and tuning choices before each run")
    args = parser.parse_args()
    import torch
    machine = {"cores": len(os.sched_getaffinity(0)), "cpu_count": os.cpu_count(),
               "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None}
    print(f"{args.model} on {args.device}, machine {machine}", flush=True)
    summary = {"model": args.model, "device": args.device, "machine": machine, "goal_s": GOAL_S}
    if args.solo:
        print("alone:", flush=True)
        summary["solo_s"] = run(1, args.model, args.device, args.cold)[0]["seconds"]
    print(f"{args.processes} at once:", flush=True)
    parallel = run(args.processes, args.model, args.device, args.cold)
    seconds = [r["seconds"] for r in parallel]
    summary.update(parallel_s=sorted(seconds), parallel_median_s=statistics.median(seconds),
                   failed=sum("error" in r for r in parallel),
                   met_goal=all(s <= GOAL_S for s in seconds) and not any("error" in r for r in parallel))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
