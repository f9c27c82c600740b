"""Does programmatic dependent launch (PDL) shorten a CUDA graph of small dependent kernels on this GPU?

A launch-bound plan (BERT at 9 tokens: ~100 kernels of 1-8 us) loses time between kernels: each waits for the one
before to finish, then for its own launch. With PDL (Hopper and later) a kernel is launched while the one before
still runs and waits in `griddepcontrol.wait` (Triton's `gdc_wait`) for it to finish and its writes to be visible;
its launch is hidden behind the earlier kernel's tail. This probe times chains of N dependent kernels (each reads
what the one before wrote) captured in one CUDA graph, GPU us per kernel (events around the replay, so the gaps
count), in four variants:

    plain       the kernel as generated today
    wait        gdc_wait() first in the kernel, launched plainly (the instruction's own cost)
    pdl         gdc_wait() first, launched with PDL
    pdl+early   pdl, and each kernel lets its dependant launch at once (gdc_launch_dependents() first)

    python benchmarks/pdl_probe.py [--kernels 100] [--sizes 6912,262144,4194304]
"""
from __future__ import annotations

import argparse
import statistics

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def step(x, y, n, XBLOCK: tl.constexpr, WAIT: tl.constexpr, EARLY: tl.constexpr):
    if EARLY:
        gdc_launch_dependents()
    if WAIT:
        gdc_wait()
    i = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    m = i < n
    tl.store(y + i, tl.load(x + i, mask=m) * 1.0001 + 1.0, mask=m)


VARIANTS = {"plain": (False, False, False), "wait": (True, False, False), "pdl": (True, False, True),
            "pdl+early": (True, True, True)}


def chain(bufs, n: int, variant: str, kernels: int):
    wait, early, pdl = VARIANTS[variant]
    grid = (triton.cdiv(n, 1024),)
    for i in range(kernels):
        step[grid](bufs[i % 2], bufs[(i + 1) % 2], n, XBLOCK=1024, WAIT=wait, EARLY=early, launch_pdl=pdl,
                   num_warps=4)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--kernels", type=int, default=100)
    p.add_argument("--sizes", default="6912,262144,4194304")
    p.add_argument("--replays", type=int, default=21)
    a = p.parse_args()
    print(f"{torch.cuda.get_device_name()}  triton {triton.__version__}  torch {torch.__version__}")
    for n in map(int, a.sizes.split(",")):
        graphs, want = {}, None
        for variant in VARIANTS:
            print(f"  {n} {variant}", flush=True)
            torch.manual_seed(0)
            bufs = [torch.randn(n, device="cuda"), torch.empty(n, device="cuda")]
            start = bufs[0].clone()
            chain(bufs, n, variant, a.kernels)  # compile, and the answer to check
            torch.cuda.synchronize()
            got = bufs[a.kernels % 2].clone()
            bufs[0].copy_(start)
            if want is None:
                want = got
            same = torch.equal(got, want)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                chain(bufs, n, variant, a.kernels)
            g.replay()  # replayed from the start: the graph's answer too
            bufs[0].copy_(start)
            g.replay()
            torch.cuda.synchronize()
            graphs[variant] = (g, same and torch.equal(bufs[a.kernels % 2], want))
        times = {v: [] for v in graphs}
        for r in range(a.replays):
            for v in list(graphs)[r % 4:] + list(graphs)[:r % 4]:
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                graphs[v][0].replay()
                e.record()
                e.synchronize()
                times[v].append(s.elapsed_time(e) * 1e3 / a.kernels)
        row = "  ".join(f"{v} {statistics.median(t):.2f}{'' if graphs[v][1] else ' WRONG'}" for v, t in times.items())
        print(f"{n:>9} elements, {a.kernels} kernels: us per kernel  {row}", flush=True)


if __name__ == "__main__":
    main()
