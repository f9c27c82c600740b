"""Recognise softmax attention written out op by op and call the fused attention kernel instead.

    scores = q @ k.transpose(-2, -1) [* scale | / divisor] [+ additive_mask]
    out    = softmax(scores, -1) @ v
becomes one `aten::scaled_dot_product_attention(q, k, v, mask, scale=...)`: a flash-attention kernel (cuDNN or
FlashAttention on the GPU, a blocked kernel on the CPU) that never writes the [L, S] score matrix to memory.
Only chains whose intermediates have no other user are rewritten, so nothing else can observe the difference.
"""
from __future__ import annotations

import math
from collections import Counter
from typing import Callable, Optional

from .ir import Attr, Block, Graph, Node, Type, Value, literals, weight_names
from .op_table import OpInfo, lookup

SDPA_SCHEMA = ("aten::scaled_dot_product_attention(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, "
               "float dropout_p=0., bool is_causal=False, *, float? scale=None, bool enable_gqa=False) -> Tensor")


def fuse_attention(graph: Graph) -> Graph:
    producer = {v.id: n for n in graph.walk() for v in n.outputs}
    uses = Counter(v.id for n in graph.walk() for v in n.inputs)
    uses.update(v.id for n in graph.walk() for b in n.blocks for v in b.outputs)
    uses.update(v.id for v in graph.outputs)
    constants = literals(graph)
    for value_id, name in weight_names(graph).items():  # a 0-d float weight (a folded `head_dim ** -0.5`) scales
        w = graph.weights[name]                          # like a Python float
        if w.dim() == 0 and w.is_floating_point():
            constants[value_id] = float(w)
    _block(graph.body, _Match(producer, uses, constants))
    return graph


class _Match:
    def __init__(self, producer, uses, constants) -> None:
        self.producer, self.uses, self.constants = producer, uses, constants

    def only_use(self, v: Value, wanted: Callable[[OpInfo], bool]) -> Optional[Node]:
        """The node that made `v`, when `wanted` holds for its op and `v` has no other reader."""
        node = self.producer.get(v.id)
        if node is None or not wanted(lookup(node.op)) or self.uses[v.id] != 1:
            return None
        return node

    def constant(self, v: Value):
        return self.constants.get(v.id)


def _block(block: Block, match: _Match) -> None:
    for node in block.nodes:
        for sub in node.blocks:
            _block(sub, match)
    removed: set[int] = set()
    rewritten: list[Node] = []
    for node in block.nodes:
        found = _attention(node, match) if lookup(node.op).batched_matmul else None
        if found is None:
            rewritten.append(node)
            continue
        replacement, consumed = found
        rewritten += replacement
        removed.update(id(n) for n in consumed)
    block.nodes = [n for n in rewritten if id(n) not in removed]


def _attention(out_matmul: Node, match: _Match):
    """([its constants..., the SDPA node], the nodes it replaces) if `out_matmul` ends an attention chain."""
    probs, v = out_matmul.inputs
    softmax = match.only_use(probs, lambda op: op.name == "aten::softmax.int")
    if softmax is None or match.constant(softmax.inputs[2]) is not None:
        return None
    scores = softmax.inputs[0]
    rank = len(scores.type.shape or ())
    if rank < 3 or match.constant(softmax.inputs[1]) not in (-1, rank - 1):
        return None
    consumed = [softmax]
    mask = None
    add = match.only_use(scores, lambda op: op.name == "aten::add.Tensor")
    if add is not None and match.constant(add.inputs[2]) == 1 and add.inputs[1].type.is_tensor:
        scores, mask = add.inputs[0], add.inputs[1]
        consumed.append(add)
    scale = 1.0
    scaled = match.only_use(scores, lambda op: bool(op.scales))
    if scaled is not None and isinstance(match.constant(scaled.inputs[1]), (int, float)):
        factor = float(match.constant(scaled.inputs[1]))
        scale = factor if lookup(scaled.op).scales == "mul" else 1.0 / factor
        scores = scaled.inputs[0]
        consumed.append(scaled)
    qk = match.only_use(scores, lambda op: op.batched_matmul)
    if qk is None:
        return None
    q, k_t = qk.inputs
    transpose = match.producer.get(k_t.id)
    if transpose is None or transpose.op != "aten::transpose.int":
        return None
    dims = {match.constant(transpose.inputs[1]), match.constant(transpose.inputs[2])}
    k = transpose.inputs[0]
    if dims not in ({-1, -2}, {rank - 1, rank - 2}) or not _same_rank(rank, q, k, v):
        return None
    consumed.append(qk)
    if match.uses[k_t.id] == 1:
        consumed.append(transpose)
    if not math.isfinite(scale):
        return None
    mask_value = mask if mask is not None else _constant_node(None, Type("None"), consumed)
    inputs = [q, k, v, mask_value, _constant_node(0.0, Type("float"), consumed),
              _constant_node(False, Type("bool"), consumed), _constant_node(scale, Type("float"), consumed),
              _constant_node(False, Type("bool"), consumed)]
    fused = Node("aten::scaled_dot_product_attention", inputs, list(out_matmul.outputs),
                 attrs={Attr.SCHEMA: SDPA_SCHEMA},
                 source=out_matmul.source)
    constants = [n for n in consumed if n.op == "prim::Constant"]
    return constants + [fused], [n for n in consumed if n.op != "prim::Constant"]


def _same_rank(rank: int, *values: Value) -> bool:
    return all(v.type.shape is not None and len(v.type.shape) == rank for v in values)


def _constant_node(value, type_: Type, sink: list) -> Value:
    out = Value("c", type_)
    sink.append(Node("prim::Constant", [], [out], attrs={Attr.VALUE: value}))
    return out
