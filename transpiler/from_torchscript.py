"""Build our IR from a frozen, inlined TorchScript graph.

Every TorchScript node becomes one IR node named by its exact overload (`aten::add.Tensor`), with its source line
kept for provenance. Constant tensors become named weights; other constants stay as literal values.
"""
from __future__ import annotations

import linecache
import os
import re
import sys
from typing import Any, Optional

import torch

from jit2triton.errors import ConversionError

from .ir import Attr, Block, Graph, Node, Source, Type, Value, dtype_name
from .packed_params import is_packed, unpack

_TYPE_KINDS = {
    "IntType": "int", "FloatType": "float", "BoolType": "bool", "StringType": "str", "NoneType": "None",
    "DeviceObjType": "Device", "NumberType": "Scalar", "ComplexType": "complex", "AnyType": "Any",
    "ScalarTypeType": "int", "LayoutType": "int", "MemoryFormatType": "int", "GeneratorType": "Generator",
}


def ir_type(ts_type) -> Type:
    kind = ts_type.kind()
    if kind == "TensorType":
        return Type("Tensor", _SCALAR_NAMES.get(ts_type.scalarType()))
    if kind == "ListType":
        return Type("List", elems=(ir_type(ts_type.getElementType()),))
    if kind == "OptionalType":
        return Type("Optional", elems=(ir_type(ts_type.getElementType()),))
    if kind == "TupleType":
        return Type("Tuple", elems=tuple(ir_type(e) for e in ts_type.elements()))
    if kind == "DictType":
        return Type("Dict", elems=(ir_type(ts_type.getKeyType()), ir_type(ts_type.getValueType())))
    return Type(_TYPE_KINDS.get(kind, str(ts_type)))


def named_tuples(ts_type) -> Optional[dict]:
    """Where TorchScript's type `ts_type` holds NamedTuples: a "Tuple" with the NamedTuple's "name" and "fields"
    (where it is one) and its "items"; a "List" or "Dict" with its "element"; an Optional as what it holds; None
    where nothing inside is named."""
    kind = ts_type.kind()
    if kind == "TupleType":
        items = [named_tuples(e) for e in ts_type.elements()]
        # an op's named return (`torch.max(x, 1)`: values, indices) has no class name: TorchScript returns it as a
        # plain tuple, and so does the package
        named = ts_type.annotation_str.rsplit(".", 1)[-1].isidentifier()
        fields = _field_names(ts_type) if named else None
        if fields is None and not any(items):
            return None
        named = {"name": ts_type.annotation_str.rsplit(".", 1)[-1], "fields": fields} if fields is not None else {}
        return {"type": "Tuple", **named, "items": items}
    if kind in ("ListType", "DictType", "OptionalType"):
        element = named_tuples(ts_type.getValueType() if kind == "DictType" else ts_type.getElementType())
        if element is None or kind == "OptionalType":
            return element
        return {"type": "List" if kind == "ListType" else "Dict", "element": element}
    return None


def _field_names(ts_type) -> Optional[list[str]]:
    """A NamedTuple type's field names, None for a plain tuple. TorchScript's Python binding shows them only in the
    type's text: "NamedTuple(boxes : Tensor, inner : NamedTuple(a : Tensor, b : Tensor?))"."""
    text = ts_type.str()
    if not text.startswith("NamedTuple(") or not text.endswith(")"):
        return None
    fields, depth, start, body = [], 0, 0, text[len("NamedTuple("):-1]
    for i, ch in enumerate(body + ","):
        depth += (ch in "([") - (ch in ")]")
        if ch == "," and depth == 0:
            fields.append(body[start:i].split(" : ", 1)[0].strip())
            start = i + 1
    return fields if len(fields) == len(ts_type.elements()) and all(f.isidentifier() for f in fields) else None


_SCALAR_NAMES = {
    "Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16", "Int": "int32",
    "Long": "int64", "Short": "int16", "Char": "int8", "Byte": "uint8", "Bool": "bool",
    "QInt8": "qint8", "QUInt8": "quint8", "QInt32": "qint32",
}


def from_torchscript(ts_graph: torch._C.Graph, input_names: list[str], name: str,
                     full_source_paths: bool = False) -> Graph:
    """Our IR of a normalised TorchScript graph. Source files are named as the model's code imports them
    (`transformers/models/bert/modeling_bert.py`, or relative to the working folder) unless `full_source_paths`:
    a package should not carry the converting machine's folder layout."""
    builder = _Builder(full_source_paths)
    body = Block()
    for ts_value, arg_name in zip(ts_graph.inputs(), input_names):
        body.inputs.append(builder.define(ts_value, arg_name))
    builder.fill_block(body, ts_graph.nodes(), ts_graph.outputs())
    returned = next(iter(ts_graph.outputs()), None)  # the model's return (written module state comes after)
    graph = Graph(body, builder.weights, name, returns=named_tuples(returned.type()) if returned else None)
    _sources_from_consumers(graph)
    return graph


def _sources_from_consumers(graph: Graph) -> None:
    """Nodes that TorchScript's own passes made have no source range (freezing merges the q, k and v linears that
    read one input into one linear and three slices); each takes the line of its nearest consumer that has one,
    so a profile or a kernel comment still names the model's code (the q projection's line for the merged one)."""
    consumers: dict[int, list[Node]] = {}
    nodes = list(graph.walk())
    for node in nodes:
        for v in node.inputs:
            consumers.setdefault(v.id, []).append(node)
    for node in reversed(nodes):  # consumers come later in program order, so theirs are settled first
        if node.source is None and node.op != "prim::Constant":
            node.source = next((c.source for v in node.outputs for c in consumers.get(v.id, ())
                                if c.source is not None), None)


class _Builder:
    def __init__(self, full_source_paths: bool = False) -> None:
        self.full_source_paths = full_source_paths
        self.values: dict[int, Value] = {}
        self.weights: dict[str, torch.Tensor] = {}

    def define(self, ts_value, name: str | None = None) -> Value:
        value = Value(_clean(name or ts_value.debugName()), ir_type(ts_value.type()))
        self.values[ts_value.unique()] = value
        return value

    def use(self, ts_value) -> Value:
        return self.values[ts_value.unique()]

    def fill_block(self, block: Block, ts_nodes, ts_outputs) -> None:
        for ts_node in ts_nodes:
            node = self.node(ts_node)
            block.nodes += node.attrs.pop(Attr.EXPANDED, [])  # a constant container's items, made before it
            block.nodes.append(node)
        block.outputs = [self.use(v) for v in ts_outputs]

    def node(self, ts_node) -> Node:
        kind = ts_node.kind()
        inputs = [self.use(v) for v in ts_node.inputs()]
        outputs = [self.define(v) for v in ts_node.outputs()]
        # a warning names its file as TorchScript's does, in full (the runtime warns at that file and line)
        node = Node(kind, inputs, outputs, source=_source(ts_node, self.full_source_paths or kind == "aten::warn"))
        if kind == "prim::Constant":
            self.constant(ts_node, node)
        schema = ts_node.schema()
        if schema != "(no schema)":
            parsed = torch._C.parse_schema(schema)
            node.op = f"{parsed.name}.{parsed.overload_name}" if parsed.overload_name else parsed.name
            node.attrs[Attr.SCHEMA] = schema
        for ts_block in ts_node.blocks():
            sub = Block([self.define(v) for v in ts_block.inputs()])
            self.fill_block(sub, ts_block.nodes(), ts_block.outputs())
            node.blocks.append(sub)
        return node

    def constant(self, ts_node, node: Node) -> None:
        out = ts_node.output()
        try:
            value = out.toIValue()
        except Exception as err:  # e.g. a constant object we cannot represent
            raise ConversionError(f"constant {out.debugName()} of type {out.type()} cannot be represented: {err}")
        if is_packed(value):  # a quantized op's packed parameters: rebuilt from their parts, once at load
            made, _ = unpack(value, _clean(out.debugName()), node.source, self.weights, _unique)
            last = made.pop()  # the node making the value itself takes the constant's place
            node.op, node.inputs, node.attrs = last.op, last.inputs, dict(last.attrs, expanded=made)
            node.outputs[0].type = last.output.type
        elif isinstance(value, torch.Tensor):
            name = _unique(_clean(out.debugName()), self.weights)
            self.weights[name] = value.detach()
            node.attrs[Attr.WEIGHT] = name
            node.outputs[0].type = Type("Tensor", dtype_name(value.dtype), tuple(value.shape), value.device.type)
        elif isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor) for v in value) \
                and not _holds_optionals(out.type()):  # an index list (`x[buffer]`) is built as the case below
            names = []  # e.g. the flat weight list of a frozen aten::lstm
            for i, tensor in enumerate(value):
                names.append(_unique(f"{_clean(out.debugName())}_{i}", self.weights))
                self.weights[names[-1]] = tensor.detach()
            node.attrs[Attr.WEIGHTS] = names
        elif _contains_tensor(value):
            # A container of tensors and other values, or any Tensor?[] (`x[..., [-1], :]` indexes with the Tensor?[]
            # [None, None, tensor([-1])], frozen into a constant), or a dict attribute of tensors (a table by name):
            # built at run time from one constant per item, as TorchScript would before freezing, so no runtime needs
            # a new kind of constant
            node.attrs[Attr.EXPANDED], node.inputs = self.items(value, out.type(), _clean(out.debugName()), node.source)
            node.op = _construct(value)
        else:
            node.attrs[Attr.VALUE] = value

    def items(self, value, ts_type, name: str, source) -> tuple[list[Node], list[Value]]:
        """(the nodes making each item of a list or tuple constant, the items' values; a dict's keys and values, in
        turn, as prim::DictConstruct takes them)."""
        nodes, items = [], []
        if isinstance(value, dict):
            for i, (key, item) in enumerate(value.items()):
                for made_nodes, made in (self.expand(key, ts_type.getKeyType(), f"{name}_k{i}", source),
                                         self.expand(item, ts_type.getValueType(), f"{name}_{i}", source)):
                    nodes += made_nodes
                    items.append(made)
            return nodes, items
        for i, item in enumerate(value):
            item_type = ts_type.getElementType() if isinstance(value, list) else ts_type.elements()[i]
            made_nodes, made = self.expand(item, item_type, f"{name}_{i}", source)
            nodes += made_nodes
            items.append(made)
        return nodes, items

    def expand(self, value: Any, ts_type, name: str, source) -> tuple[list[Node], Value]:
        """(the nodes making `value`, the value they make): a tensor as a weight, a list or tuple holding tensors
        built from its items, anything else a literal."""
        if isinstance(value, torch.Tensor):
            weight = _unique(name, self.weights)
            self.weights[weight] = value.detach()
            made = Value(name, Type("Tensor", dtype_name(value.dtype), tuple(value.shape), value.device.type))
            return [Node("prim::Constant", [], [made], attrs={Attr.WEIGHT: weight}, source=source)], made
        made = Value(name, ir_type(ts_type))
        if _contains_tensor(value):
            nodes, items = self.items(value, ts_type, name, source)
            return nodes + [Node(_construct(value), items, [made], source=source)], made
        return [Node("prim::Constant", [], [made], attrs={Attr.VALUE: value}, source=source)], made


def _holds_optionals(ts_type) -> bool:
    """A list typed Tensor?[]: an index list, whose tensors lowered readers take one by one."""
    return isinstance(ts_type, torch.ListType) and isinstance(ts_type.getElementType(), torch.OptionalType)


def _contains_tensor(value: Any) -> bool:
    """Whether a list, tuple (a NamedTuple's too) or dict constant holds a tensor."""
    if isinstance(value, (list, tuple, dict)):
        return any(isinstance(v, torch.Tensor) or _contains_tensor(v)
                   for v in (value.values() if isinstance(value, dict) else value))
    return False


def _construct(value: Any) -> str:
    """The op that builds a container constant holding tensors, item by item."""
    return ("prim::ListConstruct" if isinstance(value, list) else "prim::DictConstruct" if isinstance(value, dict)
            else "prim::TupleConstruct")


def _clean(name: str) -> str:
    return re.sub(r"[^0-9A-Za-z_]", "_", name) or "v"


def _unique(name: str, taken: dict) -> str:
    candidate, n = name, 1
    while candidate in taken:
        n += 1
        candidate = f"{name}_{n}"
    return candidate


_WHERE = re.compile(r"# (.+):(\d+):\d+$")
_TRACE_FRAME = re.compile(r"^(.+)\((\d+)\): \S+")
_SCRIPT_FRAME = re.compile(r'File "(.+)", line (\d+)')


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep  # with the separator: torchvision/ is the model's own code


def inside_torch(path: str) -> bool:
    return path.startswith(_TORCH_DIR)


def shown_path(path: str) -> str:
    """`path` relative to the longest import root (sys.path entry) or working folder holding it, else as it is."""
    if not os.path.isabs(path):
        return path
    roots = [os.path.abspath(p) for p in sys.path if p] + [os.getcwd()]
    holding = [r for r in roots if path.startswith(r.rstrip(os.sep) + os.sep)]
    return os.path.relpath(path, max(holding, key=len)) if holding else path


def _source(ts_node, full_path: bool = False) -> Source | None:
    """file:line of the node in the model's source, and that line's text when it can be found.

    A traced node's source range is a stack; its first frame is often inside torch (nn.Linear's forward), so the
    first frame outside torch, the model's own line, is the one named."""
    ranged = ts_node.sourceRange()
    frames = [m for m in map(_TRACE_FRAME.match, ranged.splitlines()) if m]
    match = next((m for m in frames if not inside_torch(m.group(1))), None)
    if match is None:
        match = _WHERE.search(str(ts_node).split("\n", 1)[0]) or _SCRIPT_FRAME.search(ranged)
    if not match:
        return None
    file, line = match.group(1), int(match.group(2))
    text = linecache.getline(file, line).strip() or _highlighted_line(ranged)
    return Source(file if full_path else shown_path(file), line, text)


def _highlighted_line(ranged: str) -> str:
    """The source line TorchScript marks with `~~~` in a scripted node's source range."""
    lines = ranged.splitlines()
    for above, below in zip(lines, lines[1:]):
        if below.strip() and set(below.strip()) <= set("~^ <-HERE"):
            return above.strip()
    return ""
