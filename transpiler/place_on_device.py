"""Place the graph on the conversion target: device constants name it, weights keep the layout the package will
store them in, and their values are typed as living on it (weights move there at load)."""
from __future__ import annotations

import dataclasses

import torch

from .ir import Attr, Graph
from .packed_params import refuse_off_cpu


def place_on_device(graph: Graph, target: torch.device) -> Graph:
    refuse_off_cpu(graph, target)
    _retarget_constants(graph, target)
    graph.host_weights = _host_weights(graph, target)
    graph.weights = {name: _stored_layout(w) for name, w in graph.weights.items()}
    for node in graph.walk():
        if node.op == "prim::Constant" and Attr.WEIGHT in node.attrs:
            device = "cpu" if node.attrs[Attr.WEIGHT] in graph.host_weights else target.type
            node.output.type = dataclasses.replace(node.output.type, device=device)
    return graph


def _host_weights(graph: Graph, target: torch.device) -> set[str]:
    """A model converted for the GPU from the GPU keeps on the CPU the tensors it held there: it combines them with
    the CPU tensors its factories make (`torch.arange(n)` with no device), as TorchScript runs it. A model given on
    the CPU moves wholly to the GPU."""
    if target.type == "cpu" or not any(w.device.type == target.type for w in graph.weights.values()):
        return set()
    return {name for name, w in graph.weights.items() if w.device.type == "cpu"}


def _retarget_constants(graph: Graph, target: torch.device) -> None:
    """Device constants baked in by tracing on another device (a traced LSTM's zero state on the CPU) name the
    conversion target instead: converting for CUDA means running on CUDA."""
    weights_on = {w.device.type for w in graph.weights.values()} or {"cpu"}
    for node in graph.walk():
        value = node.attrs.get(Attr.VALUE)
        if node.op == "prim::Constant" and isinstance(value, torch.device) and value.type in weights_on:
            node.attrs[Attr.VALUE] = target


def _stored_layout(weight: torch.Tensor) -> torch.Tensor:
    """A weight as the package will hold it: its memory order kept when it is a dense permutation (channels-last),
    else made contiguous, so the strides seen while converting are the strides the loaded package has."""
    order = sorted(range(weight.dim()), key=lambda d: (-weight.stride(d), d))
    return weight if weight.permute(order).is_contiguous() else weight.contiguous()
