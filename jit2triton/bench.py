"""`jit2triton bench`: latency statistics like trtexec's, TorchScript timed interleaved in the same process, and a
profile of where the time goes by plan step, each row naming the TorchScript source lines it covers.

Timing: warm-up for a duration (and at least MIN_WARMUP_ROUNDS calls of each path: TorchScript's profiling executor
profiles the first call and optimises on the next), then calls until an iteration count or a duration is reached.
On CUDA each call is timed with CUDA events and synchronised (the latency a caller sees); on the CPU with a wall
clock. Every path runs under torch.inference_mode(), as a deployment does: TorchScript with autograd on records
history for every op and took 2.4x as long on a small conv net. With `--against`, the package and TorchScript take
turns call by call, so a burst of load on the machine hits both.
"""
from __future__ import annotations

import math
import os
import platform
import re
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch

from .errors import WriteError

MIN_WARMUP_ROUNDS = 3
MODE = "torch.inference_mode()"  # what every timed call runs under, as the header and the JSON say


@dataclass
class Bench:
    """What `jit2triton bench` was asked for."""
    package: str
    warmup_ms: float = 200.0
    iterations: Optional[int] = None
    duration_s: float = 3.0
    threads: Optional[int] = None
    cuda_graphs: bool = True
    runtime: str = "auto"
    device: Optional[str] = None
    shape_specs: Sequence[str] = ()
    against: Optional[str] = None
    profile: bool = False
    json_path: Optional[str] = None
    seed: int = 0
    trusted_keys: Sequence[str] = ()
    host_profile: bool = False  # the profile times each step's host work, unsynchronised (implies profile)


def run_bench(options: Bench, inputs: Optional[list], echo: Callable[[str], None]) -> dict[str, Any]:
    """Time the package (and the TorchScript model `--against` names), print the statistics, profile, and write the
    JSON; -> the results. `inputs`: the user's (--inputs-file), else random ones that fit the signature.
    `--threads` sets torch's threads for the run, so ATen's ops in the plan and TorchScript use that many too."""
    threads_before = torch.get_num_threads()
    if options.threads:
        torch.set_num_threads(options.threads)
    try:
        return _run_bench(options, inputs, echo)
    finally:
        torch.set_num_threads(threads_before)


def _run_bench(options: Bench, inputs: Optional[list], echo: Callable[[str], None]) -> dict[str, Any]:
    from .api import load
    from .compare import call_reference, load_reference
    from .inputs import parse_sizes, random_inputs

    o = options
    given = inputs is not None
    module = load(o.package, map_location=o.device, runtime=o.runtime, num_threads=o.threads,
                  cuda_graphs=o.cuda_graphs, trusted_keys=o.trusted_keys)
    signature = module.manifest["signature"]
    if inputs is None:
        inputs = random_inputs(signature["inputs"], module.device, o.seed,
                               parse_sizes(o.shape_specs, signature.get("dims", {})))
    else:
        inputs = [x.to(module.device) if isinstance(x, torch.Tensor) else x for x in inputs]
    paths = {"jit2triton": lambda: module(*inputs)}
    scripted = load_reference(o.against, module.device) if o.against else None
    cuda = module.device.type == "cuda"
    results: dict[str, Any] = {
        "package": o.package, "signature": module.signature(), "device": str(module.device),
        "device_name": device_name(module.device), "runtime": module.runtime,
        "cuda_graphs": o.cuda_graphs if cuda else None, "threads": torch.get_num_threads(), "mode": MODE,
        "inputs": "given (--inputs-file)" if given else f"random, seed {o.seed}", "versions": versions()}
    echo(f"{o.package}: {module.signature()} on {module.device} ({results['device_name']}), {module.runtime} runtime"
         + (f", CUDA graphs {'on' if o.cuda_graphs else 'off'}" if cuda else "")
         + f", {results['threads']} thread{'s' if results['threads'] > 1 else ''}, timed under {MODE}")
    with torch.inference_mode():
        if scripted is not None:
            call_reference(scripted, inputs, o.against, module.signature())  # another model's inputs: one line
            paths["torch.jit"] = lambda: scripted(*inputs)
        times = measure(paths, module.device, o.warmup_ms, o.iterations, o.duration_s)
    results["stats"] = {label: summarize(t) for label, t in times.items()}
    results["times_ms"] = times
    for label, stats in results["stats"].items():
        echo(format_stats(label, stats))
    if scripted is not None:
        ratio = results["stats"]["torch.jit"]["median_ms"] / results["stats"]["jit2triton"]["median_ms"]
        results["speedup_vs_torch_jit"] = ratio
        echo(f"median speed-up over torch.jit: {ratio:.2f}x")
    if o.profile or o.host_profile:
        results.update(_profile(o, inputs, len(times["jit2triton"]), module.runtime, echo))
    if o.json_path:
        import json
        try:
            with open(o.json_path, "w") as f:
                json.dump(results, f, indent=1)
        except OSError as err:  # checked before the benchmark, so a disk that filled since
            raise WriteError(f"--json: cannot write {o.json_path}: {err.strerror or err}") from None
        echo(f"wrote {o.json_path}")
    return results


def percentile(sorted_times: list[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between the closest ranks, as numpy's default."""
    if len(sorted_times) == 1:
        return sorted_times[0]
    rank = (len(sorted_times) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(sorted_times) - 1)
    return sorted_times[low] + (sorted_times[high] - sorted_times[low]) * (rank - low)


def summarize(times_ms: list[float]) -> dict[str, float]:
    ordered = sorted(times_ms)
    mean = statistics.fmean(ordered)
    return {"calls": len(ordered), "min_ms": ordered[0], "mean_ms": mean, "median_ms": statistics.median(ordered),
            "p90_ms": percentile(ordered, 90), "p99_ms": percentile(ordered, 99), "max_ms": ordered[-1],
            "throughput_per_s": 1e3 / mean if mean > 0 else math.inf}


class _Clock:
    """One call's latency in milliseconds, measured the way the device needs."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.begin, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def time(self, fn: Callable[[], Any]) -> float:
        if self.cuda:
            self.begin.record()
            fn()
            self.end.record()
            self.end.synchronize()
            return self.begin.elapsed_time(self.end)
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3


def measure(paths: dict[str, Callable[[], Any]], device: torch.device, warmup_ms: float,
            iterations: Optional[int], duration_s: Optional[float]) -> dict[str, list[float]]:
    """Milliseconds per call of each path, the paths taking turns: warm-up until `warmup_ms` have passed (at
    least MIN_WARMUP_ROUNDS calls each), then until `iterations` rounds or `duration_s` seconds, whichever is given."""
    clock = _Clock(device)
    started, rounds = time.perf_counter(), 0
    while True:
        for fn in paths.values():
            clock.time(fn)
        rounds += 1
        if rounds >= MIN_WARMUP_ROUNDS and (time.perf_counter() - started) * 1e3 >= warmup_ms:
            break
    times: dict[str, list[float]] = {label: [] for label in paths}
    started = time.perf_counter()
    while True:
        for label, fn in paths.items():
            times[label].append(clock.time(fn))
        rounds = len(next(iter(times.values())))
        if iterations is not None and rounds >= iterations:
            break
        if iterations is None and time.perf_counter() - started >= (duration_s or 0):
            break
    return times


@dataclass
class _Row:
    node: int
    seconds: float = 0.0
    calls: int = 0


def profile_rows(steps: Sequence[_Row], nodes: list[dict], kernels: list[dict], calls: int) -> list[dict]:
    """The profile's rows, largest share first: what ran (op or kernel), ms per model call, share, where from.

    Steps that do the same thing for the same source lines are one row (`count` of them): the twelve layers of a
    BERT run one `nn.Linear` line twelve times, and a user wants that line's total, not twelve equal rows."""
    provenance = {k["name"]: k.get("provenance", []) for k in kernels}
    total = sum(r.seconds for r in steps) or 1.0
    grouped: dict[tuple, dict] = {}
    for r in sorted(steps, key=lambda r: r.node):
        node = nodes[r.node] if 0 <= r.node < len(nodes) else {}
        if node.get("category") == "kernel":
            what = f"kernel {_KERNEL_INDEX.sub('', str(node.get('kernel')))}"
            sources = sorted({f["source"] for f in node.get("fused", []) if f.get("source")})
            ops = [line.split()[0] for line in provenance.get(node.get("kernel"), []) if line.split()]
        else:
            what = node.get("op", "?")
            sources = [node["source"]] if node.get("source") else []
            ops = []
        row = grouped.setdefault((what, tuple(sources)), {
            "nodes": [], "what": what, "count": 0, "ms_per_call": 0.0, "share": 0.0, "steps_per_call": 0.0,
            "sources": sources, "ops": ops})
        row["nodes"].append(r.node)
        row["count"] += 1
        row["ms_per_call"] += r.seconds * 1e3 / max(calls, 1)
        row["share"] += r.seconds / total
        row["steps_per_call"] += r.calls / max(calls, 1)
    return sorted(grouped.values(), key=lambda row: -row["share"])


_KERNEL_INDEX = re.compile(r"^k\d+_")  # k14_add_relu and k6_add_relu are the same fusion in two places


def format_stats(label: str, s: dict[str, float]) -> str:
    return (f"{label:12s} min {s['min_ms']:.3f}  mean {s['mean_ms']:.3f}  median {s['median_ms']:.3f}  "
            f"p90 {s['p90_ms']:.3f}  p99 {s['p99_ms']:.3f}  max {s['max_ms']:.3f} ms  "
            f"({s['calls']} calls, {s['throughput_per_s']:.1f} calls/s)")


def format_profile(rows: list[dict], limit: int = 30) -> list[str]:
    lines = [f"{'share':>6s} {'ms/call':>9s}  {'step':40s} source"]
    for row in rows[:limit]:
        where = "; ".join(_source_cell(src) for src in row["sources"][:3])
        where += " ..." if len(row["sources"]) > 3 else ""
        what = row["what"] + (f" x{row['count']}" if row["count"] > 1 else "")
        lines.append(f"{row['share'] * 100:5.1f}% {row['ms_per_call']:9.4f}  {what[:40]:40s} {where}")
    if len(rows) > limit:
        rest = sum(r["share"] for r in rows[limit:])
        steps = sum(r["count"] for r in rows[limit:])
        lines.append(f"{rest * 100:5.1f}% in {steps} more steps ({len(rows) - limit} rows)")
    return lines


def _source_cell(source: str, code_chars: int = 60) -> str:
    """`path:line code` with the path and line whole and the code cut at `code_chars` (a long path must not leave the
    code a dozen characters, as one cut over both did)."""
    location, _, code = " ".join(source.split()).partition(" ")
    return f"{location} {code[:code_chars - 3] + '...' if len(code) > code_chars else code}".rstrip()


def _profile(o: Bench, inputs: list, timed_calls: int, runtime: str,
             echo: Callable[[str], None]) -> dict[str, Any]:
    """Where the time goes, step by step, in the C++ runtime's per-step timers: a second load of the package without
    CUDA graphs, synchronised around each step, so its steps add up to more than an unprofiled call. With
    `host_profile`, not synchronised: each step's time is the host's work issuing it (and any wait for the device
    the step itself makes, a size read from a tensor on the GPU), where a host-bound call's time goes."""
    from .api import load

    profiled = load(o.package, map_location=o.device, num_threads=o.threads, cuda_graphs=False, runtime=runtime,
                    trusted_keys=o.trusted_keys)
    calls = max(5, min(100, timed_calls))
    with torch.inference_mode():
        profiled(*inputs)  # a warm call outside the profile
        profiled._runtime.set_profiling(True, host_only=o.host_profile)
        started = time.perf_counter()
        for _ in range(calls):
            profiled(*inputs)
    call_ms = (time.perf_counter() - started) * 1e3 / calls
    steps = [_Row(node, seconds, runs) for node, seconds, runs in profiled._runtime.step_times()]
    rows = profile_rows(steps, profiled.manifest["nodes"], profiled.manifest["kernels"], calls)
    if o.host_profile:
        echo(f"host profile: the {runtime} runtime, {calls} calls, each step's host work (not synchronised: a step "
             f"that waits for the device holds the wait), {call_ms:.3f} ms a call:")
    else:
        echo(f"profile: the {runtime} runtime, {calls} calls, each step synchronised, {call_ms:.3f} ms a call (times "
             "add up to more than an unprofiled call's):")
    for line in format_profile(rows):
        echo(line)
    return {"profile": rows, "profiled_call_ms": call_ms, "profile_runtime": runtime, "host_profile": o.host_profile}


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's model as the OS names it."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def versions() -> dict[str, Any]:
    """What produced the numbers: the versions, and the CPU cores torch saw."""
    from .version import __version__
    return {"jit2triton": __version__, "torch": torch.__version__, "python": platform.python_version(),
            "cuda": torch.version.cuda, "cpu_count": os.cpu_count(), "platform": platform.platform()}
