"""A model saved after `torch.jit.optimize_for_inference` holds MKL-DNN's form of its ops: MKL-DNN tensor constants
(`prim::ConstantMKLDNNTensor`: opaque, no storage, which no package can hold), `aten::to_mkldnn` / `aten::to_dense`
around them, and `prim::` MKL-DNN ops, some of whose operations read their bounds from the graph node. Conversion
failed on it ("Cannot access data pointer of Tensor that doesn't have storage").

This writes the graph back in dense ATen ops, each where its MKL-DNN form stood, before anything else reads it: the
package chooses its own layouts and kernels (on the CPU, oneDNN's convolutions among them). The ops are the ones
torch's `ConvertFrozenOpsToMKLDNN` pass makes; one not written back here fails the conversion's first run of the
model, which names it.
"""
from __future__ import annotations

import torch

from .graph_nodes import all_nodes

# MKL-DNN op -> the dense ATen op taking the same inputs in the same order
SAME_INPUTS = {
    "prim::MKLDNNHardSwish_": "aten::hardswish_",
    "prim::MKLDNNHardSigmoid_": "aten::hardsigmoid_",
    "prim::MKLDNNScalarMul": "aten::mul",
    "prim::MKLDNNScalarMul_": "aten::mul_",
    "prim::MKLDNNLayerNorm": "aten::layer_norm",
}
# MKL-DNN op whose bounds are attributes of its node -> the dense op taking them as inputs, and the attributes' names
BOUNDED = {
    "prim::MKLDNNHardTanh_": ("aten::hardtanh_", ("min_val", "max_val")),
    "prim::MKLDNNClamp_": ("aten::clamp_", ("min_val", "max_val")),
}
CONVOLUTIONS = {3: "aten::conv1d", 4: "aten::conv2d", 5: "aten::conv3d"}  # by the weight's rank


def dense_form(graph: torch._C.Graph) -> None:
    """Rewrite `graph` in place: every MKL-DNN constant dense, every MKL-DNN op its dense ATen op, and the layout
    changes between them gone."""
    nodes = list(all_nodes(graph.block()))
    if not any(n.kind() in _KINDS for n in nodes):
        return
    for node in nodes:
        kind = node.kind()
        if kind == "prim::ConstantMKLDNNTensor":
            with graph.insert_point_guard(node):
                dense = graph.insertConstant(node.t("value").to_dense())
            _replace(node, [dense])
        elif kind in ("aten::to_mkldnn", "aten::to_dense") and _is_none(list(node.inputs())[1]):
            _replace(node, [node.inputsAt(0)])
        elif kind == "prim::BroadcastMKLDNNTensors":  # (dense ops broadcast on their own)
            _replace(node, list(node.inputs()))
    for node in list(all_nodes(graph.block())):  # (after the constants: a convolution's rank is its weight's)
        kind = node.kind()
        if kind == "prim::mkldnn_convolution":
            weight = node.inputsAt(1).node()
            rank = weight.t("value").dim() if weight.kind() == "prim::Constant" else 4
            _rewrite(graph, node, CONVOLUTIONS.get(rank, "aten::conv2d"), list(node.inputs()))
        elif kind in SAME_INPUTS:
            _rewrite(graph, node, SAME_INPUTS[kind], list(node.inputs()))
        elif kind in BOUNDED:
            op, names = BOUNDED[kind]
            with graph.insert_point_guard(node):
                bounds = [graph.insertConstant(node.f(name)) for name in names]
            _rewrite(graph, node, op, [node.inputsAt(0), *bounds])


_KINDS = {"prim::ConstantMKLDNNTensor", "aten::to_mkldnn", "aten::to_dense", "prim::BroadcastMKLDNNTensors",
          "prim::mkldnn_convolution", *SAME_INPUTS, *BOUNDED}


def _rewrite(graph: torch._C.Graph, node, op: str, inputs: list) -> None:
    dense = graph.create(op, inputs, 1)
    dense.insertBefore(node)
    dense.copyMetadata(node)  # (its source line, for the report and the kernels' comments)
    dense.output().setType(node.output().type())
    _replace(node, [dense.output()])


def _replace(node, values: list) -> None:
    for old, new in zip(node.outputs(), values):
        old.replaceAllUsesWith(new)
    node.destroy()


def _is_none(value) -> bool:
    return value.node().kind() == "prim::Constant" and value.type().kind() == "NoneType"

