"""A generated attention kernel for short sequences: BERT at batch 1 and 9 tokens, a decoder's few keys.

At 9 tokens an attention head is a few thousand multiply-adds; ATen's kernels are built for long sequences. On an
H200 BERT-base 1x9 in float32 spent 8.6 us a layer in `fmha_cutlassF_f32` (whose float32 path takes no tensor
cores) plus a fill and a copy that pad the additive mask to 16 keys (1.8 us). So, as for the few-row GEMM
(triton_gemm.py), the template is a form `transpiler/attention_kernels.py` times per call site against ATen's
`scaled_dot_product_attention`, kept only where it wins.

One program computes XBLOCK queries of one (batch, head) against every key, BN keys at a time, with the online
softmax of flash attention: a running maximum and sum per query, the output rescaled as the maximum grows. Both
products are `tl.dot`s of float32 tiles in ieee precision (no TF32: float32 is computed as ATen computes it;
float16/bfloat16 inputs are widened, computed in float32 and rounded once at the store). Every operand is read
through its own strides (the heads of a QKV projection's output, a mask broadcast over heads and queries) and the
output written at the strides it is given, so no copy is needed on either side.

`benchmarks/attention_probe.py` chose the body on an H200 (GPU us, operands cold in L2, against ATen): at BERT's
1x12x9x9x64 the dots took 3.15 (fp32) and 3.57 (fp16) against ATen's 11.5 and 7.3; multiply-adds over
[XBLOCK, BN, head dim] register tiles summed along an axis took 4.5-4.8, and in float32 at XBLOCK 16 Triton 3.6
compiled them to wrong answers (the checks before timing caught it). At 128 keys ATen's kernels won by 2-6x.
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
from .triton import POINTER_TYPES, TritonKernel

DTYPES = ("float32", "float16", "bfloat16")
MAX_KEYS = 64  # past this, ATen's tiled kernels are the better form (the probe: at 128 keys by 2-6x): not timed
MAX_HEAD_DIM = 128
MIN_DOT = 16  # the smallest tl.dot: blocks and head dims are padded to it
# (XBLOCK queries, BN keys, warps) tried where the blocks fit the sequence; the probe's winners first
CONFIGS = ((16, 16, 4), (16, 16, 2), (16, 16, 1), (16, 32, 4), (32, 16, 4), (32, 32, 4), (64, 64, 4))

_TEMPLATE = '''\
{head}
import triton
import triton.language as tl


@triton.jit
def {name}({params}, XBLOCK: tl.constexpr, BN: tl.constexpr):
    # out{out_shape} = softmax(q{q_shape} @ k{k_shape}^T * {scale!r}{mask_note}) @ v{v_shape}, online over BN keys
    # at a time; XBLOCK queries of one (batch, head) per program, float32 throughout
    program = tl.program_id(0)
    batch = program // {query_blocks}
    rows = (program % {query_blocks}) * XBLOCK + tl.arange(0, XBLOCK)
{batch_offsets}    d = tl.arange(0, {d_p2})
    e = tl.arange(0, {e_p2})
    q_tile = tl.load(q + q_off + {q_rows} + {q_cols},
                     mask=(rows[:, None] < {l}) & (d[None, :] < {d}), other=0.0).to(tl.float32)
    running_max = tl.full([XBLOCK], float("-inf"), tl.float32)
    running_sum = tl.zeros([XBLOCK], tl.float32)
    acc = tl.zeros([XBLOCK, {e_p2}], tl.float32)
    for start in tl.range(0, {s}, BN):
        keys = start + tl.arange(0, BN)
        k_tile = tl.load(k + k_off + {k_rows} + {k_cols},
                         mask=(keys[:, None] < {s}) & (d[None, :] < {d}), other=0.0).to(tl.float32)
        scores = tl.dot(q_tile, tl.trans(k_tile), input_precision="ieee") * {scale!r}
{mask}        scores = tl.where(keys[None, :] < {s}, scores, float("-inf"))
        new_max = tl.maximum(running_max, tl.max(scores, axis=1))
        # a query whose every score so far is -inf (masked out) subtracts 0, not -inf, so it gets no NaN from here
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        p = tl.exp(scores - shift[:, None])
        rescale = tl.exp(running_max - shift)
        running_sum = running_sum * rescale + tl.sum(p, axis=1)
        v_tile = tl.load(v + v_off + {v_rows} + {v_cols},
                         mask=(keys[:, None] < {s}) & (e[None, :] < {e}), other=0.0).to(tl.float32)
        acc = acc * rescale[:, None] + tl.dot(p, v_tile, input_precision="ieee")
        running_max = new_max
    # a query whose every key is masked out sums to 0 and gets zeros, as from ATen's attention (its safe softmax)
    acc = acc / tl.where(running_sum == 0.0, 1.0, running_sum)[:, None]
    tl.store(out + out_off + {o_rows} + {o_cols}, acc.to(out.dtype.element_ty),
             mask=(rows[:, None] < {l}) & (e[None, :] < {e}))
'''

_ADDITIVE = """\
        scores += tl.load(mask + mask_off + {m_rows} + {m_cols},
                          mask=(rows[:, None] < {l}) & (keys[None, :] < {s}), other=0.0).to(tl.float32)
"""
_BOOLEAN = """\
        keep = tl.load(mask + mask_off + {m_rows} + {m_cols},
                       mask=(rows[:, None] < {l}) & (keys[None, :] < {s}), other=0)
        scores = tl.where(keep != 0, scores, float("-inf"))
"""
_CAUSAL = """\
        scores = tl.where(keys[None, :] <= rows[:, None], scores, float("-inf"))
"""


def _p2(n: int) -> int:
    """n's tile width: the next power of two, at least a dot's."""
    return max(MIN_DOT, 1 << max(0, n - 1).bit_length())


def fits(batch: tuple[int, ...], l: int, s: int, d: int, e: int, dtype: str) -> bool:
    """Whether the template computes this attention: a short key sequence, a head dim that fits its registers."""
    elements = math.prod(batch) * max(l, s) * max(d, e)
    return (dtype in DTYPES and 0 < s <= MAX_KEYS and 0 < l and 0 < d <= MAX_HEAD_DIM and 0 < e <= MAX_HEAD_DIM
            and 0 < math.prod(batch) and elements <= INT32_LIMIT)


def configs(l: int, s: int, d: int, e: int) -> list[tuple[int, int, int]]:
    """The configurations worth trying at this shape: blocks no larger than the sequence needs."""
    return [c for c in CONFIGS if c[0] <= _p2(l) and c[1] <= _p2(s)]


@functools.lru_cache(maxsize=None)
def _batch_offsets(batch: tuple[int, ...], strides: tuple[tuple[int, ...], ...]) -> str:
    """Lines that split the program's flat (batch, head) number into each batch dim and sum every operand's
    offset over them (`strides`: per operand q, k, v, mask-or-empty, out, its strides along the batch dims)."""
    names = ("q_off", "k_off", "v_off", "mask_off", "out_off")
    lines = [f"    {n} = 0\n" for n, st in zip(names, strides) if st is not None]
    left = "batch"
    for dim in reversed(range(len(batch))):
        index = f"b{dim}"
        lines.append(f"    {index} = {left} % {batch[dim]}\n" if dim else f"    {index} = {left}\n")
        if dim:
            lines.append(f"    {left}_{dim} = {left} // {batch[dim]}\n")
            left = f"{left}_{dim}"
        for n, st in zip(names, strides):
            if st is not None and st[dim]:
                lines.append(f"    {n} += {index} * {st[dim]}\n")
    return "".join(lines)


def source(name: str, head: str, batch: tuple[int, ...], l: int, s: int, d: int, e: int, scale: float,
           mask: str, strides: tuple[tuple[int, ...], ...], xblock: int) -> str:
    """The template's module at one XBLOCK (the programs per (batch, head) are a literal). `mask`: "" (none),
    "additive", "boolean" or "causal"; `strides`: q's, k's, v's, the mask's (() where none is read) and the output's,
    each at the full rank of the batch dims and the two after (a mask's broadcast dims 0)."""
    nb = len(batch)
    reads_mask = mask in ("additive", "boolean")
    q, k, v, m, o = strides
    per = [q[:nb], k[:nb], v[:nb], m[:nb] if reads_mask else None, o[:nb]]
    q, k, v, m, o = q[nb:], k[nb:], v[nb:], m[nb:], o[nb:]
    mask_lines = ""
    if reads_mask:
        mask_lines = (_ADDITIVE if mask == "additive" else _BOOLEAN).format(
            m_rows=_times("rows[:, None]", m[0]), m_cols=_times("keys[None, :]", m[1]), l=l, s=s)
    elif mask == "causal":
        mask_lines = _CAUSAL
    note = {"": "", "additive": " + mask", "boolean": " where mask", "causal": " where causal"}[mask]
    return _TEMPLATE.format(
        head=head, name=name, params="q, k, v, mask, out" if reads_mask else "q, k, v, out",
        out_shape=list(batch) + [l, e], q_shape=list(batch) + [l, d], k_shape=list(batch) + [s, d],
        v_shape=list(batch) + [s, e], scale=scale, mask_note=note, query_blocks=-(-l // xblock),
        batch_offsets=_batch_offsets(batch, tuple(per)), d_p2=_p2(d), e_p2=_p2(e), l=l, s=s, d=d, e=e,
        q_rows=_times("rows[:, None]", q[0]), q_cols=_times("d[None, :]", q[1]),
        k_rows=_times("keys[:, None]", k[0]), k_cols=_times("d[None, :]", k[1]),
        v_rows=_times("keys[:, None]", v[0]), v_cols=_times("e[None, :]", v[1]),
        o_rows=_times("rows[:, None]", o[0]), o_cols=_times("e[None, :]", o[1]), mask=mask_lines)


def _times(index: str, stride: int) -> str:
    """An operand's offset along one dim: `index * stride`, readable where the stride is 0 or 1."""
    return "0" if stride == 0 else index if stride == 1 else f"{index} * {stride}"


def render_attention(kernel: K.AttentionKernel) -> TritonKernel:
    """The kernel's module and launch: one program per XBLOCK queries of each (batch, head), at the configuration it
    was timed at."""
    config = kernel.config
    text = source(kernel.name, provenance_comment(kernel, "#"), kernel.batch, kernel.l, kernel.s, kernel.d, kernel.e,
                  kernel.scale, kernel.mask, kernel.strides(), config["xblock"])
    arg_types = [POINTER_TYPES[b.dtype] for b in kernel.inputs + kernel.outputs]
    launch = {"constants": {"XBLOCK": config["xblock"], "BN": config["bn"]}, "num_warps": config["warps"]}
    items = math.prod(kernel.batch) * -(-kernel.l // config["xblock"]) * config["xblock"]
    return TritonKernel(kernel.name, text, arg_types, items=items, configs=[launch])


def attention_template(spec: tuple, timed: bool) -> Optional[tuple[Optional[dict[str, float]], dict]]:
    """transpiler/attention_kernels.py's hook: for one call site (`spec`: AttentionKernel.spec()), ({"aten":
    ATen's GPU seconds per call, "generated": the template's fastest}, its configuration), operands cold in L2;
    untimed (or off CUDA), (None, the first configuration). None where the template does not fit it, or where no
    configuration compiles and computes ATen's answer."""
    batch, l, s, d, e, dtype = spec[:6]
    if not fits(batch, l, s, d, e, dtype):
        return None
    if not timed or not torch.cuda.is_available():
        xblock, bn, warps = configs(l, s, d, e)[0]
        return None, {"xblock": xblock, "bn": bn, "warps": warps}
    return _timed(spec, f"cuda:{torch.cuda.current_device()}")


def operands(spec: tuple, device: str) -> tuple:
    """Random q, k, v (and mask, broadcast as the call site's) at the spec's shapes and strides, and an output at
    the output's strides."""
    batch, l, s, d, e, dtype, _, mask, strides = spec
    torch_dtype = getattr(torch, dtype)

    def made(shape, stride, kind=torch_dtype):
        size = 1 + sum((n - 1) * st for n, st in zip(shape, stride))
        base = (torch.rand(size, device=device) > 0.3 if kind == torch.bool else
                torch.randn(size, device=device).to(kind))
        return base.as_strided(shape, stride)
    q, k, v, m, out = strides
    mask_kind = torch.bool if mask == "boolean" else torch_dtype
    return (made(batch + (l, d), q), made(batch + (s, d), k), made(batch + (s, e), v),
            made(batch + (l, s), m, mask_kind) if mask in ("additive", "boolean") else None,
            made(batch + (l, e), out))


def aten_call(spec: tuple, q, k, v, m):
    """ATen's form of the call site."""
    scale, mask = spec[6], spec[7]
    return lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=mask == "causal",
                                                                    scale=scale)


@functools.lru_cache(maxsize=None)
def _timed(spec: tuple, device: str) -> Optional[tuple[dict[str, float], dict]]:
    """The template's fastest configuration at the call site against ATen's call, timed side by side on `device`."""
    batch, l, s, d, e, dtype = spec[:6]
    itemsize = getattr(torch, dtype).itemsize
    copied = [operands(spec, device) for _ in range(cold_copies(math.prod(batch) * (l * d + s * d + s * e) * itemsize))]
    by_label = {f"xblock{xblock} bn{bn} w{warps}": {"xblock": xblock, "bn": bn, "warps": warps}
                for xblock, bn, warps in configs(l, s, d, e)}

    def launcher(c: dict):
        launch = _compiled(spec, c["xblock"])
        return lambda q, k, v, m, out: launch(q, k, v, m, out, c["bn"], c["warps"])
    micros, kept = fastest_checked(by_label, launcher, copied, aten_call(spec, *copied[0][:4])(),
                                   1e-4 if dtype == "float32" else 2e-2,
                                   beside={"aten": [aten_call(spec, *ops[:4]) for ops in copied]})
    if not kept:
        return None
    best = min(kept, key=micros.get)
    return {"aten": micros["aten"] / 1e6, "generated": micros[best] / 1e6}, kept[best]


@functools.lru_cache(maxsize=None)
def _compiled(spec: tuple, xblock: int):
    """A launcher of the template at this call site: launch(q, k, v, mask, out, bn, warps)."""
    from .compile_triton import kernel_function
    batch, l, s, d, e, dtype, scale, mask, strides = spec
    name = "short_attention"
    text = source(name, "# timed by attention_kernels", batch, l, s, d, e, scale, mask, strides, xblock)
    fn = kernel_function(text, name)
    grid = (math.prod(batch) * -(-l // xblock),)

    def launch(q, k, v, m, out, bn: int, warps: int) -> None:
        args = (q, k, v, m, out) if m is not None else (q, k, v, out)
        fn[grid](*args, XBLOCK=xblock, BN=bn, num_warps=warps)
    return launch
