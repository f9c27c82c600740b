"""On the GPU machine: the programs of tests/test_call_sequences.py (a cache grown by `cat` with a reset method, a
streaming list of state tensors, a loop count given as an input, flat ids with offsets of varying length),
converted for CUDA and called over sequences of fresh inputs in the runtime beside TorchScript on the GPU; then
the stateful fuzzer's programs for CUDA. Prints one line per program, and exits non-zero on a mismatch.
Under `compute-sanitizer --tool memcheck` it is the memory-safety run of issue 43.

    python tests/gpu_call_sequences.py [--fuzz-seeds 20]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(__file__))

import jit2triton  # noqa: E402
from fuzz_stateful import failure_of  # noqa: E402
from jit2triton.verify import compare  # noqa: E402
from call_programs import Bag, KVCache, LoopN, Streaming  # noqa: E402

CUDA = torch.device("cuda")


def calls(name: str, generator: torch.Generator) -> list[tuple[str, tuple]]:
    """(method, inputs) for each call of the sequence a program is checked over."""
    def randn(*shape):
        return torch.randn(*shape, generator=generator).to(CUDA)
    if name == "kv_cache":
        return [(m, (randn(1, 1, 16),) if m == "forward" else ())
                for m in ["forward"] * 3 + ["reset"] + ["forward"] * 4]
    if name == "streaming":
        return [("forward", (randn(4, 8),)) for _ in range(7)]
    if name == "loop_n":
        return [("forward", (randn(2, 4), n)) for n in (1, 9, 5, 3, 12, 2)]
    out = []
    for count in (10, 8, 12, 40, 64, 7):
        offsets = torch.sort(torch.randint(0, count, (3,), generator=generator)).values
        offsets[0] = 0
        out.append(("forward", (torch.randint(0, 50, (count,), generator=generator).to(CUDA), offsets.to(CUDA))))
    return out


PROGRAMS = {
    "kv_cache": (KVCache, lambda: {"forward": (torch.randn(1, 1, 16, device=CUDA),), "reset": ()}, {}),
    "streaming": (Streaming, lambda: (torch.randn(4, 8, device=CUDA),), {}),
    "loop_n": (LoopN, lambda: (torch.randn(2, 4, device=CUDA), 5), {}),
    "bag": (Bag, lambda: (torch.randint(0, 50, (10,), device=CUDA), torch.tensor([0, 3, 7], device=CUDA)),
            {"dynamic_shapes": {"ids": {0: jit2triton.Dim("ids", min=7, max=64)}}}),
}


def check_program(name: str, folder: str) -> str:
    model_class, examples, options = PROGRAMS[name]
    torch.manual_seed(0)
    model = model_class().eval().to(CUDA)
    for attribute, value in list(vars(model).items()):  # plain tensor attributes, which .to() leaves on the CPU
        if isinstance(value, torch.Tensor):
            setattr(model, attribute, value.to(CUDA))
        elif isinstance(value, list) and value and all(isinstance(v, torch.Tensor) for v in value):
            setattr(model, attribute, [v.to(CUDA) for v in value])
    converted = jit2triton.convert(torch.jit.script(model), examples(), device="cuda", **options)
    summary = converted.summary()
    path = os.path.join(folder, f"{name}.j2t")
    converted.save(path)
    reference = torch.jit.script(model)
    loaded = jit2triton.load(path)
    bad = []
    for number, (method, inputs) in enumerate(calls(name, torch.Generator().manual_seed(5)), 1):
        got = getattr(loaded, method)(*inputs)
        want = getattr(reference, method)(*inputs)
        mismatches = compare(got, want, slack=10.0)
        if mismatches:
            bad.append(f"call {number} ({method}): {mismatches[0]}")
    return (f"{name} kernels={len(summary['kernels'])} verification={summary['verification']['status']}: "
            + ("ok" if not bad else "MISMATCH " + "; ".join(bad)))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fuzz-seeds", type=int, default=20)
    parser.add_argument("--only", default="", help="comma-separated program names (default: all)")
    args = parser.parse_args(argv)
    failed = 0
    with tempfile.TemporaryDirectory() as folder:
        for name in [n for n in args.only.split(",") if n] or list(PROGRAMS):
            line = check_program(name, folder)
            failed += "ok" not in line.split(": ", 1)[1][:2]
            print(line, flush=True)
    for seed in range(args.fuzz_seeds):
        report = failure_of(seed, backend="triton", device="cuda")
        failed += report is not None
        print(f"stateful fuzz seed {seed}: {report or 'ok'}", flush=True)
    print(f"{failed} failures")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
