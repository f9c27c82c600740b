"""torchvision's NMS on CUDA as two generated kernels around ATen's sort (transpiler/gpu_nms.py makes the nodes).

torchvision's CUDA `nms` sorts the scores (stably, descending), computes a bit mask of which later boxes each box
overlaps past the threshold (64 x 64 boxes a block), then walks the boxes in order in one block of threads
(`gather_keep_from_mask`): every kept box waits for a global load of its mask row and a barrier, 0.7 us a box, so
5,000 boxes took 3.7 ms of FCOS's 12 ms of GPU time, and each of SSDlite's 180 calls 40 us.

Here the mask is the same bits, computed with torchvision's float arithmetic step for step (the kernel's
`iou_form`: which product torchvision's compiler fused into an FMA, transpiler/nms_facts.py asks it), so the kept
boxes are the same. The walk
decides a block of 64 boxes at a time from the block's own 64 words (scalar loads that do not wait on the
decisions), then ORs the kept boxes' rows into the later blocks' words in one vector step.

The mask is an int8 buffer of n * n + 8 * n bytes read as int64 words [n, ceil(n / 64)] (sizes are polynomials in
n: no ceil), and the walk keeps its per-block `removed` words in the bytes past the mask's words.
"""
from __future__ import annotations

import numpy as np

from jit2triton.transpiler import kernel_ir as K

from .common import provenance_comment
from .triton import POINTER_TYPES, TritonKernel

# `Sa + Sb - inter` as each of transpiler/nms_facts.py's IOU_FORMS rounds it (the rows are the earlier boxes)
IOU_FORMS = {
    "plain": "(area_r[:, None] + area_c[None, :]) - inter",
    "fma_earlier": "tl.fma(wr[:, None], hr[:, None], area_c[None, :]) - inter",
    "fma_later": "tl.fma(wc[None, :], hc[None, :], area_r[:, None]) - inter",
}
BLOCK = 64  # boxes a mask word covers (torchvision's threadsPerBlock)

# Both kernels' first lines: the box count, the mask's column blocks, and its bytes read as int64 words
_WORDS = '''    n = ({n}).to(tl.int32)
    blocks = (n + 63) // 64
    words = mask.to(tl.pointer_type(tl.int64))
'''

_MASK = '''import triton
import triton.language as tl


@triton.jit
def _corners(boxes, first, n):
    # 64 boxes from `first`: their corners, width, height and area, in torchvision's order of operations
    index = first + tl.arange(0, 64)
    inside = index < n
    x1 = tl.load(boxes + index * 4, mask=inside, other=0.0)
    y1 = tl.load(boxes + index * 4 + 1, mask=inside, other=0.0)
    x2 = tl.load(boxes + index * 4 + 2, mask=inside, other=0.0)
    y2 = tl.load(boxes + index * 4 + 3, mask=inside, other=0.0)
    w = x2 - x1
    h = y2 - y1
    return index, inside, x1, y1, x2, y2, w, h, w * h


{decorator}
def {name}(boxes, mask, {dims}XBLOCK: tl.constexpr):
{comment}
    # Boxes sorted by score, [n, 4] (x1, y1, x2, y2); program r: rows r*64..r*64+63 against every later column
    # block. Bit j of word [i, c] is box c*64+j (after box i) overlapping box i by more than {threshold!r}.
{words}    rows, inside, rx1, ry1, rx2, ry2, wr, hr, area_r = _corners(boxes, tl.program_id(0) * 64, n)
    bits = tl.full([64], 1, tl.int64) << tl.arange(0, 64).to(tl.int64)
    for c in range(tl.program_id(0), blocks):
        cols, there, cx1, cy1, cx2, cy2, wc, hc, area_c = _corners(boxes, c * 64, n)
        width = tl.maximum(tl.minimum(rx2[:, None], cx2[None, :]) - tl.maximum(rx1[:, None], cx1[None, :]), 0.0)
        height = tl.maximum(tl.minimum(ry2[:, None], cy2[None, :]) - tl.maximum(ry1[:, None], cy1[None, :]), 0.0)
        inter = width * height
        iou = tl.math.div_rn(inter, {denominator})
        over = (iou > {threshold!r}) & there[None, :] & (cols[None, :] > rows[:, None])
        word = tl.sum(tl.where(over, bits[None, :], 0), axis=1)  # distinct bits: their sum is their OR
        tl.store(words + rows.to(tl.int64) * blocks + c, word, mask=inside)
'''

_WALK = '''import triton
import triton.language as tl


@triton.jit
def _or(a, b):
    return a | b


{decorator}
def {name}(mask, keep, {dims}XBLOCK: tl.constexpr):
{comment}
    # One program walks the boxes in score order, 64 at a time: a box is kept unless a kept box before it overlaps
    # it (the bits of its column block's word, OR-ed over the kept rows so far: `removed`)
{words}    removed = words + n.to(tl.int64) * blocks  # (the bytes past the mask's words)
    lanes = tl.arange(0, 128)
    for c0 in range(0, blocks, 128):
        tl.store(removed + c0 + lanes, tl.zeros([128], tl.int64), mask=c0 + lanes < blocks)
    tl.debug_barrier()
    one = tl.full([], 1, tl.int64)
    for b in range(0, blocks):
        row0 = b * 64
        gone = tl.load(removed + b)
        kept = tl.zeros([], tl.int64)
        for i in tl.static_range(64):  # the block's own decisions, in order
            row = row0 + i
            own = tl.load(words + row.to(tl.int64) * blocks + b, mask=row < n, other=0)
            take = ((gone >> i) & 1) == 0
            gone = tl.where(take, gone | own, gone)
            kept = tl.where(take, kept | (one << i), kept)
        rows = row0 + tl.arange(0, 64)
        taken = ((kept >> tl.arange(0, 64).to(tl.int64)) & 1) != 0
        tl.store(keep + rows, taken & (rows < n), mask=rows < n)
        reading = taken & (rows < n)
        for c0 in range(b + 1, blocks, 128):  # the kept rows' words for every later block, OR-ed in
            cols = c0 + lanes
            there = cols < blocks
            row_words = tl.load(words + rows.to(tl.int64)[:, None] * blocks + cols[None, :],
                                mask=reading[:, None] & there[None, :], other=0)
            merged = tl.reduce(row_words, 0, _or)
            tl.store(removed + cols, tl.load(removed + cols, mask=there, other=0) | merged, mask=there)
        tl.debug_barrier()
'''


def _f32(value: float) -> float:
    """The float32 threshold torchvision compares in (its double argument converted), as a Python float: exact."""
    return float(np.float32(value))


def render_nms_mask(kernel: K.NmsMaskKernel) -> TritonKernel:
    """A program per 64 sorted boxes (items n, XBLOCK 64)."""
    source = _MASK.format(threshold=_f32(kernel.threshold), denominator=IOU_FORMS[kernel.iou_form], **_parts(kernel))
    return _launch(kernel, source, kernel.boxes, BLOCK)


def render_nms_walk(kernel: K.NmsWalkKernel) -> TritonKernel:
    """One program."""
    return _launch(kernel, _WALK.format(**_parts(kernel)), 1, 1)


def _parts(kernel: K.Kernel) -> dict[str, str]:
    """The template's name, provenance comment, decorator, size parameters and box count `n` (an int, or a
    polynomial over the size parameters: the count of a mask's or an NMS's boxes, bound at run time)."""
    names = kernel.size_names
    count = kernel.boxes
    n = str(count) if isinstance(count, int) else " + ".join(
        "*".join([str(coef)] + [f"dim_{name}" for name in factors]) for coef, factors in count.terms)
    decorator = f"@triton.jit(do_not_specialize=[{', '.join(repr(f'dim_{x}') for x in names)}])" if names else \
        "@triton.jit"
    return {"name": kernel.name, "comment": _indented(provenance_comment(kernel, "#")), "decorator": decorator,
            "words": _WORDS.format(n=f"tl.full([], {n}, tl.int64)" if isinstance(count, int) else n),
            "dims": "".join(f"dim_{x}: tl.int64, " for x in names)}


def _launch(kernel: K.Kernel, source: str, items, xblock: int) -> TritonKernel:
    arg_types = [POINTER_TYPES[b.dtype] for b in kernel.inputs + kernel.outputs] + ["i64"] * len(kernel.size_names)
    return TritonKernel(kernel.name, source, arg_types, items=items,
                        configs=[{"constants": {"XBLOCK": xblock}, "num_warps": 4}],
                        size_args=kernel.size_names, dims=dict(kernel.dims))


def _indented(comment: str) -> str:
    return "\n".join("    " + line if line else line for line in comment.splitlines())
