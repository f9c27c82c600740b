"""The Triton renderer: kernel IR to one `@triton.jit` function per kernel, each in a standalone module.

A kernel without reductions is flat: each program stores XBLOCK consecutive output elements, every loop variable
recovered from the linear index with // and %. A kernel with reductions gives each program XBLOCK rows (points of
`LoopNest.outer`) as [XBLOCK, 1] columns: every reduction of those rows is one [XBLOCK, RBLOCK] tile when it fits
(persistent: RBLOCK is a literal power of two), else a loop over RBLOCK chunks into a per-lane accumulator; then
the inner dims are swept in [XBLOCK, YBLOCK] tiles. As in the C++ renderer, each expression is emitted once, at the
outermost scope where its variables are bound, so row values are hoisted out of the sweep.

Loads and stores are masked where an index can run past its range, and masked-off lanes hold the reduction's
neutral element. Values are computed in float32 for float16/bfloat16 and rounded when stored. One source compiles on
Triton 3.6 and 3.9 and also runs under the Triton interpreter: what triton.language lacks (and ATen's CUDA rounding,
through libdevice on the GPU only) are small `@triton.jit` helpers (`triton_math.py`) copied into the modules using
them.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Optional

from jit2triton.transpiler import kernel_ir as K
from jit2triton.transpiler.kernel_ir import INT32_LIMIT, compute_dtype

from .common import (KernelWriter, LoopNest, ReductionLoop, Scope, provenance_comment, reduction_size, row_major,
                     size_code, store_index, unravel)
from .triton_scatter import ScatterSweep
from .triton_math import DECOMPOSE, HELPER_NEEDS, HELPERS, OPS, TL_TYPES, literal, neutral, ordered

POINTER_TYPES = {"float32": "*fp32", "float64": "*fp64", "float16": "*fp16", "bfloat16": "*bf16", "int64": "*i64",
                 "int32": "*i32", "int16": "*i16", "int8": "*i8", "uint8": "*u8", "bool": "*i1"}
SCALAR_TYPES = {"int64": "i64", "float64": "fp64"}  # a host number a kernel takes by value (KernelBuffer.by_value)
PERSISTENT_LIMIT = 4096  # a reduction (or sweep) up to this many elements is one tile; beyond, a loop of chunks
TILE_BUDGET = 4096  # elements in a program's widest tile (XBLOCK rows x the widest reduction or sweep)
LOOP_BLOCK = 1024  # chunk width of a looped reduction or sweep


@dataclass
class TritonKernel:
    """A rendered kernel: its module source and how to launch it."""
    name: str
    source: str  # a standalone Python module: provenance comment, imports, helpers, the kernel
    arg_types: list[str]  # Triton types of the arguments: inputs' and outputs' pointers, then the dims' sizes
    items: Any  # what the grid covers: output elements (flat kernels) or rows (kernels with reductions); an int,
    # or a SymSize over `size_args` when the kernel is dynamic
    configs: list[dict] = field(default_factory=list)  # {"constants": {...}, "num_warps": n}; the default first
    size_args: tuple[str, ...] = ()  # the dynamic dims it takes, after the buffers (argument `dim_<name>`)
    dims: dict[str, tuple] = field(default_factory=dict)  # the conversion's dynamic dims (Kernel.dims)
    # the arguments (inputs) compiled without assuming a 16-byte-aligned start (KernelBuffer.aligned): the runtime
    # passes them as they are, where it copies any other unaligned input
    unaligned: tuple[int, ...] = ()
    # the outputs the launcher zeroes before the launch: a kernel that adds into them atomically (an update-parallel
    # scatter, triton_scatter.py) finds each element at zero however its programs are ordered
    zeroed: tuple[int, ...] = ()

    def grid(self, config: dict, sizes: Optional[dict] = None) -> int:
        items = self.items if isinstance(self.items, int) else self.items.evaluate(sizes)
        return -(-items // config["constants"]["XBLOCK"])


@dataclass
class _Reduction(ReductionLoop):
    kind: str  # the body's compute dtype
    group: str  # its tile axis group
    size: Any  # its number of points (an int, or a SymSize)
    width: str  # the tile's width along it: a literal power of two (one tile), or "RBLOCK" (a loop of chunks)
    persistent: bool


def next_power_of_2(n: int) -> int:
    return 1 << max(0, (max(n, 1) - 1).bit_length())


class _KernelWriter(KernelWriter):
    OPS = OPS
    DECOMPOSE = DECOMPOSE

    def __init__(self, kernel: K.Kernel) -> None:
        super().__init__(kernel)
        self.flat = not self.nest.reductions
        self.index64 = _needs_int64(self.kernel, self.nest)
        self.group: dict[int, str] = {}  # loop var -> the tile axis group it lives in ("x", "y", "r3", ...)
        self.mask: dict[str, str] = {}  # group -> its mask's name, for groups whose lanes can run past the range
        self.axis: dict[str, int] = {}  # group -> tile axis (0 for rows, 1 for reductions and the sweep)
        self.width: dict[str, str] = {}  # group -> tile width ("XBLOCK", "64", "RBLOCK")
        self.helpers: list[str] = []
        self.constexprs = ["XBLOCK"]
        self.persistent_widths: list[int] = []

    def literal(self, value, dtype: str) -> str:
        return literal(value, dtype)

    def signature(self, size_names: tuple[str, ...]) -> tuple[list[str], list[str], str]:
        """(parameters, their launchers' types, the decorator): a pointer per buffer, but an input that is a host
        number, by value; then the dynamic dims' sizes. Numbers and sizes are typed arguments Triton must not
        specialise (on 1, or on divisibility by 16): one binary serves every value, and the launchers pass each at
        a fixed width."""
        kernel = self.kernel
        size_type = "tl.int64" if self.index64 else "tl.int32"
        params = [f"{self.buffer_names[b.name]}: {TL_TYPES[b.dtype]}" if b.by_value else self.buffer_names[b.name]
                  for b in kernel.inputs]
        params += [f"out_{b.name}" for b in kernel.outputs] + [f"dim_{name}: {size_type}" for name in size_names]
        params += [f"{c}: tl.constexpr" for c in self.constexprs]
        arg_types = [SCALAR_TYPES[b.dtype] if b.by_value else POINTER_TYPES[b.dtype] for b in kernel.inputs]
        arg_types += [POINTER_TYPES[b.dtype] for b in kernel.outputs]
        arg_types += ["i64" if self.index64 else "i32"] * len(size_names)
        free = [self.buffer_names[b.name] for b in kernel.inputs if b.by_value] + [f"dim_{n}" for n in size_names]
        decorator = f"@triton.jit(do_not_specialize=[{', '.join(map(repr, free))}])" if free else "@triton.jit"
        return params, arg_types, decorator

    def declare(self, scope: Scope, name: str, node: K.KExpr, code: str) -> None:
        scope.lines.append(f"{scope.indent}{name} = {code}")

    def fresh_group(self, prefix: str) -> str:
        """A reduction's tile-axis name from its loop vars' prefix ("r3"); unique even when two reductions share
        loop vars (a factored sum reduces over a subset of the original's)."""
        name, n = prefix, 1
        while name in self.axis:
            n += 1
            name = f"{prefix}_part{n}"
        return name

    def use(self, helper: str) -> None:
        for needed in HELPER_NEEDS.get(helper, []):
            self.use(needed)
        if helper not in self.helpers:
            self.helpers.append(helper)

    def arange(self, width: str) -> str:
        return f"tl.arange(0, {width}).to(tl.int64)" if self.index64 else f"tl.arange(0, {width})"

    def groups_of(self, node: K.KExpr) -> list[str]:
        found = {self.group[id(v)] for v in K.free_vars(node)}
        return sorted(found, key=lambda g: (self.axis[g], g))

    def mask_for(self, node: K.KExpr) -> Optional[str]:
        masks = [self.mask[g] for g in self.groups_of(node) if g in self.mask]
        return " & ".join(masks) or None

    def unit_block(self) -> str:
        """The shape of a one-element block that broadcasts against every tile of the kernel. Values are kept out
        of 0-d scalars: Triton 3.9's interpreter broadcasts a 0-d comparison result as float32 data, and a bool
        `&` then fails (a 0-d load compared and and-ed with a block reproduces it)."""
        return "[1]" if self.flat else "[1, 1]"

    def tile(self, groups) -> str:
        """The shape of a tile spanning these groups (missing axes broadcast)."""
        if self.flat:
            return "[XBLOCK]"
        dims = ["1", "1"]
        for g in groups:
            dims[self.axis[g]] = self.width[g]
        return f"[{', '.join(dims)}]"

    # --- reductions -----------------------------------------------------------------------------------------

    def open_reduction(self, node: K.KExpr, target: Scope) -> "_Reduction":
        op, rvars, _ = node.arg
        kind = compute_dtype(node.args[0].dtype)
        if kind == "bool" and op in ("max", "min"):
            op = "any" if op == "max" else "all"
        group = self.fresh_group(rvars[0].arg[0].rsplit("_", 1)[0])
        size = reduction_size(node)
        persistent = most(size) <= PERSISTENT_LIMIT  # over a dynamic dim: wide enough for the range's largest
        width = str(next_power_of_2(most(size))) if persistent else "RBLOCK"
        if persistent:
            self.persistent_widths.append(int(width))
        elif "RBLOCK" not in self.constexprs:
            self.constexprs.append("RBLOCK")
        self.axis[group], self.width[group] = 1, width
        for v in rvars:
            self.group[id(v)] = group
        indent = target.indent if persistent else target.indent + "    "
        inner = Scope(target, target.bound | frozenset(rvars), indent)
        start = "" if persistent else f"{group}_start + "
        inner.lines.append(f"{indent}{group} = {start}{self.arange(width)}[None, :]")
        if not persistent or size != int(width):
            self.mask[group] = f"{group}_mask"
            inner.lines.append(f"{indent}{group}_mask = {group} < {size_code(size)}")
        inner.lines += [f"{indent}{name} = {code}" for name, code in unravel(group, rvars, "//")]
        return _Reduction(op, inner, kind, group, size, width, persistent)

    def close_reduction(self, node: K.KExpr, target: Scope, loop: "_Reduction", body: str) -> str:
        op, group, kind, width = loop.op, loop.group, loop.kind, loop.width
        inner, indent = loop.scope, loop.scope.indent
        body_node = node.args[0]
        identity = neutral(op, kind)
        tile_shape = f"[XBLOCK, {width}]"
        if body_node.op == "const":
            body = f"tl.full({tile_shape}, {body}, {TL_TYPES[kind]})"
        if group in self.mask:
            tile = f"tl.where({self.mask[group]}, {body}, {identity})"
        elif not any(self.group.get(id(v)) == group for v in K.free_vars(body_node)) and body_node.op != "const":
            tile = f"tl.broadcast_to({body}, {tile_shape})"
        else:
            tile = body
        name = self.fresh(op)
        lines = []
        if loop.persistent:
            lines += inner.lines
            tile_name = tile if tile.isidentifier() else self.fresh(f"{op}_tile")
            if tile_name != tile:
                lines.append(f"{indent}{tile_name} = {tile}")
            lines.append(f"{indent}{name} = {self.finish(op, tile_name, group, kind)}")
        else:
            acc = self.fresh(f"{op}_acc")
            acc_type = "tl.int8" if op in ("any", "all") else TL_TYPES[kind]
            lines.append(f"{target.indent}{acc} = tl.full({tile_shape}, {identity}, {acc_type})")
            if op in ("argmax", "argmin"):
                lines.append(f"{target.indent}{acc}_at = tl.zeros({tile_shape}, tl.int64)")
            lines.append(f"{target.indent}for {group}_start in range(0, {size_code(loop.size)}, RBLOCK):")
            lines += inner.lines
            lines += self.accumulate(op, acc, tile, group, indent, kind)
            lines.append(f"{target.indent}{name} = {self.finish(op, acc, group, kind)}")
        target.lines.extend(lines)
        return name

    def accumulate(self, op: str, acc: str, tile: str, group: str, indent: str, kind: str) -> list[str]:
        if op in ("argmax", "argmin"):
            chunk = self.fresh("chunk")
            better = ">" if op == "argmax" else "<"
            nan_first = f" | (({chunk} != {chunk}) & ({acc} == {acc}))" if kind.startswith("float") else ""
            take = f"({chunk} {better} {acc}){nan_first}"
            return [f"{indent}{chunk} = {tile}",
                    f"{indent}{acc}_at = tl.where({take}, {group}, {acc}_at)",
                    f"{indent}{acc} = tl.where({take}, {chunk}, {acc})"]
        if op == "sum":
            update = f"{acc} + {tile}"
        elif op == "prod":
            update = f"{acc} * {tile}"
        elif op in ("any", "all"):
            update = f"tl.{'maximum' if op == 'any' else 'minimum'}({acc}, ({tile}).to(tl.int8))"
        else:
            nan = ", propagate_nan=tl.PropagateNan.ALL" if kind.startswith("float") else ""
            update = f"tl.{'maximum' if op == 'max' else 'minimum'}({acc}, {tile}{nan})"
        return [f"{indent}{acc} = {update}"]

    def finish(self, op: str, tile: str, group: str, kind: str) -> str:
        """The [XBLOCK, 1] result of reducing a tile (or a looped accumulator) along axis 1."""
        if op == "sum":
            return f"tl.sum({tile}, 1, keep_dims=True)"
        if op == "prod":
            self.use("j2t_multiply")
            return f"tl.reduce({tile}, 1, j2t_multiply, keep_dims=True)"
        if op in ("any", "all"):
            reduce = "tl.max" if op == "any" else "tl.min"
            return f"({reduce}(({tile}).to(tl.int8), 1, keep_dims=True) != 0)"
        if op in ("max", "min"):
            if not kind.startswith("float"):  # no NaN to carry (and a NaN would make an int row a float one)
                return f"tl.{op}({tile}, 1, keep_dims=True)"
            self.use(f"j2t_row_{op}")
            return f"j2t_row_{op}({tile})"
        self.use(f"j2t_row_{op}")
        positions = f"{tile}_at" if "RBLOCK" in self.width[group] else group
        return f"j2t_row_{op}({tile}, {positions})"

    # --- the kernel -----------------------------------------------------------------------------------------

    def render(self) -> TritonKernel:
        kernel, nest = self.kernel, self.nest
        rows, sweep = self.write()
        body = self.flat_body(rows) if self.flat else self.rows_body(rows, sweep)
        params, arg_types, decorator = self.signature(kernel.size_names)
        lines = [provenance_comment(kernel, "#"), "import triton", "import triton.language as tl", ""]
        lines += [HELPERS[h].rstrip() + "\n" for h in ordered(self.helpers)]
        lines += ["", decorator, f"def {kernel.name}({', '.join(params)}):"] + body
        source = "\n".join(lines) + "\n"
        items = _size(nest.ranges) if self.flat else nest.outer_size
        unaligned = tuple(i for i, b in enumerate(kernel.inputs) if not b.aligned)
        return TritonKernel(kernel.name, source, arg_types, items, self.configs(items), kernel.size_names,
                            kernel.dims, unaligned)

    # --- the schedule's hooks: a flat kernel is one row of XBLOCK elements; else XBLOCK rows, swept in tiles -----

    def program_id(self) -> str:
        return "tl.program_id(0).to(tl.int64)" if self.index64 else "tl.program_id(0)"

    def open_rows(self) -> Scope:
        kernel, nest = self.kernel, self.nest
        self.mask["x"], self.axis["x"], self.width["x"] = "xmask", 0, "XBLOCK"
        if not self.flat:
            for v in nest.outer:
                self.group[id(v)] = "x"
            return Scope(None, frozenset(nest.outer), "    ")
        for v in kernel.ranges:
            self.group[id(v)] = "x"
        rows = Scope(None, frozenset(kernel.ranges), "    ")
        sizes = [v.arg[1] for v in kernel.ranges]
        if all(isinstance(n, int) for n in sizes):
            # a load of a buffer laid out as the loop nest (the usual case) reads at xindex itself: no // and % to
            # take it apart and sum it up again (index expressions are interned, so an equal one is this one)
            # (held while rendering: names are keyed by id, and a freed node's id could name another)
            self.flat_index = K.sum_terms(v * s for v, s in zip(kernel.ranges, row_major(sizes)) if v.arg[1] != 1)
            rows.names[id(self.flat_index)] = "xindex"
        return rows

    def open_sweep(self, rows: Scope) -> Scope:
        nest = self.nest
        if self.flat or not nest.inner:  # (a flat kernel's row is its XBLOCK elements: nothing left to sweep)
            return rows
        inner_size = nest.inner_size
        persistent = most(inner_size) <= PERSISTENT_LIMIT
        width = str(next_power_of_2(most(inner_size))) if persistent else "YBLOCK"
        if persistent:
            self.persistent_widths.append(int(width))
        else:
            self.constexprs.append("YBLOCK")
        self.axis["y"], self.width["y"] = 1, width
        for v in nest.inner:
            self.group[id(v)] = "y"
        indent = "    " if persistent else "        "
        sweep = Scope(rows, frozenset(nest.ranges), indent)
        start = "" if persistent else "y_start + "
        sweep.lines.append(f"{indent}y = {start}{self.arange(width)}[None, :]")
        if not persistent or inner_size != int(width):
            self.mask["y"] = "ymask"
            sweep.lines.append(f"{indent}ymask = y < {size_code(inner_size)}")
        sweep.lines += [f"{indent}{name} = {code}" for name, code in unravel("y", nest.inner, "//")]
        return sweep

    def store(self, sweep: Scope, out: K.KernelBuffer, code: str) -> None:
        kernel = self.kernel
        if self.flat:
            dense = tuple(out.strides) == row_major(out.shape)
            index = "xindex" if dense else self.value(store_index(kernel, out.strides), sweep)
            sweep.lines.append(f"    tl.store(out_{out.name} + {index}, {code}, mask=xmask)")
            return
        full_groups = ["x", "y"] if self.nest.inner else ["x"]
        index_node = store_index(kernel, out.strides)
        index = self.value(index_node, sweep)
        if self.groups_of(index_node) != full_groups:  # the pointer must span the whole tile the value may fill
            index = f"({index} + tl.zeros({self.tile(full_groups)}, tl.int32))"
        store_mask = " & ".join(self.mask[g] for g in ("x", "y") if g in self.mask)
        sweep.lines.append(f"{sweep.indent}tl.store(out_{out.name} + {index}, {code}, mask={store_mask})")

    def flat_body(self, rows: Scope) -> list[str]:
        kernel = self.kernel
        lines = [f"    xindex = {self.program_id()} * XBLOCK + {self.arange('XBLOCK')}",
                 f"    xmask = xindex < {size_code(_size(kernel.ranges))}"]
        body = "\n".join(rows.lines)
        lines += [f"    {name} = {code}" for name, code in unravel("xindex", kernel.ranges, "//")
                  if re.search(rf"\b{name}\b", body)]  # the loop variables the body reads
        return lines + rows.lines

    def rows_body(self, rows: Scope, sweep: Scope) -> list[str]:
        nest = self.nest
        lines = [f"    row = {self.program_id()} * XBLOCK + {self.arange('XBLOCK')}[:, None]",
                 f"    xmask = row < {size_code(nest.outer_size)}"]
        lines += [f"    {name} = {code}" for name, code in unravel("row", nest.outer, "//")]
        lines += rows.lines
        if sweep is not rows:
            if sweep.indent != "    ":
                lines.append(f"    for y_start in range(0, {size_code(nest.inner_size)}, YBLOCK):")
            lines += sweep.lines
        return lines

    # --- launch configurations ----------------------------------------------------------------------------

    def configs(self, items) -> list[dict]:
        """Candidate launch configurations; over dynamic dims, shaped for the example's sizes and capped by the
        range's largest."""
        cap = next_power_of_2(int(min(most(items), 1 << 40)))
        total, items = items, self.at_example(items)
        if self.flat:
            choices = [(1024, 4), (512, 4), (2048, 8), (256, 2)]
            return _dedupe([{"constants": {"XBLOCK": min(x, cap)}, "num_warps": max(1, min(w, min(x, cap) // 64))}
                            for x, w in choices])
        looped = [c for c in ("RBLOCK", "YBLOCK") if c in self.constexprs]
        persistent = max(self.persistent_widths, default=1)
        gpu_rows = next_power_of_2(items) // 512  # keep enough programs to fill a GPU
        # ... at the example, and at each other point of a dynamic range it is tuned at (the ranges' ends)
        other_rows = [next_power_of_2(max(1, K.at(total, point))) // 512 for point in self.points[1:]]

        def config(rows: int, chunk: int) -> dict:
            rows = max(1, min(rows, cap, TILE_BUDGET // max(persistent, chunk)))
            warps = max(1, min(8, next_power_of_2(rows * max(persistent, chunk)) // 256))
            return {"constants": {"XBLOCK": rows, **{c: chunk for c in looped}}, "num_warps": warps}

        if looped:  # long rows in wide chunks; many strided rows (a column sum) side by side in narrow ones
            return _dedupe([config(gpu_rows, LOOP_BLOCK), config(1, TILE_BUDGET), config(64, 64), config(16, 256)]
                           + [config(rows, LOOP_BLOCK) for rows in other_rows])
        return _dedupe([config(gpu_rows, 1), config(TILE_BUDGET, 1), config(gpu_rows // 4, 1)]
                       + [config(rows, 1) for rows in other_rows])


def _needs_int64(kernel: K.Kernel, nest: LoopNest) -> bool:
    """Whether index math can leave int32: any size, or any index expression's bound, past 2**31 - 1."""
    sizes = [_size(kernel.ranges)] + [reduction_size(r) for r in nest.reductions]
    if max(most(n) for n in sizes) > INT32_LIMIT // 2:
        return True
    seen: set[int] = set()
    stack = list(kernel.values) + [store_index(kernel, out.strides) for out in kernel.outputs]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.extend(node.args)
        if node.dtype == K.INT and node.op in ("var", "const", "add", "mul", "index_div", "index_mod"):
            low, high = K.bounds(node)
            if max(abs(low), abs(high)) > INT32_LIMIT and not math.isinf(low) and not math.isinf(high):
                return True
    return False




def _size(variables) -> int:
    return math.prod(v.arg[1] for v in variables)


def most(n) -> float:
    """A size's largest value: itself, or over dynamic dims their ranges' maximum (inf for an unbounded dim)."""
    return n if isinstance(n, int) else K.bounds(K.size(n))[1]


def _dedupe(configs: list[dict]) -> list[dict]:
    out: list[dict] = []
    for c in configs:
        if c not in out:
            out.append(c)
    return out


class _ScatterWriter(ScatterSweep, _KernelWriter):
    """A scatter kernel: its sweeps are triton_scatter.py's, its expressions this module's."""
    RENDERED = TritonKernel
    next_power_of_2 = staticmethod(next_power_of_2)


def render_kernel(kernel: K.Kernel) -> TritonKernel:
    """A kernel of expressions (a GEMM template is triton_gemm.py's: backends.py picks the renderer)."""
    if isinstance(kernel, K.ScatterKernel):
        return _ScatterWriter(kernel).render()
    return _KernelWriter(kernel).render()
