"""What the renderers share: how a kernel's loops are laid out, its provenance comment, and the writer core
(`KernelWriter`) that names each expression once and renders it from the language's op table."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Union

from jit2triton.transpiler import kernel_ir as K
from jit2triton.transpiler.symbolic import at_least_one
from jit2triton.transpiler.timing import range_points

from .decompose import decompose

# A float sum's lanes add in float over this many steps of its innermost loop, each chunk's sum then added in
# double (emitters/cpp.py's sums, cpp_channels_inner.py's accumulator rows): float lanes are twice as wide as double
# ones and need no conversion, and a chunk of 256 in 8 lanes (32 adds a lane) rounds little: sums of 200,000 floats
# came within 5e-8 of the exact sums where ATen's came within 1.5e-7. 256 rather than 64: the chunk's horizontal
# add, once per 64 floats, cost a log_softmax over 1000 classes 7% and a LayerNorm over 768 15%.
FLOAT_SUM_CHUNK = 256


@dataclass
class LoopNest:
    """A kernel's iteration space split for rendering.

    `outer` are the output dims the kernel's reductions depend on (one "row" per point); every reduction is
    computed once per row, before the `inner` dims are swept. Without reductions, `outer` is every dim but the
    last. Each output is stored row-major over `ranges`.
    """
    ranges: tuple[K.KExpr, ...]
    outer: tuple[K.KExpr, ...]
    inner: tuple[K.KExpr, ...]
    reductions: list[K.KExpr]  # innermost first: a reduction comes after those its body reads

    @property
    def outer_size(self) -> int:
        return _size(self.outer)

    @property
    def inner_size(self) -> int:
        return _size(self.inner)


def loop_nest(kernel: K.Kernel) -> LoopNest:
    reductions: list[K.KExpr] = []
    for value in kernel.values:
        reductions += [r for r in K.reductions_in(value) if r not in reductions]
    if reductions:
        depends = frozenset().union(*(K.free_vars(r) for r in reductions))
        outer = tuple(v for v in kernel.ranges if v in depends)
    else:
        outer = kernel.ranges[:-1]
    inner = tuple(v for v in kernel.ranges if v not in outer)
    return LoopNest(kernel.ranges, outer, inner, reductions)


def store_index(kernel: K.Kernel, strides) -> K.KExpr:
    """Where the element at the loop variables lands in an output with these (dim-order) strides."""
    return K.sum_terms(v * s for v, s in zip(kernel.index, strides) if not (v.op == "var" and v.arg[1] == 1))


def provenance_comment(kernel: K.Kernel, prefix: str) -> str:
    lines = [f"{prefix} {kernel.name}: fused from {len(kernel.provenance)} TorchScript node(s)"]
    lines += [f"{prefix}   {_one_line(p)}" for p in kernel.provenance]
    return "\n".join(lines)


def _one_line(text: str) -> str:
    """Source text made safe inside a one-line comment: no line breaks, no trailing line continuation."""
    return " ".join(text.split()).rstrip("\\ ")


def reduction_size(reduction: K.KExpr):
    return _size(reduction.arg[1])


def _size(variables):
    """The number of points of these loop variables: an int, or a SymSize when a range is dynamic."""
    n = 1
    for v in variables:
        n *= v.arg[1]
    return n


def size_code(n, name_of=lambda dim: f"dim_{dim}", int_code=str) -> str:
    """A size (int or SymSize) as an int64 expression over the kernel's size arguments; `int_code` spells a static
    size (a renderer that shares one body among kernels of other sizes spells it as a placeholder)."""
    if isinstance(n, int):
        return int_code(n)
    terms = ["*".join(([str(c)] if c != 1 else []) + [name_of(d) for d in names]) or "1" for c, names in n.terms]
    return "(" + " + ".join(terms) + ")"


class Scope:
    """A loop level of a kernel being rendered: the variables bound there, the lines emitted there, and the names
    of the expressions already computed there (visible to the nested levels)."""

    def __init__(self, parent: Optional["Scope"], bound: frozenset, indent: str) -> None:
        self.parent, self.bound, self.indent = parent, bound, indent
        self.lines: list[str] = []
        self.names: dict[int, str] = {}

    def lookup(self, node: K.KExpr) -> Optional[str]:
        scope = self
        while scope is not None:
            if id(node) in scope.names:
                return scope.names[id(node)]
            scope = scope.parent
        return None

    def home(self, node: K.KExpr) -> "Scope":
        """The outermost enclosing level where every variable `node` reads is bound: where it is computed once."""
        target, needed = self, K.free_vars(node)
        while target.parent is not None and needed <= target.parent.bound:
            target = target.parent
        return target


def row_major(shape) -> tuple:
    """Row-major strides of a shape (a size 0 or 1 dim counts as 1, as torch lays them out)."""
    strides, running = [], 1
    for d in reversed(shape):
        strides.append(running)
        running *= at_least_one(d)
    return tuple(reversed(strides))


def variables_size(variables) -> int:
    return _size(variables)


def unravel(flat: str, variables, divide: str, int_code=str) -> list[tuple[str, str]]:
    """(name, code) recovering each loop variable from a flat row-major index; `divide` is the language's
    integer division ("/" in C++, "//" in Triton); `int_code` as size_code's."""
    if len(variables) == 1:
        return [(variables[0].arg[0], flat)]
    out = []
    for i, v in enumerate(variables):
        stride = _size(variables[i + 1:])
        strided = stride != 1
        code = f"{flat} {divide} {size_code(stride, int_code=int_code)}" if strided else flat
        if i > 0:
            size = size_code(v.arg[1], int_code=int_code)
            code = f"({code}) % {size}" if strided else f"{code} % {size}"
        out.append((v.arg[0], code))
    return out


# How a language spells one kernel-IR op: a format string over the arguments' code ("({0} + {1})"), or a function
# (writer, node, argument code) -> code for what a string cannot say (a load, a cast, a typed literal).
OpRender = Union[str, Callable[["KernelWriter", K.KExpr, list], str]]


@dataclass
class ReductionLoop:
    """A reduction being written: its op and the scope binding its loop variables, where its body is written. A
    language extends it with what it decided on opening the loop (a tile width, whether it loops in chunks) that
    it needs again to close it."""
    op: str
    scope: Scope


class KernelWriter:
    """The core both renderers stand on (tinygrad's CStyleLanguage, Inductor's OpOverrides): a language subclass
    gives its op table `OPS`, the ops it needs decomposed (`DECOMPOSE`, see decompose.py), how it writes a literal
    and a named value, and the hooks of the loop schedule (`write`, `reduction`): how a row, a sweep and a
    reduction's loop open, how an output is stored, how a reduction accumulates and finishes. The core walks the
    expression DAG and emits each node once, at the outermost scope where every variable it reads is bound
    (loop-invariant work is hoisted for free)."""

    OPS: dict[str, OpRender] = {}
    DECOMPOSE: frozenset = frozenset()

    def __init__(self, kernel: K.Kernel) -> None:
        self.spelled: dict[int, str] = {}  # id of a decomposition's result -> the op it spells (its name's stem)
        self.kernel = decompose(kernel, self.DECOMPOSE, self.spelled)
        self.nest: LoopNest = loop_nest(self.kernel)
        self.points = range_points(self.kernel.dims)  # where heuristics weigh a dynamic size: the example first
        self.counter = 0
        self.buffer_names = {b.name: f"in_{b.name}" for b in self.kernel.inputs}
        self.buffer_dtypes = {b.name: b.dtype for b in self.kernel.inputs}
        self.by_value = {b.name for b in self.kernel.inputs if b.by_value}  # host numbers, not buffers

    # --- what a language defines ----------------------------------------------------------------------------

    def literal(self, value, dtype: str) -> str:
        raise NotImplementedError

    def declare(self, scope: "Scope", name: str, node: K.KExpr, code: str) -> None:
        """Bind `name` to `code` in `scope` (a line of the language)."""
        raise NotImplementedError

    def open_rows(self) -> "Scope":
        """The scope of one row (a point of `nest.outer`), with the lines that bind its variables."""
        raise NotImplementedError

    def open_sweep(self, rows: "Scope") -> "Scope":
        """The scope sweeping the `nest.inner` dims inside a row (`rows` itself where the language sweeps none)."""
        raise NotImplementedError

    def store(self, sweep: "Scope", out: K.KernelBuffer, code: str) -> None:
        """Store `code`, the output's value at the sweep's point, into `out`."""
        raise NotImplementedError

    def open_reduction(self, node: K.KExpr, target: "Scope") -> ReductionLoop:
        """A reduction's loop over its variables, opened in `target` (where it is computed once)."""
        raise NotImplementedError

    def close_reduction(self, node: K.KExpr, target: "Scope", loop: ReductionLoop, body: str) -> str:
        """Accumulate `body` over the loop and finish the reduction in `target`; -> the result's name."""
        raise NotImplementedError

    # --- the schedule both languages share ------------------------------------------------------------------

    def write(self) -> tuple["Scope", "Scope"]:
        """The loop schedule: a row per point of `nest.outer`, in which every reduction is computed once (innermost
        first), then a sweep over the `nest.inner` dims storing every output. -> the (rows, sweep) scopes, which
        the language wraps in its kernel (a parallel loop, a grid of programs)."""
        rows = self.open_rows()
        sweep = self.open_sweep(rows)
        for reduction in self.nest.reductions:
            self.value(reduction, rows)
        for value, out in zip(self.kernel.values, self.kernel.outputs):
            self.store(sweep, out, self.value(value, sweep))
        return rows, sweep

    def reduction(self, node: K.KExpr, target: "Scope") -> str:
        """A reduction, computed once in `target`: its loop opened there, its body written inside, then accumulated
        and finished."""
        loop = self.open_reduction(node, target)
        body = self.value(node.args[0], loop.scope)
        return self.close_reduction(node, target, loop, body)

    # --- the core -------------------------------------------------------------------------------------------

    def at_example(self, n) -> int:
        """A size's value at the example's dims: to order sizes when a heuristic must."""
        return K.at(n, self.points[0])

    def fresh(self, hint: str) -> str:
        self.counter += 1
        return f"{hint}{self.counter}"

    def name_for(self, node: K.KExpr) -> str:
        """A fresh name for `node`'s value: the op it spells, or _hint's stem."""
        return self.fresh(self.spelled.get(id(node)) or _hint(node))

    def value(self, node: K.KExpr, scope: "Scope") -> str:
        """The code naming node's value in `scope`, emitting it (once) where it belongs if it is new."""
        if node.op == "var":
            return node.arg[0]
        if node.op == "const":
            return self.literal(node.arg, node.dtype)
        if node.op == "sym":
            return f"dim_{node.arg}"
        found = scope.lookup(node)
        if found is not None:
            return found
        target = scope.home(node)
        if node.op == "reduce":
            name = self.reduction(node, target)
        else:
            name = self.expression(node, target)
            if not name.isidentifier():  # (a cast that changes nothing in the compute dtype is its argument)
                code, name = name, self.name_for(node)
                self.declare(target, name, node, code)
        target.names[id(node)] = name
        return name

    def expression(self, node: K.KExpr, scope: "Scope") -> str:
        args = [self.value(a, scope) for a in node.args]
        self.scope = scope  # where the node being rendered lands, for an op render that asks
        render = self.OPS.get(node.op)
        if render is None:
            raise NotImplementedError(f"{type(self).__name__} has no rendering for kernel-IR op {node.op!r}")
        return render.format(*args) if isinstance(render, str) else render(self, node, args)


def _hint(node: K.KExpr) -> str:
    """A generated name's stem: the buffer a load reads, idx for index math, else the op that made the value
    (`exp12`, `where14`): a reader can follow a kernel against its provenance without decoding `v12`."""
    if node.op == "load":
        return f"{node.arg}_"
    if node.dtype == K.INT and node.op in ("add", "mul", "index_div", "index_mod"):
        return "idx"
    return node.op
