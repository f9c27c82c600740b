"""The Triton forms of a scatter kernel (`K.ScatterKernel`: scatter_add, index_add, scatter_reduce).

A sum that starts from the destination's values (kernel_ir.update_parallel) is update-parallel, as ATen's CUDA
scatter is: the launcher zeroes the output (the kernel entry's "zeroed"), and each program takes XBLOCK points of
the flat index space [the output's first values, then the updates], adding each into its element with a relaxed
`tl.atomic_add`. Additions commute, so no program waits for another, and the updates' count (a graph's edges, a
size the data may set) sets the grid: a graph network's 16-128 feature columns no longer mean a handful of programs.
A first value that is a literal zero (a `new_zeros` destination) adds nothing and is skipped.

Every other scatter (max, min, a mean, a sum without the destination's values) keeps one owner per output element:
the output is viewed as [before, along, after] around the scattered dim, its columns being the points of (before,
after). Each program owns XBLOCK whole columns, so no two programs touch one element and one launch can hold the
whole scatter: the program writes its columns' first values, waits for its own threads (`tl.debug_barrier`), then
sweeps every update in [EBLOCK, XBLOCK] tiles, combining each into its column with `tl.atomic_add` / `atomic_max` /
`atomic_min` (two updates of one tile may meet in one element). A mean then divides by the counts it kept, read past
the L1 cache (`volatile`): the atomics wrote them in L2.

The atomics decide what is generated (lower_scatter.py refuses the rest): add, max and min of 32- and 64-bit
numbers. Float max and min are Triton's integer atomics split by the update's sign bit (3.6 and 3.9 alike: a signed
max of the bits where it is clear, an unsigned min where it is set), right for -0.0 and negatives. Float sums land in
whatever order the atomics meet, so they agree with ATen to rounding, not to the bit; integer sums, max and min are
exact.
"""
from __future__ import annotations

import math

from jit2triton.transpiler import kernel_ir as K
from jit2triton.transpiler.kernel_ir import compute_dtype

from .common import Scope, provenance_comment, row_major, size_code, unravel
from .triton_math import HELPERS, TL_TYPES, neutral, ordered

# (columns per program, updates per tile): each program sweeps every update, so its time is the number of tiles it
# takes; narrow column blocks make more programs, tall tiles fewer steps. The first is the default, the others
# are timed against it on a GPU where the kernel is large enough (compile_triton.tuning_candidates).
BLOCKS = ((16, 256), (8, 512), (32, 128))
UPDATE_BLOCKS = (256, 512, 1024)  # points per program of the update-parallel form, the first the default


class ScatterSweep:
    """The scatter's sweeps, mixed into triton.py's writer (whose expressions they emit), which gives the kernel's
    `signature`, what a rendering is (`RENDERED`: TritonKernel) and `next_power_of_2`."""
    kernel: K.ScatterKernel

    def __init__(self, kernel: K.ScatterKernel) -> None:
        super().__init__(kernel)
        kernel = self.kernel  # (decomposed)
        self.by_updates = K.update_parallel(kernel.reduce, kernel.include_self)
        self.flat = self.by_updates
        self.constexprs = ["XBLOCK", "EBLOCK"]
        self.axis.update(e=0, x=1)
        self.width.update(e="EBLOCK", x="XBLOCK")
        self.mask.update(e="emask", x="xmask")
        dim = kernel.dim
        for variables in (kernel.out_vars, kernel.sources):
            for d, v in enumerate(variables):
                self.group[id(v)] = "x" if self.by_updates or d != dim else "e"
        if self.by_updates:
            self.constexprs = ["XBLOCK"]
            self.axis.update(x=0)
        out = kernel.outputs[0]
        self.rows = out.shape[dim]
        self.before = math.prod(out.shape[:dim])
        self.after = math.prod(out.shape[dim + 1:])
        self.kind = compute_dtype(out.dtype)

    def render(self):
        if self.by_updates:
            return self.render_updates()
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
        params, arg_types, decorator = self.signature(kernel.size_names)
        source = "\n".join([provenance_comment(kernel, "#"), "import triton", "import triton.language as tl", ""]
                           + [HELPERS[h].rstrip() + "\n" for h in ordered(self.helpers)]
                           + ["", decorator, f"def {kernel.name}({', '.join(params)}):"] + body) + "\n"
        longest = self.next_power_of_2(max(self.rows, K.hint(kernel.sources[dim].arg[1])))
        configs = []
        for width, height in BLOCKS:
            config = {"constants": {"XBLOCK": min(width, self.next_power_of_2(columns)),
                                    "EBLOCK": min(height, longest)}, "num_warps": 4}
            if config not in configs:
                configs.append(config)
        return self.RENDERED(kernel.name, source, arg_types, columns, configs, kernel.size_names, kernel.dims)

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
        count = size_code(along.arg[1])
        lines = [f"    for edge_start in range(0, {count}, EBLOCK):",
                 f"        {along.arg[0]} = edge_start + {self.arange('EBLOCK')}[:, None]",
                 f"        emask = {along.arg[0]} < {count}"] + scope.lines
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

    # --- the update-parallel form: a sum, added atomically into a zeroed output ---------------------------------

    def render_updates(self):
        """XBLOCK points per program of [the output's first values (unless a literal zero), the updates]; each
        phase runs in the programs its points reach (a scalar branch), under its own mask."""
        kernel, out = self.kernel, self.kernel.outputs[0]
        dim, sources = kernel.dim, kernel.sources
        numel = math.prod(out.shape)
        updates = math.prod(v.arg[1] for v in sources)  # (an int, or a SymSize: the updates' count may be dynamic)
        first = not (kernel.init.op == "const" and kernel.init.arg == 0)
        skipped = numel if first else 0
        target = f"out_{out.name}"
        lines = [f"    start = {self.program_id()} * XBLOCK",
                 f"    offsets = start + {self.arange('XBLOCK')}"]
        if first:
            scope = Scope(None, frozenset(kernel.out_vars), "        ")
            value = self.value(kernel.init, scope)
            lines += [f"    if start < {numel}:",
                      "        xindex = offsets",
                      f"        xmask = xindex < {numel}"]
            lines += [f"        {name} = {code}" for name, code in unravel("xindex", kernel.out_vars, "//")]
            lines += scope.lines + [f"        tl.atomic_add({target} + xindex, {self.flat_value(value, kernel.init)}, "
                                    "mask=xmask, sem=\"relaxed\")"]
        scope = Scope(None, frozenset(sources), "        " if first else "    ")
        strides = row_major(out.shape)
        at_node = K.sum_terms([kernel.target * strides[d] if d == dim else v * strides[d]
                               for d, v in enumerate(sources)])
        at = self.value(at_node, scope)
        update = self.flat_value(self.value(kernel.update, scope), kernel.update)
        if first:  # the programs past the first values' (and the one that holds both)
            lines += [f"    if start + XBLOCK > {skipped}:",
                      f"        xindex = offsets - {skipped}",
                      f"        xmask = (xindex >= 0) & (xindex < {size_code(updates)})"]
        else:
            lines += ["    xindex = offsets", f"    xmask = xindex < {size_code(updates)}"]
        indent = scope.indent
        lines += [f"{indent}{name} = {code}" for name, code in unravel("xindex", sources, "//")]
        lines += scope.lines + [f"{indent}tl.atomic_add({target} + {at}, {update}, mask=xmask, sem=\"relaxed\")"]
        params, arg_types, decorator = self.signature(kernel.size_names)
        source = "\n".join([provenance_comment(kernel, "#"), "import triton", "import triton.language as tl", ""]
                           + [HELPERS[h].rstrip() + "\n" for h in ordered(self.helpers)]
                           + ["", decorator, f"def {kernel.name}({', '.join(params)}):"] + lines) + "\n"
        items = skipped + updates
        largest = self.next_power_of_2(K.hint(items))
        configs = []
        for width in UPDATE_BLOCKS:
            config = {"constants": {"XBLOCK": min(width, max(largest, 16))}, "num_warps": 4}
            if config not in configs:
                configs.append(config)
        return self.RENDERED(kernel.name, source, arg_types, items, configs, kernel.size_names, kernel.dims,
                             zeroed=(0,))

    def flat_value(self, code: str, node: K.KExpr) -> str:
        """A value as a whole [XBLOCK] block of the output's dtype (a literal broadcast)."""
        if node.op == "const":
            return f"tl.full([XBLOCK], {code}, {TL_TYPES[self.kind]})"
        return f"({code} + tl.zeros([XBLOCK], {TL_TYPES[self.kind]}))"
