"""What each kernel-IR op means in Triton: the op table, the ops decomposed in the kernel IR first (expm1, log1p,
tanh, round, trunc, sign, tan, pow: decompose.py), literals, reductions' neutral elements, and the small
`@triton.jit` helpers for what neither triton.language nor a decomposition gives (Python's integer floor division and
remainder, bfloat16 rounding, NaN-propagating row max/min, first-index argmax).

On the GPU, ops round as ATen's CUDA kernels do, bit for bit, where a cheap form does: float32 division and
reciprocal IEEE-rounded (`tl.math.div_rn`; Triton's `/` is the approximate div.full), exp, sigmoid and rsqrt
through libdevice (as nvcc compiles ATen's; `tl.exp` is the approximate ex2). A detector's top-k or NMS turns a
last-bit difference into another box (issue 46: FCOS and Mask R-CNN lost every kernel to verification). libdevice
is reached only through the helpers below, whose `J2T_LIBDEVICE` switch takes triton.language's forms under the
Triton interpreter (which has no libdevice), so one source compiles on Triton 3.6 and 3.9 and runs there too.
"""
from __future__ import annotations

import math
import struct

from jit2triton.transpiler.kernel_ir import compute_dtype, free_vars

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
# ATen's CUDA rounding (the module docstring): libdevice on the GPU, triton.language's forms under the interpreter.
# J2T_LIBDEVICE is a module constant (a constexpr, as Triton requires of a global a kernel reads), decided when the
# module is imported: the interpreter is chosen by TRITON_INTERPRET before any kernel is made
HELPERS["j2t_libdevice"] = '''
import os
from triton.language.extra import libdevice
J2T_LIBDEVICE = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") != "1")
'''


def _libdevice_or(name: str, call: str, interpreted: str) -> str:
    """A helper taking libdevice's `call` on the GPU and `interpreted` under the interpreter."""
    return f'''
@triton.jit
def {name}(x):
    if J2T_LIBDEVICE:
        y = libdevice.{call}(x)
    else:
        y = {interpreted}
    return y
'''


HELPERS["j2t_exp"] = _libdevice_or("j2t_exp", "exp", "tl.exp(x)")
HELPERS["j2t_rsqrt"] = _libdevice_or("j2t_rsqrt", "rsqrt", "1.0 / tl.sqrt_rn(x)")
HELPERS["j2t_sigmoid"] = '''
@triton.jit
def j2t_sigmoid(x):
    # ATen's 1 / (1 + exp(-x)) in float32, each step rounded as it rounds
    return tl.math.div_rn(1.0, 1.0 + j2t_exp(-x))
'''
HELPER_NEEDS = {"j2t_row_argmax": ["j2t_row_max"], "j2t_row_argmin": ["j2t_row_min"], "j2t_exp": ["j2t_libdevice"],
                "j2t_rsqrt": ["j2t_libdevice"], "j2t_sigmoid": ["j2t_exp", "j2t_libdevice"]}

# Ops triton.language lacks, rewritten in the kernel IR before rendering (decompose.py)
DECOMPOSE = frozenset({"expm1", "log1p", "tanh", "round", "trunc", "sign", "tan", "pow"})


def _is_float(node) -> bool:
    return compute_dtype(node.args[0].dtype).startswith("float")


def _load(writer, node, args: list) -> str:
    if node.arg in writer.by_value:  # a host number, a one-element block of it
        if free_vars(node):
            raise NotImplementedError(f"a load of host number {node.arg} that varies with the loop")
        return f"({writer.buffer_names[node.arg]} + tl.zeros({writer.unit_block()}, {TL_TYPES[node.dtype]}))"
    mask = writer.mask_for(node)
    pointer = f"{writer.buffer_names[node.arg]} + {args[0]}"
    if not free_vars(node):  # a one-element block, never a 0-d scalar (see `unit_block`)
        pointer += f" + tl.zeros({writer.unit_block()}, tl.int32)"
    elif writer.groups_of(node.args[0]) != writer.groups_of(node):  # the pointer spans its mask's whole tile
        pointer += f" + tl.zeros({writer.tile(writer.groups_of(node))}, tl.int32)"
    if len(args) == 2:  # a masked load (a piece of a cat): lanes outside its piece read no memory
        mask = f"{mask} & {args[1]}" if mask else args[1]
    code = f"tl.load({pointer}, mask={mask}, other=0)" if mask else f"tl.load({pointer})"
    # float16/bfloat16 compute in float32
    return code + ".to(tl.float32)" if compute_dtype(node.dtype) != node.dtype else code


def _cast(writer, node, args: list) -> str:
    kind, source = compute_dtype(node.dtype), compute_dtype(node.args[0].dtype)
    if node.dtype in ("float16", "bfloat16") and node.args[0].dtype not in ("float16", "bfloat16"):
        if node.dtype == "bfloat16":  # round there and then, as the eager cast does
            return _helper("j2t_round_bf16({0}.to(tl.float32))")(writer, node, args)
        return f"{args[0]}.to(tl.float16).to(tl.float32)"
    if source == kind:
        return args[0]
    return f"({args[0]} != 0)" if kind == "bool" else f"{args[0]}.to({TL_TYPES[kind]})"


def _helper(template: str):
    """A call of one of HELPERS, copied into the module. A helper is Python code under the interpreter: literal
    arguments go in as typed one-element blocks."""
    def render(writer, node, args: list) -> str:
        writer.use(template.split("(")[0])
        args = [f"tl.full({writer.unit_block()}, {a}, {TL_TYPES[compute_dtype(n.dtype)]})" if n.op == "const" else a
                for a, n in zip(args, node.args)]
        return template.format(*args)
    return render


def _float_only(template: str):
    """Rounding to an integral value: the identity on integers."""
    return lambda writer, node, args: template.format(*args) if _is_float(node) else args[0]


def _extremum(writer, node, args: list) -> str:
    if compute_dtype(node.args[0].dtype) == "bool":
        return f"({args[0]} {'|' if node.op == 'maximum' else '&'} {args[1]})"
    nan = ", propagate_nan=tl.PropagateNan.ALL" if _is_float(node) else ""
    return f"tl.{node.op}({args[0]}, {args[1]}{nan})"


def _truediv(writer, node, args: list) -> str:
    # integer operands: C's truncating division, as in the C++ renderer; float32 IEEE-rounded, as ATen's
    if not _is_float(node):
        return f"({args[0]} // {args[1]})"
    return f"tl.math.div_rn({args[0]}, {args[1]})" if _is_float32(node) else f"({args[0]} / {args[1]})"


def _reciprocal(writer, node, args: list) -> str:
    return f"tl.math.div_rn(1.0, {args[0]})" if _is_float32(node) else f"(1.0 / {args[0]})"


def _sigmoid(writer, node, args: list) -> str:
    return _helper("j2t_sigmoid({0})")(writer, node, args) if _is_float32(node) else f"tl.sigmoid({args[0]})"


def _is_float32(node) -> bool:
    return compute_dtype(node.dtype) == "float32"


def _floordiv(writer, node, args: list) -> str:
    if _is_float(node):
        return f"tl.floor({args[0]} / {args[1]})"
    return _helper("j2t_floordiv_int({0}, {1})")(writer, node, args)


def _sqrt(writer, node, args: list) -> str:
    if node.op == "rsqrt" and _is_float32(node):
        return _helper("j2t_rsqrt({0})")(writer, node, args)
    root = f"tl.sqrt_rn({args[0]})" if _is_float32(node) else f"tl.sqrt({args[0]})"
    return root if node.op == "sqrt" else f"(1.0 / {root})"


OPS = {
    "load": _load, "cast": _cast, "where": "tl.where({0}, {1}, {2})", "fma": "tl.fma({0}, {1}, {2})",
    "neg": "(-{0})", "exp": _helper("j2t_exp({0})"), "exp2": "tl.exp2({0})", "log": "tl.log({0})",
    "log2": "tl.log2({0})", "sin": "tl.sin({0})", "cos": "tl.cos({0})", "erf": "tl.erf({0})", "sigmoid": _sigmoid,
    "sqrt": _sqrt, "rsqrt": _sqrt, "abs": "tl.abs({0})", "floor": _float_only("tl.floor({0})"),
    "ceil": _float_only("tl.ceil({0})"), "reciprocal": _reciprocal, "isnan": "({0} != {0})",
    "isinf": '(tl.abs({0}) == float("inf"))', "not": "({0} == 0)",
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "truediv": _truediv, "floordiv": _floordiv,
    "mod": _helper("j2t_mod({0}, {1})"), "fmod": "({0} % {1})", "maximum": _extremum, "minimum": _extremum,
    "lt": "({0} < {1})", "le": "({0} <= {1})", "gt": "({0} > {1})", "ge": "({0} >= {1})", "eq": "({0} == {1})",
    "ne": "({0} != {1})", "and": "({0} & {1})", "or": "({0} | {1})", "xor": "({0} ^ {1})",
    "index_div": "({0} // {1})", "index_mod": "({0} % {1})",
}


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
