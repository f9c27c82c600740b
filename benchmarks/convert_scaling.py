"""How conversion time grows with depth, per pass, on the CPU (C++ backend): a DenseNet-style dense block (every
layer BN-ReLU-conv1x1-BN-ReLU-conv3x3 over the concatenation of all earlier features) at growing depth, a chain of
N pointwise+cat layers, and DenseNet-121 written out. A pass whose seconds grow faster than the model is the one to
fix; each pass's seconds come from the conversion report (`summary()["pass_seconds"]`).

    python benchmarks/convert_scaling.py [--quick] [--only dense,chain,densenet121] [--threads 1] [--json out.json]

Prints one table per model family: a row per depth, a column per pass (seconds), the total, the kernels generated
and the distinct C++ kernel bodies they compile to.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(__file__))
import jit2triton  # noqa: E402
from workloads import DenseBlock, DenseNet  # noqa: E402


class CatChain(nn.Module):
    """N layers, each appending a pointwise function of the newest `width` channels to the running tensor:
    h = cat([h, relu(h[:, -width:] * scale_i + shift_i)], 1). One kernel a layer, each at a new channel count."""

    def __init__(self, layers: int, width: int = 4) -> None:
        super().__init__()
        self.width = width
        self.scale = nn.Parameter(torch.randn(layers, 1, width, 1, 1))
        self.shift = nn.Parameter(torch.randn(layers, 1, width, 1, 1))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        for scale, shift in zip(self.scale, self.shift):
            h = torch.cat([h, torch.relu(h[:, -self.width:] * scale + shift)], 1)
        return h


def dense_block(depth: int) -> tuple[nn.Module, tuple]:
    return DenseBlock(depth, 16, 8).eval(), (torch.randn(1, 16, 16, 16),)


def cat_chain(layers: int) -> tuple[nn.Module, tuple]:
    return CatChain(layers).eval(), (torch.randn(1, 4, 8, 8),)


def densenet121(_: int) -> tuple[nn.Module, tuple]:
    return DenseNet().eval(), (torch.randn(1, 3, 224, 224),)


FAMILIES = {  # name -> (builder, depths, quick depths)
    "dense": (dense_block, (6, 12, 24, 48), (6, 12, 24)),
    "chain": (cat_chain, (125, 250, 500, 1000), (50, 100, 200)),
    "densenet121": (densenet121, (121,), ()),
}


def convert(model: nn.Module, example: tuple) -> dict:
    """One conversion with an empty kernel cache (what a new machine pays) -> its total and per-pass seconds, and
    what it built."""
    os.environ["JIT2TRITON_CACHE"] = tempfile.mkdtemp()
    with torch.no_grad():
        traced = torch.jit.trace(model, example, check_trace=False)
    started = time.perf_counter()
    converted = jit2triton.convert(traced, example_inputs=example, device="cpu")
    total = time.perf_counter() - started
    summary = converted.summary()
    with torch.no_grad():
        error = (converted(*example) - traced(*example)).abs().max().item()
    return {"total": total, "passes": summary["pass_seconds"], "kernels": len(summary["kernels"]),
            "bodies": converted.manifest.get("cpp", {}).get("bodies", 0), "max_abs_error": error,
            "verification": summary["verification"]["status"]}


def print_table(family: str, rows: list[tuple[int, dict]]) -> None:
    passes = list(dict.fromkeys(name for _, row in rows for name in row["passes"]))
    shown = [p for p in passes if max(row["passes"].get(p, 0.0) for _, row in rows) >= 0.05]
    head = f"{family:>11s} {'depth':>6s} " + " ".join(f"{p[:12]:>12s}" for p in shown)
    print(head + f" {'other':>7s} {'total s':>8s} {'kernels':>8s} {'bodies':>7s}")
    for depth, row in rows:
        other = row["total"] - sum(row["passes"].get(p, 0.0) for p in shown)
        cells = " ".join(f"{row['passes'].get(p, 0.0):12.2f}" for p in shown)
        print(f"{'':11s} {depth:6d} {cells} {other:7.2f} {row['total']:8.2f} {row['kernels']:8d} {row['bodies']:7d}",
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="smaller depths (a minute or so)")
    parser.add_argument("--only", default="dense,chain,densenet121", help="families, comma-separated")
    parser.add_argument("--json", help="write every row here")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch's threads (default: torch's choice). On a CPU shared past its cores, 1 keeps "
                             "OpenMP's waits for a descheduled thread out of every ATen call the conversion makes")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    if args.threads:
        torch.set_num_threads(args.threads)
    results = {}
    for family in args.only.split(","):
        build, depths, quick = FAMILIES[family]
        rows = []
        for depth in (quick if args.quick else depths):
            torch.manual_seed(0)
            rows.append((depth, convert(*build(depth))))
        if rows:
            print_table(family, rows)
            results[family] = {depth: row for depth, row in rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
