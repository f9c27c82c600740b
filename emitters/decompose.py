"""Decompositions: kernel-IR rewrites that spell an op through simpler ones, for a language that lacks it.

Triton's `triton.language` has no expm1, log1p, tanh, round, trunc, sign, tan or a pow that keeps a negative base's
sign (and libdevice, which has them, exists neither under the interpreter nor on every Triton we support). Each
decomposition here is the accurate formula (Kahan's tricks for expm1 and log1p, half-to-even rounding, C's pow),
written once in the kernel IR, so that every renderer that lists the op in its `DECOMPOSE` shares it, and the parts
are hash-consed, hoisted and simplified like any other expression. C++ lists none: libm has them all.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional

from jit2triton.transpiler import kernel_ir as K
from jit2triton.transpiler.kernel_ir import compute_dtype

KExpr = K.KExpr


def _c(value, like: KExpr) -> KExpr:
    return K.const(value, like.dtype)


def _expm1(x: KExpr) -> KExpr:
    # (u - 1) * x / log(u) cancels the rounding error of u = exp(x) near 0
    u = K.op("exp", x)
    u_minus_1 = K.op("sub", u, _c(1.0, x))
    result = K.op("where", K.op("eq", u, _c(1.0, x)), x,
                  K.op("truediv", K.op("mul", u_minus_1, x), K.op("log", u)))
    result = K.op("where", K.op("eq", u_minus_1, _c(-1.0, x)), _c(-1.0, x), result)
    return K.op("where", K.op("eq", u, _c(float("inf"), x)), u, result)


def _log1p(x: KExpr) -> KExpr:
    # log(u) * x / (u - 1) cancels the rounding error of u = 1 + x near 0
    u = K.op("add", _c(1.0, x), x)
    result = K.op("where", K.op("eq", u, _c(1.0, x)), x,
                  K.op("truediv", K.op("mul", K.op("log", u), x), K.op("sub", u, _c(1.0, x))))
    return K.op("where", K.op("eq", u, _c(float("inf"), x)), u, result)


def _tanh(x: KExpr) -> KExpr:
    # tanh|x| = -expm1(-2|x|) / (2 + expm1(-2|x|)): accurate near 0, and exactly 1 where it saturates
    e = _expm1(K.op("mul", _c(-2.0, x), K.op("abs", x)))
    magnitude = K.op("truediv", K.op("neg", e), K.op("add", _c(2.0, x), e))
    return K.op("where", K.op("lt", x, _c(0.0, x)), K.op("neg", magnitude), magnitude)


def _round(x: KExpr) -> KExpr:
    # half to even, as torch.round
    low = K.op("floor", x)
    fraction = K.op("sub", x, low)
    low_is_odd = K.op("eq", K.op("sub", low, K.op("mul", _c(2.0, x), K.op("floor", K.op("mul", low, _c(0.5, x))))),
                      _c(1.0, x))
    up = K.op("or", K.op("gt", fraction, _c(0.5, x)), K.op("and", K.op("eq", fraction, _c(0.5, x)), low_is_odd))
    return K.op("where", up, K.op("add", low, _c(1.0, x)), low)


def _trunc(x: KExpr) -> KExpr:
    return K.op("where", K.op("lt", x, _c(0, x)), K.op("ceil", x), K.op("floor", x))


def _sign(x: KExpr) -> KExpr:
    return K.op("sub", K.cast(K.op("gt", x, _c(0, x)), x.dtype), K.cast(K.op("lt", x, _c(0, x)), x.dtype))


def _tan(x: KExpr) -> KExpr:
    return K.op("truediv", K.op("sin", x), K.op("cos", x))


def _float_pow(x: KExpr, y: KExpr) -> KExpr:
    # C's pow through exp2 and log2: a negative base keeps its sign under an odd integral exponent, and is NaN
    # under a fractional one; x**0 and 1**y are 1, even for NaN
    negative = K.op("lt", x, _c(0.0, x))
    magnitude = K.op("exp2", K.op("mul", y, K.op("log2", K.op("abs", x))))
    integral = K.op("eq", K.op("floor", y), y)
    odd = K.op("and", integral, K.op("ne", K.op("mul", _c(2.0, y), K.op("floor", K.op("mul", y, _c(0.5, y)))), y))
    result = K.op("where", K.op("and", negative, odd), K.op("neg", magnitude), magnitude)
    result = K.op("where", K.op("and", negative, K.op("not", integral)), _c(float("nan"), x), result)
    return K.op("where", K.op("or", K.op("eq", y, _c(0.0, y)), K.op("eq", x, _c(1.0, x))), _c(1.0, x), result)


def _pow(x: KExpr, y: KExpr) -> KExpr:
    if compute_dtype(x.dtype).startswith("float"):
        return _float_pow(x, y)
    # integers: the float64 power rounded, exact while the result fits in 53 bits
    power = _float_pow(K.cast(x, "float64"), K.cast(y, "float64"))
    return K.cast(K.op("floor", K.op("add", power, K.const(0.5, "float64"))), x.dtype)


def _on_floats(rewrite: Callable[[KExpr], KExpr]) -> Callable[[KExpr], KExpr]:
    """Rounding ops are the identity on integers."""
    return lambda x: rewrite(x) if compute_dtype(x.dtype).startswith("float") else x


DECOMPOSITIONS: dict[str, Callable[..., KExpr]] = {
    "expm1": _expm1, "log1p": _log1p, "tanh": _tanh, "round": _on_floats(_round), "trunc": _on_floats(_trunc),
    "sign": _sign, "tan": _tan, "pow": _pow,
}


# Ops folded when their arguments are constants: those exact in every float width (a decomposition over a
# constant exponent leaves no all-constant work, and no 0-d block, in the kernel)
_EXACT = {
    "floor": math.floor, "ceil": math.ceil, "neg": lambda a: -a, "abs": abs, "not": lambda a: not a,
    "eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "lt": lambda a, b: a < b, "le": lambda a, b: a <= b,
    "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b, "and": lambda a, b: bool(a and b),
    "or": lambda a, b: bool(a or b),
}


def _fold(node: KExpr) -> KExpr:
    args = node.args
    constant = [a.op == "const" for a in args]
    if node.op in _EXACT and all(constant) and not any(isinstance(a.arg, float) and not math.isfinite(a.arg)
                                                       for a in args):
        return K.const(_EXACT[node.op](*(a.arg for a in args)), node.dtype)
    if node.op in ("and", "or") and any(constant):  # x & True == x, x & False == False (and so for |)
        known, other = (args[0], args[1]) if constant[0] else (args[1], args[0])
        absorbing = node.op == "or"
        if bool(known.arg) == absorbing:
            return K.const(absorbing, node.dtype)
        return other if other.dtype == node.dtype else node
    if node.op == "where" and constant[0]:
        return args[1] if args[0].arg else args[2]
    return node


def decompose(kernel: K.Kernel, ops: frozenset, names: Optional[dict] = None) -> K.Kernel:
    """The kernel with every op in `ops` rewritten through its decomposition (to a fixpoint: tanh uses expm1).
    `names`, if given, gets id(result) -> the op it spells, so a renderer can name the value after it."""
    if not ops:
        return kernel
    memo: dict[int, KExpr] = {}
    names = {} if names is None else names

    def visit(node: KExpr) -> KExpr:
        found = memo.get(id(node))
        if found is not None:
            return found
        args = tuple(visit(a) for a in node.args)
        if node.op in ops:
            result = visit(DECOMPOSITIONS[node.op](*args))
            names.setdefault(id(result), node.op)
        elif all(a is b for a, b in zip(args, node.args)):
            result = _fold(node)
        else:
            result = _fold(K.KExpr(node.op, args, node.arg, node.dtype))
        memo[id(node)] = result
        return result

    values = [visit(v) for v in kernel.values]
    if all(a is b for a, b in zip(values, kernel.values)):
        return kernel
    return dataclasses.replace(kernel, values=values)
