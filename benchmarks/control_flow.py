"""A model with a loop on the GPU: CUDA graph regions against step-by-step runs and the peers, in one process.

The workload is a scripted recurrent decoder (tests/models.py's, wider): a `for` loop over `steps` whose body is a
GRU-like cell, a LayerNorm and an output projection, appending each step's output to a list. Its plan cannot run as
one CUDA graph (the loop), so the loop body runs as a graph region, replayed once per iteration.

Paths: eager, torch.jit (scripted, frozen), torch.compile (default and reduce-overhead, which unroll the loop for
the given `steps`), jit2triton's C++ runtime with regions (the default) and with `cuda_graphs=False`, and the
Python reference runtime (no graphs). Per path: the output checked against eager, then the median CUDA-event time per call after warm-up,
the paths taking turns.

    python benchmarks/control_flow.py [--dim 256] [--batch 8] [--steps 32] [--runs 100] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
import jit2triton  # noqa: E402
from gpu_bench import interleaved_us  # noqa: E402
from models import RecurrentDecoder  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--skip-compile", action="store_true")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = RecurrentDecoder(args.dim).cuda().eval()
    inputs = (torch.randn(args.batch, 16, args.dim, device="cuda"), args.steps)
    folder = tempfile.mkdtemp()
    with torch.no_grad():
        expected = model(*inputs)
        scripted = torch.jit.freeze(torch.jit.script(model))
        package = os.path.join(folder, "decoder.j2t")
        jit2triton.convert(scripted, example_inputs=inputs, device="cuda").save(package)
        paths = {"eager": model, "torch.jit": scripted}
        if not args.skip_compile:
            paths["compile"] = torch.compile(model)
            paths["compile-ro"] = torch.compile(model, mode="reduce-overhead")
        paths["j2t cpp, regions"] = jit2triton.load(package, runtime="cpp")
        paths["j2t cpp, no graphs"] = jit2triton.load(package, runtime="cpp", cuda_graphs=False)
        errors = {label: (fn(*inputs) - expected).abs().max().item() for label, fn in paths.items()}
        times = interleaved_us(paths, inputs, args.runs)
        rows = [{"path": label, "us": times[label], "max error": errors[label]} for label in paths]
    summary = jit2triton.load(package).summary()
    print(f"recurrent decoder, dim {args.dim}, batch {args.batch}, {args.steps} steps on "
          f"{torch.cuda.get_device_name()}; {len(summary['kernels'])} kernels, {summary['fallback_nodes']} fallbacks")
    best_ours = min(r["us"] for r in rows if r["path"].startswith("j2t"))
    print("| path | us per call | ours (best) vs it | max error |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['path']} | {r['us']:.1f} | {r['us'] / best_ours:.2f}x | {r['max error']:.1e} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
