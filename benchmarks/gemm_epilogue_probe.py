"""Would a Triton GEMM with the bias and an exact GELU in its epilogue beat ATen's `linear` then `gelu` on this GPU?

The question behind the MLP row of gpu_bench.py: its first GEMM writes a 32 MiB intermediate that the GELU kernel
reads back, and an epilogue would save both passes. ATen has no exact-GELU epilogue (cuBLASLt's is the tanh
approximation), so it would take a generated Triton GEMM. This probe times two such kernels, best of several
configurations each, against ATen at the GEMM shapes of the table's models (fp16, CUDA events through
`triton.testing.do_bench`), and checks each against ATen. On the H100 with Triton 3.6 (README, Benchmarks) Triton's
GEMM ran at about 70% of cuBLAS's speed, which ate the saving, so jit2triton does not generate one.

    python benchmarks/gemm_epilogue_probe.py [--json out.json]
"""
from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

SHAPES = [(4096, 1024, 4096), (1024, 768, 3072), (1576, 768, 3072), (4096, 4096, 1024)]  # M, K, N
CONFIGS = [(128, 256, 64, 3, 8), (128, 256, 64, 4, 8), (128, 128, 64, 4, 8), (128, 128, 64, 3, 4),
           (256, 128, 64, 3, 8), (64, 256, 64, 4, 8), (128, 128, 32, 4, 4), (64, 128, 64, 4, 4)]  # BM BN BK stages warps


@triton.jit
def _epilogue(acc, bias, out, rm, rn, M, N: tl.constexpr):
    """ATen's rounding: the GEMM and its bias rounded to fp16, then the exact GELU, rounded again."""
    v = (acc + tl.load(bias + rn, mask=rn < N, other=0).to(tl.float32)).to(tl.float16).to(tl.float32)
    v = v * 0.5 * (1.0 + tl.erf(v * 0.7071067811865476))
    tl.store(out + rm * N + rn, v.to(tl.float16), mask=(rm < M) & (rn < N))


@triton.jit
def gemm_gelu_pointers(a, b, bias, out, M, N: tl.constexpr, K: tl.constexpr,
                       BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """One output tile per program; `b` is the weight as [N, K] (nn.Linear's layout)."""
    ram = tl.program_id(0) * BM + tl.arange(0, BM)
    rbn = tl.program_id(1) * BN + tl.arange(0, BN)
    ram, rbn = tl.where(ram < M, ram, 0), tl.where(rbn < N, rbn, 0)
    rk = tl.arange(0, BK)
    a_at = a + ram[:, None] * K + rk[None, :]
    b_at = b + rk[:, None] + rbn[None, :] * K
    acc = tl.zeros((BM, BN), tl.float32)
    for k in range(0, K, BK):
        if K % BK == 0:  # (decided when compiling) no masks in the main loop
            acc += tl.dot(tl.load(a_at), tl.load(b_at))
        else:
            acc += tl.dot(tl.load(a_at, mask=rk[None, :] < K - k, other=0),
                          tl.load(b_at, mask=rk[:, None] < K - k, other=0))
        a_at += BK
        b_at += BK
    _epilogue(acc, bias, out, tl.program_id(0) * BM + tl.arange(0, BM)[:, None],
              tl.program_id(1) * BN + tl.arange(0, BN)[None, :], M, N)


@triton.jit
def gemm_gelu_descriptors(a, b, bias, out, M, N: tl.constexpr, K: tl.constexpr,
                          BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PROGRAMS: tl.constexpr):
    """Tiles loaded by TMA through device-side descriptors; persistent when PROGRAMS < tiles, grouped by 8 rows
    of tiles for L2 reuse."""
    a_desc = tl.make_tensor_descriptor(a, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    b_desc = tl.make_tensor_descriptor(b, shape=[N, K], strides=[K, 1], block_shape=[BN, BK])
    tiles_m = tl.cdiv(M, BM)
    tiles_n: tl.constexpr = (N + BN - 1) // BN
    for tile in range(tl.program_id(0), tiles_m * tiles_n, PROGRAMS):
        first_m = (tile // (8 * tiles_n)) * 8
        group_m = min(tiles_m - first_m, 8)
        pid_m = first_m + (tile % (8 * tiles_n)) % group_m
        pid_n = (tile % (8 * tiles_n)) // group_m
        acc = tl.zeros((BM, BN), tl.float32)
        for k in range(0, K, BK):
            acc = tl.dot(a_desc.load([pid_m * BM, k]), b_desc.load([pid_n * BN, k]).T, acc)
        _epilogue(acc, bias, out, pid_m * BM + tl.arange(0, BM)[:, None], pid_n * BN + tl.arange(0, BN)[None, :],
                  M, N)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    args = parser.parse_args()
    from triton.testing import do_bench
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    print("| M×K→N, fp16 | ATen linear + gelu | (linear alone) | Triton, pointers | Triton, TMA descriptors |")
    print("|---|---|---|---|---|")
    for m, k, n in SHAPES:
        x = torch.randn(m, k, device="cuda", dtype=torch.float16)
        w = torch.randn(n, k, device="cuda", dtype=torch.float16) / k ** 0.5
        bias = torch.randn(n, device="cuda", dtype=torch.float16)
        reference = torch.nn.functional.gelu(torch.nn.functional.linear(x, w, bias))
        out = torch.empty_like(reference)
        row = {"shape": [m, k, n],
               "aten_us": do_bench(lambda: torch.nn.functional.gelu(torch.nn.functional.linear(x, w, bias))) * 1e3,
               "linear_us": do_bench(lambda: torch.nn.functional.linear(x, w, bias)) * 1e3}
        for kind in ("pointers", "descriptors"):
            best = (float("inf"), None)
            for bm, bn, bk, stages, warps in CONFIGS:
                tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
                for programs in ((tiles,) if kind == "pointers" else (tiles, min(sms, tiles))):
                    if kind == "pointers":
                        def call():
                            gemm_gelu_pointers[(triton.cdiv(m, bm), triton.cdiv(n, bn))](
                                x, w, bias, out, m, n, k, BM=bm, BN=bn, BK=bk, num_stages=stages, num_warps=warps)
                    else:
                        def call():
                            gemm_gelu_descriptors[(programs,)](x, w, bias, out, m, n, k, BM=bm, BN=bn, BK=bk,
                                                              PROGRAMS=programs, num_stages=stages, num_warps=warps)
                    out.zero_()
                    call()
                    torch.testing.assert_close(out, reference, rtol=2e-2, atol=2e-2)  # a wrong kernel times nothing
                    us = do_bench(call) * 1e3
                    best = min(best, (us, f"{bm}x{bn}x{bk} stages {stages} warps {warps} programs {programs}"))
            row[kind + "_us"], row[kind + "_config"] = best
        rows.append(row)
        print(f"| {m}×{k}→{n} | {row['aten_us']:.1f} | {row['linear_us']:.1f} | {row['pointers_us']:.1f} | "
              f"{row['descriptors_us']:.1f} |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
