"""Lowerings of ops that move elements by a shift along dims: padding in its four modes and `roll`. Each output
element reads one input element at a shifted position (wrapped, reflected or clamped at the borders), or, for a
constant pad outside the input, the pad value: an index expression, so they fuse with what surrounds them."""
from __future__ import annotations

from typing import Optional

from . import kernel_ir as K
from .lowering import LowerContext, TensorBox, compute_dtype, is_box, lowering, make_box, normalize_dim, require


@lowering("aten::pad", "aten::constant_pad_nd")
def pad(ctx: LowerContext, x: TensorBox, pads, mode: str = "constant", value: Optional[float] = None) -> TensorBox:
    if ctx.op == "aten::constant_pad_nd":  # constant_pad_nd(self, pad, Scalar value=0)
        mode, value = "constant", mode if not isinstance(mode, str) else 0
    require(isinstance(pads, (list, tuple)) and len(pads) % 2 == 0 and len(pads) // 2 <= len(x.shape)
            and all(isinstance(p, int) for p in pads), "pad widths computed at run time")
    require(mode in _BORDERS or mode == "constant", f"pad mode {mode!r}")
    require(not is_box(value), "a pad value computed at run time")
    rank = len(x.shape)
    # pads run from the last dim backwards: (last's left, last's right, the one before's left, ...)
    lefts = {rank - 1 - i: pads[2 * i] for i in range(len(pads) // 2)}
    require(all(isinstance(x.shape[d], int) for d in lefts), "padding a dynamic dim")
    dtype = compute_dtype(x.dtype)
    fill = K.const(value or 0, dtype)

    def fn(index):
        inside, source = [], list(index)
        for d, left in lefts.items():
            position = index[d] + (-left)
            if mode == "constant":
                test = K.within(position, 0, x.shape[d])
                if test is not None:
                    inside.append(test)
                source[d] = position
            else:
                source[d] = _BORDERS[mode](position, x.shape[d])
        if not inside:
            return x(source)
        hit = inside[0] if len(inside) == 1 else K.op("and", *inside)
        return K.op("where", hit, K.guarded(x(source), hit), fill)

    require(mode == "constant" or all(0 <= p <= x.shape[d] - (mode == "reflect") for d, left in lefts.items()
                                       for p in (left, pads[2 * (rank - 1 - d) + 1])),
            f"{mode} padding wider than its dim")
    return make_box(ctx.out_shape, x.dtype, fn, [x])


def _reflect(position: K.KExpr, n: int) -> K.KExpr:
    """n-1 - |n-1 - |p||: p inside [0, n), mirrored (edge excluded) at either end, for p in [-(n-1), 2(n-1)] (a
    reflect pad is at most n-1 wide). Written so, its bounds are [0, n) for the index rules: the views around a pad
    (a reshape's division and modulo of it) fold away, where a where-chain left them per element (Spectrogram's
    centring pad ran at half ATen's speed)."""
    last = K.const(n - 1, K.INT)
    return K.op("sub", last, K.op("abs", K.op("sub", last, K.op("abs", position))))


def _replicate(position: K.KExpr, n: int) -> K.KExpr:
    return K.op("minimum", K.op("maximum", position, K.const(0, K.INT)), K.const(n - 1, K.INT))


def _circular(position: K.KExpr, n: int) -> K.KExpr:
    return (position + n) % n  # a circular pad is at most the dim's size: one wrap either way


_BORDERS = {"reflect": _reflect, "replicate": _replicate, "circular": _circular}


@lowering("aten::roll")
def roll(ctx: LowerContext, x: TensorBox, shifts, dims=()) -> TensorBox:
    require(isinstance(shifts, (list, tuple)) and all(isinstance(s, int) for s in shifts),
            "roll shifts computed at run time")
    require(len(dims) == len(shifts) and len(dims) > 0, "a roll of the flattened tensor")
    rank = len(x.shape)
    moves = {normalize_dim(d, rank): s for d, s in zip(dims, shifts)}
    require(all(isinstance(x.shape[d], int) and x.shape[d] > 0 for d in moves), "rolling a dynamic or empty dim")

    def fn(index):
        # out[i] = x[(i - shift) mod n], with the shift brought into [0, n) so the sum never goes negative
        return x([(i + (-moves[d]) % x.shape[d]) % x.shape[d] if d in moves else i for d, i in enumerate(index)])

    return make_box(ctx.out_shape, x.dtype, fn, [x])
