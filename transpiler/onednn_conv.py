"""On the CPU, a 2-d convolution by a constant weight runs as oneDNN's `mkldnn::_convolution_pointwise` where that is
faster, with the residual add and the activation after it as the convolution's own post-ops.

ATen's CPU convolution is oneDNN's too, but each op after it is another pass over the activation: a small conv
net (issues #35 and #37) spent a quarter of its call in `relu`, `silu`, `hardtanh` and residual `add` kernels
after its convolutions, which oneDNN folds into the convolution's stores. BatchNorm is already folded into the
weight and bias by freezing. Only nets that run channels-last (channels_last.py chose it) are rewritten: the
activations stay in the layout oneDNN wants between convolutions, and each output has the layout ATen's gave.

    y = conv2d(x, W, b); z = relu(y)        ->  z = mkldnn::_convolution_pointwise(x, W, b, ..., "relu", [], None)
    y = conv2d(x, W, b); z = relu(y + r)    ->  z = mkldnn::_convolution_pointwise.binary(x, r, W, b, ..., "add",
                                                                                           None, "relu", [], None)

Which is faster depends on the CPU and the shape, so both are timed on random operands of each convolution's shape
while converting (`choose`, through timing.py: interleaved, medians, a margin in the fused op's favour, see MARGIN) and the package
records the choice; `choices="fixed"` keeps ATen's convolution. The weight is reordered into oneDNN's blocked
layout once, at load (a packed constant of the plan). Only float32/bfloat16, groups (depthwise) and
1x1 included; the fused ops run in both runtimes through the dispatcher, as any ATen op.

Where the face generates C++ kernels, a third form is timed first: the generated template (conv_kernels.py,
emitters/cpp_conv.py; a static float32 1x1, depthwise or small dense convolution), against oneDNN's convolution
alone (`_template_wins`; every shape of the model compiled at once, `_template_runners`). A convolution it wins
stays this node, marked, for conv_kernels.py to make a kernel after fusion; what oneDNN would have folded in is
left to fusion (the template's epilogue), stored once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from .conv_templates import shape_key, template_kernel
from .convs import Conv, as_conv
from .packed_params import AT_LOAD
from .ir import (CHANNELS_LAST_FORMAT, Attr, Graph, Node, Type, Value, blocks, clone_graph, literals as literals_of,
                 readers as readers_of, weight_names)
from .kernel_ir import ConvKernel
from .symbolic import at_example
from . import timing

OP, BINARY_OP = "mkldnn::_convolution_pointwise", "mkldnn::_convolution_pointwise.binary"
SCHEMA = ("mkldnn::_convolution_pointwise(Tensor X, Tensor W, Tensor? B, int[] padding, int[] stride, "
          "int[] dilation, int groups, str attr, Scalar?[] scalars, str? algorithm) -> Tensor Y")
BINARY_SCHEMA = ("mkldnn::_convolution_pointwise.binary(Tensor X, Tensor other, Tensor W, Tensor? B, int[] padding, "
                 "int[] stride, int[] dilation, int groups, str binary_attr, Scalar? alpha, str? unary_attr, "
                 "Scalar?[] unary_scalars, str? unary_algorithm) -> Tensor Y")
REORDER_OP = "mkldnn::_reorder_convolution_weight"
REORDER_SCHEMA = ("mkldnn::_reorder_convolution_weight(Tensor self, int[2] padding=0, int[2] stride=1, "
                  "int[2] dilation=1, int groups=1, int[]? input_size=None) -> Tensor Y")
# activation op -> oneDNN's post-op name (hardtanh, ReLU6 in a trace, takes its bounds as scalars; gelu its
# `approximate` as the algorithm)
ACTIVATIONS = {"aten::relu": "relu", "aten::sigmoid": "sigmoid", "aten::tanh": "tanh", "aten::hardswish": "hardswish",
               "aten::silu": "swish", "aten::gelu": "gelu", "aten::hardtanh": "hardtanh", "aten::relu6": "hardtanh"}
_TORCH_ACTIVATIONS = {"relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
                      "hardswish": torch.nn.functional.hardswish, "swish": torch.nn.functional.silu}
MODE = "auto"  # "auto": where timing says oneDNN is faster; "always"; "never"
# The fused convolution is kept unless it takes more than this multiple of ATen's convolution and epilogue. Timed
# alone, one convolution again and again, ATen's looks cheaper than it is in a net, where each call meets another
# convolution's shapes: whole nets on the loaded project machine (one thread, interleaved medians) ran faster with
# every convolution fused than with the per-convolution choice at 0.9, and both far faster than ATen's alone: the
# edge conv net 1.42-1.96 ms against 4.0-6.3 and 10.3 (ONNX Runtime 1.02-1.05), transformers' ResNetModel 2x128^2
# 253 ms against 272 and 348 (ORT 219). So timing here only guards against a shape the fused op is far worse at.
MARGIN = 2.0
# The generated template replaces oneDNN's convolution where it takes at most this share of its time (both timed
# bare: each computes the epilogue on its tile)
TEMPLATE_MARGIN = 1.0
TEMPLATE = "auto"  # "auto": where timing says the template is faster (not with choices="fixed"); "always"; "never"
FIXED = "aten"  # choices="fixed": ATen's convolution, as the model wrote it

_chosen: dict[tuple, timing.Choice] = {}  # per process: the convolution's shapes and epilogue -> the choice


def onednn_conv(graph: Graph, ctx, offer_template: bool = True) -> int:
    """Rewrite in place; returns how many convolutions now run through oneDNN's fused op or are marked for the
    generated template (conv_kernels.py: where the face generates C++ kernels, `ctx.generated_conv`, and timing
    finds it faster). Only in a net that runs channels-last (channels_last.py): the fused op's output is
    channels-last whatever its input's layout, where ATen's keeps the input's. The rewritten graph must run at
    every size conversion observes, or it is dropped."""
    if ctx.device.type != "cpu" or MODE == "never" or not available() or not _runs_channels_last(graph):
        return 0
    trial = clone_graph(graph)
    template = getattr(ctx, "generated_conv", None) if offer_template else None
    done = _rewrite_graph(trial, ctx.example_sizes or {}, template)
    if not done or not ctx.runs_at_every_draw(trial, [(ctx.example_sizes, ctx.example_inputs)]):
        return 0
    graph.body, graph.weights = trial.body, trial.weights
    return done


def as_it_will_run(graph: Graph, ctx) -> Graph:
    """A copy of a channels-last `graph` with its convolutions fused as `onednn_conv` would fuse them and their
    weights reordered now (each a constant, not a step of the plan's load), for channels_last.py to time the
    layout as it will run: through ATen, where a plan's run builds its packed constants on every call. The
    per-convolution choices made here are not recorded (the pass itself records them, reusing their times)."""
    trial = clone_graph(graph)
    with timing.recording():  # a recording of its own, dropped (and oneDNN's for the templates': the closer)
        if not onednn_conv(trial, ctx, offer_template=False):
            return trial
    literals, names = literals_of(trial), weight_names(trial)
    for node in trial.walk():
        if node.op == REORDER_OP and node.attrs.get(AT_LOAD):
            weight = trial.weights[names[node.inputs[0].id]]
            args = [literals.get(v.id) for v in node.inputs[1:]]
            name = f"{node.output.name}_timed"
            trial.weights[name] = torch.ops.mkldnn._reorder_convolution_weight(weight, *args)
            node.op, node.inputs, node.attrs = "prim::Constant", [], {"weight": name}
    return trial


def _runs_channels_last(graph: Graph) -> bool:
    consts = literals_of(graph)
    return any(n.op == "aten::contiguous" and n.attrs.get(Attr.SYNTHETIC) and len(n.inputs) == 2
               and consts.get(n.inputs[1].id) == CHANNELS_LAST_FORMAT for n in graph.body.nodes)


def _rewrite_graph(graph: Graph, sizes: dict[str, int], template=None) -> int:
    weights, literals, readers = weight_names(graph), literals_of(graph), readers_of(graph)
    runners = _template_runners(graph, weights, literals, template) if template is not None else {}
    done = 0
    for block in blocks(graph):
        defined_at = {v.id: i for i, n in enumerate(block.nodes) for v in n.outputs}
        out: list[Node] = []
        for at, node in enumerate(block.nodes):
            if node.attrs.get(Attr.FOLDED_INTO_CONV):
                continue
            conv = as_conv(node, weights, literals)
            if conv is not None:
                conv.sizes = sizes
                _epilogue(conv, block, readers, literals, lambda v: defined_at.get(v.id, -1) < at)
                kernel = _template_wins(conv, graph, weights, runners) if runners else None
                if kernel is not None:  # stays this node through fusion; its epilogue fuses after it
                    node.attrs[Attr.CONV_TEMPLATE] = kernel
                    if conv.folded:  # what oneDNN would fold in is stored once (the template's epilogue),
                        conv.folded[-1].attrs[Attr.STORE] = True  # not recomputed by each reader of it
                    out.append(node)
                    done += 1
                    continue
                if choose(conv, graph, weights, sizes):
                    out += _rewrite(conv)
                    done += 1
                    continue
            out.append(node)
        block.nodes = out
    return done


def available() -> bool:
    """Whether this torch has oneDNN and the three ops (torch 2.1 on; a build without them keeps ATen's)."""
    ops = torch.ops.mkldnn
    return torch.backends.mkldnn.is_available() and all(hasattr(ops, op) for op in (
        "_convolution_pointwise", "_reorder_convolution_weight")) and hasattr(ops._convolution_pointwise, "binary")


def _epilogue(conv: Conv, block, readers: dict[int, list], literals: dict[int, object], before) -> None:
    """Fold into `conv` a residual add of a value defined before it, then an activation, each where it is the one
    reader of what precedes it, in the same block."""
    in_block = {id(n) for n in block.nodes}
    result = conv.node.output
    add = _only_reader(result, readers, in_block)
    if add is not None and add.op == "aten::add.Tensor" and len(add.inputs) == 3 \
            and literals.get(add.inputs[2].id) == 1:
        a, b = add.inputs[0], add.inputs[1]
        other = b if a is result else a if b is result else None
        if other is not None and other is not result and before(other) and _same_tensor_type(other, result) \
                and add.output.type.dtype == result.type.dtype:
            conv.other, result = other, add.output
            conv.folded.append(add)
    act = _only_reader(result, readers, in_block)
    if act is None or act.inputs[0] is not result or act.output.type.dtype != result.type.dtype:
        return
    name = ACTIVATIONS.get(act.op)
    if name == "gelu":
        approximate = literals.get(act.inputs[1].id, "none") if len(act.inputs) > 1 else "none"
        if approximate not in ("none", "tanh"):
            return
        conv.algorithm = approximate
    elif act.op == "aten::relu6" and len(act.inputs) == 1:
        conv.scalars = [0.0, 6.0]
    elif name == "hardtanh":
        bounds = [literals.get(v.id) for v in act.inputs[1:3]]
        if len(act.inputs) != 3 or not all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in bounds):
            return
        conv.scalars = [float(b) for b in bounds]
    elif name is None or len(act.inputs) != 1:
        return
    conv.activation = name
    conv.folded.append(act)


def _only_reader(value: Value, readers: dict[int, list], in_block: set[int]) -> Optional[Node]:
    users = readers.get(value.id, [])
    if len(users) != 1 or users[0] is None or id(users[0]) not in in_block:
        return None
    return users[0]


def _same_tensor_type(a: Value, b: Value) -> bool:
    return a.type.is_tensor and a.type.dtype == b.type.dtype and a.type.shape is not None \
        and tuple(a.type.shape) == tuple(b.type.shape or ())


def choose(conv: Conv, graph: Graph, weights: dict[int, str], sizes: dict[str, int]) -> bool:
    """Whether oneDNN's fused convolution beats ATen's convolution and epilogue here, each timed on random operands
    of the convolution's shape, channels-last."""
    if MODE == "always":
        return True
    shape = at_example(conv.x.type.shape, sizes)
    weight = graph.weights[weights[conv.weight.id]]
    epilogue = "+".join((["add"] if conv.other is not None else []) + ([conv.activation] if conv.activation else []))
    what = (f"fused oneDNN or ATen convolution, {'x'.join(map(str, shape or ()))} * {'x'.join(map(str, weight.shape))}"
            f" s{conv.stride} p{conv.padding} d{conv.dilation} g{conv.groups}"
            f"{' + ' + epilogue if epilogue else ''}, channels-last")
    if timing.fixed():
        return timing.take_fixed(what, FIXED, "aten").chosen == "onednn"
    if shape is None:  # an opaque size: nothing to time at, so ATen's own
        return False
    key = (what, conv.bias is not None, tuple(conv.scalars), conv.algorithm, torch.get_num_threads())
    if key in _chosen:
        return timing.record(_chosen[key]).chosen == "onednn"
    choice = timing.settle_timed(what, _candidates(conv, shape, weight), "aten", MARGIN, FIXED)
    if not choice.busy:  # a busy machine's fixed answer is not kept: a later conversion times it again
        _chosen[key] = choice
    return choice.chosen == "onednn"


def _template_kernel(conv: Conv, graph: Graph, weights: dict[int, str]) -> Optional[ConvKernel]:
    weight = graph.weights[weights[conv.weight.id]]
    return template_kernel(conv.x.type, tuple(weight.shape), conv.node.output.type, conv.stride, conv.padding,
                           conv.dilation, conv.groups, conv.bias is not None)


def _template_runners(graph: Graph, weights: dict[int, str], literals: dict[int, object], template) -> dict:
    """shape_key -> a call of the template at that shape to time (None where it does not compile or compute the
    convolution here), for every convolution of the graph a template computes: compiled together, once."""
    if TEMPLATE == "never" or (timing.fixed() and TEMPLATE != "always"):
        return {}
    kernels = {}
    for node in graph.walk():
        conv = as_conv(node, weights, literals)
        kernel = _template_kernel(conv, graph, weights) if conv is not None else None
        if kernel is not None:
            kernels.setdefault(shape_key(kernel), kernel)
    return dict(zip(kernels, template(list(kernels.values())))) if kernels else {}


def _template_wins(conv: Conv, graph: Graph, weights: dict[int, str], runners: dict) -> Optional[ConvKernel]:
    """The template kernel for this convolution where it beats oneDNN's convolution, each without its epilogue
    (computed on the tile by either, at the same cost), timed on random operands; else None."""
    kernel = _template_kernel(conv, graph, weights)
    run = runners.get(shape_key(kernel)) if kernel is not None else None
    if run is None:  # no template computes it, or it does not compile or compute the convolution here
        return None
    if TEMPLATE == "always":
        return kernel
    weight = graph.weights[weights[conv.weight.id]]
    shape = conv.x.type.shape
    what = (f"generated or oneDNN convolution, {'x'.join(map(str, shape))} * {'x'.join(map(str, weight.shape))}"
            f" s{conv.stride} p{conv.padding} d{conv.dilation} g{conv.groups}, channels-last")
    key = (what, conv.bias is not None, torch.get_num_threads())
    if key in _chosen:
        choice = timing.record(_chosen[key])
    else:  # busy: oneDNN's, as choices="fixed" has it
        choice = timing.settle_timed(what, {"onednn": _bare(conv, list(shape), weight), "generated": run}, "onednn",
                                     TEMPLATE_MARGIN, "onednn")
        if not choice.busy:
            _chosen[key] = choice
    return kernel if choice.chosen == "generated" else None


def _bare(conv: Conv, shape: list[int], weight: torch.Tensor):
    """oneDNN's convolution alone, its weight reordered, on random channels-last operands."""
    x = torch.randn(shape, dtype=weight.dtype).contiguous(memory_format=torch.channels_last)
    w = torch.randn(weight.shape, dtype=weight.dtype).contiguous(memory_format=torch.channels_last)
    b = torch.randn(weight.shape[0], dtype=weight.dtype) if conv.bias is not None else None
    args = (conv.padding, conv.stride, conv.dilation, conv.groups)
    packed = torch.ops.mkldnn._reorder_convolution_weight(w, *args, shape)
    return lambda: _inference(lambda: torch.ops.mkldnn._convolution_pointwise(x, packed, b, *args, "none", [], ""))


def _candidates(conv: Conv, shape: list[int], weight: torch.Tensor) -> dict:
    layout = torch.channels_last
    x = torch.randn(shape, dtype=weight.dtype).contiguous(memory_format=layout)
    w = torch.randn(weight.shape, dtype=weight.dtype).contiguous(memory_format=layout)
    b = torch.randn(weight.shape[0], dtype=weight.dtype) if conv.bias is not None else None
    y_shape = torch.nn.functional.conv2d(x, w, b, conv.stride, conv.padding, conv.dilation, conv.groups).shape
    other = torch.randn(y_shape, dtype=weight.dtype).contiguous(memory_format=layout) if conv.other is not None \
        else None
    args = (conv.padding, conv.stride, conv.dilation, conv.groups)
    act = conv.activation or "none"
    packed = torch.ops.mkldnn._reorder_convolution_weight(w, *args, list(shape))

    def aten():
        y = torch.nn.functional.conv2d(x, w, b, conv.stride, conv.padding, conv.dilation, conv.groups)
        y = y + other if other is not None else y
        return _torch_activation(conv)(y)

    if other is None:
        fused = lambda: torch.ops.mkldnn._convolution_pointwise(x, packed, b, *args, act, conv.scalars,
                                                                conv.algorithm)
    else:
        fused = lambda: torch.ops.mkldnn._convolution_pointwise.binary(
            x, other, packed, b, *args, "add", None, conv.activation or None, conv.scalars, conv.algorithm or None)
    return {"aten": lambda: _inference(aten), "onednn": lambda: _inference(fused)}


def _inference(fn):
    with torch.inference_mode():
        return fn()


def _torch_activation(conv: Conv):
    if conv.activation == "hardtanh":
        low, high = conv.scalars
        return lambda y: torch.nn.functional.hardtanh(y, low, high)
    if conv.activation == "gelu":
        return lambda y: torch.nn.functional.gelu(y, approximate=conv.algorithm)
    return _TORCH_ACTIVATIONS.get(conv.activation, lambda y: y)


def _packed_weight(conv: Conv, result: Value, geometry: list[Value], constant) -> "_Packed":
    """The weight reordered into oneDNN's blocked layout for this convolution, once, at load (build_plan puts the
    node in the plan's "packed" list): the package stores the plain tensor, and no call reorders it again."""
    shape = conv.x.type.shape
    example = [d if isinstance(d, int) else at_example([d], conv.sizes)[0] for d in shape] \
        if conv.sizes is not None else None
    size = constant("input_size", example, Type("List", elems=(Type("int"),))) if example and None not in example \
        else constant("input_size", None, Type("None"))
    w = conv.weight.type
    packed = Value(f"{conv.weight.name}_onednn_{result.name}", Type("Tensor", w.dtype, w.shape, w.device))
    node = Node(REORDER_OP, [conv.weight, *geometry, size], [packed], source=conv.node.source,
                attrs={Attr.SCHEMA: REORDER_SCHEMA, AT_LOAD: True})
    return _Packed(node, packed)


@dataclass
class _Packed:
    node: Node
    value: Value


def _rewrite(conv: Conv) -> list[Node]:
    node = conv.node
    result = conv.folded[-1].output if conv.folded else node.output
    for folded in conv.folded:
        folded.attrs[Attr.FOLDED_INTO_CONV] = True
    constants: list[Node] = []

    def constant(name: str, value, kind: Type) -> Value:
        v = Value(f"{result.name}_{name}", kind)
        constants.append(Node("prim::Constant", [], [v], attrs={Attr.VALUE: value}))
        return v

    ints = Type("List", elems=(Type("int"),))
    scalars = Type("List", elems=(Type("Optional", elems=(Type("Scalar"),)),))
    bias = conv.bias or constant("no_bias", None, Type("None"))
    geometry = [constant("padding", conv.padding, ints), constant("stride", conv.stride, ints),
                constant("dilation", conv.dilation, ints), constant("groups", conv.groups, Type("int"))]
    weight = _packed_weight(conv, result, geometry, constant)
    constants.append(weight.node)
    if conv.other is None:
        op, schema = OP, SCHEMA
        inputs = [conv.x, weight.value, bias, *geometry, constant("attr", conv.activation or "none", Type("str")),
                  constant("scalars", conv.scalars, scalars), constant("algorithm", conv.algorithm, Type("str"))]
    else:
        op, schema = BINARY_OP, BINARY_SCHEMA
        optional = lambda name, value: constant(name, value, Type("str") if value else Type("None"))
        inputs = [conv.x, conv.other, weight.value, bias, *geometry, constant("binary_attr", "add", Type("str")),
                  constant("alpha", None, Type("None")), optional("unary_attr", conv.activation or None),
                  constant("unary_scalars", conv.scalars, scalars),
                  optional("unary_algorithm", conv.algorithm or None)]
    fused = Node(op, inputs, [result], source=node.source,
                 attrs={Attr.SCHEMA: schema, Attr.FROM_OPS: [node.op] + [n.op for n in conv.folded]})
    return constants + [fused]
