"""Per-call overhead of the runtime, side by side in one process: torch.jit (traced, frozen, warmed up) and our
C++ runtime (`jit2triton.load`), on a tiny model (sin+cos of a 0-d
tensor, where the call is all overhead) and on BERT base at batch 1 x seq 9 (transformers; a BERT-like layer
when transformers is missing); and (`--programs host`) on programs that are mostly host steps
(benchmarks/host_programs.py: an NMS post-process, a loop over a List[Tensor] input, a scripted refinement loop in a
traced model, a beam search, a KV-cache decode step, int and list ops, a chain of 200 ATen calls no kernel replaces),
the TorchScript model as the user holds it (not frozen), each with its cost per plan step (the call's wall time over
the steps it runs, counted by the C++ runtime's step timers; TorchScript's interpreter runs a node per step).

Per path: back-to-back wall time per call (median over runs of 200 calls; on CUDA synchronised at the end of each
run) and, on CUDA, the CUDA-event time of a single call (median of many). Also the load time of each runtime. The
host programs' paths take turns run by run (a run: `--calls` calls, after the program's reset method if it has
one), so that a shared machine's drift falls on every path alike; the median over `--runs` runs is reported.

    python benchmarks/runtime_overhead.py [--device cpu|cuda] [--programs overhead|host|all] [--json out.json]
                                          [--keep DIR] [--runs 41] [--calls 20] [--threads N] [--only TEXT]
                                          [--no-cuda-graphs] [--no-torchscript-fuser]

--keep saves each workload's package and frozen TorchScript file in DIR, for `j2t-run PKG --torchscript PT`, which
times the C++ runtime against torch::jit::load with no Python in the process.
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
from gpu_bench import cuda_time_us, extra_workloads  # noqa: E402
from host_programs import HOST_PROGRAMS, Program  # noqa: E402
from workloads import WORKLOADS, Workload  # noqa: E402


def bert_1x9() -> Workload:
    bert = extra_workloads().get("BERT base 1x9")
    if bert is not None:
        return bert
    print("timing the BERT-like layer 1x9x768 instead of BERT base 1x9")
    layer = WORKLOADS["BERT-like layer 8x128x768"]
    return Workload("BERT-like layer 1x9x768", lambda dev, dt: (layer.build(dev, dt)[0],
                                                               (torch.randn(1, 9, 768, device=dev, dtype=dt),)))


def wall_us(fn, inputs, device: str, calls: int = 200, runs: int = 15) -> float:
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(20):
        fn(*inputs)
    sync()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        for _ in range(calls):
            fn(*inputs)
        sync()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def measure(workload: Workload, device: str, folder: str, keep: str = "") -> dict:
    torch.manual_seed(0)
    with torch.no_grad():
        model, inputs = workload.build(device, torch.float32)
        traced = torch.jit.freeze(torch.jit.trace(model.eval(), inputs))
        path = os.path.join(folder, "model.j2t")
        jit2triton.convert(traced, example_inputs=inputs, device=device).save(path)
        if keep:
            stem = os.path.join(keep, workload.name.split()[0].replace("+", "_"))
            traced.save(stem + ".pt")
            with open(path, "rb") as src, open(stem + ".j2t", "wb") as dst:
                dst.write(src.read())
        paths = {"torch.jit": lambda: traced, "jit2triton cpp": lambda: jit2triton.load(path)}
        expected = traced(*inputs)
        row = {"workload": workload.name}
        for name, make in paths.items():
            start = time.perf_counter()
            fn = make()
            load_ms = (time.perf_counter() - start) * 1e3
            got = fn(*inputs)
            error = (got.float() - expected.float()).abs().max().item()
            row[name] = {"wall_us": wall_us(fn, inputs, device), "max_abs_error": error,
                         "load_ms": None if name == "torch.jit" else load_ms}
            if device == "cuda":
                row[name]["event_us"] = cuda_time_us(fn, inputs, 300)[0]
        return row


def max_error(got, want) -> float:
    """Largest absolute difference over a nested output; inf where the structure differs."""
    if isinstance(want, torch.Tensor):
        if not isinstance(got, torch.Tensor) or got.shape != want.shape:
            return float("inf")
        return (got.double() - want.double()).abs().max().item() if want.numel() else 0.0
    if isinstance(want, (list, tuple)):
        if not isinstance(got, (list, tuple)) or len(got) != len(want):
            return float("inf")
        return max([max_error(g, w) for g, w in zip(got, want)] or [0.0])
    return 0.0 if got == want else float("inf")


def interleaved_wall_us(paths: dict, program: Program, device: str, runs: int, calls: int) -> dict:
    """Median wall time per call of each path, the paths taking turns run by run."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    times: dict = {label: [] for label in paths}
    for turn in range(runs + 2):  # the first two turns warm up (TorchScript's profiling executor optimises then)
        for label, fn in paths.items():
            if program.reset:
                getattr(fn, program.reset)()
            sync()
            start = time.perf_counter()
            for _ in range(calls):
                fn(*program.inputs)
            sync()
            if turn >= 2:
                times[label].append((time.perf_counter() - start) / calls * 1e6)
    return {label: statistics.median(t) for label, t in times.items()}


def steps_per_call(loaded, program: Program) -> int:
    """How many plan steps one call runs (each control-flow step and each step inside it, every time it runs), from
    the C++ runtime's step timers: the same count serves TorchScript's interpreter, one node per step."""
    if program.reset:
        getattr(loaded, program.reset)()
    loaded._runtime.set_profiling(True)
    loaded(*program.inputs)
    steps = sum(runs for _node, _seconds, runs in loaded._runtime.step_times())
    loaded._runtime.set_profiling(False)
    return steps


def measure_host_program(name: str, device: str, folder: str, runs: int, calls: int, cuda_graphs: bool = True) -> dict:
    with torch.no_grad():
        program = HOST_PROGRAMS[name](device)
        path = os.path.join(folder, "program.j2t")
        converted = jit2triton.convert(program.model, program.example, device=device)
        converted.save(path)
        nodes = converted.summary()
        paths = {"torch.jit": program.model, "jit2triton cpp": jit2triton.load(path, cuda_graphs=cuda_graphs)}
        row = {"workload": name, "kernel_nodes": nodes["native_nodes"], "host_nodes": nodes["host_nodes"],
               "aten_nodes": nodes["fallback_nodes"] + nodes["extern_nodes"],
               "steps": steps_per_call(jit2triton.load(path), program)}
        for label, fn in paths.items():
            if program.reset:
                getattr(fn, program.reset)()
        expected = program.model(*program.inputs)
        for label, fn in paths.items():
            row[label] = {"max_abs_error": max_error(fn(*program.inputs), expected)} if label != "torch.jit" else {}
        for label, us in interleaved_wall_us(paths, program, device, runs, calls).items():
            row[label]["wall_us"] = us
        return row


def print_host_table(rows: list) -> None:
    print("\n| program | kernel / host / ATen nodes | steps per call | torch.jit | jit2triton cpp "
          "| µs per step: torch.jit / cpp | cpp vs torch.jit |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        jit, cpp = (row[p]["wall_us"] for p in ("torch.jit", "jit2triton cpp"))
        steps = max(row["steps"], 1)
        print(f"| {row['workload']} | {row['kernel_nodes']} / {row['host_nodes']} / {row['aten_nodes']} | "
              f"{row['steps']} | {jit:.1f} | {cpp:.1f} | {jit / steps:.3f} / {cpp / steps:.3f} | {jit / cpp:.2f}x |")
    for row in rows:
        if row["jit2triton cpp"]["max_abs_error"] > 1e-4:
            print(f"{row['workload']}: outputs differ from TorchScript's: {row['jit2triton cpp']['max_abs_error']}")


def print_overhead_table(rows: list, name: str, device: str) -> None:
    print(f"\n{name}, torch {torch.__version__}: microseconds per call (back-to-back wall"
          f"{'; CUDA events of one call' if device == 'cuda' else ''})\n")
    paths = ["torch.jit", "jit2triton cpp"]
    print("| workload | " + " | ".join(paths) + " | cpp vs torch.jit |")
    print("|---|" + "---|" * (len(paths) + 1))
    for row in rows:
        cells = []
        for p in paths:
            cell = f"{row[p]['wall_us']:.1f}"
            if "event_us" in row[p]:
                cell += f" ({row[p]['event_us']:.1f})"
            cells.append(cell)
        ratio_jit = row["torch.jit"]["wall_us"] / row["jit2triton cpp"]["wall_us"]
        print(f"| {row['workload']} | " + " | ".join(cells) + f" | {ratio_jit:.2f}x |")
    for row in rows:
        print(f"{row['workload']}: load ms {row['jit2triton cpp']['load_ms']:.1f}; max abs error "
              f"{row['jit2triton cpp']['max_abs_error']:.2e}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json")
    parser.add_argument("--keep", default="")
    parser.add_argument("--programs", choices=["overhead", "host", "all"], default="all")
    parser.add_argument("--runs", type=int, default=41, help="host programs: timed turns per path")
    parser.add_argument("--calls", type=int, default=20, help="host programs: calls per turn")
    parser.add_argument("--threads", type=int, default=0, help="torch's CPU threads (0: torch's default)")
    parser.add_argument("--only", default="", help="host programs whose names contain this text")
    parser.add_argument("--no-cuda-graphs", action="store_true",
                        help="host programs: load the packages with cuda_graphs=False (their regions step by step)")
    parser.add_argument("--no-torchscript-fuser", action="store_true",
                        help="TorchScript without its fuser (NNC fuses pointwise runs on CUDA): what its interpreter "
                             "alone costs per node")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.no_torchscript_fuser:
        torch._C._jit_set_texpr_fuser_enabled(False)
    from jit2triton.deploy.cpp_runtime import extension
    extension()  # built (or found in the cache) before anything is timed
    rows, host_rows = [], []
    with tempfile.TemporaryDirectory() as folder:
        if args.programs in ("overhead", "all"):
            for workload in (WORKLOADS["sin+cos 0-d"], bert_1x9()):
                rows.append(measure(workload, args.device, folder, args.keep))
        if args.programs in ("host", "all"):
            for program in (p for p in HOST_PROGRAMS if args.only in p):
                host_rows.append(measure_host_program(program, args.device, folder, args.runs, args.calls,
                                                      cuda_graphs=not args.no_cuda_graphs))
                print_host_table(host_rows[-1:])  # as it comes, so a run cut short still says something
                sys.stdout.flush()
    threads = torch.get_num_threads()
    name = torch.cuda.get_device_name() if args.device == "cuda" else f"CPU, {threads} thread{'s' if threads != 1 else ''}"
    if host_rows:
        print(f"\n{name}, torch {torch.__version__}: host programs, microseconds per call (wall, median of "
              f"{args.runs} interleaved turns of {args.calls} calls){'; packages without CUDA graphs' * args.no_cuda_graphs}"
              f"{'; TorchScript without its fuser' * args.no_torchscript_fuser}")
        print_host_table(host_rows)
    if rows:
        print_overhead_table(rows, name, args.device)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "torch": torch.__version__, "rows": rows, "host_programs": host_rows}, f,
                      indent=1)


if __name__ == "__main__":
    main()
