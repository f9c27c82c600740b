"""On the GPU machine: one BERT-base package (batch 1-32, sequence 8-512) and one resnet18 package (batch 1-64),
each converted once with dynamic dims for CUDA, served at the ranges' ends and at random sizes inside them from
Python (the C++ runtime's extension) and `j2t-run --shape`, against TorchScript on fresh inputs; sizes outside the
ranges must be refused with an InputError (and by j2t-run with its message). Not collected by pytest: it needs
transformers and torchvision on a CUDA machine.

    python tests/gpu_dynamic_models.py [--j2t-run path/to/j2t-run] [--sizes 5]
"""
from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import jit2triton  # noqa: E402
from jit2triton import Dim, InputError  # noqa: E402
from jit2triton.inputs import random_inputs  # noqa: E402
from dynamic_bench import bert_base, bert_inputs, resnet18  # noqa: E402
from helpers import FRESH_SEED, assert_close_on_gpu  # noqa: E402

# name -> (model, example inputs, dims (name, min, max), dynamic_shapes for those Dims, a size outside the ranges)
CASES = {
    "bert-base": (bert_base, lambda: bert_inputs((4, 64), "cuda"), [("B", 1, 32), ("S", 8, 512)],
                  lambda b, s: [{0: b, 1: s}, {0: b, 1: s}], {"B": 2, "S": 513}),
    "resnet18": (resnet18, lambda: (torch.randn(8, 3, 224, 224, device="cuda"),), [("B", 1, 64)],
                 lambda b: [{0: b}], {"B": 65}),
}


def sizes_to_try(dims: list, count: int, rng: random.Random) -> list[dict]:
    ends = [{n: lo for n, lo, _ in dims}, {n: hi for n, _, hi in dims}]
    return ends + [{n: rng.randint(lo, hi) for n, lo, hi in dims} for _ in range(count)]


def check(name: str, count: int, j2t_run: str, folder: str) -> None:
    build, example, dims, dynamic_shapes, outside = CASES[name]
    torch.manual_seed(0)
    model = build("cuda")
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        inputs = example()
        traced = torch.jit.freeze(torch.jit.trace(model, inputs, check_trace=False))
        started = time.perf_counter()
        converted = jit2triton.convert(traced, inputs, device="cuda",
                                       dynamic_shapes=dynamic_shapes(*(Dim(n, min=lo, max=hi) for n, lo, hi in dims)))
        print(f"{name}: converted in {time.perf_counter() - started:.1f} s; {len(converted.summary()['kernels'])} "
              f"kernels, removed by verification: {converted.summary()['verification']['kernels_removed']}")
        # a kernel taken out keeps the answers right but hides a bug (a BERT once lost every kernel this way)
        assert converted.summary()["verification"]["kernels_removed"] == [], f"{name}: kernels were taken out"
        path = os.path.join(folder, f"{name}.j2t")
        converted.save(path)
        runtimes = {"cpp": jit2triton.load(path)}
        signature = converted.manifest["signature"]["inputs"]
        rng = random.Random(FRESH_SEED)
        for k, sizes in enumerate(sizes_to_try(dims, count, rng)):
            seed = FRESH_SEED + k
            fresh = random_inputs(signature, "cpu", seed, sizes)
            expected = traced(*[x.cuda() for x in fresh])
            expected = tuple(e.cpu() for e in expected) if isinstance(expected, tuple) else expected.cpu()
            for label, module in runtimes.items():
                for _ in range(3):  # the third call replays the CUDA graph captured for this shape
                    actual = module(*[x.cuda() for x in fresh])
                    actual = tuple(a.cpu() for a in actual) if isinstance(actual, tuple) else actual.cpu()
                    assert_close_on_gpu(actual, expected, f"{name} {label} runtime at {sizes}")
            if j2t_run:
                shape = ",".join(f"{n}={v}" for n, v in sizes.items())
                done = subprocess.run([j2t_run, path, "--shape", shape, "--seed", str(seed), "--dump", folder],
                                      capture_output=True, text=True)
                assert done.returncode == 0, done.stderr
                first = expected[0] if isinstance(expected, tuple) else expected
                raw = np.fromfile(os.path.join(folder, "output_0.bin"), dtype=np.float32)
                assert_close_on_gpu(torch.from_numpy(raw).reshape(first.shape), first, f"{name} j2t-run at {sizes}")
            print(f"{name}: {sizes} matches TorchScript (python, cpp{', j2t-run' if j2t_run else ''})")
        bad = random_inputs(signature, "cpu", 1, outside)
        for label, module in runtimes.items():
            try:
                module(*[x.cuda() for x in bad])
            except InputError as err:
                print(f"{name}: {label} runtime refuses {outside}: {err}")
            else:
                raise AssertionError(f"{name}: the {label} runtime accepted {outside}")
        if j2t_run:
            shape = ",".join(f"{n}={v}" for n, v in outside.items())
            done = subprocess.run([j2t_run, path, "--shape", shape], capture_output=True, text=True)
            assert done.returncode != 0 and "range" in done.stderr, done.stderr
            print(f"{name}: j2t-run refuses {outside}: {done.stderr.strip().splitlines()[-1]}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--j2t-run", default="", help="the j2t-run binary (CMake build); skipped when not given")
    parser.add_argument("--sizes", type=int, default=5, help="random sizes per model, besides the ranges' ends")
    parser.add_argument("--only", help="one of: " + ", ".join(CASES))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        for name in CASES:
            if not args.only or name == args.only:
                check(name, args.sizes, args.j2t_run, folder)
    print("all dynamic-model checks passed")


if __name__ == "__main__":
    main()
