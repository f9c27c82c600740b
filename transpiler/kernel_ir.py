"""The kernel IR: one interned expression node, `KExpr`, for index math, loads, pointwise math and reductions.

Expressions are hash-consed (tinygrad's UOp idea): building the same expression twice returns the same object, so
common subexpressions are shared by construction and a renderer emits each node once. Index arithmetic lives in
the same node type as value math (int64 dtype) and is simplified as it is built, using each loop variable's range.

Ops:
  var        a loop index; arg = (name, size): size an int, or a SymSize over the package's dynamic dims
  sym        a dynamic dim's size, a kernel argument; arg = the dim's name
  const      a literal; arg = value
  load       args = (flat element index,) or (flat element index, mask); arg = buffer name. A masked load
             touches no memory where its (bool) mask is false, and reads 0 there
  reduce     args = (body,); arg = (reduction op, loop vars reduced over, tag)
  cast       args = (x,); arg = dtype name
  index_div, index_mod   index arithmetic on non-negative ints (what C's / and % do there)
  everything else is pointwise math named in POINTWISE_OPS, with torch's semantics (floordiv and mod floor)
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from .symbolic import SymSize

POINTWISE_OPS = {
    # arity 1
    "neg", "exp", "exp2", "log", "log2", "log1p", "expm1", "sqrt", "rsqrt", "sin", "cos", "tan", "tanh", "erf", "abs", "floor",
    "ceil", "round", "trunc", "sign", "not", "isnan", "isinf", "reciprocal", "sigmoid",
    # arity 2
    "add", "sub", "mul", "truediv", "floordiv", "mod", "fmod", "pow", "maximum", "minimum", "lt", "le", "gt", "ge",
    "eq", "ne", "and", "or", "xor",
    # arity 3
    "where", "fma",  # fma: a * b + c rounded once, as ATen's vectorised CPU kernels compute it (BatchNorm)
}
COMPARISONS = {"lt", "le", "gt", "ge", "eq", "ne", "not", "and", "or", "xor", "isnan", "isinf"}
REDUCE_OPS = {"sum", "max", "min", "prod", "any", "all", "argmax", "argmin"}

INT = "int64"
# The dtypes a kernel's buffers and values hold: every renderer has a type for each (tests/test_kernel_ir.py).
# A tensor of any other (complex64, a quantized dtype) is never a kernel's input or output: its ops run through ATen
DTYPES = frozenset({"float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool"})


# Bytes: a GPU kernel is compiled assuming each buffer starts at such an address (vector loads), unless the buffer
# says it may not (`KernelBuffer.aligned`); the runtime copies an input that breaks the assumption
ALIGNMENT = 16
INT32_LIMIT = 2 ** 31 - 1  # the largest offset a Triton kernel's int32 index arithmetic holds


def compute_dtype(dtype: str) -> str:
    """The dtype values are computed in inside a kernel: float16 and bfloat16 in float32, rounded when stored."""
    return "float32" if dtype in ("float16", "bfloat16") else dtype


class KExpr:
    __slots__ = ("op", "args", "arg", "dtype")
    _interned: dict = {}

    def __new__(cls, op: str, args: tuple = (), arg: Any = None, dtype: str = "float32") -> "KExpr":
        key = (op, tuple(id(a) for a in args), _key(arg), dtype)
        found = cls._interned.get(key)
        if found is not None:
            return found
        node = super().__new__(cls)
        node.op, node.args, node.arg, node.dtype = op, tuple(args), arg, dtype
        cls._interned[key] = node  # the node holds its args, so the ids in interned keys stay valid
        return node

    def __repr__(self) -> str:
        if self.op == "var":
            return self.arg[0]
        if self.op == "const":
            return repr(self.arg)
        if self.op == "load":
            return f"{self.arg}[{self.args[0]!r}]"
        inner = ", ".join(map(repr, self.args))
        return f"{self.op}({inner}{', ' + repr(self.arg) if self.arg is not None else ''})"

    # index arithmetic with Python operators, for readable lowering code
    def __add__(self, other): return add(self, as_index(other))
    def __radd__(self, other): return add(as_index(other), self)
    def __mul__(self, other): return mul(self, as_index(other))
    def __rmul__(self, other): return mul(as_index(other), self)
    def __floordiv__(self, k: int): return floordiv(self, k)
    def __mod__(self, k: int): return mod(self, k)


def fresh_scope(dims: Optional[dict[str, tuple[int, Optional[int], int]]] = None) -> None:
    """Forget interned nodes and cached analyses; called once per conversion so memory does not grow. `dims`: the
    package's dynamic dims as (min, max or None, example size): ranges bound index arithmetic over them."""
    KExpr._interned.clear()
    _bounds.clear()
    _free.clear()
    _dims.clear()
    _dims.update(dims or {})


_dims: dict[str, tuple[int, Optional[int], int]] = {}


def hint(n) -> int:
    """A size's value at the example's dims: to order sizes when a heuristic must (which stride is larger)."""
    return n.evaluate({name: d[2] for name, d in _dims.items()}) if isinstance(n, SymSize) else n


def dims() -> dict[str, tuple[int, Optional[int], int]]:
    """This conversion's dynamic dims, name -> (min, max or None, example)."""
    return dict(_dims)


def at(n, point: dict[str, int]) -> int:
    """A size's value at `point` (every dim's size): where a kernel over dynamic dims is tuned."""
    return n.evaluate(point) if isinstance(n, SymSize) else n


def _key(arg: Any) -> Any:
    if isinstance(arg, float) and math.isnan(arg):
        return ("nan",)
    if isinstance(arg, tuple):
        return tuple(id(a) if isinstance(a, KExpr) else _key(a) for a in arg)
    if isinstance(arg, float):
        return ("f", arg)  # keep 1.0 and 1 apart
    return arg


def var(name: str, size) -> KExpr:
    return KExpr("var", (), (name, size if isinstance(size, SymSize) else int(size)), INT)


def sym(name: str) -> KExpr:
    return KExpr("sym", (), name, INT)


def size(n) -> KExpr:
    """An int or SymSize as an index expression (a SymSize over `sym` leaves)."""
    if not isinstance(n, SymSize):
        return const(int(n), INT)
    total = const(0, INT)
    for coef, names in n.terms:
        term = const(coef, INT)
        for name in names:
            term = mul(term, sym(name))
        total = add(total, term)
    return total



def const(value: Any, dtype: str) -> KExpr:
    if dtype == "bool":
        value = bool(value)
    elif dtype.startswith(("int", "uint")):
        value = int(value)
    else:
        value = float(value)
    return KExpr("const", (), value, dtype)


def as_index(x: Any) -> KExpr:
    return x if isinstance(x, KExpr) else size(x)


def load(buffer: str, index: KExpr, dtype: str, mask: Optional[KExpr] = None) -> KExpr:
    return KExpr("load", (index,) if mask is None else (index, mask), buffer, dtype)


def guarded(x: KExpr, condition: KExpr) -> KExpr:
    """x, evaluated only where `condition` holds: every load in x is masked by it (it reads no memory elsewhere),
    and an integer divisor made from loads becomes 1 elsewhere (a masked-off 0 must not raise a division by zero).
    Where `condition` is false the result is garbage that the caller must discard (a `where` on the condition)."""
    memo: dict[int, KExpr] = {}

    def visit(node: KExpr) -> KExpr:
        found = memo.get(id(node))
        if found is not None:
            return found
        args = tuple(visit(a) for a in node.args)
        if node.op == "load":
            mask = condition if len(args) == 1 else op("and", args[1], condition)
            result = load(node.arg, args[0], node.dtype, mask)
        elif all(a is b for a, b in zip(args, node.args)):
            result = node
        else:
            if node.op in ("floordiv", "mod", "truediv") and not node.dtype.startswith(("float", "bfloat")) \
                    and args[1] is not node.args[1]:
                args = (args[0], op("where", condition, args[1], const(1, args[1].dtype)))
            result = KExpr(node.op, args, node.arg, node.dtype)
        memo[id(node)] = result
        return result

    return visit(x)


def within(position: KExpr, start: int, stop: int) -> Optional[KExpr]:
    """start <= position < stop, leaving out the sides the position's range already settles; None if both."""
    low, high = bounds(position)
    tests = []
    if low < start:
        tests.append(op("ge", position, const(start, INT)))
    if high >= stop:
        tests.append(op("lt", position, const(stop, INT)))
    if not tests:
        return None
    return tests[0] if len(tests) == 1 else op("and", *tests)


def cast(x: KExpr, dtype: str) -> KExpr:
    if x.dtype == dtype:
        return x
    if x.op == "const":
        return const(x.arg, dtype)
    return KExpr("cast", (x,), dtype, dtype)


def op(name: str, *args: KExpr, dtype: Optional[str] = None) -> KExpr:
    """A pointwise op; comparisons give bool, the rest keep the dtype of their (already promoted) inputs."""
    assert name in POINTWISE_OPS, name
    if dtype is None:
        dtype = "bool" if name in COMPARISONS else args[-1].dtype
    return KExpr(name, args, None, dtype)


def reduce(reduction: str, body: KExpr, rvars: tuple[KExpr, ...], dtype: str, tag: int = 0) -> KExpr:
    """`tag` names the TensorBox that made this reduction, so fusion can find and realize it."""
    assert reduction in REDUCE_OPS, reduction
    return _rewrite("reduce", (reduction, body, tuple(rvars), dtype, tag)) or \
        KExpr("reduce", (body,), (reduction, tuple(rvars), tag), dtype)


def _factor_sum_of_products(reduction, body, rvars, dtype, tag) -> Optional[KExpr]:
    """sum over (r, s) of a(r) * b(s) == (sum over r of a) * (sum over s of b).

    An outer product summed over both its dims is then two 1-D sums instead of a 2-D one (O(n), not O(n^2)), and
    a factor that depends on no reduced variable moves out of the sum."""
    if reduction != "sum" or body.op != "mul" or body.dtype != dtype:
        return None
    a, b = body.args
    reduced = frozenset(rvars)
    in_a, in_b = free_vars(a) & reduced, free_vars(b) & reduced
    if in_a & in_b:
        return None
    if not in_a and not in_b:
        return None

    def total(x: KExpr, over: frozenset) -> KExpr:
        own = tuple(v for v in rvars if v in over)
        return reduce("sum", x, own, dtype, tag) if own else x

    product = op("mul", total(a, in_a), total(b, in_b))
    unused = 1  # reduced variables neither factor reads: the sum adds the same product that many times
    for v in rvars:
        if v not in in_a and v not in in_b:
            unused *= v.arg[1]
    if unused == 1:
        return product
    return op("mul", product, const(unused, dtype) if isinstance(unused, int) else cast(size(unused), dtype))


# --- index arithmetic with simplification ---------------------------------------------------------------------


def bounds(x: KExpr) -> tuple[float, float]:
    """Inclusive [min, max] of an int expression over its variables' ranges."""
    cached = _bounds.get(id(x))
    if cached is not None:
        return cached
    if x.op == "var":
        result = (0, bounds(size(x.arg[1]))[1] - 1) if isinstance(x.arg[1], SymSize) else (0, x.arg[1] - 1)
    elif x.op == "sym":
        low, high, _ = _dims.get(x.arg, (1, None, 1))
        result = (low, math.inf if high is None else high)
    elif x.op == "const":
        result = (x.arg, x.arg)
    elif x.op == "add":
        (a0, a1), (b0, b1) = bounds(x.args[0]), bounds(x.args[1])
        result = (a0 + b0, a1 + b1)
    elif x.op == "mul":
        (a0, a1), (b0, b1) = bounds(x.args[0]), bounds(x.args[1])
        products = tuple(0 if x == 0 or y == 0 else x * y for x, y in ((a0, b0), (a0, b1), (a1, b0), (a1, b1)))
        result = (min(products), max(products))
    elif x.op == "index_div":
        a0, a1 = bounds(x.args[0])
        k0, k1 = bounds(x.args[1])
        result = (a0 // k1 if k1 != math.inf else 0, a1 // k0 if a1 != math.inf else math.inf)
        var = x.args[0]
        if var.op == "var" and isinstance(var.arg[1], SymSize):  # i // k over i's range c * k: below c
            c = _over(size(var.arg[1]), x.args[1])
            if c is not None and c.op == "const":
                result = (0, min(result[1], c.arg - 1))
    elif x.op == "index_mod":
        result = (0, bounds(x.args[1])[1] - 1)
    # the pointwise ops a lowering writes index math with (a pad's borders: lower_padding.py): with their bounds, a
    # view's division and modulo of such an index fold away (the rules below)
    elif x.op == "sub":
        (a0, a1), (b0, b1) = bounds(x.args[0]), bounds(x.args[1])
        result = (a0 - b1, a1 - b0)
    elif x.op == "neg":
        a0, a1 = bounds(x.args[0])
        result = (-a1, -a0)
    elif x.op == "abs":
        a0, a1 = bounds(x.args[0])
        result = (0 if a0 <= 0 <= a1 else min(abs(a0), abs(a1)), max(abs(a0), abs(a1)))
    elif x.op in ("minimum", "maximum"):
        (a0, a1), (b0, b1) = bounds(x.args[0]), bounds(x.args[1])
        pick = min if x.op == "minimum" else max
        result = (pick(a0, b0), pick(a1, b1))
    elif x.op == "where":
        (a0, a1), (b0, b1) = bounds(x.args[1]), bounds(x.args[2])
        result = (min(a0, b0), max(a1, b1))
    else:
        result = (-math.inf, math.inf)
    _bounds[id(x)] = result
    return result


_bounds: dict[int, tuple] = {}


def add(a: KExpr, b: KExpr) -> KExpr:
    return _rewrite("add", (a, b)) or KExpr("add", (a, b), None, INT)


def mul(a: KExpr, b: KExpr) -> KExpr:
    return _rewrite("mul", (a, b)) or KExpr("mul", (a, b), None, INT)


def floordiv(a: KExpr, k) -> KExpr:
    k = as_index(k)
    return _rewrite("index_div", (a, k)) or KExpr("index_div", (a, k), None, INT)


def mod(a: KExpr, k) -> KExpr:
    k = as_index(k)
    return _rewrite("index_mod", (a, k)) or KExpr("index_mod", (a, k), None, INT)


# --- the simplification rules ---------------------------------------------------------------------------------
# Each rule sees a node about to be built (its op's arguments) and returns a simpler equal expression, or None. The
# constructors above try the rules of their op in table order; a rule may build through the constructors again
# (so rules compose). Every rule has a switch (`Rule.enabled`, `rules_disabled`) and its own test
# (tests/test_kernel_ir.py), which checks both that it fires and that the value is unchanged.


@dataclass
class Rule:
    name: str
    op: str  # the constructor it applies in: add, mul, index_div, index_mod, reduce
    apply: Any  # (args) -> Optional[KExpr]
    why: str
    enabled: bool = True


def _const_k(k: KExpr) -> Optional[int]:
    return k.arg if k.op == "const" else None


def _nonnegative_below(a: KExpr, k: KExpr) -> bool:
    """0 <= a < k over every point of a's and k's ranges."""
    return bounds(a)[0] >= 0 and bounds(a)[1] < bounds(k)[0]


def _multiples(a: KExpr, k: KExpr) -> Optional[tuple[list[KExpr], KExpr]]:
    """a as (terms that are multiples of a constant k, the rest) when some are and the rest is non-negative."""
    kk = _const_k(k)
    if kk is None or kk <= 0:
        return None
    divisible, rest = _split_multiples(a, kk)
    return (divisible, rest) if divisible and bounds(rest)[0] >= 0 else None


def _split_by(t: KExpr, op: str) -> Optional[tuple[KExpr, KExpr, KExpr]]:
    """(x, k, m) for t = (x op k) * m, in either order of the product (m = 1 for a bare x op k); k and m may be
    constants or sizes known only at run time."""
    if t.op == op:
        return t.args[0], t.args[1], const(1, INT)
    if t.op == "mul":
        for inner, m in ((t.args[0], t.args[1]), (t.args[1], t.args[0])):
            if inner.op == op:
                return inner.args[0], inner.args[1], m
    return None


def _recombine_div_mod(ab: tuple) -> Optional[KExpr]:
    """A sum holding (x // k) * (k * c) and (x % k) * c (k any size, c a constant), the two replaced by x * c.
    (Expressions are interned and built in one normal form, so an equal multiplier is the same node.)"""
    terms = split_terms(ab[0]) + split_terms(ab[1])
    for i, t in enumerate(terms):
        low = _split_by(t, "index_mod")
        if low is None or low[2].op != "const":
            continue
        x, k, c = low
        want = mul(k, c)
        for j, u in enumerate(terms):
            high = _split_by(u, "index_div")
            if high is not None and high[0] is x and high[1] is k and high[2] is want:
                return sum_terms([v for n, v in enumerate(terms) if n not in (i, j)] + [mul(x, c)])
    return None


def _is_size(x: KExpr) -> bool:
    """A constant, a dynamic size, or a product of them: what a stride is."""
    return x.op in ("const", "sym") or (x.op == "mul" and all(_is_size(a) for a in x.args))


def _distribute(ab: tuple) -> Optional[KExpr]:
    """(a + b) * s == a * s + b * s for a stride s: an index as a sum of strided terms, which the division rules
    and recombine_div_mod read term by term."""
    for total, s in ((ab[0], ab[1]), (ab[1], ab[0])):
        if total.op == "add" and _is_size(s):
            return add(mul(total.args[0], s), mul(total.args[1], s))
    return None


def _factors(t: KExpr) -> list[KExpr]:
    return _factors(t.args[0]) + _factors(t.args[1]) if t.op == "mul" else [t]


def _over(t: KExpr, k: KExpr) -> Optional[KExpr]:
    """t / k where the product t holds every factor of the dynamic size k (its syms, and its constant dividing t's),
    else None."""
    factors = _factors(t)
    left = [f for f in factors if f.op != "const"]
    coefficient = math.prod(f.arg for f in factors if f.op == "const")
    divisor = math.prod(f.arg for f in _factors(k) if f.op == "const")
    for f in (f for f in _factors(k) if f.op != "const"):
        if not any(g is f for g in left):
            return None
        left.pop(next(i for i, g in enumerate(left) if g is f))
    if divisor == 0 or coefficient % divisor:
        return None
    quotient = const(coefficient // divisor, INT)
    for f in left:
        quotient = mul(f, quotient)
    return quotient


def _dynamic_multiples(a: KExpr, k: KExpr) -> Optional[tuple[list[KExpr], KExpr]]:
    """a as (its terms that are multiples of the dynamic size k, each divided by k; the rest), when some are, the
    rest is non-negative and so is a (then C's truncating division and modulo are the floor's)."""
    if not (_is_size(k) and any(f.op == "sym" for f in _factors(k))) or bounds(a)[0] < 0:
        return None
    quotients, rest = [], []
    for t in split_terms(a):
        q = _over(t, k)
        (rest if q is None else quotients).append(t if q is None else q)
    remainder = sum_terms(rest)
    return (quotients, remainder) if quotients and bounds(remainder)[0] >= 0 else None


def _below(a: KExpr, k: KExpr) -> bool:
    """0 <= a < k, shown from the expressions where k is a size known only at run time (bounds shows it from
    numbers): a loop variable over k; v // b for v over k * b; (x % (k * b)) // b for x >= 0."""
    if a.op == "var" and isinstance(a.arg[1], SymSize):
        return size(a.arg[1]) is k
    if a.op != "index_div":
        return False
    inner, b = a.args
    if inner.op == "var" and isinstance(inner.arg[1], SymSize):
        return _over(size(inner.arg[1]), b) is k
    if inner.op == "index_mod":
        x, whole = inner.args
        return (whole is mul(k, b) or whole is mul(b, k)) and bounds(x)[0] >= 0
    return False


RULES: list[Rule] = [
    Rule("fold_add", "add", lambda ab: const(ab[0].arg + ab[1].arg, INT)
         if ab[0].op == "const" and ab[1].op == "const" else None, "c1 + c2 is a constant"),
    Rule("add_zero", "add", lambda ab: ab[1] if ab[0].op == "const" and ab[0].arg == 0
         else ab[0] if ab[1].op == "const" and ab[1].arg == 0 else None, "x + 0 == x"),
    Rule("add_constant_last", "add", lambda ab: add(ab[1], ab[0]) if ab[0].op == "const" and ab[1].op != "const"
         else None, "c + x == x + c: one canonical form, so equal sums intern to one node"),
    Rule("add_constants_together", "add", lambda ab: add(ab[0].args[0], const(ab[0].args[1].arg + ab[1].arg, INT))
         if ab[1].op == "const" and ab[0].op == "add" and ab[0].args[1].op == "const" else None,
         "(x + c1) + c2 == x + (c1 + c2): an offset and its undoing cancel ((x + 4) + -4 == x)"),
    Rule("recombine_div_mod", "add", _recombine_div_mod,
         "(x // k) * k * c + (x % k) * c == x * c (in C's truncating division too): a flat index a view split into "
         "dims and a dense read joined again; a group norm's statistics read each element through a division and "
         "a modulo, and did not vectorise"),
    Rule("fold_mul", "mul", lambda ab: const(ab[0].arg * ab[1].arg, INT)
         if ab[0].op == "const" and ab[1].op == "const" else None, "c1 * c2 is a constant"),
    Rule("mul_constant_last", "mul", lambda ab: mul(ab[1], ab[0]) if ab[0].op == "const" and ab[1].op != "const"
         else None, "c * x == x * c: the coefficient is where the division rules look for it"),
    Rule("mul_zero", "mul", lambda ab: const(0, INT) if ab[1].op == "const" and ab[1].arg == 0 else None,
         "x * 0 == 0"),
    Rule("mul_one", "mul", lambda ab: ab[0] if ab[1].op == "const" and ab[1].arg == 1 else None, "x * 1 == x"),
    Rule("distribute_stride", "mul", _distribute,
         "(a + b) * s == a * s + b * s for a constant or dynamic stride s: a view's index as a sum of terms"),
    Rule("div_one", "index_div", lambda ak: ak[0] if _const_k(ak[1]) == 1 else None, "x // 1 == x"),
    Rule("div_small", "index_div", lambda ak: const(0, INT) if _const_k(ak[1]) and _nonnegative_below(*ak)
         else None, "x // k == 0 when 0 <= x < k over x's range"),
    Rule("fold_div", "index_div", lambda ak: const(ak[0].arg // ak[1].arg, INT)
         if ak[0].op == "const" and _const_k(ak[1]) else None, "c1 // c2 is a constant"),
    Rule("div_multiples", "index_div", lambda ak: None if (m := _multiples(*ak)) is None else
         add(sum_terms(_divide(t, ak[1].arg) for t in m[0]), floordiv(m[1], ak[1])),
         "(k*x + r) // k == x + r // k, for r >= 0 (so in C's truncating division too)"),
    Rule("div_dynamic_multiples", "index_div", lambda ak: None if (m := _dynamic_multiples(*ak)) is None else
         add(sum_terms(m[0]), floordiv(m[1], ak[1])),
         "(k*x + r) // k == x + r // k for a dynamic size k, where k*x + r >= 0 and r >= 0: a dynamic view's flat "
         "index taken apart again"),
    Rule("div_below_dynamic_size", "index_div", lambda ak: const(0, INT) if _below(*ak) else None,
         "a // k == 0 where 0 <= a < k shows in the expressions (i over k, (i over k*b) // b, (x % (k*b)) // b), "
         "for a dynamic size k"),
    Rule("mod_one", "index_mod", lambda ak: const(0, INT) if _const_k(ak[1]) == 1 else None, "x % 1 == 0"),
    Rule("mod_small", "index_mod", lambda ak: ak[0] if _nonnegative_below(*ak) else None,
         "x % k == x when 0 <= x < k over the ranges (k may be a dynamic size)"),
    Rule("fold_mod", "index_mod", lambda ak: const(ak[0].arg % ak[1].arg, INT)
         if ak[0].op == "const" and _const_k(ak[1]) else None, "c1 % c2 is a constant"),
    Rule("mod_multiples", "index_mod", lambda ak: None if (m := _multiples(*ak)) is None else mod(m[1], ak[1]),
         "(k*x + r) % k == r % k, for r >= 0"),
    Rule("mod_dynamic_multiples", "index_mod", lambda ak: None if (m := _dynamic_multiples(*ak)) is None else
         mod(m[1], ak[1]), "(k*x + r) % k == r % k for a dynamic size k, where k*x + r >= 0 and r >= 0"),
    Rule("mod_below_dynamic_size", "index_mod", lambda ak: ak[0] if _below(*ak) else None,
         "a % k == a where 0 <= a < k shows in the expressions, for a dynamic size k: a view's dims taken apart and "
         "joined again"),
    Rule("factor_sum_of_products", "reduce", lambda r: _factor_sum_of_products(*r),
         "sum over (r, s) of a(r) * b(s) == (sum over r of a) * (sum over s of b): O(n), not O(n^2)"),
]
_RULES_BY_OP: dict[str, list[Rule]] = {}
for _rule in RULES:
    _RULES_BY_OP.setdefault(_rule.op, []).append(_rule)


def rule(name: str) -> Rule:
    return next(r for r in RULES if r.name == name)


@contextmanager
def rules_disabled(*names: str):
    """Build with these simplifications off (to test each, or to see the IR a lowering makes before them)."""
    # Interned nodes stay valid across switches: the rules run before a node is looked up, so a switch changes only
    # which node a constructor returns, never what a key means.
    chosen = [rule(n) for n in names]
    saved = [r.enabled for r in chosen]
    try:
        for r in chosen:
            r.enabled = False
        yield
    finally:
        for r, on in zip(chosen, saved):
            r.enabled = on


def _rewrite(op: str, args: tuple) -> Optional[KExpr]:
    for r in _RULES_BY_OP.get(op, ()):
        if r.enabled:
            found = r.apply(args)
            if found is not None:
                return found
    return None


def _split_multiples(a: KExpr, k: int) -> tuple[list[KExpr], KExpr]:
    terms = split_terms(a)
    return [t for t in terms if _multiple_of(t, k)], sum_terms(t for t in terms if not _multiple_of(t, k))


def split_terms(x: KExpr) -> list[KExpr]:
    if x.op == "add":
        return split_terms(x.args[0]) + split_terms(x.args[1])
    return [x]


def sum_terms(terms: Iterable[KExpr]) -> KExpr:
    total = const(0, INT)
    for t in terms:
        total = add(total, t)
    return total


def _coefficient(t: KExpr) -> int:
    if t.op == "const":
        return t.arg
    if t.op == "mul" and t.args[1].op == "const":
        return t.args[1].arg
    return 1


def _multiple_of(t: KExpr, k: int) -> bool:
    c = _coefficient(t)
    return c != 0 and c % k == 0 and t.op in ("const", "mul")


def _divide(t: KExpr, k: int) -> KExpr:
    if t.op == "const":
        return const(t.arg // k, INT)
    return mul(t.args[0], const(t.args[1].arg // k, INT))


# --- analysis ------------------------------------------------------------------------------------------------


def free_vars(x: KExpr) -> frozenset:
    """Loop variables an expression depends on (a reduction's own variables are bound inside it)."""
    cached = _free.get(id(x))
    if cached is not None:
        return cached
    if x.op == "var":
        result = frozenset([x])
    elif x.op == "reduce":
        result = free_vars(x.args[0]) - frozenset(x.arg[1])
    else:
        result = frozenset().union(*(free_vars(a) for a in x.args)) if x.args else frozenset()
    _free[id(x)] = result
    return result


_free: dict[int, frozenset] = {}


def nodes_in(*roots: KExpr) -> list[KExpr]:
    """Every node reachable from `roots`, once each, a node's args before the node."""
    seen: set[int] = set()
    order: list[KExpr] = []

    def visit(node: KExpr) -> None:
        if id(node) in seen:
            return
        seen.add(id(node))
        for a in node.args:
            visit(a)
        order.append(node)

    for root in roots:
        visit(root)
    return order


def substitute(x: KExpr, v: KExpr, by: KExpr, memo: Optional[dict[int, KExpr]] = None) -> KExpr:
    """x with the loop variable v replaced by `by`, index arithmetic rebuilt through its constructors (so their rules
    simplify it), every other node as it was but for its arguments (interned: the same expression built twice is
    one node)."""
    memo = {} if memo is None else memo
    if x is v:
        return by
    if v not in free_vars(x):
        return x
    done = memo.get(id(x))
    if done is not None:
        return done
    args = tuple(substitute(a, v, by, memo) for a in x.args)
    build = _INDEX_BUILDERS.get(x.op) if x.dtype == INT else None
    built = build(*args) if build else KExpr(x.op, args, x.arg, x.dtype)
    memo[id(x)] = built
    return built


_INDEX_BUILDERS = {"add": add, "mul": mul, "index_div": floordiv, "index_mod": mod}  # (substitute: their rules)


def reductions_in(x: KExpr) -> list[KExpr]:
    """Every reduce node reachable from x, innermost first (a reduce after the reduces its body needs)."""
    return [n for n in nodes_in(x) if n.op == "reduce"]


def loads_in(x: KExpr) -> set[str]:
    return {n.arg for n in nodes_in(x) if n.op == "load"}


@dataclass
class KernelBuffer:
    name: str
    dtype: str
    shape: tuple[int, ...]
    strides: tuple[int, ...] = ()
    aligned: bool = True  # an input always starts ALIGNMENT-aligned: false for one seen elsewhere (kernel_alignment.py)
    # an input that is a host number (int64 or float64, shape ()) the kernel takes by value, not a tensor it reads
    # through a pointer (fuse.py: a Triton kernel takes a loop counter with no fill launch to make it a tensor)
    by_value: bool = False


@dataclass
class Kernel:
    """One generated kernel: stores `outputs[i] = values[i]` for every point of the iteration space `ranges`.

    `ranges` are the output's loop variables in the order of the output's memory layout, outermost first (for a
    row-major output, dim order); reductions inside `values` bind their own variables. Each output is dense, at
    its `strides`.
    """
    name: str
    ranges: tuple[KExpr, ...]
    inputs: list[KernelBuffer]
    outputs: list[KernelBuffer]
    values: list[KExpr]
    provenance: list[str] = field(default_factory=list)  # "aten::add.Tensor  model.py:12  y = x + 1"
    index: tuple[KExpr, ...] = ()  # the output's loop variables in dim order (default: `ranges`)
    # the conversion's dynamic dims, name -> (min, max or None, example size): where renderers size and tune it
    dims: dict[str, tuple[int, Optional[int], int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.index = self.index or self.ranges

    @property
    def size_names(self) -> tuple[str, ...]:
        """The dynamic dims the kernel takes as arguments, sorted: its `sizes` array, in this order."""
        names: set[str] = set()
        for x in nodes_in(*self.values, *self.ranges):
            if x.op == "sym":
                names.add(x.arg)
            for v in x.arg[1] if x.op == "reduce" else (x,) if x.op == "var" else ():
                if isinstance(v.arg[1], SymSize):
                    names.update(v.arg[1].names)
        for b in (*self.inputs, *self.outputs):
            for n in (*b.shape, *b.strides):
                if isinstance(n, SymSize):
                    names.update(n.names)
        return tuple(sorted(names))


@dataclass
class ScatterKernel(Kernel):
    """A scatter: the output starts as `init` (over `out_vars`, one per output dim), then every point of the
    scattered space (`sources`, one var per dim of the index or source) combines `update` into the output element
    at the same coordinates but for `dim`, where it is at `target` (an int64 position, already clamped into the
    dim: a kernel never writes outside its output). `reduce` is sum, mean, max or min; without `include_self` an
    element that receives anything starts from the reduction's identity instead of `init`. A mean's kernel has a
    second output, the int32 count per element, which nothing reads. `values` holds [init, update, target] so that
    decompositions and analyses see every expression; `ranges` and `index` are one flat variable over the output,
    named for this kernel, so a pass that matches kernels by iteration space (merge_kernels, epilogues) never takes
    a scatter for a pointwise kernel. The scattered dims other than `dim` have the output's sizes."""
    out_vars: tuple[KExpr, ...] = ()
    sources: tuple[KExpr, ...] = ()
    dim: int = 0
    reduce: str = "sum"
    include_self: bool = True

    @property
    def init(self) -> KExpr:
        return self.values[0]

    @property
    def update(self) -> KExpr:
        return self.values[1]

    @property
    def target(self) -> KExpr:
        return self.values[2]


def update_parallel(reduce: str, include_self: bool) -> bool:
    """Whether a scatter may be rendered a block of updates per program, atomically added into an output zeroed
    first: a sum that starts from the destination's values (its adds may land in any order). Triton renders it so
    (emitters/triton_scatter.py); lower_scatter.py lets such a scatter onto the GPU at any width."""
    return reduce == "sum" and include_self


@dataclass
class TemplateKernel(Kernel):
    """A kernel generated from a fixed template rather than from expressions (a GEMM, a convolution). Without an
    epilogue, outputs[0] is the template's product; with one, the pointwise kernel that read the product (the
    buffer named `product` there) is computed on the product's tile in registers (transpiler/epilogues.py): its
    other inputs follow the template's, its outputs are the kernel's. `ranges` and `values` stay empty."""
    epilogue: Optional[Kernel] = None
    product: str = ""

    @property
    def inner_dim(self) -> int:
        """The product's dim its tile's rows run along, innermost in memory (an epilogue sweeps it)."""
        return -1


@dataclass
class GemmKernel(TemplateKernel):
    """A GEMM by a constant weight over few rows, `x @ w^T (+ b)` with x = inputs[0] [rows, k], the weight inputs[1]
    [n, k] and the bias inputs[2] [n] (where `bias`), from emitters/triton_gemm.py. `config` is the launch
    configuration timed fastest when the form was chosen (transpiler/gemm_forms.py)."""
    rows: int = 0
    k: int = 0
    n: int = 0
    bias: bool = False
    config: dict = field(default_factory=dict)
    x_row: int = 0  # x's stride between rows, where not k (a row of a larger tensor: BERT's pooler reads token 0)


@dataclass
class AttentionKernel(Kernel):
    """softmax(q @ k^T * scale [+ mask]) @ v over a short key sequence, from emitters/triton_attention.py: inputs q
    [*batch, l, d], k [*batch, s, d], v [*batch, s, e] and, where `mask` is "additive" or "boolean", the mask
    (broadcast to [*batch, l, s]); "causal" masks keys after the query's position; the output is [*batch, l, e].
    Every buffer is read or written at its own strides. `config` is the launch configuration timed fastest
    (transpiler/attention_kernels.py). Not a TemplateKernel: it takes no epilogue."""
    batch: tuple[int, ...] = ()
    l: int = 0
    s: int = 0
    d: int = 0
    e: int = 0
    scale: float = 1.0
    mask: str = ""
    config: dict = field(default_factory=dict)
    # where the output's [*batch, l, e] elements go in outputs[0], per dim, when that is another layout's buffer (a
    # copy it took over, transpiler/store_through_copies.py); () for outputs[0]'s own strides
    out_strides: tuple[int, ...] = ()

    def strides(self) -> tuple[tuple[int, ...], ...]:
        """q's, k's, v's, the mask's (() without one) and the output's strides at the full rank, [*batch, ., .]: a
        dim the mask broadcasts along (missing, or of size 1) strides 0."""
        rank = len(self.batch) + 2
        own = [tuple(b.strides) for b in self.inputs[:3]]
        mask = ()
        if self.mask in ("additive", "boolean"):
            buffer = self.inputs[3]
            pad = rank - len(buffer.shape)
            mask = (0,) * pad + tuple(0 if n == 1 else st for n, st in zip(buffer.shape, buffer.strides))
        return (*own, mask, tuple(self.out_strides or self.outputs[0].strides))

    def spec(self) -> tuple:
        """What the template is rendered and timed from (hashable): emitters/triton_attention.py's `spec`."""
        return (self.batch, self.l, self.s, self.d, self.e, self.inputs[0].dtype, self.scale, self.mask,
                self.strides())


@dataclass
class NmsMaskKernel(Kernel):
    """NMS's overlap bits over boxes sorted by score, from emitters/triton_nms.py: inputs[0] the boxes [n, 4]
    float32, outputs[0] an int8 buffer of n * n + 8 * n bytes whose first n * ceil(n / 64) int64 words are the mask
    (bit j of word [i, c]: box c*64+j, after box i, overlaps it by more than `threshold`, in torchvision's CUDA
    arithmetic, `iou_form` one of transpiler/nms_facts.py's IOU_FORMS). transpiler/gpu_nms.py makes it; `ranges`
    and `values` stay empty."""
    threshold: float = 0.5
    iou_form: str = "plain"

    @property
    def boxes(self):
        return self.inputs[0].shape[0]


@dataclass
class NmsWalkKernel(Kernel):
    """NMS's keep flags from NmsMaskKernel's buffer (inputs[0]): outputs[0] bool [n], box i kept unless a kept box
    before it overlaps it, as torchvision's `gather_keep_from_mask`. One program; it writes its scratch words into
    the mask buffer past the mask."""

    @property
    def boxes(self):
        return self.outputs[0].shape[0]


@dataclass
class ConvKernel(TemplateKernel):
    """A 2-d convolution by a constant weight over a channels-last activation, from emitters/cpp_conv.py: `kind`
    "pointwise" (1x1, stride 1, no padding, one group: a GEMM over the pixels), "depthwise" (a group per channel)
    or "dense" (one group, a small patch: gathered, then the pointwise tile). inputs[0] is x [batch, cin, h, w]
    channels-last, inputs[1] the weight packed for the template (transpiler/conv_kernels.py's `pack`), inputs[2]
    the bias [cout] where `bias`; the product is [batch, cout, ho, wo] channels-last. Pairs are (height, width)."""
    kind: str = ""
    batch: int = 0
    cin: int = 0
    cout: int = 0
    size: tuple[int, int] = (0, 0)  # the input's height and width
    out_size: tuple[int, int] = (0, 0)
    kernel_size: tuple[int, int] = (1, 1)
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int] = (0, 0)
    dilation: tuple[int, int] = (1, 1)
    bias: bool = False

    @property
    def inner_dim(self) -> int:
        return 1  # channels
