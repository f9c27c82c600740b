"""A convolutional net runs on channels-last activations where that is faster.

oneDNN's CPU convolutions run faster on channels-last (NHWC) memory than on the NCHW a model is usually written
for: on this project's AVX-512 machine a 3x3 convolution over 64x56x56 took 0.53 against 1.39 ms, a depthwise 7x7
0.08 against 0.12 ms. cuDNN's fp16/bf16 tensor-core convolutions want NHWC too (Inductor converts conv nets to it
for that reason). ATen keeps the layout of a convolution's input in its output, and the generated kernels
write the layout ATen gave their values (`fuse._observed_order`), so converting the model's image inputs to
channels-last once, at the top, carries the whole net over; its convolution weights are stored channels-last too.
The outputs go back to the layout TorchScript returned them in, so a caller sees the same tensors.

    x -> conv -> relu -> ... -> y     becomes     x -> contiguous(channels_last) -> conv -> ... -> y -> contiguous()

On the CPU whether it pays depends on the net and the shapes, so both layouts are timed (the plan through ATen, on
the example inputs) while converting, and the package records the faster. The channels-last plan is timed as it
will run, its convolutions fused by onednn_conv.py (the pipeline passes `then`): through ATen's convolutions alone
transformers' ResNetModel (2x128^2, one thread) took 174 ms channels-last against 147 in NCHW, and kept NCHW, where
fused it takes 129. On CUDA a half-precision conv net is always converted (see `channels_last`). A model that fails
in the new layout (`x.view(n, -1)` of a channels-last activation) keeps its own.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Optional

import torch

from .ir import CHANNELS_LAST_FORMAT, CONTIGUOUS_FORMAT, Attr, Graph, Node, Type, Value, clone_graph, literals, readers
from .lowering import strides_in_order
from .op_table import lookup, schema_of
from .symbolic import at_example
from . import timing

CONTIGUOUS_SCHEMA = "aten::contiguous(Tensor(a) self, *, MemoryFormat memory_format=contiguous_format) -> Tensor(a)"
FLOATS = ("float32", "float16", "bfloat16", "float64")
MODE = "auto"  # "auto": where timing says channels-last is faster; "always"; "never"
MARGIN = 0.95  # channels-last must take at most this share of the model's time in its own layout
FIXED = "own layout"  # the answer on the CPU with choices="fixed": it pays for some conv nets and not others


def channels_last(graph: Graph, ctx, then: Optional[Callable[[Graph, object], Graph]] = None) -> bool:
    """Rewrite `graph` in place when channels-last is faster here; returns whether it did. `then` gives the
    channels-last graph as the passes after this one will make it run (fused convolutions on the CPU), for timing."""
    convs = [n for n in graph.walk() if _is_conv2d(n)]
    if MODE == "never" or not convs:
        return False
    if ctx.device.type == "cuda" and not any(n.inputs[1].type.dtype in ("float16", "bfloat16") for n in convs):
        # fp32 on CUDA stays NCHW: in NHWC a small ConvNeXt's fp32 outputs moved by 1.2e-4 against TorchScript on
        # the H100 (tests/test_real_models.py), as the observed orders once did; perhaps TF32 convolution kernels
        # that NHWC selects, not confirmed
        return False
    trial = clone_graph(graph)
    if not _rewrite(trial, ctx.example_sizes):
        return False
    if not ctx.runs_at_every_draw(trial, [(ctx.example_sizes, ctx.example_inputs)]):
        return False  # the model does not run in the new layout
    # On CUDA the plan's run through ATen here is bound by the host (a Python step costs more than a convolution
    # of resnet18 on an H100), so its time hides the GPU's: resnet18's choice flipped from run to run. cuDNN's
    # fp16/bf16 tensor-core convolutions are NHWC kernels, so channels-last is taken there, as Inductor does, once
    # the model runs in it.
    timed = then(trial, ctx) if then and MODE != "always" and ctx.device.type != "cuda" and not timing.fixed() \
        else trial
    if MODE != "always" and ctx.device.type != "cuda" and _choose(graph, timed, ctx) != "channels-last":
        return False
    graph.body, graph.weights = trial.body, trial.weights
    return True


def _choose(graph: Graph, trial: Graph, ctx) -> str:
    """"channels-last" or "own layout", the model's plan through ATen on the example inputs timed in both (the
    channels-last one as it will run: on the CPU with its convolutions fused)."""
    shapes = ", ".join("x".join(map(str, v.type.shape)) for v in graph.inputs if _image(v.type))
    what = f"channels-last or the model's own layout, images {shapes}"
    if timing.fixed():
        return timing.take_fixed(what, FIXED, "own layout").chosen
    runs = {label: _plan_run(g, ctx) for label, g in (("own layout", graph), ("channels-last", trial))}
    try:  # (the clone of the inputs is timed too, alike in both layouts)
        return timing.settle_timed(what, runs, "own layout", MARGIN, FIXED, timings=1, budget_s=0.5).chosen
    except Exception:  # noqa: BLE001 - the model's own layout failed to run (it ran in shape inference)
        return timing.settle(what, {}, "own layout", MARGIN).chosen


def _is_conv2d(node: Node) -> bool:
    weight = node.inputs[1] if lookup(node.op).convolution and len(node.inputs) > 1 else None
    return weight is not None and weight.type.shape is not None and len(weight.type.shape) == 4


def _plan_run(graph: Graph, ctx):
    """A call of the graph's plan through ATen on copies of the example inputs (a seam the tests spy on)."""
    return ctx.trial_run(graph)


def _rewrite(graph: Graph, sizes: dict[str, int]) -> bool:
    """Channels-last image inputs and convolution weights, outputs restored; False where it cannot be done safely
    (no 4-d floating input, or an output whose layout it could not restore)."""
    images = [v for v in graph.inputs if _image(v.type)]
    if not images:
        return False
    restores = _output_layouts(graph, sizes)
    if restores is None:
        return False
    head, swap = [], {}
    fmt = _constant(head, "channels_last_format", CHANNELS_LAST_FORMAT)
    for x in images:
        converted = Value(f"{x.name}_channels_last", x.type)
        head.append(Node("aten::contiguous", [x, fmt], [converted], attrs={Attr.SCHEMA: CONTIGUOUS_SCHEMA,
                                                                            Attr.SYNTHETIC: True}))
        swap[x.id] = converted
    _replace_uses(graph, swap)
    restores.update({swap[x.id].id: restores[x.id] for x in images if x.id in restores})  # an input returned
    graph.body.nodes = head + graph.body.nodes
    _weights_channels_last(graph)
    _single_tap_dilations(graph)
    _restore_outputs(graph, restores)
    return True


def _single_tap_dilations(graph: Graph) -> None:
    """A dilation along a dim where the kernel has one tap changes nothing: set to 1. oneDNN in torch 2.13 crashes
    the process (a segfault, not an error) on a channels-last 1x1 convolution with dilation 2 (found by
    tests/test_conv_template.py's random chains), where the same convolution in NCHW runs."""
    consts, head = literals(graph), []
    for node in graph.walk():
        at = _dilation_at(node.op) if _is_conv2d(node) else None
        if at is None or at >= len(node.inputs):
            continue
        dilation, taps = consts.get(node.inputs[at].id), node.inputs[1].type.shape[2:]
        if not (isinstance(dilation, list) and len(dilation) == 2):
            continue
        undilated = [1 if k == 1 else d for d, k in zip(dilation, taps)]
        if undilated != dilation:
            v = Value(f"{node.output.name}_dilation", node.inputs[at].type)
            head.append(Node("prim::Constant", [], [v], attrs={Attr.VALUE: undilated}))
            node.inputs[at] = v
    graph.body.nodes = head + graph.body.nodes


@functools.lru_cache(maxsize=None)
def _dilation_at(op: str) -> Optional[int]:
    """The position of a convolution's `dilation` argument, by its schema's argument names."""
    schema = schema_of(op)
    names = [a.name for a in torch._C.parse_schema(schema).arguments] if schema else []
    return names.index("dilation") if "dilation" in names else None


def _image(t: Type) -> bool:
    return t.is_tensor and t.dtype in FLOATS and t.shape is not None and len(t.shape) == 4


def _output_layouts(graph: Graph, sizes: dict[str, int]) -> Optional[dict[int, int]]:
    """value id -> the memory format to give it back in, for every 4-d tensor the graph returns (directly or in a
    container built at the top level); None if one has a layout that is neither."""
    makers = {v.id: n for n in graph.body.nodes for v in n.outputs}
    found: dict[int, int] = {}

    def visit(v: Value) -> bool:
        maker = makers.get(v.id)
        if v.type.is_tensor:
            if v.type.shape is None or len(v.type.shape) != 4:
                return True
            layout = _layout(v.type, sizes)
            if layout is None:
                return False
            found[v.id] = layout
            return True
        if maker is not None and lookup(maker.op).builds_container:
            return all(visit(item) for item in maker.inputs)
        return "Tensor" not in str(v.type) and v.type.kind != "Any"

    return found if all(visit(v) for v in graph.outputs) else None


def _layout(t: Type, sizes: dict[str, int]) -> Optional[int]:
    """The memory format of a 4-d tensor type at the example's dims (a dynamic one's strides are polynomials)."""
    if t.strides is None:
        return None
    shape, strides = at_example(t.shape, sizes), at_example(t.strides, sizes)
    if shape is None or strides is None:
        return None
    if list(strides_in_order(shape, [0, 1, 2, 3])) == strides:
        return CONTIGUOUS_FORMAT
    if list(strides_in_order(shape, [0, 2, 3, 1])) == strides:
        return CHANNELS_LAST_FORMAT
    return None


def _constant(nodes: list[Node], name: str, value: int) -> Value:
    v = Value(name, Type("int"))
    nodes.append(Node("prim::Constant", [], [v], attrs={Attr.VALUE: value}))
    return v


def _replace_uses(graph: Graph, swap: dict[int, Value]) -> None:
    for node in graph.walk():
        node.inputs = [swap.get(v.id, v) for v in node.inputs]
        for block in node.blocks:
            block.outputs = [swap.get(v.id, v) for v in block.outputs]
    graph.body.outputs = [swap.get(v.id, v) for v in graph.body.outputs]


def _weights_channels_last(graph: Graph) -> None:
    """Convolution weights stored channels-last (oneDNN reorders an NCHW weight on every call), where only
    convolutions read them."""
    read_by = readers(graph)
    for node in graph.walk():
        if node.op != "prim::Constant" or Attr.WEIGHT not in node.attrs:
            continue
        users = read_by.get(node.output.id, [])
        if not users or not all(u is not None and _is_conv2d(u) and u.inputs[1] is node.output for u in users):
            continue
        name = node.attrs[Attr.WEIGHT]
        weight = graph.weights[name].contiguous(memory_format=torch.channels_last)
        graph.weights[name] = weight
        node.output.type = dataclasses.replace(node.output.type, strides=tuple(weight.stride()))


def _restore_outputs(graph: Graph, restores: dict[int, int]) -> None:
    """Each returned 4-d tensor in the memory format TorchScript returned it in: the last nodes before the return
    (for one inside a container, just before the container is built)."""
    made: dict[tuple[int, int], Value] = {}
    formats: dict[int, Value] = {}

    def restored(v: Value, out: list[Node]) -> Value:
        layout = restores[v.id]
        if (v.id, layout) not in made:
            if layout not in formats:
                formats[layout] = _constant(out, f"restore_format_{layout}", layout)
            back = Value(f"{v.name}_restored", v.type)
            out.append(Node("aten::contiguous", [v, formats[layout]], [back],
                            attrs={Attr.SCHEMA: CONTIGUOUS_SCHEMA, Attr.SYNTHETIC: True}))
            made[(v.id, layout)] = back
        return made[(v.id, layout)]

    nodes: list[Node] = []
    for node in graph.body.nodes:
        if lookup(node.op).builds_container and any(v.id in restores for v in node.inputs):
            node.inputs = [restored(v, nodes) if v.id in restores else v for v in node.inputs]
        nodes.append(node)
    graph.body.outputs = [restored(v, nodes) if v.id in restores else v for v in graph.body.outputs]
    graph.body.nodes = nodes
