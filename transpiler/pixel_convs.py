"""On the CPU, a 1x1 convolution of a one-pixel image (squeeze-excite's two convolutions after its global pool)
becomes the GEMM it is, `linear` of the pixel's channels, which onednn_linear.py then times like any other; the
small gate computed from it is stored once rather than recomputed by the kernel that multiplies it in.

As a convolution it is an ATen or oneDNN call on a few hundred numbers that costs what setting a convolution up
costs: on the edge conv net (benchmarks/workloads.py, one thread) 40-100 us each, four a call, where ATen's linear of
the same 2x64 -> 16 takes 5 us.

    y = conv2d(x, W, b)      x: [N, C, 1, 1], W: [O, C, 1, 1] constant, no padding, one group
      ->  y = reshape(linear(reshape(x, [-1, C]), Wm, b), [-1, O, 1, 1])      Wm = W as [O, C], stored once

Stride and dilation do not matter: a 1x1 kernel over one pixel with no padding reads that pixel. Only float32 and
bfloat16 convolutions whose input's last two dims are 1 at every size (numbers, not dynamic dims).

The values that follow on the pixel (relu, the second GEMM, sigmoid: still [N, C, 1, 1]) are what a broadcasting
op then reads for every element of the full activation (`x * gate`). Left to fusion, that op's kernel inlined the
gate and recomputed its sigmoid per element, costing what the GEMMs saved; so each one-pixel value read by an op
whose output is larger is marked `store` (fuse.py writes it out once).
"""
from __future__ import annotations

from .ir import Attr, Graph, Node, Type, Value, blocks, literals as literals_of, readers as readers_of, weight_names
from .convs import Conv, as_conv
from .op_table import schema_of

MODE = "auto"  # "auto": on the CPU; "never"


def pixel_convs(graph: Graph, device_type: str) -> int:
    """Rewrite in place; returns how many convolutions became GEMMs."""
    if device_type != "cpu" or MODE == "never":
        return 0
    weights, literals = weight_names(graph), literals_of(graph)
    results: list[Value] = []
    for block in blocks(graph):
        out: list[Node] = []
        for node in block.nodes:
            conv = as_conv(node, weights, literals)
            if conv is not None and _on_one_pixel(conv):
                out += _as_product(graph, weights, conv)
                results.append(conv.node.output)
            else:
                out.append(node)
        block.nodes = out
    _store_gates(graph, results)
    return len(results)


def _one_pixel(v: Value) -> bool:
    shape = v.type.shape
    return v.type.kind == "Tensor" and shape is not None and len(shape) == 4 and tuple(shape[2:]) == (1, 1)


def _full_image(v: Value) -> bool:
    """A 4-d image of more than one pixel (a dynamic batch or size included): what a gate is broadcast over."""
    shape = v.type.shape
    return v.type.kind == "Tensor" and shape is not None and len(shape) == 4 and tuple(shape[2:]) != (1, 1)


def _on_one_pixel(conv: Conv) -> bool:
    return (_one_pixel(conv.x) and tuple(conv.weight.type.shape[2:]) == (1, 1) and conv.groups == 1
            and conv.padding == [0, 0])


def _store_gates(graph: Graph, results: list[Value]) -> None:
    """Mark `store` on each one-pixel value downstream of the rewritten convolutions that an op making a full image
    reads (the gate a full activation is multiplied by)."""
    readers = readers_of(graph)
    seen: set[tuple[int, int]] = set()  # (reader, value read): a reader of two gates marks both
    todo = list(results)
    while todo:
        v = todo.pop()
        for reader in readers.get(v.id, []):
            if reader is None or (id(reader), v.id) in seen:
                continue
            seen.add((id(reader), v.id))
            outs = [o for o in reader.outputs if o.type.kind == "Tensor"]
            if outs and all(_one_pixel(o) for o in outs):
                todo += outs
            elif any(_full_image(o) for o in outs):
                _mark(v, graph)


def _mark(v: Value, graph: Graph) -> None:
    for node in graph.walk():
        if v in node.outputs:
            node.attrs[Attr.STORE] = True
            return


def _as_product(graph: Graph, weights: dict[int, str], conv: Conv) -> list[Node]:
    node, result = conv.node, conv.node.output
    outs, ins = conv.weight.type.shape[:2]
    name = f"{weights[conv.weight.id]}.matrix"
    if name not in graph.weights:
        graph.weights[name] = graph.weights[weights[conv.weight.id]].reshape(outs, ins).contiguous()
    weights_type = conv.weight.type
    matrix = Value(f"{result.name}_matrix", Type("Tensor", weights_type.dtype, (outs, ins), weights_type.device))
    weights[matrix.id] = name
    nodes = [Node("prim::Constant", [], [matrix], attrs={Attr.WEIGHT: name})]

    def constant(suffix: str, value, kind: Type) -> Value:
        v = Value(f"{result.name}_{suffix}", kind)
        nodes.append(Node("prim::Constant", [], [v], attrs={Attr.VALUE: value}))
        return v

    def op(name: str, inputs: list[Value], output: Value) -> Value:
        nodes.append(Node(name, inputs, [output], source=node.source,
                          attrs={Attr.SCHEMA: schema_of(name), Attr.SYNTHETIC: True, Attr.FROM_OPS: [node.op]}))
        return output

    ints = Type("List", elems=(Type("int"),))
    batch = conv.x.type.shape[0]

    def rows(suffix: str, width: int) -> Value:
        return Value(f"{result.name}_{suffix}", Type("Tensor", result.type.dtype, (batch, width), result.type.device))

    flat = op("aten::reshape", [conv.x, constant("rows_shape", [-1, ins], ints)], rows("rows", ins))
    bias = conv.bias or constant("no_bias", None, Type("None"))
    product = op("aten::linear", [flat, matrix, bias], rows("product", outs))
    op("aten::reshape", [product, constant("image_shape", [-1, outs, 1, 1], ints)], result)
    return nodes
