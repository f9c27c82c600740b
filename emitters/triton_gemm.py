"""A generated GEMM for few rows: BERT at batch 1, a decoder's step. Rendered from one template, not from expressions.

At 9 rows a GEMM by a 768x3072 weight does almost no arithmetic; its time is the weight's bytes over the memory
bandwidth, when enough loads are in flight. cuBLAS's kernels for such shapes are tiled for more rows: on an H200
(benchmarks/skinny_gemm_probe.py, fp16, weights cold in L2) BERT-base's 9x768 -> 768 took 4.0-4.3 us in cuBLAS and
2.8 here, 9x768 -> 2304 4.4-4.6 against 3.9; at 9x3072 -> 768 cuBLAS's split-K stayed ahead. So the template is one
of the forms `transpiler/gemm_forms.py` times per GEMM, kept only where it wins.

Each program computes BN output columns for every row, reading its BN rows of the weight once over all of K, RBLOCK
at a time, pipelined `STAGES` deep; fp32 accumulation, the bias added in fp32, one rounding to the output's type (as
cuBLAS's epilogue does). Two loop bodies, each configuration of either timed at the GEMM's shape:

    dot    float16, bfloat16: tensor-core `tl.dot`s, rows padded to 16 (the smallest dot)
    rows   any dtype, fp32 FMAs (ATen computes float32 GEMMs without TF32 by default, so no tensor cores for
           float32): one [BN, RBLOCK] product sum per row, written out per row so no row is padded, each summed
           across K once after the loop, so the loop is loads and FMAs only. On an H200
           (benchmarks/skinny_gemm_probe.py --rows-body, weights cold in L2, GPU us), BERT-base's float32
           9x768 -> 2304 took 6.8 against cuBLAS's 11.2, 9x768 -> 768 4.2 / 7.9, 9x768 -> 3072 7.3 / 11.6,
           9x3072 -> 768 7.8 / 13.7; the previous body, a sum per K lane over rows padded to a power of two
           ([16, BN, RBLOCK]), 8.2, 5.1, 8.6 and 10.0. In float16 it beat the dot body and cuBLAS at 9x3072 -> 768
           (6.3 against cuBLAS's 7.5); the more loads in flight per thread, the faster, up to the registers' limit
"""
from __future__ import annotations

import functools
import math
from typing import Optional

import torch

from jit2triton.transpiler import kernel_ir as K
from jit2triton.transpiler.kernel_ir import INT32_LIMIT
from jit2triton.transpiler.timing import cold_copies, fastest_checked

from .common import provenance_comment
from .triton import POINTER_TYPES, TritonKernel, _KernelWriter
from .triton_math import HELPERS, TL_TYPES, ordered

DOT_DTYPES = ("float16", "bfloat16")
DTYPES = DOT_DTYPES + ("float32",)
MAX_ROWS = 16  # one tl.dot tile of rows
# (body, BN, RBLOCK, warps, stages): the winners of the probe's sweeps at BERT's shapes on the H200. The dot body's
# last is for small K; the rows body's last two for small shapes
DOT_CONFIGS = tuple(("dot",) + c for c in ((16, 128, 2, 6), (16, 128, 4, 6), (32, 128, 4, 6), (16, 256, 2, 6),
                                           (32, 256, 2, 4), (16, 64, 2, 4)))
ROWS_CONFIGS = tuple(("rows",) + c for c in ((8, 128, 2, 4), (4, 128, 2, 4), (4, 256, 2, 4), (8, 128, 4, 4),
                                             (8, 256, 4, 4), (2, 512, 2, 4), (4, 128, 4, 4), (2, 64, 2, 4),
                                             (2, 32, 1, 4)))
# the rows body keeps rows x (its weight elements per thread) sums in registers: past this, they spill
MAX_ROW_SUMS = 144

_TEMPLATE = '''\
{head}
import triton
import triton.language as tl

{helpers}
@triton.jit
def {name}({params}, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    # out[{rows}, {n}] = x[{rows}, {k}] @ w[{n}, {k}]^T{bias_note}: XBLOCK columns of every row per program
    rows = tl.arange(0, {padded})
    cols = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    ks = tl.arange(0, RBLOCK)
    w_at = w + cols[:, None] * {k} + ks[None, :]
{loop}{bias}{store}'''

_DOT = """\
    x_at = x + rows[:, None] * {x_row} + ks[None, :]
    acc = tl.zeros(({padded}, XBLOCK), tl.float32)
    for _ in tl.range(0, {k}, RBLOCK, num_stages={stages}):
        a = tl.load(x_at, mask=rows[:, None] < {rows}, other=0.0)
        acc += tl.dot(a, tl.trans(tl.load(w_at)))
        x_at += RBLOCK
        w_at += RBLOCK
"""

_ROWS = """\
    # fp32 FMAs (ATen's float32 GEMMs use no TF32): a product sum per row and weight element, summed after the loop
    x_at = x + ks
{sums}    for _ in tl.range(0, {k}, RBLOCK, num_stages={stages}):
        wt = tl.load(w_at).to(tl.float32)
{fmas}        x_at += RBLOCK
        w_at += RBLOCK
    # the rows' sums, gathered into one [rows, XBLOCK] tile as the dot body leaves it
    acc = tl.zeros(({padded}, XBLOCK), tl.float32)
{gather}"""


def _rows_body(rows: int, k: int, x_row: int, padded: int, stages: int) -> str:
    return _ROWS.format(
        k=k, stages=stages, padded=padded,
        sums="".join(f"    sum{r} = tl.zeros((XBLOCK, RBLOCK), tl.float32)\n" for r in range(rows)),
        fmas="".join(f"        sum{r} += wt * tl.load(x_at{f' + {r * x_row}' if r else ''}).to(tl.float32)[None, :]\n"
                     for r in range(rows)),
        gather="".join(f"    acc = tl.where(rows[:, None] == {r}, tl.sum(sum{r}, axis=1)[None, :], acc)\n"
                       for r in range(rows)))


_STORE = """\
    tl.store(out + rows[:, None] * {n} + cols[None, :], acc.to(out.dtype.element_ty), mask=rows[:, None] < {rows})
"""

# The epilogue's own kernel, computed on this tile: its flat index and mask are the tile's, its read of the product
# is the accumulator rounded as ATen rounds the GEMM's output
_EPILOGUE_HEAD = """\
    # epilogue: {epilogue}
    xindex = rows[:, None] * {n} + cols[None, :]
    xmask = xindex < {elements}
    product = acc.to({product_type}).to(tl.float32)
"""


def configs(rows: int, k: int, n: int, dtype: str) -> list[dict]:
    """The launch configurations of the loop bodies this dtype takes that fit this shape: their BN divides N, their
    RBLOCK divides K, and the rows body's sums fit the registers."""
    return [{"body": body, "bn": bn, "rblock": rblock, "warps": warps, "stages": stages}
            for body, bn, rblock, warps, stages in (DOT_CONFIGS if dtype in DOT_DTYPES else ()) + ROWS_CONFIGS
            if n % bn == 0 and k % rblock == 0
            and (body == "dot" or rows * max(1, bn * rblock // (32 * warps)) <= MAX_ROW_SUMS)]


def label(config: dict) -> str:
    """How a configuration is named in the timed choices and the tests."""
    return "{body} bn{bn} rblock{rblock} w{warps} s{stages}".format(**config)


def fits(rows: int, k: int, n: int, dtype: str) -> bool:
    """Whether the template computes this GEMM (a configuration fits its shape)."""
    return (dtype in DTYPES and 0 < rows <= MAX_ROWS and bool(configs(rows, k, n, dtype))
            and n * k <= INT32_LIMIT and MAX_ROWS * max(k, n) <= INT32_LIMIT)


def source(name: str, rows: int, k: int, n: int, bias: bool, config: dict, head: str, params: str = "out",
           store: Optional[str] = None, helpers: str = "", x_row: int = 0) -> str:
    """The template's module, with `config`'s loop body; `head` opens it (the provenance comment). Without `store`
    (an epilogue's lines and its output parameters `params`), the product is stored to `out`. `x_row`: x's row
    stride where not k."""
    padded, x_row = 1 << (rows - 1).bit_length(), x_row or k
    if config["body"] == "dot":
        padded = max(16, padded)
        loop = _DOT.format(padded=padded, k=k, rows=rows, stages=config["stages"], x_row=x_row)
    else:
        loop = _rows_body(rows, k, x_row, padded, config["stages"])
    return _TEMPLATE.format(name=name, params=("x, w, b, " if bias else "x, w, ") + params, head=head,
                            helpers=helpers, rows=rows, k=k, n=n, padded=padded, loop=loop,
                            bias_note=" + b" if bias else "",
                            bias="    acc += tl.load(b + cols)[None, :].to(tl.float32)\n" if bias else "",
                            store=store if store is not None else _STORE.format(n=n, rows=rows))


def render_gemm(kernel: K.GemmKernel) -> TritonKernel:
    """The kernel's module and launch: one program per XBLOCK output columns, at the configuration it was timed at."""
    config, head = kernel.config, provenance_comment(kernel, "#")
    if kernel.epilogue is None:
        text = source(kernel.name, kernel.rows, kernel.k, kernel.n, kernel.bias, config, head, x_row=kernel.x_row)
    else:
        params, store, helpers = _epilogue(kernel)
        text = source(kernel.name, kernel.rows, kernel.k, kernel.n, kernel.bias, config, head, params, store, helpers,
                      kernel.x_row)
    arg_types = [POINTER_TYPES[b.dtype] for b in kernel.inputs + kernel.outputs]
    launch = {"constants": {"XBLOCK": config["bn"], "RBLOCK": config["rblock"]}, "num_warps": config["warps"]}
    return TritonKernel(kernel.name, text, arg_types, items=kernel.n, configs=[launch])


def _epilogue(kernel: K.GemmKernel) -> tuple[str, str, str]:
    """(its parameters after the GEMM's, its lines, the helpers they call): the epilogue kernel as the flat renderer
    writes it, on the tile's flat index."""
    epilogue = kernel.epilogue
    writer = _EpilogueWriter(epilogue, kernel.product)
    rows, _ = writer.write()
    body = writer.flat_body(rows)
    if not body[0].lstrip().startswith("xindex =") or not body[1].lstrip().startswith("xmask ="):
        raise ValueError(f"the epilogue of {kernel.name} does not start as a flat kernel does")
    product_type = next(b.dtype for b in epilogue.inputs if b.name == kernel.product)
    lines = _EPILOGUE_HEAD.format(epilogue=epilogue.name, n=kernel.n, elements=kernel.rows * kernel.n,
                                  product_type=TL_TYPES[product_type]) + "\n".join(body[2:]) + "\n"
    params = [writer.buffer_names[b.name] for b in epilogue.inputs if b.name != kernel.product]
    params += [f"out_{b.name}" for b in epilogue.outputs]
    helpers = "".join(HELPERS[h].rstrip() + "\n\n" for h in ordered(writer.helpers))
    return ", ".join(params), lines, helpers


class _EpilogueWriter(_KernelWriter):
    """The flat renderer, but the product's loads are the accumulator's value (`product`, named in the tile)."""

    def __init__(self, kernel: K.Kernel, product: str) -> None:
        super().__init__(kernel)
        self.product = product

    def open_rows(self):
        rows = super().open_rows()
        if not self.flat:
            raise ValueError(f"the epilogue {self.kernel.name} is not pointwise")
        for node in K.nodes_in(*self.kernel.values):
            if node.op == "load" and node.arg == self.product:
                if node.args != (self.flat_index,):
                    raise ValueError(f"the epilogue {self.kernel.name} reads the product off its element")
                rows.names[id(node)] = "product"
        return rows


def gemm_template(rows: int, k: int, n: int, dtype: str, has_bias: bool, timed: bool
                  ) -> Optional[tuple[Optional[float], dict]]:
    """transpiler/gemm_forms.py's hook for this form: (GPU seconds per call, configuration) of the template's fastest
    configuration at this shape, weights cold in L2 as there; untimed (or off CUDA), (None, the first configuration
    that fits). None where the template does not fit, or where no configuration compiles and computes the GEMM."""
    if not fits(rows, k, n, dtype):
        return None
    if not timed or not torch.cuda.is_available():
        return None, configs(rows, k, n, dtype)[0]
    return _timed(rows, k, n, dtype, has_bias, f"cuda:{torch.cuda.current_device()}")


@functools.lru_cache(maxsize=None)
def _timed(rows: int, k: int, n: int, dtype: str, has_bias: bool, device: str) -> Optional[tuple[float, dict]]:
    torch_dtype = getattr(torch, dtype)
    operands = []
    for _ in range(cold_copies((n * k + rows * k) * torch_dtype.itemsize)):
        x = torch.randn(rows, k, device=device, dtype=torch_dtype)
        w = torch.randn(n, k, device=device, dtype=torch_dtype) / math.sqrt(k)
        b = torch.randn(n, device=device, dtype=torch_dtype) if has_bias else None
        operands.append((x, w, b, torch.empty(rows, n, device=device, dtype=torch_dtype)))
    by_label = {label(c): c for c in configs(rows, k, n, dtype)}

    def launcher(c: dict):
        launch = _compiled(rows, k, n, has_bias, c["body"], c["stages"], dtype)
        return lambda x, w, b, out: launch(x, w, b, out, c["bn"], c["rblock"], c["warps"])
    x, w, b, _ = operands[0]
    micros, kept = fastest_checked(by_label, launcher, operands, torch.nn.functional.linear(x, w, b),
                                   1e-2 if dtype in DOT_DTYPES else 1e-4)
    if not kept:
        return None
    best = min(kept, key=micros.get)
    return micros[best] / 1e6, kept[best]


@functools.lru_cache(maxsize=None)
def _compiled(rows: int, k: int, n: int, has_bias: bool, body: str, stages: int, dtype: str):
    """A launcher of the template at this shape: launch(x, w, b, out, bn, rblock, warps)."""
    from .compile_triton import kernel_function
    name = "skinny_gemm"
    fn = kernel_function(source(name, rows, k, n, has_bias, {"body": body, "stages": stages},
                                "# timed by gemm_forms"), name)

    def launch(x, w, b, out, bn: int, rblock: int, warps: int) -> None:
        args = (x, w, b, out) if has_bias else (x, w, out)
        fn[(n // bn,)](*args, XBLOCK=bn, RBLOCK=rblock, num_warps=warps)
    return launch
