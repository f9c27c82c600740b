"""Per-call overhead of the runtimes, side by side in one process: torch.jit (traced, frozen, warmed up), our
Python runtime and our C++ runtime (`jit2triton.load(..., runtime="cpp")`), on a tiny model (sin+cos of a 0-d
tensor, where the call is all overhead) and on BERT base at batch 1 x seq 9 (transformers; a BERT-like layer
when transformers is missing).

Per path: back-to-back wall time per call (median over runs of 200 calls; on CUDA synchronised at the end of each
run) and, on CUDA, the CUDA-event time of a single call (median of many). Also the load time of each runtime.

    python benchmarks/runtime_overhead.py [--device cpu|cuda] [--json out.json] [--keep DIR]

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
        paths = {"torch.jit": lambda: traced}
        for runtime in ("python", "cpp"):
            paths[f"jit2triton {runtime}"] = (lambda r=runtime: jit2triton.load(path, runtime=r))
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json")
    parser.add_argument("--keep", default="")
    args = parser.parse_args()
    from jit2triton.deploy.cpp_runtime import extension
    extension()  # built (or found in the cache) before anything is timed
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for workload in (WORKLOADS["sin+cos 0-d"], bert_1x9()):
            rows.append(measure(workload, args.device, folder, args.keep))
    name = torch.cuda.get_device_name() if args.device == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"\n{name}, torch {torch.__version__}: microseconds per call (back-to-back wall"
          f"{'; CUDA events of one call' if args.device == 'cuda' else ''})\n")
    paths = ["torch.jit", "jit2triton python", "jit2triton cpp"]
    print("| workload | " + " | ".join(paths) + " | cpp vs python | cpp vs torch.jit |")
    print("|---|" + "---|" * (len(paths) + 2))
    for row in rows:
        cells = []
        for p in paths:
            cell = f"{row[p]['wall_us']:.1f}"
            if "event_us" in row[p]:
                cell += f" ({row[p]['event_us']:.1f})"
            cells.append(cell)
        ratio_py = row["jit2triton python"]["wall_us"] / row["jit2triton cpp"]["wall_us"]
        ratio_jit = row["torch.jit"]["wall_us"] / row["jit2triton cpp"]["wall_us"]
        print(f"| {row['workload']} | " + " | ".join(cells) + f" | {ratio_py:.2f}x | {ratio_jit:.2f}x |")
    for row in rows:
        print(f"{row['workload']}: load ms python {row['jit2triton python']['load_ms']:.1f}, "
              f"cpp {row['jit2triton cpp']['load_ms']:.1f}; max abs error python "
              f"{row['jit2triton python']['max_abs_error']:.2e}, cpp {row['jit2triton cpp']['max_abs_error']:.2e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
