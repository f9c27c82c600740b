"""Dynamic shapes benchmark: one package converted with dynamic dims, timed at several sizes against a static
package converted at each size, torch.jit (traced at one size, run at all) and torch.compile(dynamic=True).

All in one process, same inputs; every path's output is checked against eager first. Median of many runs after
warm-up (CUDA: synchronised). Prints a table of milliseconds and ratios, and writes JSON.

    python benchmarks/dynamic_bench.py [--device cpu|cuda] [--quick] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Callable

import torch

sys.path.insert(0, os.path.dirname(__file__))
import jit2triton  # noqa: E402
from workloads import EncoderLayer, MLPBlock  # noqa: E402

@dataclass
class Case:
    build: Callable[[str], torch.nn.Module]  # device -> eager model (eval)
    inputs: Callable[[tuple, str], tuple]  # (sizes, device) -> fresh inputs at those sizes
    dims: list  # (name, min, max), in the order of `sizes`
    dynamic_shapes: Callable[[list], object]  # the Dims -> convert's dynamic_shapes
    example: tuple
    sizes: list  # sizes to time


def hidden_input(width: int) -> Callable[[tuple, str], tuple]:
    return lambda size, device: (torch.randn(*size, width, device=device),)


class TupleOutputs(torch.nn.Module):
    """A transformers model called as a deployed one is: positional tensors in, a tuple out."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids, attention_mask=attention_mask, return_dict=False)


def bert_base(device: str) -> torch.nn.Module:
    from transformers import BertConfig, BertModel  # random weights: the speed does not depend on them
    return TupleOutputs(BertModel(BertConfig(attn_implementation="eager"))).to(device).eval()


def bert_inputs(size: tuple, device: str) -> tuple:
    batch, seq = size
    ids = torch.randint(0, 30522, (batch, seq), device=device)
    mask = torch.ones(batch, seq, dtype=torch.int64, device=device)
    mask[:, seq - seq // 4:] = 0  # padded tails, as a batch of unequal sentences has
    return ids, mask


def resnet18(device: str) -> torch.nn.Module:
    import torchvision
    return torchvision.models.resnet18().to(device).eval()


CASES = {
    "BERT-like layer (B, S, 768)": Case(lambda d: EncoderLayer(768, 12).to(d).eval(), hidden_input(768),
                                        [("B", 1, 32), ("S", 8, 512)], lambda d: {"x": {0: d[0], 1: d[1]}}, (2, 16),
                                        [(1, 16), (2, 16), (4, 64), (8, 128)]),
    "MLP+LayerNorm (B, S, 1024)": Case(lambda d: MLPBlock(1024).to(d).eval(), hidden_input(1024),
                                       [("B", 1, 32), ("S", 1, 512)], lambda d: {"x": {0: d[0], 1: d[1]}}, (2, 16),
                                       [(1, 8), (2, 16), (4, 128), (8, 256)]),
    "BERT-base (transformers)": Case(bert_base, bert_inputs, [("B", 1, 32), ("S", 8, 512)],
                                     lambda d: [{0: d[0], 1: d[1]}, {0: d[0], 1: d[1]}], (4, 64),
                                     [(1, 8), (4, 64), (8, 128), (32, 512)]),
    "resnet18 (torchvision)": Case(resnet18, lambda size, device: (torch.randn(size[0], 3, 224, 224, device=device),),
                                   [("B", 1, 64)], lambda d: [{0: d[0]}], (8,), [(1,), (8,), (32,), (64,)]),
}
GPU_ONLY = {"BERT-base (transformers)", "resnet18 (torchvision)"}  # torchvision needs a CUDA torch here
QUICK_SIZES = 2


def timeit(fn, inputs, device: str, min_runs: int = 10, min_seconds: float = 0.5) -> float:
    for _ in range(3):
        fn(*inputs)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    times = []
    start = time.perf_counter()
    while len(times) < min_runs or time.perf_counter() - start < min_seconds:
        if device == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            fn(*inputs)
            end.record()
            end.synchronize()
            times.append(begin.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn(*inputs)
            times.append((time.perf_counter() - t0) * 1e3)
        if len(times) >= 500:
            break
    return statistics.median(times)


def convert_saved(model, inputs, folder: str, name: str, device: str, **options):
    path = os.path.join(folder, f"{name}.pt")
    torch.jit.save(torch.jit.trace(model, inputs), path)
    package = os.path.join(folder, f"{name}.j2t")
    jit2triton.convert(path, example_inputs=inputs, device=device, **options).save(package)
    return jit2triton.load(package)


def first(out):
    """The first tensor of a model's output (BERT returns a tuple)."""
    return out[0] if isinstance(out, (tuple, list)) else out


def run_case(name: str, device: str, quick: bool) -> list[dict]:
    case = CASES[name]
    sizes = case.sizes[:QUICK_SIZES] if quick else case.sizes
    torch.manual_seed(0)
    model = case.build(device)
    rows = []
    with torch.no_grad(), tempfile.TemporaryDirectory() as folder:
        dims = [jit2triton.Dim(n, min=lo, max=hi) for n, lo, hi in case.dims]
        started = time.perf_counter()
        dynamic = convert_saved(model, case.inputs(case.example, device), folder, "dynamic", device,
                                dynamic_shapes=case.dynamic_shapes(dims))
        dynamic_convert = time.perf_counter() - started
        traced = torch.jit.freeze(torch.jit.trace(model, case.inputs(case.example, device)))
        paths = {"dynamic package": dynamic, "torch.jit": traced,
                 "torch.compile(dynamic)": torch.compile(model, dynamic=True)}
        if device == "cuda":
            paths["reduce-overhead(dynamic)"] = torch.compile(model, dynamic=True, mode="reduce-overhead")
        for size in sizes:
            inputs = case.inputs(size, device)
            expected = first(model(*inputs))
            runs = {"static package": convert_saved(model, inputs, folder, "static", device), **paths}
            for label, fn in runs.items():
                torch.testing.assert_close(first(fn(*inputs)), expected, rtol=2e-3, atol=2e-3,
                                           msg=lambda m: f"{label} at {size}: {m}")
            times = {label: timeit(fn, inputs, device) for label, fn in runs.items()}
            rows.append({"case": name, "size": ", ".join(f"{d[0]}={n}" for d, n in zip(case.dims, size)),
                         "example": tuple(size) == tuple(case.example), "ms": times,
                         "dynamic_convert_s": round(dynamic_convert, 2)})
            print_row(rows[-1])
    return rows


HEADER = f"{'case':30s} {'size':14s} {'static':>9s} {'dynamic':>9s} {'jit':>9s} {'compile':>9s} {'red.-ovh':>9s}  " \
         f"{'dyn/static':>10s} {'compile/dyn':>11s} {'r-o/dyn':>8s} {'jit/dyn':>8s}"


def print_row(row: dict) -> None:
    t = row["ms"]
    dyn = t["dynamic package"]
    mark = "*" if row["example"] else " "
    overhead = t.get("reduce-overhead(dynamic)", float("nan"))
    print(f"{row['case']:30s} {row['size'] + mark:14s} {t['static package']:9.3f} {dyn:9.3f} {t['torch.jit']:9.3f} "
          f"{t['torch.compile(dynamic)']:9.3f} {overhead:9.3f}  {dyn / t['static package']:10.2f} "
          f"{t['torch.compile(dynamic)'] / dyn:11.2f} {overhead / dyn:8.2f} {t['torch.jit'] / dyn:8.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--quick", action="store_true", help=f"only the first {QUICK_SIZES} sizes of each case")
    parser.add_argument("--only", help="run one case (a prefix of its name); BERT-base and resnet18 run only on "
                        "CUDA unless named here")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, device {args.device}, {torch.get_num_threads()} threads; ms, median; "
          "* = the dynamic package's example size; ratios > 1 favour the dynamic package except dyn/static")
    print(HEADER)
    rows = []
    for name in CASES:
        if args.only and not name.startswith(args.only):
            continue
        if name in GPU_ONLY and args.device != "cuda" and not args.only:
            continue
        rows += run_case(name, args.device, args.quick)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
