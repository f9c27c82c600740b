"""Packed parameters as nodes that pack them again from plain tensors and numbers.

A frozen quantized model holds TorchScript objects as constants: a Linear's or Conv's prepacked weight
(`LinearPackedParamsBase`, `Conv2dPackedParamsBase`) and an RNN cell's parameters (`CellParamsBase`), which
`quantized::linear_dynamic`, `quantized::conv2d` and `aten::quantized_lstm` read. A package stores no objects (no
pickle), so each becomes its unpacked parts and the registered op that packs them:

    %w_int8 = prim::Constant[weight=...]                    the quantized weight's integers (int_repr)
    %w      = aten::_make_per_channel_quantized_tensor(%w_int8, %scales, %zero_points, axis)
    %packed = quantized::linear_prepack(%w, %bias)

Nodes marked AT_LOAD read only constants; build_plan hoists them out of the steps into the plan's "packed" list, which
both runtimes run once at load. Packing ops record the quantized engine (x86, fbgemm, qnnpack, onednn) they were
converted under: packed weights are laid out for one engine's kernels, and a package loaded where that engine is
missing says so. A quantized tensor constant outside any object is stored the same way.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from jit2triton.errors import ConversionError

from .ir import Attr, Graph, Node, Source, Type, Value, dtype_name

AT_LOAD = "at_load"  # node attr: the node reads only constants and runs once, at load (build_plan's "packed")

Unpacked = tuple[str, list[tuple[str, Any]]]  # (the op that packs it again, its arguments by name)


def is_packed(value: Any) -> bool:
    """Whether a constant must be stored as its parts: a TorchScript object, a quantized tensor, or a list or tuple
    holding one."""
    if isinstance(value, (list, tuple)):
        return any(is_packed(v) for v in value)
    return isinstance(value, torch.ScriptObject) or (isinstance(value, torch.Tensor) and value.is_quantized)


def unpack(value: Any, name: str, source: Source | None, weights: dict[str, torch.Tensor],
           unique: Callable[[str, dict], str]) -> tuple[list[Node], Value]:
    """(the nodes that make `value` again from weights and literals, the value they make); new weights are added to
    `weights` under names `unique` gives."""
    maker = _Maker(weights, source, unique)
    made = maker.value(value, name)
    return maker.nodes, made


def refuse_off_cpu(graph: Graph, target: torch.device) -> None:
    """Quantized ops over packed weights are CPU kernels (FBGEMM, oneDNN, QNNPACK): a model holding packed weights
    converts for the CPU only."""
    if target.type == "cpu":
        return
    packing = next((n for n in graph.walk() if Attr.QUANTIZED_ENGINE in n.attrs), None)
    if packing is not None:
        where = f" (model source {packing.source})" if packing.source else ""
        raise ConversionError(
            f"the model holds quantized weights ({packing.output.type.kind}){where}, which torch's quantized kernels "
            f"read on the CPU only; convert it with device='cpu', not {target.type!r}")


class _Maker:
    def __init__(self, weights: dict[str, torch.Tensor], source: Source | None,
                 unique: Callable[[str, dict], str]) -> None:
        self.weights, self.source, self.unique = weights, source, unique
        self.nodes: list[Node] = []

    def value(self, value: Any, name: str) -> Value:
        if isinstance(value, torch.ScriptObject):
            return self.object(value, name)
        if isinstance(value, torch.Tensor):
            return self.quantized(value, name) if value.is_quantized else self.weight(value, name)
        if isinstance(value, (list, tuple)) and is_packed(value):
            items = [self.value(v, f"{name}_{i}") for i, v in enumerate(value)]
            kind = "List" if isinstance(value, list) else "Tuple"
            elems = (items[0].type,) if kind == "List" and items else tuple(v.type for v in items)
            made = Value(name, Type(kind, elems=elems))
            op = "prim::ListConstruct" if kind == "List" else "prim::TupleConstruct"
            self.nodes.append(Node(op, items, [made], source=self.source))
            return made
        return self.literal(value, name)

    def weight(self, tensor: torch.Tensor, name: str) -> Value:
        stored = self.unique(name, self.weights)
        self.weights[stored] = tensor.detach()
        made = Value(name, Type("Tensor", dtype_name(tensor.dtype), tuple(tensor.shape), tensor.device.type))
        self.nodes.append(Node("prim::Constant", [], [made], attrs={Attr.WEIGHT: stored}, source=self.source))
        return made

    def literal(self, value: Any, name: str) -> Value:
        made = Value(name, _literal_type(value))
        self.nodes.append(Node("prim::Constant", [], [made], attrs={Attr.VALUE: value}, source=self.source))
        return made

    def quantized(self, tensor: torch.Tensor, name: str) -> Value:
        """A quantized tensor from its integers and quantizer (per tensor or per channel, affine)."""
        scheme = tensor.qscheme()
        integers = self.weight(tensor.int_repr(), f"{name}_int")
        if scheme == torch.per_tensor_affine:
            op = "aten::_make_per_tensor_quantized_tensor"
            args = [integers, self.literal(tensor.q_scale(), f"{name}_scale"),
                    self.literal(tensor.q_zero_point(), f"{name}_zero_point")]
        elif scheme in (torch.per_channel_affine, torch.per_channel_affine_float_qparams):  # the latter: embeddings
            op = "aten::_make_per_channel_quantized_tensor"
            args = [integers, self.weight(tensor.q_per_channel_scales(), f"{name}_scales"),
                    self.weight(tensor.q_per_channel_zero_points(), f"{name}_zero_points"),
                    self.literal(tensor.q_per_channel_axis(), f"{name}_axis")]
        else:
            raise ConversionError(
                f"constant {name} is a quantized tensor with scheme {scheme}; jit2triton stores per-tensor and "
                "per-channel affine quantization (torch.per_tensor_affine, torch.per_channel_affine, "
                "torch.per_channel_affine_float_qparams): quantize the model with one of those")
        made = Value(name, Type("Tensor", dtype_name(tensor.dtype), tuple(tensor.shape), tensor.device.type))
        self.nodes.append(self.at_load(op, args, made))
        return made

    def object(self, obj: torch.ScriptObject, name: str) -> Value:
        cls = obj._type().qualified_name()
        unpacker = _UNPACKERS.get(cls.removeprefix(_CLASSES))
        if unpacker is None:
            raise ConversionError(
                f"constant {name} is a TorchScript object of class {cls}; a package stores tensors and numbers, and "
                f"rebuilds only the packed parameters of quantized ops ({', '.join(sorted(_UNPACKERS))})")
        op, parts = unpacker(obj, name)
        args = [self.value(part, f"{name}_{label}") for label, part in parts]
        node = self.at_load(op, args, Value(name, Type(cls)))
        node.attrs[Attr.QUANTIZED_ENGINE] = torch.backends.quantized.engine
        self.nodes.append(node)
        return node.output

    def at_load(self, op: str, args: list[Value], made: Value) -> Node:
        return Node(op, args, [made], attrs={Attr.SCHEMA: _schema(op), AT_LOAD: True}, source=self.source)


def _linear(obj: torch.ScriptObject, name: str) -> Unpacked:
    weight, bias = torch.ops.quantized.linear_unpack(obj)  # an fp16 packing unpacks to float32
    op = "quantized::linear_prepack" if weight.is_quantized else "quantized::linear_prepack_fp16"
    return op, [("weight", weight), ("bias", bias)]


def _conv(dims: int) -> Callable[[torch.ScriptObject, str], Unpacked]:
    def unpack_conv(obj: torch.ScriptObject, name: str) -> Unpacked:
        def read(what: str) -> Any:
            return getattr(torch.ops.quantized, f"conv{dims}d_{what}")(obj)

        weight, bias = read("unpack")
        if read("transpose"):
            return f"quantized::conv_transpose{dims}d_prepack", [
                ("weight", weight), ("bias", bias), ("stride", read("stride")), ("padding", read("padding")),
                ("output_padding", read("output_padding")), ("dilation", read("dilation")), ("groups", read("groups"))]
        # a Conv1d packs as a Conv2d over a height of 1: its parts are already the 2-d conv's
        return f"quantized::conv{dims}d_prepack", [
            ("weight", weight), ("bias", bias), ("stride", read("stride")), ("padding", read("padding")),
            ("dilation", read("dilation")), ("groups", read("groups"))]
    return unpack_conv


def _embedding(obj: torch.ScriptObject, name: str) -> Unpacked:
    weight = torch.ops.quantized.embedding_bag_unpack(obj)
    if weight.dtype != torch.quint8:
        raise ConversionError(
            f"constant {name} packs an embedding table of dtype {weight.dtype}; jit2triton rebuilds 8-bit ones "
            "(torch.quint8, as float_qparams_weight_only_qconfig makes): quantize the embedding that way")
    return "quantized::embedding_bag_prepack", [("weight", weight)]


def _rnn_cell(obj: torch.ScriptObject, name: str) -> Unpacked:
    (kind, tensors, _, integers, packed), _ = obj.__getstate__()
    if kind == "quantized_dynamic":  # quantize_dynamic(..., dtype=torch.qint8): int8 weights, float biases
        return "quantized::make_quantized_cell_params_dynamic", [
            ("w_ih", packed[0]), ("w_hh", packed[1]), ("b_ih", tensors[0]), ("b_hh", tensors[1]),
            ("reduce_range", bool(integers[0]))]
    if kind == "quantized_fp16":  # quantize_dynamic(..., dtype=torch.float16)
        return "quantized::make_quantized_cell_params_fp16", [("w_ih", packed[0]), ("w_hh", packed[1])]
    raise ConversionError(
        f"constant {name} holds RNN cell parameters of kind {kind!r}; jit2triton rebuilds the dynamic-quantized "
        "ones (quantize_dynamic with dtype torch.qint8 or torch.float16): quantize the RNN that way")


_CLASSES = "__torch__.torch.classes."
_UNPACKERS: dict[str, Callable[[torch.ScriptObject, str], Unpacked]] = {  # by class, less _CLASSES
    "quantized.LinearPackedParamsBase": _linear,
    "quantized.Conv2dPackedParamsBase": _conv(2),
    "quantized.Conv3dPackedParamsBase": _conv(3),
    "quantized.EmbeddingPackedParamsBase": _embedding,
    "rnn.CellParamsBase": _rnn_cell,
}


def _schema(op: str) -> str:
    name, _, overload = op.partition(".")
    schema = next(s for s in torch._C._jit_get_schemas_for_operator(name) if s.overload_name == overload)
    return str(schema)


def _literal_type(value: Any) -> Type:
    if value is None:
        return Type("None")
    if isinstance(value, list):
        return Type("List", elems=(_literal_type(value[0]) if value else Type("int"),))
    return Type({bool: "bool", int: "int", float: "float"}[type(value)])
