"""The C++ form of a scatter kernel (`K.ScatterKernel`: scatter_add, index_add, scatter_reduce).

The output is viewed as [before, along, after] around the scattered dim. It is first written with its first values
(the destination's, an SIMD loop), then every thread owns whole columns (a point of `before` and a range of
`after`) and adds each update into them in index order, as ATen's CPU kernels do: no two threads write one element,
and a float sum comes out the same at any thread count. The update (a gather by the edge list, scaled, for a graph
network's message) is computed in the loop, each part at the outermost loop where its variables are bound: what
depends on the edge only (its target, its weight) once per edge, not once per column.
"""
from __future__ import annotations

import math
import re

from jit2triton.transpiler import kernel_ir as K

from .common import Scope, provenance_comment, row_major, size_code, unravel


class ScatterLoops:
    """The scatter's loops, mixed into cpp.py's writer (whose expressions they emit), which gives the C types
    (`CTYPES`, `value_type`), the reductions' identities (`identity`) and the work a thread is worth spawning for
    (`PARALLEL_WORK`)."""
    kernel: K.ScatterKernel

    def render(self) -> str:
        kernel = self.kernel
        head = [provenance_comment(kernel, "//"),
                f'J2T_KERNEL int {kernel.name}(void* const* buffers, const int64_t* sizes, int num_threads) {{',
                "  int j2t_status = 0;"]
        # (the updates' count may be a dynamic dim: lower_scatter.py)
        head += [f"  const int64_t dim_{name} = sizes[{i}];" for i, name in enumerate(kernel.size_names)]
        for i, b in enumerate(kernel.inputs):
            head.append(f"  const {self.CTYPES[b.dtype]}* __restrict {self.buffer_names[b.name]} = "
                        f"(const {self.CTYPES[b.dtype]}*)buffers[{i}];")
        for j, b in enumerate(kernel.outputs):
            head.append(f"  {self.CTYPES[b.dtype]}* __restrict out_{b.name} = "
                        f"({self.CTYPES[b.dtype]}*)buffers[{len(kernel.inputs) + j}];")
        root = Scope(None, frozenset(), "  ")
        body = self.first_values(root) + self.scattered(root)
        return "\n".join(head + root.lines + body + ["  return j2t_status;", "}"])

    def first_values(self, root: Scope) -> list[str]:
        """out = the destination's values (and a mean's count = 1 where they count, else 0)."""
        kernel, out = self.kernel, self.kernel.outputs[0]
        numel = math.prod(out.shape)
        scope = Scope(root, frozenset(kernel.out_vars), "    ")
        value = self.value(kernel.init, scope)
        pragma = "#pragma omp parallel for simd num_threads(num_threads)" if numel > self.PARALLEL_WORK else \
            "#pragma omp simd"
        lines = [f"  {pragma}", f"  for (int64_t flat = 0; flat < {numel}; ++flat) {{"]
        read = "\n".join(scope.lines) + value
        lines += [f"    const int64_t {name} = {code};" for name, code in unravel("flat", kernel.out_vars, "/")
                  if re.search(rf"\b{name}\b", read)]  # (the coordinates the first values read)
        lines += scope.lines + [f"    out_{out.name}[flat] = {value};"]
        if kernel.reduce == "mean":
            lines.append(f"    out_{kernel.outputs[1].name}[flat] = {1 if kernel.include_self else 0};")
        return lines + ["  }"]

    def scattered(self, root: Scope) -> list[str]:
        """Threads own (a point of the dims before `dim`) x (a range of the first dim after it): whole columns."""
        kernel, out = self.kernel, self.kernel.outputs[0]
        dim = kernel.dim
        before = kernel.sources[:dim]
        columns_before = math.prod(out.shape[:dim])
        first = out.shape[dim + 1] if dim + 1 < len(out.shape) else 1
        work = math.prod(out.shape[:dim] + out.shape[dim + 1:]) * K.hint(kernel.sources[dim].arg[1])
        parallel = work > self.PARALLEL_WORK
        column = Scope(root, frozenset(before), "    ")
        lines = [f"  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>({first}, "
                 f"(num_threads + {columns_before - 1}) / {columns_before}));" if parallel else
                 "  const int64_t chunks = 1;"]
        if parallel:
            lines.append("  #pragma omp parallel for num_threads(num_threads)")
        lines += [f"  for (int64_t item = 0; item < {columns_before} * chunks; ++item) {{",
                  "    const int64_t before = item / chunks, chunk = item % chunks;",
                  f"    const int64_t first_begin = {first} * chunk / chunks, "
                  f"first_end = {first} * (chunk + 1) / chunks;"]
        lines += [f"    const int64_t {name} = {code};" for name, code in unravel("before", before, "/")]
        phases = []
        if not kernel.include_self:  # an element that receives an update starts from the reduction's identity
            identity = self.identity("sum" if kernel.reduce == "mean" else kernel.reduce, out.dtype)
            phases += self.over_updates(column, lambda at, update: [f"out_{out.name}[{at}] = {identity};"],
                                        with_update=False)
        phases += self.over_updates(column, self.combine)
        if kernel.reduce == "mean":
            phases += self.divide_by_counts()
        return lines + column.lines + phases + ["  }"]

    def after_loops(self, sizes: list, names: list[str], scopes: list[Scope]) -> list[str]:
        """The loops over the dims after `dim`, the first over this thread's range, each followed by the lines of
        its scope; the innermost is `omp simd`: within one update point its elements are distinct (they differ in
        their position after `dim`)."""
        lines = []
        for depth, (name, size, scope) in enumerate(zip(names, sizes, scopes)):
            ind = "      " + "  " * depth
            low, high = ("first_begin", "first_end") if depth == 0 else ("0", str(size))
            if depth == len(names) - 1:
                lines.append(f"{ind}#pragma omp simd")
            lines.append(f"{ind}for (int64_t {name} = {low}; {name} < {high}; ++{name}) {{")
            lines += scope.lines
        return lines

    def close(self, depth: int) -> list[str]:
        return [f"      {'  ' * d}}}" for d in reversed(range(depth))]

    def over_updates(self, column: Scope, statements, with_update: bool = True) -> list[str]:
        """The loop over the updates into this thread's columns, in index order; `statements(at, update)` are the
        lines at each (`at`: the element's flat position). What depends on the update's position along `dim`
        only (its target, an edge's weight) is computed once per position."""
        kernel, out = self.kernel, self.kernel.outputs[0]
        dim, sources = kernel.dim, kernel.sources
        along, after = sources[dim], sources[dim + 1:]
        strides = row_major(out.shape)
        at_node = K.sum_terms([v * strides[d] for d, v in enumerate(sources[:dim])] + [kernel.target * strides[dim]]
                              + [v * strides[dim + 1 + d] for d, v in enumerate(after)])
        scopes = [Scope(column, column.bound | {along}, "      ")]
        for depth, v in enumerate(after):
            scopes.append(Scope(scopes[-1], scopes[-1].bound | {v}, "      " + "  " * (depth + 1)))
        point = scopes[-1]
        at = self.value(at_node, point)
        update = self.value(kernel.update, point) if with_update else ""
        name = along.arg[0]
        lines = [f"    for (int64_t {name} = 0; {name} < {size_code(along.arg[1])}; ++{name}) {{"] + scopes[0].lines
        lines += self.after_loops([v.arg[1] for v in after], [v.arg[0] for v in after], scopes[1:])
        lines += [f"{point.indent}{line}" for line in statements(at, update)]
        return lines + self.close(len(after)) + ["    }"]

    def combine(self, at: str, update: str) -> list[str]:
        kernel, out = self.kernel, f"out_{self.kernel.outputs[0].name}"
        if kernel.reduce in ("sum", "mean"):
            lines = [f"{out}[{at}] += {update};"]
        else:
            kind = self.value_type(kernel.outputs[0].dtype)
            lines = [f"{out}[{at}] = j2t_{kernel.reduce}({out}[{at}], ({kind}){update});"]
        if kernel.reduce == "mean":
            lines.append(f"out_{kernel.outputs[1].name}[{at}] += 1;")
        return lines

    def divide_by_counts(self) -> list[str]:
        """A mean: each element over its count (at least 1: an element nothing reached keeps its value); integers
        floor, as ATen's mean does."""
        kernel = self.kernel
        out, count = (f"out_{b.name}" for b in kernel.outputs)
        shape, dim = kernel.outputs[0].shape, kernel.dim
        strides = row_major(shape)
        sizes = shape[dim + 1:]
        names = [f"after{d}" for d in range(len(sizes))]
        kind = self.value_type(kernel.outputs[0].dtype)
        at = " + ".join([f"before * {shape[dim] * strides[dim]}", f"row * {strides[dim]}"]
                        + [f"{n} * {strides[dim + 1 + d]}" for d, n in enumerate(names)])
        divided = (f"{out}[at] / ({kind})n" if kind in ("float", "double") else
                   f"({kind})j2t_floordiv((int64_t){out}[at], n, &j2t_status)")
        ind = "      " + "  " * len(names)
        lines = [f"    for (int64_t row = 0; row < {shape[dim]}; ++row) {{"]
        lines += self.after_loops(list(sizes), names, [Scope(None, frozenset(), ind)] * len(names))
        lines += [f"{ind}const int64_t at = {at};", f"{ind}const int64_t n = std::max<int64_t>({count}[at], 1);",
                  f"{ind}{out}[at] = {divided};"]
        return lines + self.close(len(names)) + ["    }"]
