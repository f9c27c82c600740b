"""The Triton form of a scatter kernel (`K.ScatterKernel`: scatter_add, index_add, scatter_reduce).

The output is viewed as [before, along, after] around the scattered dim, its columns being the points of
(before, after). Each program owns XBLOCK whole columns, so no two programs touch one element and one launch can
hold the whole scatter: the program writes its columns' first values, waits for its own threads
(`tl.debug_barrier`), then sweeps every update in [EBLOCK, XBLOCK] tiles, combining each into its column with
`tl.atomic_add` / `atomic_max` / `atomic_min` (two updates of one tile may meet in one element). A mean then divides
by the counts it kept, read past the L1 cache (`volatile`): the atomics wrote them in L2.

The atomics decide what is generated (lower_scatter.py refuses the rest): add, max and min of 32- and 64-bit
numbers. Float max and min are Triton's integer atomics split by the update's sign bit (3.6 and 3.9 alike: a signed
max of the bits where it is clear, an unsigned min where it is set), right for -0.0 and negatives. Float sums land in
whatever order the atomics meet, so they agree with ATen to rounding, not to the bit; integer sums, max and min are
exact. Parallelism is the number of column blocks: a graph network's 128 features are a few programs, each
sweeping every edge (an init launch before an edge-parallel atomic launch would need a step writing into its input,
which plans do not have yet).
"""
from __future__ import annotations

import math

from jit2triton.transpiler import kernel_ir as K
from jit2triton.transpiler.kernel_ir import compute_dtype

from .common import Scope, provenance_comment, unravel
from .triton_math import HELPERS, TL_TYPES, neutral, ordered

# (columns per program, updates per tile): each program sweeps every update, so its time is the number of tiles it
# takes; narrow column blocks make more programs, tall tiles fewer steps. The first is the default, the others
# are timed against it on a GPU where the kernel is large enough (compile_triton.tuning_candidates).
BLOCKS = ((16, 256), (8, 512), (32, 128))


class ScatterSweep:
    """The scatter's sweeps, mixed into triton.py's writer (whose expressions they emit), which gives the kernel's
    `signature`, what a rendering is (`RENDERED`: TritonKernel) and `next_power_of_2`."""
    kernel: K.ScatterKernel

    def __init__(self, kernel: K.ScatterKernel) -> None:
        super().__init__(kernel)
        kernel = self.kernel  # (decomposed)
        self.flat = False
        self.constexprs = ["XBLOCK", "EBLOCK"]
        self.axis.update(e=0, x=1)
        self.width.update(e="EBLOCK", x="XBLOCK")
        self.mask.update(e="emask", x="xmask")
        dim = kernel.dim
        for variables in (kernel.out_vars, kernel.sources):
            for d, v in enumerate(variables):
                self.group[id(v)] = "e" if d == dim else "x"
        out = kernel.outputs[0]
        self.rows = out.shape[dim]
        self.before = math.prod(out.shape[:dim])
        self.after = math.prod(out.shape[dim + 1:])
        self.kind = compute_dtype(out.dtype)

    def render(self):
        kernel, out = self.kernel, self.kernel.outputs[0]
        dim = kernel.dim
        columns = self.before * self.after
        column_vars = frozenset(v for vs in (kernel.out_vars, kernel.sources) for d, v in enumerate(vs) if d != dim)
        program = Scope(None, column_vars, "    ")
        phases = self.first_values(program)
        if not kernel.include_self:
            identity = neutral("sum" if kernel.reduce == "mean" else kernel.reduce, self.kind)
            phases += ["    tl.debug_barrier()"]
            phases += self.over_updates(program, lambda at, update: [
                f"tl.store(out_{out.name} + {at}, tl.full([EBLOCK, XBLOCK], {identity}, {TL_TYPES[self.kind]}), "
                "mask=emask & xmask)"], with_update=False)
        phases += ["    tl.debug_barrier()"] + self.over_updates(program, self.combine)
        if kernel.reduce == "mean":
            phases += ["    tl.debug_barrier()"] + self.divide_by_counts()
        lines = [f"    col = {self.program_id()} * XBLOCK + {self.arange('XBLOCK')}[None, :]",
                 f"    xmask = col < {columns}",
                 f"    before = col // {self.after}",
                 f"    after = col % {self.after}",
                 f"    column = before * {self.rows * self.after} + after"]
        for variables in (kernel.out_vars, kernel.sources):
            lines += [f"    {name} = {code}" for name, code in unravel("before", variables[:dim], "//")]
            lines += [f"    {name} = {code}" for name, code in unravel("after", variables[dim + 1:], "//")]
        body = lines + program.lines + phases
        params, arg_types, decorator = self.signature(())
        source = "\n".join([provenance_comment(kernel, "#"), "import triton", "import triton.language as tl", ""]
                           + [HELPERS[h].rstrip() + "\n" for h in ordered(self.helpers)]
                           + ["", decorator, f"def {kernel.name}({', '.join(params)}):"] + body) + "\n"
        longest = self.next_power_of_2(max(self.rows, kernel.sources[dim].arg[1]))
        configs = []
        for width, height in BLOCKS:
            config = {"constants": {"XBLOCK": min(width, self.next_power_of_2(columns)),
                                    "EBLOCK": min(height, longest)}, "num_warps": 4}
            if config not in configs:
                configs.append(config)
        return self.RENDERED(kernel.name, source, arg_types, columns, configs, (), kernel.dims)

    def first_values(self, program: Scope) -> list[str]:
        kernel, out = self.kernel, self.kernel.outputs[0]
        row = kernel.out_vars[kernel.dim]
        scope = Scope(program, program.bound | {row}, "        ")
        value = self.value(kernel.init, scope)
        lines = [f"    for row_start in range(0, {self.rows}, EBLOCK):",
                 f"        {row.arg[0]} = row_start + {self.arange('EBLOCK')}[:, None]",
                 f"        emask = {row.arg[0]} < {self.rows}"] + scope.lines
        at = f"column + {row.arg[0]} * {self.after}"
        lines.append(f"        tl.store(out_{out.name} + {at}, {self.tile_of(value, kernel.init)}, mask=emask & xmask)")
        if kernel.reduce == "mean":
            lines.append(f"        tl.store(out_{kernel.outputs[1].name} + {at}, "
                         f"tl.full([EBLOCK, XBLOCK], {1 if kernel.include_self else 0}, tl.int32), mask=emask & xmask)")
        return lines

    def tile_of(self, code: str, node: K.KExpr) -> str:
        """A value as a whole [EBLOCK, XBLOCK] tile of the output's dtype (a literal or a column's value broadcast)."""
        if node.op == "const":
            return f"tl.full([EBLOCK, XBLOCK], {code}, {TL_TYPES[self.kind]})"
        return f"({code} + tl.zeros([EBLOCK, XBLOCK], {TL_TYPES[self.kind]}))"

    def over_updates(self, program: Scope, statements, with_update: bool = True) -> list[str]:
        """The sweep over every update in tiles; `statements(at, update)` are its lines per tile."""
        kernel = self.kernel
        along = kernel.sources[kernel.dim]
        scope = Scope(program, program.bound | {along}, "        ")
        target = self.value(kernel.target, scope)
        update = self.tile_of(self.value(kernel.update, scope), kernel.update) if with_update else ""
        lines = [f"    for edge_start in range(0, {along.arg[1]}, EBLOCK):",
                 f"        {along.arg[0]} = edge_start + {self.arange('EBLOCK')}[:, None]",
                 f"        emask = {along.arg[0]} < {along.arg[1]}"] + scope.lines
        lines.append(f"        at = column + {target} * {self.after}")
        return lines + [f"        {line}" for line in statements("at", update)]

    def combine(self, at: str, update: str) -> list[str]:
        kernel, out = self.kernel, f"out_{self.kernel.outputs[0].name}"
        if kernel.reduce in ("sum", "mean"):
            lines = [f"tl.atomic_add({out} + {at}, {update}, mask=emask & xmask)"]
        else:
            lines = [f"tl.atomic_{kernel.reduce}({out} + {at}, {update}, mask=emask & xmask)"]
        if kernel.reduce == "mean":
            lines.append(f"tl.atomic_add(out_{kernel.outputs[1].name} + {at}, "
                         "tl.full([EBLOCK, XBLOCK], 1, tl.int32), mask=emask & xmask)")
        return lines

    def divide_by_counts(self) -> list[str]:
        """A mean: each element over its count (at least 1); integers floor, as ATen's mean does."""
        out, count = (f"out_{b.name}" for b in self.kernel.outputs)
        at = f"column + row * {self.after}"
        if self.kind.startswith("float"):
            divided = f"total / n.to({TL_TYPES[self.kind]})"
        else:
            self.use("j2t_floordiv_int")
            divided = f"j2t_floordiv_int(total, n.to({TL_TYPES[self.kind]}))"
        return [f"    for row_start in range(0, {self.rows}, EBLOCK):",
                f"        row = row_start + {self.arange('EBLOCK')}[:, None]",
                f"        emask = row < {self.rows}",
                f"        total = tl.load({out} + {at}, mask=emask & xmask, other=0, volatile=True)",
                f"        n = tl.maximum(tl.load({count} + {at}, mask=emask & xmask, other=1, volatile=True), 1)",
                f"        tl.store({out} + {at}, {divided}, mask=emask & xmask)"]
