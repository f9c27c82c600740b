"""Does prefetching the next GEMM's weights into L2 shorten a launch-bound transformer call on this GPU?

At BERT-base's 9 tokens a layer reads 28 MB of float32 weights in four GEMMs (QKV, output, FFN up and down) with
small kernels between them (attention, residual + LayerNorm). The GEMMs run at ~1 TB/s of the H200's ~4.8: each is
a few microseconds of loads ramping up and draining, and between them the memory is idle while the small kernels
and the launches run. Here each kernel may issue `prefetch.global.L2` for the next GEMM's weight, so that GEMM
reads it from L2 and its DRAM traffic overlaps what came before. A CUDA graph of 12 layers (each layer its own
weights, 340 MB in float32, so nothing stays in L2 from one replay to the next), GPU us per layer, in variants:

    none      the kernels as generated today (triton_gemm's rows body at each shape's fastest configuration)
    gemm      each GEMM prefetches the next GEMM's weight (before its own loop, or `--at end`: after it)
    small     each small kernel prefetches the next GEMM's weight; the GEMMs do not
    all       both

    python benchmarks/prefetch_probe.py [--dtype float32] [--layers 12] [--at start]

Measured (H200, Triton 3.6, 2026-11-29), us a layer: float32 none 29.0, gemm 31.3 (at start) / 28.3 (at end, none
28.7 in that run), small 45.3, all 49.0; float16 none 23.2, gemm 24.6, small 31.0, all 33.2. No variant helps: the
GEMMs are not waiting on DRAM that a prefetch could start earlier (their own loads are latency-bound at ~2-4 warps
an SM), and the small kernels' prefetch instructions (a 9 MB weight from 8 programs) cost more than they save. Not
taken into the template.
"""
from __future__ import annotations

import argparse
import math

import torch
import triton
import triton.language as tl

from jit2triton.emitters import triton_gemm
from jit2triton.emitters.compile_triton import kernel_function
from jit2triton.transpiler.timing import graphs_gpu_us

ROWS, HIDDEN, FFN = 9, 768, 3072
GEMMS = (("qkv", HIDDEN, 3 * HIDDEN), ("out", HIDDEN, HIDDEN), ("up", HIDDEN, FFN), ("down", FFN, HIDDEN))
# the layer's kernels in order: a GEMM by name, or a small kernel ("s")
LAYER = ("qkv", "s", "s", "out", "s", "up", "down", "s")
LINE = 128  # bytes a prefetch brings into L2

_PREFETCH = """\
    if PF_LINES > 0:  # this program's share of the next GEMM's weight, a cache line per element, into L2
        lines = tl.program_id(0) * PF_LINES + tl.arange(0, PF_LINES)
        pf_at = tl.where(lines < PF_TOTAL, pf + lines.to(tl.int64) * PF_STEP, pf)
        tl.inline_asm_elementwise("mov.u32 $0, 0;\\n\\tprefetch.global.L2::evict_last [$1];", "=r,l", [pf_at],
                                  dtype=tl.int32, is_pure=False, pack=1)
"""


@triton.jit
def small(x, y, pf, n, PF_LINES: tl.constexpr, PF_TOTAL: tl.constexpr, PF_STEP: tl.constexpr,
          XBLOCK: tl.constexpr):
    if PF_LINES > 0:
        lines = tl.program_id(0) * PF_LINES + tl.arange(0, PF_LINES)
        pf_at = tl.where(lines < PF_TOTAL, pf + lines.to(tl.int64) * PF_STEP, pf)
        tl.inline_asm_elementwise("mov.u32 $0, 0;\n\tprefetch.global.L2::evict_last [$1];", "=r,l", [pf_at],
                                  dtype=tl.int32, is_pure=False, pack=1)
    i = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    m = i < n
    tl.store(y + i, tl.load(x + i, mask=m) * 0.5 + 1.0, mask=m)


def gemm_kernel(k: int, n: int, dtype: str, config: dict, at: str):
    """triton_gemm's template at this shape and configuration, with a prefetch of another tensor's lines."""
    src = triton_gemm.source("probe_gemm", ROWS, k, n, False, config, "# prefetch probe")
    src = src.replace("x, w, out, XBLOCK: tl.constexpr", "x, w, out, pf, PF_LINES: tl.constexpr, "
                      "PF_TOTAL: tl.constexpr, PF_STEP: tl.constexpr, XBLOCK: tl.constexpr")
    marker = "    ks = tl.arange(0, RBLOCK)\n" if at == "start" else "    # the rows' sums, gathered"
    if config["body"] == "dot" and at == "end":
        marker = "    tl.store("
    assert marker in src, marker
    src = src.replace(marker, (marker if at == "start" else "") + _PREFETCH + ("" if at == "start" else marker), 1)
    return kernel_function(src, "probe_gemm")


def programs_lines(total_lines: int, programs: int) -> int:
    return triton.next_power_of_2(max(1, math.ceil(total_lines / programs)))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dtype", default="float32")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--at", default="start", choices=("start", "end"))
    p.add_argument("--replays", type=int, default=21)
    a = p.parse_args()
    dtype = getattr(torch, a.dtype)
    print(f"{torch.cuda.get_device_name()}  triton {triton.__version__}  torch {torch.__version__}  {a.dtype}, "
          f"prefetch at {a.at}")
    shapes = {name: (k, n) for name, k, n in GEMMS}
    chosen = {}
    for name, (k, n) in shapes.items():
        seconds, config = triton_gemm.gemm_template(ROWS, k, n, a.dtype, False, True)
        chosen[name] = config
        print(f"  {name} {ROWS}x{k}->{n}: {triton_gemm.label(config)}, {seconds * 1e6:.2f} us alone (cold L2)")
    kernels = {name: gemm_kernel(k, n, a.dtype, chosen[name], a.at) for name, (k, n) in shapes.items()}
    layers = [{name: torch.randn(n, k, device="cuda", dtype=dtype) / math.sqrt(k) for name, (k, n) in shapes.items()}
              for _ in range(a.layers)]
    x = {k: torch.randn(ROWS, k, device="cuda", dtype=dtype) for k in (HIDDEN, FFN)}
    outs = {name: torch.empty(ROWS, n, device="cuda", dtype=dtype) for name, (k, n) in shapes.items()}
    s_in, s_out = torch.randn(ROWS * HIDDEN, device="cuda", dtype=dtype), torch.empty(ROWS * HIDDEN, device="cuda",
                                                                                       dtype=dtype)
    step = LINE // dtype.itemsize
    order = [(layer, kind) for layer in range(a.layers) for kind in LAYER]

    def next_gemm(i: int) -> torch.Tensor:
        for j in range(i + 1, i + 1 + len(order)):
            layer, kind = order[j % len(order)]
            if kind != "s":
                return layers[layer][kind]
        raise AssertionError

    def calls(variant: str):
        out = []
        for i, (layer, kind) in enumerate(order):
            pf = next_gemm(i)
            lines = math.ceil(pf.numel() / step)
            if kind == "s":
                programs = 8
                per = programs_lines(lines, programs) if variant in ("small", "all") else 0
                out.append(lambda pf=pf, per=per, lines=lines: small[(programs,)](
                    s_in, s_out, pf, s_in.numel(), PF_LINES=per, PF_TOTAL=lines, PF_STEP=step,
                    XBLOCK=triton.next_power_of_2(s_in.numel() // programs), num_warps=4))
            else:
                k, n = shapes[kind]
                c = chosen[kind]
                programs = n // c["bn"]
                per = programs_lines(lines, programs) if variant in ("gemm", "all") else 0
                out.append(lambda kind=kind, layer=layer, k=k, c=c, programs=programs, pf=pf, per=per, lines=lines:
                           kernels[kind][(programs,)](x[k], layers[layer][kind], outs[kind], pf, PF_LINES=per,
                                                      PF_TOTAL=lines, PF_STEP=step, XBLOCK=c["bn"],
                                                      RBLOCK=c["rblock"], num_warps=c["warps"]))
        return out

    variants = ("none", "gemm", "small", "all")
    for v in variants:
        for f in calls(v):
            f()
        torch.cuda.synchronize()
        for name, (k, n) in shapes.items():  # the prefetch changes no answer
            want = torch.nn.functional.linear(x[k], layers[-1][name])
            assert torch.allclose(outs[name].float(), want.float(), rtol=1e-2, atol=1e-2), (v, name)
    # (each variant's calls in one CUDA graph, the graphs replayed in turns: GPU us per call, so x calls / layers)
    per_call = graphs_gpu_us({v: calls(v) for v in variants}, replays=a.replays)
    per_layer = {v: us * len(order) / a.layers for v, us in per_call.items()}
    weight_mb = sum(k * n for _, k, n in GEMMS) * dtype.itemsize / 1e6
    print(f"  a layer: {len(LAYER)} kernels, {weight_mb:.1f} MB of weights")
    for v in variants:
        us = per_layer[v]
        print(f"  {v:6s} {us:7.2f} us a layer  ({weight_mb / us:.2f} TB/s of weights)")


if __name__ == "__main__":
    main()
