"""After the attention kernels are made: where the attention's output is read only by a kernel that copies it into
another layout (BERT's `attn.transpose(1, 2).reshape(b, n, heads * head_dim)`, made contiguous), the attention
stores each element where the copy would have put it and the copy's kernel goes.

The attention template writes its output at whatever strides it is given, so this saves the copy's launch and a
round trip of the output through memory; the value the copy made is then the attention's. Taken where the copy's
kernel is one load of the attention's output and nothing else, every element read once, and its placement is
linear in the attention's coordinates (a stride per dim): found by evaluating the copy's index at every element.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

import numpy as np

from . import kernel_ir as K
from .alias_analysis import sole_kernel_reader
from .ir import KERNEL_OP, Attr, Block, Graph, Node, blocks, readers
from .kernel_ir import AttentionKernel
from .lowering import contiguous_strides

MAX_ELEMENTS = 1 << 24  # a copy of more elements is not evaluated (the attention template covers short sequences)


def store_through_copies(graph: Graph) -> int:
    """Rewrite in place; returns how many copies went."""
    read_by = readers(graph)
    return sum(_fold(block, read_by) for block in blocks(graph))


def _fold(block: Block, read_by: dict[int, list]) -> int:
    position = {id(n): i for i, n in enumerate(block.nodes)}
    dropped: set[int] = set()
    for node in list(block.nodes):
        kernel = node.attrs.get(Attr.KERNEL)
        if not isinstance(kernel, AttentionKernel) or kernel.out_strides:
            continue
        copy = sole_kernel_reader(node, block, position, read_by)
        if copy is None:
            continue
        strides = copy_strides(copy.attrs[Attr.KERNEL], kernel.outputs[0])
        if strides is None:
            continue
        copied = copy.attrs[Attr.KERNEL]
        moved = dataclasses.replace(kernel, outputs=list(copied.outputs), out_strides=strides,
                                    provenance=kernel.provenance + copied.provenance)
        block.nodes[position[id(node)]] = Node(KERNEL_OP, list(node.inputs), list(copy.outputs), source=node.source,
                                               attrs={Attr.KERNEL: moved,
                                                      Attr.FUSED: node.attrs[Attr.FUSED] + copy.attrs[Attr.FUSED]})
        dropped.add(id(copy))
    block.nodes = [n for n in block.nodes if id(n) not in dropped]
    return len(dropped)


def copy_strides(copy: K.Kernel, product: K.KernelBuffer) -> Optional[tuple[int, ...]]:
    """Where `copy` (a kernel over one input, the product) puts the product's elements, as a stride per product dim
    into its output; None unless it is a copy of every element once, linear in the product's coordinates."""
    if type(copy) is not K.Kernel or len(copy.inputs) != 1 or len(copy.outputs) != 1 or len(copy.values) != 1:
        return None
    load, out = _uncast(copy.values[0], product.dtype), copy.outputs[0]
    if (load.op != "load" or len(load.args) != 1 or load.arg != copy.inputs[0].name or out.dtype != product.dtype
            or copy.inputs[0].dtype != product.dtype or tuple(copy.inputs[0].strides) != tuple(product.strides)):
        return None
    shape = tuple(product.shape)
    if not all(isinstance(n, int) for n in (*shape, *out.shape, *out.strides)) or math.prod(shape) > MAX_ELEMENTS \
            or math.prod(out.shape) != math.prod(shape) or tuple(out.strides) != contiguous_strides(out.shape):
        return None
    points = _points(copy.index)
    if points is None:
        return None
    read = _evaluate(load.args[0], points)
    if read is None:
        return None
    written = sum(points[v.arg[0]] * s for v, s in zip(copy.index, out.strides))
    at = np.full(1 + sum((n - 1) * s for n, s in zip(shape, product.strides)), -1, dtype=np.int64)
    if read.min() < 0 or read.max() >= len(at):
        return None
    at[read] = written  # where each element of the product went
    coordinates = np.indices(shape).reshape(len(shape), -1)
    offsets = (np.asarray(product.strides, dtype=np.int64)[:, None] * coordinates).sum(axis=0)
    placed = at[offsets]
    if len(np.unique(read)) != len(read) or (placed < 0).any() or placed[0] != 0:
        return None
    strides = tuple(int(at[s]) if n > 1 else 0 for n, s in zip(shape, product.strides))
    expected = (np.asarray(strides, dtype=np.int64)[:, None] * coordinates).sum(axis=0)
    return strides if np.array_equal(placed, expected) else None


def _uncast(x: K.KExpr, dtype: str) -> K.KExpr:
    """`x` without the casts that keep every value of `dtype` as it is (a half type computed in float32)."""
    exact = {dtype, K.compute_dtype(dtype)}
    while x.op == "cast" and x.arg in exact:
        x = x.args[0]
    return x


def _points(index: tuple) -> Optional[dict[str, np.ndarray]]:
    """Each loop variable's value at every point of the copy's iteration space (flat, in one order)."""
    if not all(v.op == "var" and isinstance(v.arg[1], int) for v in index):
        return None
    grids = np.indices(tuple(v.arg[1] for v in index)).reshape(len(index), -1)
    return {v.arg[0]: grids[i].astype(np.int64) for i, v in enumerate(index)}


_INDEX_OPS = {"add": np.add, "mul": np.multiply, "sub": np.subtract, "index_div": np.floor_divide,
              "index_mod": np.mod, "floordiv": np.floor_divide, "mod": np.mod}


def _evaluate(x: K.KExpr, points: dict[str, np.ndarray]) -> Optional[np.ndarray]:
    """An index expression's value at every point; None where it holds anything but index arithmetic."""
    values: dict[int, np.ndarray] = {}
    for node in K.nodes_in(x):
        if node.op == "var":
            if node.arg[0] not in points:
                return None
            values[id(node)] = points[node.arg[0]]
        elif node.op == "const" and isinstance(node.arg, int) and not isinstance(node.arg, bool):
            values[id(node)] = np.int64(node.arg)
        elif node.op in _INDEX_OPS and len(node.args) == 2:
            values[id(node)] = _INDEX_OPS[node.op](values[id(node.args[0])], values[id(node.args[1])])
        else:
            return None
    return np.broadcast_to(values[id(x)], next(iter(points.values())).shape).astype(np.int64)
