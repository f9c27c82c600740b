"""Where the time of a TorchScript program goes, TorchScript beside the package (issue 46's slow rows): per call,
wall time, the CUDA kernels launched and their GPU time, the host synchronisations (device-to-host copies, stream
syncs), and the kernels that take the most GPU time in each, from torch.profiler over a few warm calls. With
`--steps`, also the package's plan-step profile (`jit2triton bench --profile`'s table: each step timed alone,
synchronised); with `--host-steps`, each step's host work instead (`bench --host-profile`: not synchronised).

    python benchmarks/program_profiles.py --programs nms,gcn,gat --device cuda [--calls 10] [--steps | --host-steps]
                                          [--json out]

The programs are benchmarks/torchscript_programs.py's.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import tempfile
import time
import warnings

import torch
from torch.profiler import ProfilerActivity, profile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import jit2triton  # noqa: E402
from jit2triton.deploy.policy import library_of  # noqa: E402
from torchscript_programs import PROGRAMS, contender, torchscript_contender  # noqa: E402

COPIES = ("aten::clone", "aten::copy_", "aten::fill_", "aten::contiguous", "aten::scalar_tensor")
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpyAsync", "cudaMemcpy", "cudaEventSynchronize")


def wall_us(fn, inputs, reset, calls: int, sync) -> float:
    times = []
    for _ in range(calls):
        reset()
        sync()
        start = time.perf_counter()
        fn(*inputs)
        sync()
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


def traced(fn, inputs, reset, calls: int, device: str) -> dict:
    """Kernel launches, GPU µs and host syncs per call, and the top kernels by GPU time (µs per call)."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(calls):
            reset()
            fn(*inputs)
        if device == "cuda":
            torch.cuda.synchronize()
    kernels: dict = collections.defaultdict(lambda: [0, 0.0])
    syncs: dict = collections.Counter()
    aten: dict = collections.defaultdict(lambda: [0, 0.0])
    copies: dict = collections.Counter()  # a copy, clone or fill, by the outermost op that made it
    for event in prof.events():
        if event.name in COPIES:
            outer = event
            while outer.cpu_parent is not None:
                outer = outer.cpu_parent
            copies[f"{event.name} in {outer.name[:60]}"] += 1
        if event.device_type == torch.autograd.DeviceType.CUDA:
            entry = kernels[event.name[:90]]
            entry[0] += 1
            entry[1] += event.device_time_total if hasattr(event, "device_time_total") else event.cuda_time_total
        elif event.name in SYNCS:
            syncs[event.name] += 1
        elif event.name.startswith("aten::"):
            entry = aten[event.name]
            entry[0] += 1
            entry[1] += event.cpu_time_total
    # on the CPU, where the time goes: each op's own time (an op inside another counts in that one's total only),
    # µs per call; the package's generated kernels run outside any op and are not in it
    self_cpu = sorted(((e.key, e.count / calls, e.self_cpu_time_total / calls) for e in prof.key_averages()),
                      key=lambda row: -row[2])[:12] if device == "cpu" else []
    launches = sum(n for n, _ in kernels.values())
    gpu = sum(t for _, t in kernels.values())
    top = sorted(kernels.items(), key=lambda kv: -kv[1][1])[:12]
    top_aten = sorted(aten.items(), key=lambda kv: -kv[1][0])[:15]
    return {"launches": launches / calls, "gpu_us": round(gpu / calls, 1),
            "syncs": {k: v / calls for k, v in syncs.items()},
            "top_kernels": [(name, n / calls, round(t / calls, 1)) for name, (n, t) in top],
            "aten_calls": [(name, n / calls, round(t / calls, 1)) for name, (n, t) in top_aten],
            "copies": [(name, n / calls) for name, n in copies.most_common(12)],
            "self_cpu": [(name, n, round(us, 1)) for name, n, us in self_cpu]}


def census(plan: dict) -> list:
    """The plan's steps by op (a kernel step by its kind), blocks included, most common first."""
    counts: collections.Counter = collections.Counter()

    def walk(steps: list) -> None:
        for step in steps:
            counts[step.get("op") or step["kind"]] += 1
            for block in step.get("blocks", ()):
                walk(block["steps"])
    walk(plan["steps"])
    return counts.most_common()


def run(name: str, args, folder: str) -> dict:
    entry = PROGRAMS[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = entry.build(args.device, False)
        row: dict = {"program": name}
        started = time.perf_counter()
        converted = jit2triton.convert(program.model, program.example, device=args.device)
        row["convert_s"] = round(time.perf_counter() - started, 1)
        summary = converted.summary()
        row["nodes"] = {k: summary[k] for k in ("native_nodes", "fallback_nodes", "extern_nodes", "host_nodes")}
        row["verification"] = summary["verification"]["status"]
        path = os.path.join(folder, f"{name}.j2t")
        converted.save(path)
        package = jit2triton.load(path, cuda_graphs=not args.no_cuda_graphs)
        row["census"] = census(converted.manifest["plan"])
        with torch.inference_mode():
            ts, note = torchscript_contender(program)
            ours = contender(package, program)
            sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
            for _ in range(3):
                for c in (ts, ours):
                    c.reset()
                    c.call(*program.inputs)
            row["torchscript_us"] = wall_us(ts.call, program.inputs, ts.reset, args.calls, sync)
            row["package_us"] = wall_us(ours.call, program.inputs, ours.reset, args.calls, sync)
            row["torchscript"] = traced(ts.call, program.inputs, ts.reset, args.calls, args.device)
            row["package"] = traced(ours.call, program.inputs, ours.reset, args.calls, args.device)
            if note:
                row["note"] = note
    if args.steps or args.host_steps:
        import subprocess  # the CLI's profile, as a user gets it
        libraries = {library_of(op) for op, _ in row["census"] if "::" in op} - {None}
        imports = [arg for library in sorted(libraries) for arg in ("--import", library)]  # (torchvision::nms)
        profile = "--host-profile" if args.host_steps else "--profile"
        out = subprocess.run([sys.executable, "-m", "jit2triton.cli", "bench", path, profile, "--duration-s", "2",
                              *imports], capture_output=True, text=True)
        row["steps"] = out.stdout[-6000:] + out.stderr[-2000:]
    return row


def show(row: dict) -> None:
    print(f"\n=== {row['program']}: TorchScript {row['torchscript_us']:.0f} µs, package {row['package_us']:.0f} µs "
          f"({row['torchscript_us'] / row['package_us']:.2f}x); nodes {row['nodes']}; {row['verification']}")
    for side in ("torchscript", "package"):
        t = row[side]
        print(f"  {side}: {t['launches']:.0f} launches, {t['gpu_us']} GPU µs per call, syncs {t['syncs']}")
        for kname, n, us in t["top_kernels"]:
            print(f"      {us:8.1f} µs  {n:5.1f}x  {kname}")
        print("    aten calls: " + ", ".join(f"{n.replace('aten::', '')} {c:.0f}" for n, c, _ in t["aten_calls"]))
        print("    copies by outermost op: " + ", ".join(f"{n} {c:.0f}" for n, c in t["copies"]))
        if t.get("self_cpu"):
            print("    own CPU time per call: " + ", ".join(f"{n} {us / 1000:.2f} ms ({c:.0f})" for n, c, us in t["self_cpu"]))
    if "census" in row:
        print("  plan steps by op (each step once, loops not unrolled): " +
              ", ".join(f"{op} {n}" for op, n in row["census"][:25]))
    if "steps" in row:
        print(row["steps"])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--programs", default="nms,gcn,gat,int_list_ops")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--steps", action="store_true")
    parser.add_argument("--host-steps", action="store_true", help="the steps' host work (bench --host-profile)")
    parser.add_argument("--no-cuda-graphs", action="store_true", help="load the package with cuda_graphs=False")
    parser.add_argument("--json")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name in args.programs.split(","):
            try:
                row = run(name, args, folder)
                show(row)
            except Exception as err:  # noqa: BLE001 - the run goes on
                row = {"program": name, "error": f"{type(err).__name__}: {str(err)[:300]}"}
                print(f"\n=== {name}: {row['error']}")
            rows.append(row)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(rows, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
