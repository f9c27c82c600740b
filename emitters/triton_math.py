"""What each kernel-IR op means in Triton: the expression table, literals, reductions' neutral elements, and the
small `@triton.jit` helpers for what `triton.language` lacks (tanh, expm1, log1p, round, Python's floor division and
remainder, NaN-propagating row max/min, first-index argmax). Only `triton.language` is used, never libdevice: the
same source compiles on Triton 3.6 and 3.9 and runs under the Triton interpreter, which has no libdevice.
"""
from __future__ import annotations

import math
import struct

from jit2triton.transpiler.kernel_ir import compute_dtype

TL_TYPES = {"float32": "tl.float32", "float64": "tl.float64", "float16": "tl.float16", "bfloat16": "tl.bfloat16",
            "int64": "tl.int64", "int32": "tl.int32", "int16": "tl.int16", "int8": "tl.int8", "uint8": "tl.uint8",
            "bool": "tl.int1"}
HELPERS = {
    "j2t_round_bf16": '''
@triton.jit
def j2t_round_bf16(x):
    # float32 -> bfloat16 -> float32, round to nearest even, on the bits: the interpreter's own cast truncates
    bits = x.to(tl.uint32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return tl.where(x != x, x, rounded.to(tl.float32, bitcast=True))
''',
    "j2t_floordiv_int": '''
@triton.jit
def j2t_floordiv_int(a, b):
    # Python's floor division: the GPU's integer division truncates toward zero
    quotient = a // b
    return tl.where(((a % b) != 0) & ((a < 0) != (b < 0)), quotient - 1, quotient)
''',
    "j2t_mod": '''
@triton.jit
def j2t_mod(a, b):
    # Python's remainder takes the divisor's sign; `%` here is C's, which takes the dividend's
    rest = a % b
    return tl.where((rest != 0) & ((rest < 0) != (b < 0)), rest + b, rest)
''',
    "j2t_expm1": '''
@triton.jit
def j2t_expm1(x):
    # Kahan's trick: (u - 1) * x / log(u) cancels the rounding error of u = exp(x) near 0
    u = tl.exp(x)
    u_minus_1 = u - 1.0
    result = tl.where(u == 1.0, x, u_minus_1 * x / tl.log(u))
    result = tl.where(u_minus_1 == -1.0, -1.0, result)
    return tl.where(u == float("inf"), u, result)
''',
    "j2t_log1p": '''
@triton.jit
def j2t_log1p(x):
    # Kahan's trick: log(u) * x / (u - 1) cancels the rounding error of u = 1 + x near 0
    u = 1.0 + x
    result = tl.where(u == 1.0, x, tl.log(u) * x / (u - 1.0))
    return tl.where(u == float("inf"), u, result)
''',
    "j2t_tanh": '''
@triton.jit
def j2t_tanh(x):
    # tanh|x| = -expm1(-2|x|) / (2 + expm1(-2|x|)): accurate near 0 and saturating exactly at 1
    e = j2t_expm1(-2.0 * tl.abs(x))
    magnitude = -e / (2.0 + e)
    return tl.where(x < 0, -magnitude, magnitude)
''',
    "j2t_round": '''
@triton.jit
def j2t_round(x):
    # round half to even, as torch.round
    low = tl.floor(x)
    fraction = x - low
    low_is_odd = (low - 2.0 * tl.floor(low * 0.5)) == 1.0
    up = (fraction > 0.5) | ((fraction == 0.5) & low_is_odd)
    return tl.where(up, low + 1.0, low)
''',
    "j2t_trunc": '''
@triton.jit
def j2t_trunc(x):
    return tl.where(x < 0, tl.ceil(x), tl.floor(x))
''',
    "j2t_sign": '''
@triton.jit
def j2t_sign(x):
    return (x > 0).to(x.dtype) - (x < 0).to(x.dtype)
''',
    "j2t_pow": '''
@triton.jit
def j2t_pow(x, y):
    # C's pow through exp2/log2: a negative base keeps its sign under an odd integral exponent
    magnitude = tl.exp2(y * tl.log2(tl.abs(x)))
    integral = tl.floor(y) == y
    odd = integral & (2.0 * tl.floor(y * 0.5) != y)
    result = tl.where((x < 0) & odd, -magnitude, magnitude)
    result = tl.where((x < 0) & (integral == 0), float("nan"), result)
    return tl.where((y == 0) | (x == 1), 1.0, result)
''',
    "j2t_multiply": '''
@triton.jit
def j2t_multiply(a, b):
    return a * b
''',
    "j2t_row_max": '''
@triton.jit
def j2t_row_max(x):
    # tl.max skips NaN; torch's max is NaN for a row that holds one
    biggest = tl.max(x, 1, keep_dims=True)
    return tl.where(tl.max((x != x).to(tl.int8), 1, keep_dims=True) != 0, float("nan"), biggest)
''',
    "j2t_row_min": '''
@triton.jit
def j2t_row_min(x):
    smallest = tl.min(x, 1, keep_dims=True)
    return tl.where(tl.max((x != x).to(tl.int8), 1, keep_dims=True) != 0, float("nan"), smallest)
''',
    "j2t_row_argmax": '''
@triton.jit
def j2t_row_argmax(values, positions):
    # the first position of the row's largest value; NaN counts as the largest, as in torch
    best = j2t_row_max(values)
    is_best = (values == best) | ((values != values) & (best != best))
    return tl.min(tl.where(is_best, positions, 2147483647), 1, keep_dims=True)
''',
    "j2t_row_argmin": '''
@triton.jit
def j2t_row_argmin(values, positions):
    best = j2t_row_min(values)
    is_best = (values == best) | ((values != values) & (best != best))
    return tl.min(tl.where(is_best, positions, 2147483647), 1, keep_dims=True)
''',
}
HELPER_NEEDS = {"j2t_tanh": ["j2t_expm1"], "j2t_row_argmax": ["j2t_row_max"], "j2t_row_argmin": ["j2t_row_min"]}
EXPRESSIONS = {
    "neg": "(-{0})", "exp": "tl.exp({0})", "log": "tl.log({0})", "sin": "tl.sin({0})", "cos": "tl.cos({0})",
    "tan": "(tl.sin({0}) / tl.cos({0}))", "erf": "tl.erf({0})", "sigmoid": "tl.sigmoid({0})",
    "reciprocal": "(1.0 / {0})", "isnan": "({0} != {0})", "isinf": '(tl.abs({0}) == float("inf"))',
    "not": "({0} == 0)", "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})",
    "truediv": "({0} / {1})", "fmod": "({0} % {1})", "lt": "({0} < {1})", "le": "({0} <= {1})",
    "gt": "({0} > {1})", "ge": "({0} >= {1})", "eq": "({0} == {1})", "ne": "({0} != {1})", "and": "({0} & {1})",
    "or": "({0} | {1})", "xor": "({0} ^ {1})", "where": "tl.where({0}, {1}, {2})", "index_div": "({0} // {1})",
    "index_mod": "({0} % {1})", "log1p": "j2t_log1p({0})", "expm1": "j2t_expm1({0})", "tanh": "j2t_tanh({0})",
    "sign": "j2t_sign({0})", "pow": "j2t_pow({0}, {1})", "abs": "tl.abs({0})",
}
FLOAT_ONLY = {"floor": "tl.floor({0})", "ceil": "tl.ceil({0})", "round": "j2t_round({0})",
               "trunc": "j2t_trunc({0})"}  # on integers these are the identity


def literal(value, dtype: str) -> str:
    kind = compute_dtype(dtype)
    if kind == "bool":
        return "True" if value else "False"
    if kind.startswith(("int", "uint")):
        return f"({int(value)})" if value < 0 else str(int(value))
    if math.isnan(value):
        return 'float("nan")'
    if math.isinf(value):
        return 'float("inf")' if value > 0 else '(-float("inf"))'
    text = repr(float(value))
    if kind == "float64" and float(_as_float32(value)) != value:  # a bare literal would be rounded to float32
        return f"tl.full([], {text}, tl.float64)"
    return f"({text})" if value < 0 else text


def _as_float32(value: float) -> float:
    return struct.unpack("f", struct.pack("f", value))[0] if abs(value) < 3.4e38 else value


def neutral(op: str, kind: str) -> str:
    """The value a masked-off lane holds so that it never changes the reduction `op` over values of `kind`."""
    if op in ("any", "all"):
        return "0" if op == "any" else "1"
    if op in ("sum", "prod"):
        return literal(0 if op == "sum" else 1, kind)
    low = op in ("max", "argmax")
    if kind.startswith("float"):
        return '(-float("inf"))' if low else 'float("inf")'
    bits = int(kind.removeprefix("uint").removeprefix("int")) if kind != "bool" else 1
    if kind.startswith("uint"):
        return "0" if low else str(2 ** bits - 1)
    return f"({-2 ** (bits - 1)})" if low else str(2 ** (bits - 1) - 1)


def ordered(helpers: list[str]) -> list[str]:
    """Helpers in definition order: a helper after the helpers it calls."""
    return sorted(helpers, key=list(HELPERS).index)
