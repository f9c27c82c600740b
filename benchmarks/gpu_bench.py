"""GPU benchmark: our package (Triton backend, loaded from disk) against eager, torch.jit, torch.compile (default and
reduce-overhead), in one process.

Per workload and path: output checked against eager, then CUDA-event time per call (median of many, after
warm-up, the paths taking turns call by call) and back-to-back wall time per call. Also sin2+cos2's achieved
bandwidth against a device-to-device copy, and cold start (load + first output, in a fresh process) against
torch.jit.load. Prints a table, writes JSON.

    python benchmarks/gpu_bench.py [--only NAME ...] [--paths eager,compile-ro,jit2triton] [--json out.json]
                                   [--skip-compile] [--profile N]

--profile N prints, per workload, the N GPU kernels that take the most time per call for each path compared
(torch.profiler), which is where a row that trails shows why.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
import jit2triton  # noqa: E402
from cold_start import cold_start_ms  # noqa: E402
from workloads import WORKLOADS, Workload, bert_base  # noqa: E402

GPU_SET = ["sin+cos 0-d", "sin2+cos2 16M", "numpy_fn 1024x640", "MLP+LayerNorm 8x512x1024", "attention 8x256x768",
           "resnet18 16x224", "resnet18 NCHW 16x224", "resnet50 NCHW 16x224", "ViT-B/16 8x224", "BERT base 1x9",
           "BERT base 8x128"]
HALF = {"MLP+LayerNorm 8x512x1024", "attention 8x256x768", "resnet18 16x224", "resnet18 NCHW 16x224",
        "resnet50 NCHW 16x224", "ViT-B/16 8x224", "BERT base 8x128"}
PATHS = ("eager", "torch.jit", "compile", "compile-ro", "jit2triton")


def extra_workloads() -> dict[str, Workload]:
    extra = {}
    try:
        import torchvision

        def resnet(dev, dt):
            model = torchvision.models.resnet18().to(dev, dt).eval().to(memory_format=torch.channels_last)
            return model, (torch.randn(16, 3, 224, 224, device=dev, dtype=dt),)
        extra["resnet18 16x224"] = Workload("resnet18 16x224", resnet)

        def resnet_nchw(dev, dt):  # as users write it: weights and images NCHW
            model = torchvision.models.resnet18().to(dev, dt).eval()
            return model, (torch.randn(16, 3, 224, 224, device=dev, dtype=dt),)
        extra["resnet18 NCHW 16x224"] = Workload("resnet18 NCHW 16x224", resnet_nchw)

        def classifier(name, batch):  # torchvision models as users write them: NCHW, no hand tuning
            def build(dev, dt):
                model = getattr(torchvision.models, name)().to(dev, dt).eval()
                return model, (torch.randn(batch, 3, 224, 224, device=dev, dtype=dt),)
            return build
        extra["resnet50 NCHW 16x224"] = Workload("resnet50 NCHW 16x224", classifier("resnet50", 16))
        extra["ViT-B/16 8x224"] = Workload("ViT-B/16 8x224", classifier("vit_b_16", 8))
    except Exception as err:  # noqa: BLE001 - any import failure means: skip, and say so
        print(f"skipping resnet18: torchvision unavailable ({err})")
    try:
        import transformers  # noqa: F401

        extra["BERT base 1x9"] = Workload("BERT base 1x9", bert_base(1, 9))
        extra["BERT base 8x128"] = Workload("BERT base 8x128", bert_base(8, 128))
    except Exception as err:  # noqa: BLE001
        print(f"skipping BERT: transformers unavailable ({err})")
    return extra


def events_us(fn, inputs, calls: int = 1, runs: int = 200, warmup: int = 10) -> float:
    """Median CUDA-event time per call, in microseconds, over `runs` timings of `calls` back-to-back calls."""
    for _ in range(warmup):
        fn(*inputs)
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn(*inputs)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(times)


def interleaved_us(paths: dict, inputs, runs: int) -> dict[str, float]:
    """Median CUDA-event time of one call per path, the paths taking turns run by run: small calls are bound by the
    host, whose speed drifts on a shared machine, and turns spread the drift evenly over the paths compared."""
    times: dict[str, list[float]] = {label: [] for label in paths}
    for fn in paths.values():
        events_us(fn, inputs, runs=3)  # warm-up: captures, autotuning, caches
    for _ in range(runs):
        for label, fn in paths.items():
            times[label].append(events_us(fn, inputs, runs=1, warmup=0))
    return {label: statistics.median(t) for label, t in times.items()}


def cuda_time_us(fn, inputs, runs: int) -> tuple[float, float]:
    """(median CUDA-event time per call, back-to-back wall time per call), in microseconds."""
    events = events_us(fn, inputs, runs=runs)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(runs):
        fn(*inputs)
    torch.cuda.synchronize()
    return events, (time.perf_counter() - t0) / runs * 1e6


def run(workload: Workload, args) -> dict:
    torch.manual_seed(0)
    dtype = torch.float16 if workload.name in HALF else torch.float32
    model, inputs = workload.build("cuda", dtype)
    row = {"workload": workload.name, "dtype": str(dtype).removeprefix("torch.")}
    with torch.no_grad():
        expected = model(*inputs)
        folder = tempfile.mkdtemp()
        pt_path = os.path.join(folder, "model.pt")
        torch.jit.save(torch.jit.trace(model, inputs, check_trace=False), pt_path)
        traced = torch.jit.freeze(torch.jit.load(pt_path).eval())
        t0 = time.perf_counter()
        converted = jit2triton.convert(pt_path, example_inputs=inputs, device="cuda")
        row["convert_s"] = time.perf_counter() - t0
        package = os.path.join(folder, "model.j2t")
        converted.save(package)
        ours = jit2triton.load(package)
        summary = ours.summary()
        row.update(kernels=len(summary["kernels"]), fallbacks=summary["fallback_nodes"],
                   fallback_ops=summary["fallback_ops"])
        paths = {"eager": model, "torch.jit": traced}
        if not args.skip_compile:
            paths["compile"] = torch.compile(model)
            paths["compile-ro"] = torch.compile(model, mode="reduce-overhead")
        paths["jit2triton"] = ours
        paths = {label: fn for label, fn in paths.items() if label in args.paths}
        tolerance = 3e-2 if dtype == torch.float16 else 1e-3
        for label, fn in paths.items():
            got = fn(*inputs)
            error = (got.float() - expected.float()).abs().max().item()
            scale = expected.float().abs().max().item()
            row[f"{label} error"] = error
            row[f"{label} ok"] = bool(error <= tolerance * max(scale, 1.0))
        row.update(interleaved_us(paths, inputs, args.runs))
        for label, fn in paths.items():
            row[f"{label} wall"] = cuda_time_us(fn, inputs, args.runs)[1]
        row["cold start"] = cold_start(package, pt_path, inputs, folder)
        if args.profile:
            row["profile"] = {label: kernel_profile(fn, inputs, args.profile) for label, fn in paths.items()}
    if workload.name == "sin2+cos2 16M":
        # per call (CUDA events around one call: the host's time before the launch counts) and back to back
        # (events around 50 calls: the kernel's own throughput), each against a device-to-device copy timed alike
        nbytes = 2 * inputs[0].numel() * 4
        out = torch.empty_like(inputs[0])
        row["GB/s"] = nbytes / (row["jit2triton"] * 1e-6) / 1e9
        row["copy GB/s"] = nbytes / (cuda_time_us(lambda t: out.copy_(t), inputs, args.runs)[0] * 1e-6) / 1e9
        row["GB/s back-to-back"] = nbytes / (batch_time_us(ours, inputs) * 1e-6) / 1e9
        row["copy GB/s back-to-back"] = nbytes / (batch_time_us(lambda t: out.copy_(t), inputs) * 1e-6) / 1e9
    return row


def kernel_profile(fn, inputs, top: int, calls: int = 20) -> list[tuple[str, float, float]]:
    """The `top` GPU kernels by device time per call: (name, µs per call, launches per call), and the total."""
    from torch.profiler import ProfilerActivity, profile
    for _ in range(3):
        fn(*inputs)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn(*inputs)
        torch.cuda.synchronize()
    kernels = [e for e in prof.key_averages() if e.device_type.name == "CUDA" and e.self_device_time_total > 0]
    kernels.sort(key=lambda e: -e.self_device_time_total)
    rows = [(e.key[:90], e.self_device_time_total / calls, e.count / calls) for e in kernels]
    total = ("total", sum(r[1] for r in rows), sum(r[2] for r in rows))
    return rows[:top] + [total]


def batch_time_us(fn, inputs, calls: int = 50, runs: int = 21) -> float:
    """Median CUDA-event time per call over runs of `calls` back-to-back calls, in microseconds."""
    return events_us(fn, inputs, calls=calls, runs=runs)


def cold_start(package: str, pt_path: str, inputs, folder: str) -> dict:
    inputs_path = os.path.join(folder, "inputs.pt")
    torch.save(tuple(inputs), inputs_path)
    result = {}
    for kind, path in (("jit2triton", package), ("torch.jit", pt_path)):
        try:
            result[kind] = cold_start_ms(kind, path, inputs_path)
        except subprocess.CalledProcessError as err:
            result[kind] = f"failed: {err.stderr[-300:]}"
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", action="append")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--json", default=None)
    parser.add_argument("--skip-compile", action="store_true")
    parser.add_argument("--paths", default=",".join(PATHS), help="the paths to time, comma-separated")
    parser.add_argument("--profile", type=int, default=0, help="print the N costliest GPU kernels of each path")
    args = parser.parse_args()
    args.paths = set(args.paths.split(",")) | {"jit2triton"}
    unknown = args.paths - set(PATHS)
    if unknown:
        parser.error(f"unknown paths {sorted(unknown)}; choose from {', '.join(PATHS)}")
    workloads = dict(WORKLOADS, **extra_workloads())
    rows = []
    for name in args.only or GPU_SET:
        if name not in workloads:
            print(f"skipping {name}: not available here")
            continue
        try:
            rows.append(run(workloads[name], args))
        except Exception as err:  # noqa: BLE001 - one broken workload must not hide the others' numbers
            rows.append({"workload": name, "error": f"{type(err).__name__}: {err}"[:2000]})
            print(f"{name}: FAILED {rows[-1]['error']}")
        if args.json:  # after each row: a run cut short keeps the rows it finished
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1, default=str)
    props = torch.cuda.get_device_properties(0)
    import triton
    print(f"\nGPU: {props.name}; torch {torch.__version__}; triton {triton.__version__}; {time.strftime('%Y-%m-%d')}")
    peers = [p for p in PATHS[:-1] if any(p in r for r in rows)]
    good = [r for r in rows if "error" not in r]
    for title, suffix in (("single call, CUDA events", ""), ("back to back, wall time per call", " wall")):
        print(f"\n{title} (µs):")
        print("| workload | dtype | " + " | ".join(f"{p}" for p in peers) + " | jit2triton | vs best peer | "
              + " | ".join(f"vs {p}" for p in peers) + " | kernels | fallbacks | convert s |")
        print("|" + "---|" * (6 + 2 * len(peers)))
        for r in rows:
            if "error" in r:
                print(f"| {r['workload']} | failed: {r['error'][:120]} |")
                continue
            ours = r["jit2triton" + suffix]
            best = min(r[p + suffix] for p in peers) if peers else float("nan")
            print(f"| {r['workload']} | {r['dtype']} | " + " | ".join(f"{r[p + suffix]:.1f}" for p in peers)
                  + f" | {ours:.1f} | {best / ours:.2f}x | " + " | ".join(f"{r[p + suffix] / ours:.2f}x" for p in peers)
                  + f" | {r['kernels']} | {r['fallbacks']} | {r['convert_s']:.1f} |")
        for p in peers:
            if good:
                geo = math.exp(statistics.mean(math.log(r[p + suffix] / r["jit2triton" + suffix]) for r in good))
                print(f"geometric mean speed-up vs {p}: {geo:.2f}x")
    for r in good:
        for label, kernels in r.get("profile", {}).items():
            print(f"\n{r['workload']} / {label}: GPU kernels per call (µs, launches)")
            for name, us, launches in kernels:
                print(f"  {us:9.1f} {launches:6.1f}  {name}")
    for r in good:
        print(f"{r['workload']}: outputs ok: " + ", ".join(f"{p}={r[p + ' ok']}" for p in peers + ["jit2triton"])
              + f"; cold start ms {r['cold start']}; convert {r['convert_s']:.1f}s"
              + (f"; per call {r['GB/s']:.0f} GB/s vs copy {r['copy GB/s']:.0f} GB/s "
                 f"({r['GB/s'] / r['copy GB/s']:.0%}); back to back {r['GB/s back-to-back']:.0f} GB/s vs copy "
                 f"{r['copy GB/s back-to-back']:.0f} GB/s ({r['GB/s back-to-back'] / r['copy GB/s back-to-back']:.0%})"
                 if "GB/s" in r else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1, default=str)


if __name__ == "__main__":
    main()
