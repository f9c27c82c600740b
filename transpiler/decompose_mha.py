"""`nn.MultiheadAttention`'s inference fast path, written out in ops the rest of the pipeline handles.

In eval mode without grad, `nn.MultiheadAttention` (and so torchvision's ViT, and any model built on it) traces
to one `aten::_native_multi_head_attention`: an opaque ATen op, so its two projections cannot take the GEMM
rewrites (oneDNN on the CPU, `gemm_forms` on CUDA) and nothing around it fuses. Self-attention without a mask and
without the attention weights becomes

    qkv = linear(x, in_proj_weight, in_proj_bias).unflatten(-1, [3, heads, head_dim]).permute(2, 0, 3, 1, 4)
    o   = scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])          # scale 1/sqrt(head_dim), as MHA's
    out = linear(o.transpose(1, 2).flatten(2, 3), out_proj_weight, out_proj_bias)

which is what the op computes (torch/nn/functional.py's multi_head_attention_forward, in batch-first form). A call
with a mask, separate key/value tensors, or whose attention weights are read stays as it is: counted, correct.
"""
from __future__ import annotations

from typing import Optional

from .ir import Attr, Graph, Node, Type, Value, blocks, literals as literals_of, readers as readers_of

OP = "aten::_native_multi_head_attention"
_SCHEMAS = {
    "aten::linear": "aten::linear(Tensor input, Tensor weight, Tensor? bias=None) -> Tensor",
    "aten::unflatten.int": "aten::unflatten.int(Tensor(a) self, int dim, SymInt[] sizes) -> Tensor(a)",
    "aten::permute": "aten::permute(Tensor(a) self, int[] dims) -> Tensor(a)",
    "aten::select.int": "aten::select.int(Tensor(a) self, int dim, SymInt index) -> Tensor(a)",
    "aten::scaled_dot_product_attention": (
        "aten::scaled_dot_product_attention(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, "
        "float dropout_p=0., bool is_causal=False, *, float? scale=None, bool enable_gqa=False) -> Tensor"),
    "aten::transpose.int": "aten::transpose.int(Tensor(a) self, int dim0, int dim1) -> Tensor(a)",
    "aten::flatten.using_ints": ("aten::flatten.using_ints(Tensor(a) self, int start_dim=0, int end_dim=-1) "
                                 "-> Tensor(a)"),
}


def decompose_mha(graph: Graph) -> int:
    """Rewrite in place; returns how many attention calls were written out."""
    literals = literals_of(graph)
    readers = readers_of(graph)
    done = 0
    for block in blocks(graph):
        out: list[Node] = []
        for node in block.nodes:
            heads = _self_attention_heads(node, literals, readers)
            if heads is None:
                out.append(node)
                continue
            out += _written_out(node, heads)
            done += 1
        block.nodes = out
    return done


def _self_attention_heads(node: Node, literals: dict, readers: dict) -> Optional[int]:
    """The head count of a maskless batch-first self-attention whose weights nobody reads; else None."""
    if node.op != OP or len(node.inputs) < 12:
        return None
    x, key, value = node.inputs[:3]
    embed, heads = literals.get(node.inputs[3].id), literals.get(node.inputs[4].id)
    mask = node.inputs[9]
    need_weights = literals.get(node.inputs[10].id, True)
    shape = x.type.shape
    if (key.id != x.id or value.id != x.id or not isinstance(embed, int) or not isinstance(heads, int)
            or heads <= 0 or embed % heads or mask.type.kind != "None" or need_weights is not False
            or shape is None or len(shape) != 3 or shape[-1] != embed or x.type.dtype not in
            ("float32", "float16", "bfloat16") or any(v.type.kind == "None" for v in node.inputs[5:9])
            or len(node.outputs) != 2 or readers.get(node.outputs[1].id)):
        return None
    return heads


def _written_out(node: Node, heads: int) -> list[Node]:
    x, embed = node.inputs[0], node.inputs[0].type.shape[-1]
    in_w, in_b, out_w, out_b = node.inputs[5:9]
    result = node.outputs[0]
    nodes: list[Node] = []

    def constant(value, kind: str) -> Value:
        v = Value(f"{result.name}_c", Type(kind, elems=(Type("int"),)) if kind == "List" else Type(kind))
        nodes.append(Node("prim::Constant", [], [v], attrs={Attr.VALUE: value}))
        return v

    def op(name: str, inputs: list[Value], output: Optional[Value] = None, replaces: bool = False) -> Value:
        output = output or Value(f"{result.name}_{name.split('::')[1].split('.')[0]}",
                                 Type("Tensor", x.type.dtype, None, x.type.device))
        # the report counts the attention call once, as the first projection; the rest is made by the rewrite
        attrs = {Attr.SCHEMA: _SCHEMAS[name], **({"from_ops": [OP]} if replaces else {"synthetic": True})}
        nodes.append(Node(name, inputs, [output], source=node.source, attrs=attrs))
        return output

    qkv = op("aten::linear", [x, in_w, in_b], replaces=True)
    qkv = op("aten::unflatten.int", [qkv, constant(-1, "int"), constant([3, heads, embed // heads], "List")])
    qkv = op("aten::permute", [qkv, constant([2, 0, 3, 1, 4], "List")])
    q, k, v = (op("aten::select.int", [qkv, constant(0, "int"), constant(i, "int")]) for i in range(3))
    attended = op("aten::scaled_dot_product_attention",
                  [q, k, v, constant(None, "None"), constant(0.0, "float"), constant(False, "bool"),
                   constant(None, "None"), constant(False, "bool")])
    merged = op("aten::transpose.int", [attended, constant(1, "int"), constant(2, "int")])
    merged = op("aten::flatten.using_ints", [merged, constant(2, "int"), constant(3, "int")])
    op("aten::linear", [merged, out_w, out_b], output=result)
    return nodes
