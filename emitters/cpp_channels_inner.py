"""A reduction kernel over channels-last activations, rendered with the channels innermost.

The C++ kernel's usual form computes each reduction once per output point, its innermost loop running over the
reduction's own dims. A global average pool of a channels-last (NHWC) activation then reads H*W floats C apart
for each (n, c): a gather the vectorizer cannot use (EfficientNet-style nets' `silu -> adaptive_avg_pool2d` took
0.23 ms for 2x64x32x32, several times ATen's own pool). Here the loops are interchanged, as ATen's channels-last
pool does: for each row (the output dims but the channels) and block of channels, one accumulator per channel,
the reduction's dims outside and a `simd` loop over the block's channels inside, whose loads are contiguous.

    for n, block:  acc[c] = 0;  for h, w:  simd for c in block: acc[c] += f(x[n, h, w, c])
                   simd for c in block: out[n, c] = g(acc[c])

It applies where the kernel sweeps no dims besides its rows (every output point holds reductions), its
reductions are sums, maxima or minima whose bodies read no other reduction, and each load that moves with the
last output dim moves by one element along it while the innermost reduction dim does not.
"""
from __future__ import annotations

from typing import Optional

from jit2triton.transpiler import kernel_ir as K
from jit2triton.transpiler.kernel_ir import compute_dtype

from .common import Scope, store_index, unravel

BLOCK = 64  # channels per block: a block's accumulators (64 doubles) stay in registers and L1
MIN_CHANNELS = 8  # fewer channels than a vector holds: the usual form


def channel_var(nest) -> Optional[K.KExpr]:
    """The loop variable to put innermost (the last output dim), or None where the usual form is kept."""
    if nest.inner or not nest.outer or not nest.reductions:
        return None
    channel = nest.outer[-1]
    if not isinstance(channel.arg[1], int) or channel.arg[1] < MIN_CHANNELS:
        return None
    contiguous = False
    for reduction in nest.reductions:
        op, rvars, _ = reduction.arg
        body = reduction.args[0]
        if op not in ("sum", "max", "min") or _reads_reduction(body):
            return None
        for load in (n for n in K.nodes_in(body) if n.op == "load"):
            along = _coefficient(load.args[0], channel)
            if along is None or along not in (0, 1):
                return None
            innermost = _coefficient(load.args[0], rvars[-1])
            if along == 1:
                if innermost is None or innermost == 1:
                    return None  # contiguous along the reduction already: the usual form vectorizes it
                contiguous = True
    return channel if contiguous else None


def _reads_reduction(body: K.KExpr) -> bool:
    return any(n.op == "reduce" for n in K.nodes_in(body))


def _coefficient(index: K.KExpr, variable: K.KExpr) -> Optional[int]:
    """How far `index` moves when `variable` grows by one, where it is linear in it; None where it is not."""
    if variable not in K.free_vars(index):
        return 0
    if index is variable:
        return 1
    if index.op == "add":
        parts = [_coefficient(a, variable) for a in index.args]
        return None if None in parts else sum(parts)
    if index.op == "mul" and index.args[1].op == "const":
        part = _coefficient(index.args[0], variable)
        return None if part is None else part * index.args[1].arg
    return None


def render_loops(writer, channel: K.KExpr, ctype, reduction_init) -> tuple[list[str], list[str], object]:
    """(lines before the row loop, the row loop's body, the number of rows): the caller wraps the body in the
    row loop, parallel or not. `ctype` and `reduction_init` are the C++ renderer's type and start-value rules."""
    nest, kernel = writer.nest, writer.kernel
    rows = nest.outer[:-1]
    channels = channel.arg[1]
    block = min(BLOCK, channels)
    blocks = -(-channels // block)
    root = Scope(None, frozenset(), "  ")
    row = Scope(root, frozenset(rows), "    ")
    c = channel.arg[0]
    first, last = writer.fresh("first"), writer.fresh("last")
    head = [f"    const int64_t channel_block = row % {writer.int_code(blocks)};"]
    head += [f"    const int64_t {name} = {code};"
             for name, code in unravel(f"(row / {writer.int_code(blocks)})", rows, "/", int_code=writer.int_code)]
    head.append(f"    const int64_t {first} = channel_block * {writer.int_code(block)};")
    head.append(f"    const int64_t {last} = std::min<int64_t>({first} + {writer.int_code(block)}, "
                f"{writer.int_code(channels)});")
    channel_loop = f"for (int64_t {c} = {first}; {c} < {last}; ++{c})"
    accumulators: dict[int, str] = {}
    for reduction in nest.reductions:
        accumulators[id(reduction)] = _accumulate(writer, reduction, row, channel, channel_loop, first, block,
                                                  ctype, reduction_init)
    epilogue = Scope(row, row.bound | {channel}, "      ")
    for reduction in nest.reductions:
        name = writer.fresh("red")
        epilogue.lines.append(f"      const {ctype(reduction.dtype)} {name} = "
                              f"({ctype(reduction.dtype)}){accumulators[id(reduction)]}[{c} - {first}];")
        epilogue.names[id(reduction)] = name
    stores = []
    for value, out in zip(kernel.values, kernel.outputs):
        code = writer.value(value, epilogue)
        index = writer.value(store_index(kernel, out.strides), epilogue)
        converted = {"float16": f"j2t_f2h({code})", "bfloat16": f"j2t_f2bf({code})"}.get(out.dtype, code)
        stores.append(f"      out_{out.name}[{index}] = {converted};")
    body = head + row.lines + ["    #pragma omp simd", f"    {channel_loop} {{"] + epilogue.lines + stores + ["    }"]
    return root.lines, body, _rows_size(rows) * blocks


def _rows_size(rows):
    n = 1
    for v in rows:
        n *= v.arg[1]
    return n


def _accumulate(writer, reduction: K.KExpr, row: Scope, channel: K.KExpr, channel_loop: str, first: str,
                block: int, ctype, reduction_init) -> str:
    """Emit one reduction's loops into `row`; returns its accumulator array's name."""
    op, rvars, _ = reduction.arg
    body_dtype = reduction.args[0].dtype
    acc_type = "double" if op == "sum" and compute_dtype(body_dtype) == "float32" else ctype(body_dtype)
    depth = len(rvars)
    outer = Scope(row, row.bound | frozenset(rvars), "    " + "  " * depth)
    inner = Scope(outer, outer.bound | {channel}, outer.indent + "  ")
    value = writer.value(reduction.args[0], inner)
    acc, c = writer.fresh("acc"), channel.arg[0]
    lines = [f"    {acc_type} {acc}[{writer.int_code(block)}];",
             f"    for (int64_t j = 0; j < {writer.int_code(block)}; ++j) {acc}[j] = {reduction_init(op, body_dtype)};"]
    for d, r in enumerate(rvars):
        lines.append(f"    {'  ' * d}for (int64_t {r.arg[0]} = 0; {r.arg[0]} < {writer.size(r.arg[1])}; "
                     f"++{r.arg[0]}) {{")
    lines += outer.lines
    ind = "    " + "  " * depth
    lines += [f"{ind}#pragma omp simd", f"{ind}{channel_loop} {{"]
    lines += inner.lines
    slot = f"{acc}[{c} - {first}]"
    update = {"sum": f"{slot} += ({acc_type}){value};",
              "max": f"{slot} = j2t_max({slot}, ({acc_type}){value});",
              "min": f"{slot} = j2t_min({slot}, ({acc_type}){value});"}[op]
    lines += [f"{inner.indent}{update}", f"{ind}}}"]
    lines += [f"    {'  ' * d}}}" for d in reversed(range(depth))]
    row.lines.extend(lines)
    return acc
