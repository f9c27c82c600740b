"""Does a generated Triton GEMM for few rows (a decoder step, BERT at batch 1) beat cuBLAS on this GPU?

At 9 rows, BERT-base's GEMMs read their weights once and do almost no arithmetic: the time is the weight's bytes
over the memory bandwidth, if the kernel keeps enough loads in flight. This probe times, weights cold in L2 (each
call reads its own copy, in a CUDA graph), ATen's `linear` and `matmul` with the weight stored [K, N] against two
Triton kernels over a sweep of configurations: one program per block of output columns reading all of K ("split
N"), and split K with fp32 atomics into a zeroed buffer (its memset and the final cast counted). Each Triton
result is checked against ATen first.

With `--fma` (float32, which ATen computes without TF32), kernels without tensor cores instead: `fma_n` (split N,
each K chunk's products summed across the chunk), `fma3` (a product sum per K lane, the lanes summed once after
the loop: emitters/triton_gemm.py's float32 body) and, where SKIP_SPLIT_K is off, `fma_k` (split K, partial sums
added in a fixed order by a second kernel). On an H200 (2026-11-29, GPU us, weights cold), fma3 against cuBLAS's
best form: 9x768->2304 8.2 / 11.5, 9x768->768 5.1 / 8.0, 9x768->3072 8.6 / 11.8, 9x3072->768 10.0 / 13.8,
9x1024->4096 11.0 / 16.4, 9x4096->1024 12.1 / 16.1; fma_n 10-46, fma_k 15-79.

With `--rows-body`, the body generated per row count instead (`rows`: one [BN, BK] accumulator per row, no padding
of the rows to a power of two, the products summed across K once after the loop; for any dtype, fp32 FMAs; `vec`:
each thread's 16 bytes of products summed in the thread every iteration, fewer sums to keep) and, for float32,
`tf32x3` (split_n's tensor-core dots in three-pass TF32, near float32's accuracy), with `rows_k` (split K, fp32
atomics into a zeroed buffer) as the bound split K could reach. On an H200 (2026-11-29, GPU us, BERT-base's 9x768 ->
2304, 768, 3072 and 9x3072 -> 768): rows 6.8, 4.2, 7.1-7.3, 7.7-8.0 in float32 (cuBLAS 11.2, 7.8, 11.5, 13.6) and
5.6, 3.2, 5.9, 6.3-6.5 in float16 (cuBLAS 4.4, 4.0, 4.7, 7.5); vec 7.6, 4.7, 8.9, 8.9 and 6.1, 3.7, 6.8, 7.7; rows_k
6.8-11.3; tf32x3 8.1-25.7. Pipelining 4 deep beat 2, 3, 6 and 8.

    python benchmarks/skinny_gemm_probe.py [--rows 1,9,16] [--dtype float16|bfloat16|float32] [--fma]
                                           [--rows-body] [--shapes K:N,...] [--json out.json]
"""
from __future__ import annotations

import argparse
import functools
import itertools
import json
import math

import torch
import triton
import triton.language as tl

from jit2triton.transpiler.timing import graphs_gpu_us

SHAPES = [(768, 2304), (768, 768), (768, 3072), (3072, 768), (1024, 4096), (4096, 1024)]  # K, N
COLD_BYTES = 2 * 50 * 2 ** 20
NO_SPLIT = False
SKIP_SPLIT_K = True  # fma_k lost to fma_n at every BERT shape on an H200 (below)


@triton.jit
def split_n(x, w, out, M, N: tl.constexpr, K: tl.constexpr, MP: tl.constexpr, BN: tl.constexpr,
            BK: tl.constexpr, PRECISION: tl.constexpr):
    """out[M, N] = x[M, K] @ w[N, K]^T, one program per BN columns over all of K; rows padded to MP."""
    rm = tl.arange(0, MP)
    rn = tl.program_id(0) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    x_at = x + rm[:, None] * K + rk[None, :]
    w_at = w + rn[:, None] * K + rk[None, :]
    acc = tl.zeros((MP, BN), tl.float32)
    for k in range(0, K, BK):
        a = tl.load(x_at, mask=rm[:, None] < M, other=0.0)
        b = tl.load(w_at, mask=rn[:, None] < N, other=0.0)
        acc += tl.dot(a, tl.trans(b), input_precision=PRECISION)
        x_at += BK
        w_at += BK
    tl.store(out + rm[:, None] * N + rn[None, :], acc.to(out.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def split_k(x, w, acc_out, M, N: tl.constexpr, K: tl.constexpr, MP: tl.constexpr, BN: tl.constexpr,
            BK: tl.constexpr, KS: tl.constexpr, PRECISION: tl.constexpr):
    """Partial products over K / KS of the columns' block, added with fp32 atomics into a zeroed acc_out."""
    rm = tl.arange(0, MP)
    rn = tl.program_id(0) * BN + tl.arange(0, BN)
    k0 = tl.program_id(1) * (K // KS)
    rk = k0 + tl.arange(0, BK)
    x_at = x + rm[:, None] * K + rk[None, :]
    w_at = w + rn[:, None] * K + rk[None, :]
    acc = tl.zeros((MP, BN), tl.float32)
    for k in range(0, K // KS, BK):
        a = tl.load(x_at, mask=rm[:, None] < M, other=0.0)
        b = tl.load(w_at, mask=rn[:, None] < N, other=0.0)
        acc += tl.dot(a, tl.trans(b), input_precision=PRECISION)
        x_at += BK
        w_at += BK
    tl.atomic_add(acc_out + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N),
                  sem="relaxed")


@triton.jit
def fma_n(x, w, out, M, N: tl.constexpr, K: tl.constexpr, MP: tl.constexpr, BN: tl.constexpr,
          BK: tl.constexpr, STAGES: tl.constexpr):
    """float32 without tensor cores: BN columns per program over all of K, each BK chunk's products of every row
    summed across the chunk (a [MP, BN, BK] product, tree-summed), fp32 FMAs as cuBLAS's non-TF32 kernels do."""
    rm = tl.arange(0, MP)
    rn = tl.program_id(0) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    x_at = x + rm[:, None] * K + rk[None, :]
    w_at = w + rn[:, None] * K + rk[None, :]
    acc = tl.zeros((MP, BN), tl.float32)
    for _ in tl.range(0, K, BK, num_stages=STAGES):
        a = tl.load(x_at, mask=rm[:, None] < M, other=0.0)
        b = tl.load(w_at)
        acc += tl.sum(a[:, None, :] * b[None, :, :], axis=2)
        x_at += BK
        w_at += BK
    tl.store(out + rm[:, None] * N + rn[None, :], acc, mask=rm[:, None] < M)


@triton.jit
def fma3(x, w, out, M, N: tl.constexpr, K: tl.constexpr, MP: tl.constexpr, BN: tl.constexpr,
         BK: tl.constexpr, STAGES: tl.constexpr):
    """fma_n, but the products are accumulated per K lane ([MP, BN, BK]) and summed across the lanes once at the
    end: the loop is loads and FMAs only, no cross-thread sum per chunk."""
    rm = tl.arange(0, MP)
    rn = tl.program_id(0) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    x_at = x + rm[:, None] * K + rk[None, :]
    w_at = w + rn[:, None] * K + rk[None, :]
    acc = tl.zeros((MP, BN, BK), tl.float32)
    for _ in tl.range(0, K, BK, num_stages=STAGES):
        a = tl.load(x_at, mask=rm[:, None] < M, other=0.0)
        b = tl.load(w_at)
        acc += a[:, None, :] * b[None, :, :]
        x_at += BK
        w_at += BK
    tl.store(out + rm[:, None] * N + rn[None, :], tl.sum(acc, axis=2), mask=rm[:, None] < M)


@triton.jit
def fma_k(x, w, part, M, N: tl.constexpr, K: tl.constexpr, MP: tl.constexpr, BN: tl.constexpr,
          BK: tl.constexpr, KS: tl.constexpr, STAGES: tl.constexpr):
    """fma_n over K / KS of the columns' block, each split's partial sums stored apart ([KS, M, N]): summed in a
    fixed order after, so the result is deterministic."""
    rm = tl.arange(0, MP)
    rn = tl.program_id(0) * BN + tl.arange(0, BN)
    split = tl.program_id(1)
    rk = split * (K // KS) + tl.arange(0, BK)
    x_at = x + rm[:, None] * K + rk[None, :]
    w_at = w + rn[:, None] * K + rk[None, :]
    acc = tl.zeros((MP, BN), tl.float32)
    for _ in tl.range(0, K // KS, BK, num_stages=STAGES):
        a = tl.load(x_at, mask=rm[:, None] < M, other=0.0)
        b = tl.load(w_at)
        acc += tl.sum(a[:, None, :] * b[None, :, :], axis=2)
        x_at += BK
        w_at += BK
    tl.store(part + split * M * N + rm[:, None] * N + rn[None, :], acc, mask=rm[:, None] < M)


@triton.jit
def sum_splits(part, out, MN: tl.constexpr, KS: tl.constexpr, XBLOCK: tl.constexpr):
    i = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    mask = i < MN
    acc = tl.load(part + i, mask=mask, other=0.0)
    for s in tl.static_range(1, KS):
        acc += tl.load(part + s * MN + i, mask=mask, other=0.0)
    tl.store(out + i, acc, mask=mask)


def _fma_candidates(m: int, k: int, n: int):
    mp = triton.next_power_of_2(m)
    for bn, bk, warps, stages in ((4, 256, 4, 4),):
        if n % bn or k % bk or mp * bn * bk > 32768:
            continue
        yield f"fma_n bn{bn} bk{bk} w{warps} s{stages}", ("fn", mp, bn, bk, 1, warps, stages)
    for bn, bk, warps, stages in itertools.product((4, 8, 16, 32), (16, 32, 64, 128), (2, 4, 8), (4, 5)):
        if n % bn or k % bk or mp * bn * bk > 16384 or mp * bn * bk < 1024:
            continue
        yield f"fma3 bn{bn} bk{bk} w{warps} s{stages}", ("f3", mp, bn, bk, 1, warps, stages)
    for bn, bk, ks, warps, stages in itertools.product((8, 16), (64, 128), (2, 4, 8), (4,), (2, 4)):
        if SKIP_SPLIT_K:
            break
        if n % bn or k % (bk * ks) or mp * bn * bk > 32768:
            continue
        yield f"fma_k bn{bn} bk{bk} ks{ks} w{warps} s{stages}", ("fk", mp, bn, bk, ks, warps, stages)


def _candidates(m: int, k: int, n: int, fma: bool = False, rows_body: bool = False, dtype=torch.float16):
    if rows_body:
        yield from _rows_candidates(m, k, n, dtype)
        return
    if fma:
        yield from _fma_candidates(m, k, n)
        return
    mp = max(16, triton.next_power_of_2(m))
    for bn, bk, warps, stages in itertools.product((16, 32, 64), (64, 128, 256), (2, 4, 8), (3, 4, 6)):
        if n % bn or k % bk:
            continue
        yield f"split_n bn{bn} bk{bk} w{warps} s{stages}", ("n", mp, bn, bk, 1, warps, stages)
    for bn, bk, ks, warps, stages in itertools.product((32, 64, 128), (64, 128), (2, 4, 8), (4,), (3, 4)):
        if n % bn or k % (bk * ks):
            continue
        yield f"split_k bn{bn} bk{bk} ks{ks} w{warps} s{stages}", ("k", mp, bn, bk, ks, warps, stages)


def rows_source(m: int, k: int, n: int, stages: int, split: int = 1, vec: int = 0) -> str:
    """The `rows` body for m rows: an accumulator per row, written out, so no row is padded. With `split` > 1, the
    program's K / split partial sums are added with fp32 atomics (into a zeroed fp32 buffer). With `vec` (the `vec`
    body), each thread's `vec` consecutive products (one 16-byte load of the weight) are summed in the thread every
    iteration, so the per-row sums are [BN, BK / vec]: fewer registers, more loads in flight."""
    if vec:
        ks = f"tl.arange(0, BK // {vec})[:, None] * {vec} + tl.arange(0, {vec})[None, :]"
        w_index, acc_shape, x_at = "cols[:, None, None]", f"(BN, BK // {vec})", "[None, :, :]"
        product = "tl.sum({}, axis=2)"
    else:
        ks = f"tl.program_id(1) * {k // split} + tl.arange(0, BK)"
        w_index, acc_shape, x_at, product = "cols[:, None]", "(BN, BK)", "[None, :]", "{}"
    accs = "".join(f"    acc{r} = tl.zeros({acc_shape}, tl.float32)\n" for r in range(m))
    fmas = "".join(f"        acc{r} += " + product.format(f"wt * tl.load(x_at + {r * k}).to(tl.float32){x_at}") + "\n"
                   for r in range(m))
    store = ("    tl.atomic_add(out + {at} + cols, tl.sum(acc{r}, axis=1), sem='relaxed')\n" if split > 1 else
             "    tl.store(out + {at} + cols, tl.sum(acc{r}, axis=1).to(out.dtype.element_ty))\n")
    stores = "".join(store.format(at=r * n, r=r) for r in range(m))
    w_ks = "ks[None, :, :]" if vec else "ks[None, :]"
    return f"""import triton
import triton.language as tl


@triton.jit
def rows_gemm(x, w, out, BN: tl.constexpr, BK: tl.constexpr):
    cols = tl.program_id(0) * BN + tl.arange(0, BN)
    ks = {ks}
    x_at = x + ks
    w_at = w + {w_index} * {k} + {w_ks}
{accs}    for _ in tl.range(0, {k // split}, BK, num_stages={stages}):
        wt = tl.load(w_at).to(tl.float32)
{fmas}        x_at += BK
        w_at += BK
{stores}"""


@functools.lru_cache(maxsize=None)
def _rows_kernel(m: int, k: int, n: int, stages: int, split: int, vec: int = 0):
    from jit2triton.emitters.compile_triton import kernel_function
    return kernel_function(rows_source(m, k, n, stages, split, vec), "rows_gemm")


ROWS_STAGES = (2, 4)


def _rows_candidates(m: int, k: int, n: int, dtype: torch.dtype):
    for bn, bk, warps, stages in itertools.product((2, 4, 8, 16), (128, 256, 512), (2, 4, 8), ROWS_STAGES):
        per_thread = bn * bk // (32 * warps)
        if n % bn or k % bk or per_thread not in (4, 8, 16) or m * per_thread > 144:
            continue
        yield f"rows bn{bn} bk{bk} w{warps} s{stages}", ("r", m, bn, bk, 1, warps, stages)
        if not NO_SPLIT and stages == 4 and bn in (4, 8) and n // bn < 264:
            for ks in (2, 4):
                if k % (bk * ks) == 0:
                    yield f"rows_k bn{bn} bk{bk} ks{ks} w{warps}", ("rk", m, bn, bk, ks, warps, 1)
    v = 16 // dtype.itemsize
    for bn, bk, warps, stages in itertools.product((4, 8, 16), (128, 256, 512), (2, 4, 8), (3, 4)):
        per_thread = bn * bk // (32 * warps)
        if n % bn or k % bk or per_thread not in (8, 16, 32, 64) or m * per_thread // v > 144:
            continue
        yield f"vec bn{bn} bk{bk} w{warps} s{stages}", ("v", m, bn, bk, v, warps, stages)
    if dtype == torch.float32 and not NO_SPLIT:
        for bn, bk, warps, stages in itertools.product((16, 32), (64, 128, 256), (2, 4), (4, 6)):
            if n % bn == 0 and k % bk == 0:
                yield f"tf32x3 bn{bn} bk{bk} w{warps} s{stages}", ("x3", 16, bn, bk, 1, warps, stages)


def _call(cfg, x, w, out, acc):
    kind, mp, bn, bk, ks, warps, stages = cfg
    m, k = x.shape
    n = w.shape[0]
    if kind == "r":
        fn = _rows_kernel(m, k, n, stages, 1)
        return lambda: fn[(n // bn, 1)](x, w, out, bn, bk, num_warps=warps)
    if kind == "v":
        fn = _rows_kernel(m, k, n, stages, 1, ks)
        return lambda: fn[(n // bn, 1)](x, w, out, bn, bk, num_warps=warps)
    if kind == "rk":
        fn = _rows_kernel(m, k, n, 1, ks)

        def run_split():
            acc.zero_()
            fn[(n // bn, ks)](x, w, acc, bn, bk, num_warps=warps)
            out.copy_(acc)
        return run_split
    if kind == "x3":
        return lambda: split_n[(n // bn,)](x, w, out, m, n, k, mp, bn, bk, "tf32x3", num_warps=warps,
                                           num_stages=stages)
    if kind == "fn":
        return lambda: fma_n[(n // bn,)](x, w, out, m, n, k, mp, bn, bk, stages, num_warps=warps)
    if kind == "f3":
        return lambda: fma3[(n // bn,)](x, w, out, m, n, k, mp, bn, bk, stages, num_warps=warps)
    if kind == "fk":
        part = torch.empty(ks, m, n, device=x.device, dtype=torch.float32)
        return lambda: (fma_k[(n // bn, ks)](x, w, part, m, n, k, mp, bn, bk, ks, stages, num_warps=warps),
                        sum_splits[(triton.cdiv(m * n, 1024),)](part, out, m * n, ks, 1024, num_warps=4))
    if kind == "n":
        return lambda: split_n[(n // bn,)](x, w, out, m, n, k, mp, bn, bk, _precision(x), num_warps=warps,
                                           num_stages=stages)

    def run():
        acc.zero_()
        split_k[(n // bn, ks)](x, w, acc, m, n, k, mp, bn, bk, ks, _precision(x), num_warps=warps,
                               num_stages=stages)
        out.copy_(acc)
    return run


def _precision(x) -> str:
    """float32 as ATen computes it without TF32 (the default): ieee dots."""
    return "ieee" if x.dtype == torch.float32 else "tf32"


def probe(m: int, k: int, n: int, dtype: torch.dtype, fma: bool = False, rows_body: bool = False) -> dict:
    copies = max(2, min(32, COLD_BYTES // ((n * k + m * k) * dtype.itemsize)))
    ops = [(torch.randn(m, k, device="cuda", dtype=dtype), torch.randn(n, k, device="cuda", dtype=dtype) / math.sqrt(k))
           for _ in range(copies)]
    wts = [w.t().contiguous() for _, w in ops]
    outs = [torch.empty(m, n, device="cuda", dtype=dtype) for _ in ops]
    accs = [torch.empty(m, n, device="cuda", dtype=torch.float32) for _ in ops]
    want = torch.nn.functional.linear(*ops[0])
    base = graphs_gpu_us({"linear": [lambda x=x, w=w: torch.nn.functional.linear(x, w) for x, w in ops],
                      "kn": [lambda x=x, wt=wt: torch.matmul(x, wt) for (x, _), wt in zip(ops, wts)]})
    best: dict[str, tuple[float, str]] = {}
    tried = {}
    for label, cfg in _candidates(m, k, n, fma, rows_body, dtype):
        try:
            _call(cfg, ops[0][0], ops[0][1], outs[0], accs[0])()
            torch.cuda.synchronize()
            tol = 1e-4 if dtype == torch.float32 else 2e-2
            if not torch.allclose(outs[0].float(), want.float(), rtol=tol, atol=tol):
                tried[label] = "wrong"
                continue
            us = graphs_gpu_us({label: [_call(cfg, x, w, o, a) for (x, w), o, a in zip(ops, outs, accs)]})[label]
        except Exception as e:  # noqa: BLE001 - a configuration that does not compile or fit
            tried[label] = type(e).__name__
            continue
        tried[label] = us
        kind = label.split()[0]
        if kind not in best or us < best[kind][0]:
            best[kind] = (us, label)
    roofline = (n * k + m * k + m * n) * dtype.itemsize / 3.0e6  # us at 3 TB/s
    return {"m": m, "k": k, "n": n, "aten": base, "best": best, "roofline_3TBs_us": roofline, "tried": tried}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", default="1,9,16")
    p.add_argument("--dtype", default="float16")
    p.add_argument("--fma", action="store_true", help="float32: the kernels without tensor cores (fma_n, fma_k)")
    p.add_argument("--rows-body", action="store_true", help="the bodies generated per row count (rows, rows_k, "
                   "and tf32x3 for float32)")
    p.add_argument("--rows-stages", default="2,4", help="the rows body's pipeline depths swept")
    p.add_argument("--no-split", action="store_true", help="leave rows_k and tf32x3 out")
    p.add_argument("--shapes", help="K:N,... (default: BERT-base's and a 1024-wide model's)")
    p.add_argument("--json")
    a = p.parse_args()
    dtype = getattr(torch, a.dtype)
    global ROWS_STAGES, NO_SPLIT
    ROWS_STAGES, NO_SPLIT = tuple(map(int, a.rows_stages.split(","))), a.no_split
    results = []
    print(f"{torch.cuda.get_device_name()}  triton {triton.__version__}  {a.dtype}  (GPU us per call, L2 cold)")
    for m in map(int, a.rows.split(",")):
        shapes = [tuple(map(int, s.split(":"))) for s in a.shapes.split(",")] if a.shapes else SHAPES
        for k, n in shapes:
            r = probe(m, k, n, dtype, a.fma, a.rows_body)
            results.append(r)
            bests = "  ".join(f"{kind} {us:.2f} ({label})" for kind, (us, label) in r["best"].items())
            print(f"{m:3d}x{k}->{n}: linear {r['aten']['linear']:.2f} kn {r['aten']['kn']:.2f} "
                  f"roof {r['roofline_3TBs_us']:.2f} | {bests}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
