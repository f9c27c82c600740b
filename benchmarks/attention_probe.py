"""Where does the generated short-sequence attention (emitters/triton_attention.py) stand against ATen's, per launch
configuration and loop body, on this GPU?

Times, operands cold in L2 (each call reads its own copy, in a CUDA graph; transpiler/timing.graphs_gpu_us), ATen's
`scaled_dot_product_attention` against the template at every configuration `configs()` offers and a few more, in
three bodies: `dot` (the template: both products as `tl.dot` in ieee float32 precision), `hoist` (v's tile loaded at
the top of the loop, beside k's) and `fma` (float32 multiply-adds over [XBLOCK, BN, head dim] register tiles,
summed along an axis). Each result is checked against ATen first. q, k and v are views of one [b, n, 3, heads, d]
projection output, as BERT's are; the mask is additive and broadcast over heads and queries.

On an H200 (2026-11-29, GPU us): 1x12x9x9x64 fp32 aten 11.49, dot 3.15, fma 4.47 (and wrong at XBLOCK 16, as
Triton 3.6 compiled it); fp16 aten 7.26, dot 3.57; 1x12x1x32x64 fp32 aten 9.06, dot 5.74, fp16 aten 3.24, dot 7.27;
8x12x128x128x64 fp32 aten 28.1, dot 46.6, fp16 aten 8.8, dot 53.3.

    python benchmarks/attention_probe.py [--shapes B:H:L:S:D,...] [--dtype float32|float16] [--no-mask]
                                         [--json out.json]
"""
from __future__ import annotations

import argparse
import functools
import json
import math

import torch

from jit2triton.emitters import triton_attention as A
from jit2triton.emitters.compile_triton import kernel_function
from jit2triton.transpiler.timing import graphs_gpu_us

SHAPES = [(1, 12, 9, 9, 64), (1, 12, 16, 16, 64), (1, 12, 1, 32, 64), (8, 12, 128, 128, 64)]
EXTRA = ((16, 16, 8), (8, 16, 2), (8, 16, 1), (16, 8, 1), (8, 8, 1))
BODIES = {
    "dot": [],
    "hoist": [("        k_tile = tl.load(", "        v_tile = tl.load(v + v_off + {v_rows} + {v_cols},\n"
               "                         mask=(keys[:, None] < {s}) & (e[None, :] < {e}), other=0.0).to(tl.float32)\n"
               "        k_tile = tl.load("),
              ("        v_tile = tl.load(v + v_off + {v_rows} + {v_cols},\n"
               "                         mask=(keys[:, None] < {s}) & (e[None, :] < {e}), other=0.0).to(tl.float32)\n"
               "        acc = acc", "        acc = acc")],
    "fma": [('tl.dot(q_tile, tl.trans(k_tile), input_precision="ieee")',
             "tl.sum(q_tile[:, None, :] * k_tile[None, :, :], axis=2)"),
            ('tl.dot(p, v_tile, input_precision="ieee")', "tl.sum(p[:, :, None] * v_tile[None, :, :], axis=1)")],
}
COPIES = 16


def spec(b: int, h: int, l: int, s: int, d: int, dtype: str, mask: bool) -> tuple:
    """BERT's layout: q, k, v heads of one projection output [b, n, 3, h, d] (self-attention: l == s), else each
    [b, n, h, d]; the output [b, h, l, d] contiguous; the mask [b, 1, 1, s]."""
    row = 3 * h * d if l == s else h * d
    q = (l * row, d, row, 1)
    kv = (s * row, d, row, 1)
    out = (h * l * d, l * d, d, 1)
    return ((b, h), l, s, d, d, dtype, 1 / math.sqrt(d), "additive" if mask else "",
            (q, kv, kv, (s, 0, 0, 1) if mask else (), out))


@functools.lru_cache(maxsize=None)
def launcher(spec_: tuple, body: str, xblock: int):
    batch, l, s, d, e, _, scale, mask, strides = spec_
    template = A._TEMPLATE
    for old, new in BODIES[body]:
        assert old in template, (body, old)
        template = template.replace(old, new)
    saved, A._TEMPLATE = A._TEMPLATE, template
    try:
        text = A.source("probe", "# probe", batch, l, s, d, e, scale, mask, strides, xblock)
    finally:
        A._TEMPLATE = saved
    fn = kernel_function(text, "probe")
    grid = (math.prod(batch) * -(-l // xblock),)

    def launch(q, k, v, m, out, bn: int, warps: int) -> None:
        fn[grid](*((q, k, v, m, out) if m is not None else (q, k, v, out)), XBLOCK=xblock, BN=bn, num_warps=warps)
    return launch


def probe(shape: tuple, dtype: str, mask: bool) -> dict:
    s_ = spec(*shape, dtype, mask)
    copies = [A.operands(s_, "cuda") for _ in range(COPIES)]
    calls = {"aten": [A.aten_call(s_, *ops[:4]) for ops in copies]}
    q, k, v, m, out = copies[0]
    expected = A.aten_call(s_, q, k, v, m)()
    tolerance = 1e-4 if dtype == "float32" else 2e-2
    b, h, l, s, d = shape
    configs = list(dict.fromkeys(A.configs(l, s, d, d) + [c for c in EXTRA if c[0] * c[1] * d <= 32768]))
    failed = []
    for body in BODIES:
        for xblock, bn, warps in configs:
            if body != "fma" and (xblock < A.MIN_DOT or bn < A.MIN_DOT):
                continue
            label = f"{body} x{xblock} bn{bn} w{warps}"
            try:
                launch = launcher(s_, body, xblock)
                launch(q, k, v, m, out, bn, warps)
                if not torch.allclose(out.float(), expected.float(), rtol=tolerance, atol=tolerance, equal_nan=True):
                    failed.append(f"{label} (wrong)")
                    continue
            except Exception as error:  # noqa: BLE001 - a variant this Triton cannot compile
                failed.append(f"{label} ({type(error).__name__})")
                continue
            calls[label] = [functools.partial(launch, *ops, bn, warps) for ops in copies]
    micros = graphs_gpu_us(calls)
    return {"shape": shape, "dtype": dtype, "mask": mask, "us": dict(sorted(micros.items(), key=lambda kv: kv[1])),
            "failed": failed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default=",".join(":".join(map(str, s)) for s in SHAPES))
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--no-mask", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args()
    results = []
    for text in args.shapes.split(","):
        shape = tuple(int(n) for n in text.split(":"))
        result = probe(shape, args.dtype, not args.no_mask)
        results.append(result)
        best = list(result["us"].items())
        print(f"{'x'.join(map(str, shape))} {args.dtype}: aten {result['us']['aten']:.2f} us; best "
              + ", ".join(f"{label} {us:.2f}" for label, us in best[:6]))
        if result["failed"]:
            print("  failed: " + ", ".join(result["failed"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
