"""A reduction kernel over channels-last activations, rendered with the channels innermost.

The C++ kernel's usual form computes each reduction once per output point, its innermost loop running over the
reduction's own dims. A global average pool of a channels-last (NHWC) activation then reads H*W floats C apart
for each (n, c): a gather the vectorizer cannot use (EfficientNet-style nets' `silu -> adaptive_avg_pool2d` took
0.23 ms for 2x64x32x32, several times ATen's own pool). Here the loops are interchanged, as ATen's channels-last
pool does: for each row (the output dims but the channels) and block of channels, one accumulator per channel,
the reduction's dims outside and a `simd` loop over the block's channels inside, whose loads are contiguous.

    for n, block:  acc[c] = 0;  for h, w:  simd for c in block: acc[c] += f(x[n, h, w, c])
                   simd for c in block: out[n, c] = g(acc[c])

The same interchange serves a reduction over a dim that is not the last followed by a sweep over it: a softmax
over dim 1 of [N, C, L], or a channels-first LayerNorm over C of NCHW (ConvNeXt's), read each of its C values L
apart per (n, l), a gather per element (softmax over dim 1 of 32x256x64 took 2.5 ms where ATen's takes 0.33). The
later reductions read the earlier ones per channel, and the sweep runs its dims outside the channel loop:

    for n, block:  max[c]: for r: simd for c;  sum[c]: for r: simd for c: sum[c] += exp(x - max[c])
                   for l: simd for c in block: out[n, l, c] = exp(x - max[c]) / sum[c]

It applies where the channel dim (the last of the kernel's rows) is static and at least MIN_CHANNELS wide, its
reductions are sums, maxima or minima whose bodies read no reductions but earlier ones of the kernel, every load
moves by zero or one element along the channel dim, and some load of a reduction moves by one along it while the
innermost reduction dim does not.
"""
from __future__ import annotations

from typing import Optional

from jit2triton.transpiler import kernel_ir as K
from jit2triton.transpiler.kernel_ir import compute_dtype

from .common import FLOAT_SUM_CHUNK, Scope, store_index, unravel

BLOCK = 64  # channels per block: a block's accumulators (64 doubles) stay in registers and L1
MIN_CHANNELS = 8  # fewer channels than a vector holds: the usual form


def channel_var(nest, values) -> Optional[K.KExpr]:
    """The loop variable to put innermost (the last of the rows), or None where the usual form is kept. `values`:
    the kernel's stored values (the sweep's loads must not gather across channels either)."""
    if not nest.outer or not nest.reductions:
        return None
    channel = nest.outer[-1]
    if not isinstance(channel.arg[1], int) or channel.arg[1] < MIN_CHANNELS:
        return None
    contiguous = False
    for i, reduction in enumerate(nest.reductions):
        op, rvars, _ = reduction.arg
        earlier = {id(r) for r in nest.reductions[:i]}
        if op not in ("sum", "max", "min") or any(id(r) not in earlier for r in _own(reduction.args[0], "reduce")):
            return None
        for load in _own(reduction.args[0], "load"):
            along = _coefficient(load.args[0], channel)
            if along is None or along not in (0, 1):
                return None
            innermost = _coefficient(load.args[0], rvars[-1])
            if along == 1:
                if innermost is None or innermost == 1:
                    return None  # contiguous along the reduction already: the usual form vectorizes it
                contiguous = True
    if nest.inner and any(_coefficient(load.args[0], channel) not in (0, 1)
                          for value in values for load in _own(value, "load")):
        return None
    return channel if contiguous else None


def _own(root: K.KExpr, op: str) -> list[K.KExpr]:
    """The `op` nodes of an expression outside the reductions it reads (each of those is checked on its own)."""
    found, seen, stack = [], set(), [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if node.op == op:
            found.append(node)
        if node.op != "reduce" or node is root:
            stack += node.args
    return found


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


def render_loops(writer, channel: K.KExpr, ctype, reduction_init, stashes: dict) -> tuple[list[str], list[str], object]:
    """(lines before the row loop, the row loop's body, the number of rows): the caller wraps the body in the
    row loop, parallel or not. `ctype` and `reduction_init` are the C++ renderer's type and start-value rules;
    `stashes` its sums whose bodies the sweep computes again (cpp.py's _stashes: stored into the output as the sum
    runs, read back by the sweep: a softmax over dim 1 computes each exp once)."""
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

    def read_accumulators(scope: Scope) -> None:  # each reduction's value for channel c, named in `scope`
        for reduction, acc in ((r, accumulators[id(r)]) for r in nest.reductions if id(r) in accumulators):
            name = writer.fresh("red")
            scope.lines.append(f"{scope.indent}const {ctype(reduction.dtype)} {name} = "
                               f"({ctype(reduction.dtype)}){acc}[{c} - {first}];")
            scope.names[id(reduction)] = name

    for reduction in nest.reductions:
        accumulators[id(reduction)] = _accumulate(writer, reduction, row, channel, channel_loop, first, block,
                                                  ctype, reduction_init, read_accumulators, stashes.get(id(reduction)))
    sweep = "    " + "  " * len(nest.inner)  # (the sweep's dims, where there are any, outside the channel loop)
    swept = Scope(row, row.bound | set(nest.inner), sweep)
    epilogue = Scope(swept, swept.bound | {channel}, sweep + "  ")
    read_accumulators(epilogue)
    for stash in stashes.values():
        index, name = writer.value(stash.at_sweep, epilogue), writer.fresh("stashed")
        epilogue.lines.append(f"{epilogue.indent}const float {name} = out_{stash.out.name}[{index}];")
        epilogue.names[id(stash.swept)] = name
    stores = []
    for value, out in zip(kernel.values, kernel.outputs):
        code = writer.value(value, epilogue)
        index = writer.value(store_index(kernel, out.strides), epilogue)
        converted = {"float16": f"j2t_f2h({code})", "bfloat16": f"j2t_f2bf({code})"}.get(out.dtype, code)
        stores.append(f"{epilogue.indent}out_{out.name}[{index}] = {converted};")
    loops = [f"    {'  ' * d}for (int64_t {v.arg[0]} = 0; {v.arg[0]} < {writer.size(v.arg[1])}; ++{v.arg[0]}) {{"
             for d, v in enumerate(nest.inner)]
    body = head + row.lines + loops + swept.lines + [f"{sweep}#pragma omp simd", f"{sweep}{channel_loop} {{"]
    body += epilogue.lines + stores + [f"{sweep}}}"] + [f"    {'  ' * d}}}" for d in reversed(range(len(nest.inner)))]
    return root.lines, body, _rows_size(rows) * blocks


def _rows_size(rows):
    n = 1
    for v in rows:
        n *= v.arg[1]
    return n


def _accumulate(writer, reduction: K.KExpr, row: Scope, channel: K.KExpr, channel_loop: str, first: str,
                block: int, ctype, reduction_init, read_accumulators, stash=None) -> str:
    """Emit one reduction's loops into `row`; returns its accumulator array's name."""
    op, rvars, _ = reduction.arg
    body_dtype = reduction.args[0].dtype
    acc_type = "double" if op == "sum" and compute_dtype(body_dtype) == "float32" else ctype(body_dtype)
    depth = len(rvars)
    outer = Scope(row, row.bound | frozenset(rvars), "    " + "  " * depth)
    inner = Scope(outer, outer.bound | {channel}, outer.indent + "  ")
    read_accumulators(inner)  # (the earlier reductions', which this one's body may read)
    value = writer.value(reduction.args[0], inner)
    acc, c = writer.fresh("acc"), channel.arg[0]
    size = writer.int_code(block)
    lines = [f"    {acc_type} {acc}[{size}];",
             f"    for (int64_t j = 0; j < {size}; ++j) {acc}[j] = {reduction_init(op, body_dtype)};"]
    # A float sum adds in float over chunks of its innermost reduction dim, each chunk's row of sums then added to
    # the double accumulators (as emitters/cpp.py's sums): a sum over dim 0 of 1024x512, 38 -> 25 us as C++ loops.
    chunked = op == "sum" and acc_type == "double"
    part = writer.fresh("part") if chunked else acc
    for d, r in enumerate(rvars):
        var, extent = r.arg[0], writer.size(r.arg[1])
        if chunked and d == depth - 1:
            step = FLOAT_SUM_CHUNK
            lines.append(f"    {'  ' * d}for (int64_t {var}_c = 0; {var}_c < {extent}; {var}_c += {step}) {{")
            lines.append(f"    {'  ' * d}float {part}[{size}] = {{}};")
            lines.append(f"    {'  ' * d}for (int64_t {var} = {var}_c; {var} < std::min<int64_t>({var}_c + "
                         f"{FLOAT_SUM_CHUNK}, {extent}); ++{var}) {{")
            continue
        lines.append(f"    {'  ' * d}for (int64_t {var} = 0; {var} < {extent}; ++{var}) {{")
    lines += outer.lines
    ind = "    " + "  " * depth
    lines += [f"{ind}#pragma omp simd", f"{ind}{channel_loop} {{"]
    if stash is not None:  # (its body, stored where the sweep reads it back)
        stored = f"{inner.indent}out_{stash.out.name}[{writer.value(stash.at_reduction, inner)}] = {value};"
    lines += inner.lines
    if stash is not None:
        lines.append(stored)
    slot = f"{part}[{c} - {first}]"
    update = {"sum": f"{slot} += {value};" if chunked else f"{slot} += ({acc_type}){value};",
              "max": f"{slot} = j2t_max({slot}, ({acc_type}){value});",
              "min": f"{slot} = j2t_min({slot}, ({acc_type}){value});"}[op]
    lines += [f"{inner.indent}{update}", f"{ind}}}"]
    for d in reversed(range(depth)):
        lines.append(f"    {'  ' * d}}}")
        if chunked and d == depth - 1:  # (the chunk's sums into the accumulators, then the chunk loop closes)
            lines += [f"    {'  ' * d}#pragma omp simd", f"    {'  ' * d}{channel_loop} {acc}[{c} - {first}] += "
                      f"{part}[{c} - {first}];", f"    {'  ' * d}}}"]
    row.lines.extend(lines)
    return acc
