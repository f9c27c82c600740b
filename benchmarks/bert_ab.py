"""BERT base 1x9 packages with and without one conversion switch, timed in one process in turns: what a change
saves on a launch-bound model. A switch is an environment variable conversion reads, set to 1 and to 0: by default
JIT2TRITON_PDL (programmatic dependent launch, emitters/dependent_launch.py). Each dtype's model is traced on the
GPU, converted twice by the CLI, both packages loaded and checked against TorchScript, then `--rounds` rounds of
`--calls` calls back to back each, the order alternating by round, under inference mode; median us a call, and
each package's kernels.

    python benchmarks/bert_ab.py [--switch JIT2TRITON_PDL] [--dtypes float32,float16] [--rounds 30] [--calls 100]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
import jit2triton  # noqa: E402
from dynamic_bench import bert_base  # noqa: E402
from package_tools import manifest_of  # noqa: E402


def packages(folder: str, dtype: str, switch: str) -> tuple[str, dict[str, str]]:
    """The traced model's path and each setting's package path."""
    with torch.no_grad():
        ids = torch.randint(0, 30522, (1, 9), device="cuda")
        model = bert_base("cuda").to(getattr(torch, dtype))
        traced = os.path.join(folder, f"bert_{dtype}.pt")
        torch.jit.save(torch.jit.trace(model, (ids, torch.ones_like(ids))), traced)
    made = {}
    for on in ("1", "0"):
        made[on] = os.path.join(folder, f"bert_{dtype}_{on}.j2t")
        subprocess.run([sys.executable, "-m", "jit2triton.cli", "convert", traced, "--input", "1x9:int64:0-30522",
                        "--input", "1x9:int64:1-2", "--device", "cuda", "--quiet", "-o", made[on]],
                       env={**os.environ, switch: on}, check=True)
    return traced, made


def first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--switch", default="JIT2TRITON_PDL", help="the environment variable to set to 1, then 0")
    p.add_argument("--dtypes", default="float32,float16")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--calls", type=int, default=100)
    a = p.parse_args()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    with tempfile.TemporaryDirectory() as folder:
        for dtype in a.dtypes.split(","):
            traced, paths = packages(folder, dtype, a.switch)
            for on, path in paths.items():
                entries = manifest_of(path)["triton"]["kernels"].values()
                print(f"{dtype}, {a.switch}={on}: {len(entries)} kernels, "
                      f"{sum(bool(e.get('pdl')) for e in entries)} launched with PDL")
            ids = torch.randint(0, 30522, (1, 9), device="cuda")
            mask = torch.ones_like(ids)
            reference = torch.jit.load(traced)
            loaded = {on: jit2triton.load(path) for on, path in paths.items()}
            times: dict[str, list[float]] = {on: [] for on in loaded}
            with torch.inference_mode():
                want = first(reference(ids, mask)).float()
                for on, package in loaded.items():
                    got = first(package(ids, mask)).float()
                    error = (got - want).abs().max().item()
                    print(f"  {a.switch}={on}: max abs difference from TorchScript {error:.3g}")
                    for _ in range(50):
                        package(ids, mask)
                for r in range(a.rounds):
                    for on in (("1", "0") if r % 2 else ("0", "1")):
                        torch.cuda.synchronize()
                        started = time.perf_counter()
                        for _ in range(a.calls):
                            loaded[on](ids, mask)
                        torch.cuda.synchronize()
                        times[on].append((time.perf_counter() - started) / a.calls * 1e6)
            for on in loaded:
                print(f"  {a.switch}={on}: median {statistics.median(times[on]):.1f} us a call back to back "
                      f"(min {min(times[on]):.1f})")


if __name__ == "__main__":
    main()
