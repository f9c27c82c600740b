"""The one small typed IR: values, nodes, blocks, graphs.

One node type for every op (the op name says what it is, the op table says how it lowers); structured control flow
keeps its sub-blocks. Every value has a `Type`; tensors carry dtype, shape and device, and a dim is an int or a
named symbol (a str) so dynamic dims fit without changing the IR.
"""
from __future__ import annotations

import copy
import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Any, Optional, Union

import torch

Dim = Union[int, str]
KERNEL_OP = "j2t::kernel"  # a generated kernel: fusion's output node (attrs: the kernel, the nodes it fused)


class Attr:
    """The keys of `Node.attrs`, declared once: passes read what other passes wrote through these names, so a
    misspelt key is an AttributeError, not a value silently missed (tests/test_ir_attrs.py refuses literal keys)."""
    VALUE = "value"  # prim::Constant: the literal it gives
    WEIGHT = "weight"  # prim::Constant: the name of the frozen weight it gives
    WEIGHTS = "weights"  # prim::Constant: the names of the frozen weights of the list it gives
    EXPANDED = "expanded"  # from_torchscript, while building: a constant container's item nodes
    SCHEMA = "schema"  # the op's TorchScript schema, by which ATen calls it
    KERNEL = "kernel"  # j2t::kernel: its kernel_ir.Kernel
    FUSED = "fused"  # j2t::kernel: the nodes it computes
    NOT_LOWERED = "not_lowered"  # fusion: why the node runs through ATen (the report's reason)
    UNREACHED = "unreached"  # observe: no observed run made its outputs (a branch the example and draws never took)
    EXTERN = "extern"  # fusion: its lowering calls ATen on purpose (a GEMM, a convolution)
    ATEN_VIEW = "aten_view"  # fusion: a view made by ATen as an alias, where a kernel would copy
    SCALAR_CARRIER = "scalar_carrier"  # fusion: the aten::scalar_tensor that hands a runtime scalar to a kernel
    STORE = "store"  # a rewrite asks fusion to store the value rather than recompute it in each reader
    SYNTHETIC = "synthetic"  # made by a pass, not by TorchScript: the report does not count it
    # an ATen node finishing what kernels computed for the node it stands for (gpu_nms.py's masked_select): (the
    # kernel node, that node). The kernels' own outputs have no value in ATen's plan to compare with: verification
    # runs the stood-for op on the package's own inputs to it instead
    FINISHES = "finishes"
    FROM_OPS = "from_ops"  # a rewrite's node: the TorchScript ops it stands for (the report counts them)
    DECOMPOSES = "decomposes"  # a rewrite's piece of an op written as pieces for kernels: its Decomposition
    GEMM_FORM = "gemm_form"  # gemm_forms: the form a GEMM took, read by gemm_kernels for the generated one
    GEMM_CONFIG = "gemm_config"  # gemm_forms: the generated form's launch configuration, timed fastest
    FOLDED_FROM = "folded_from"  # fold_shapes: the op a constant was computed from
    FOLDED_INTO_LINEAR = "folded_into_linear"  # onednn_linear: an activation its fused linear computes
    FOLDED_INTO_CONV = "folded_into_conv"  # onednn_conv: a node its fused convolution computes
    CONV_TEMPLATE = "conv_template"  # onednn_conv: the template kernel timed faster, made by conv_kernels
    BINDS = "binds"  # bind_sizes: [(output index, axis, size name)] the runtime reads from the outputs
    GUARDS = "guards"  # check_indices: the uids of the nodes an index check's assert guards
    QUANTIZED_ENGINE = "quantized_engine"  # packed_params: the engine a packing op's weights are laid out for


@dataclass(frozen=True)
class Type:
    kind: str  # Tensor, int, float, bool, str, None, Device, ScalarType, List, Tuple, Dict, Optional, Any, ...
    dtype: Optional[str] = None  # tensors: torch dtype name without the "torch." prefix
    shape: Optional[tuple[Dim, ...]] = None
    device: Optional[str] = None
    elems: tuple["Type", ...] = ()  # List[e], Tuple[e...], Dict[k, v], Optional[e]
    strides: Optional[tuple[int, ...]] = None  # tensors: the strides seen when the plan ran on the example inputs

    def __str__(self) -> str:
        if self.kind == "Tensor":
            if self.dtype is None:
                return "Tensor"
            dims = ", ".join(str(d) for d in self.shape) if self.shape is not None else "?"
            return f"{self.dtype}[{dims}]" + (f"@{self.device}" if self.device else "")
        if self.elems:
            return f"{self.kind}[{', '.join(str(e) for e in self.elems)}]"
        return self.kind

    @property
    def is_tensor(self) -> bool:
        return self.kind == "Tensor"


TENSOR = Type("Tensor")


def tensor_type(t: torch.Tensor) -> Type:
    # A sparse tensor the model makes has no strides: typed as a value of unknown shape, which no kernel reads (ATen's
    # ops run on it)
    if t.layout != torch.strided:
        return Type("Tensor", dtype_name(t.dtype), None, t.device.type)
    return Type("Tensor", dtype_name(t.dtype), tuple(t.shape), t.device.type, strides=tuple(t.stride()))


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# Quantized dtypes: their values are integers read through a scale and zero point the tensor carries, which no
# generated kernel reads; every op on them runs through ATen's quantized kernels
GENERATED_GEMM = "skinny"  # the GEMM form (Attr.GEMM_FORM) computed by a generated template kernel
# torch.memory_format as TorchScript's graphs hold it (an int)
CONTIGUOUS_FORMAT, CHANNELS_LAST_FORMAT = 0, 2
QUANTIZED_DTYPES = frozenset({"qint8", "quint8", "qint32", "quint4x2", "quint2x4"})


def torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


@dataclass(frozen=True)
class Source:
    """Where a node came from in the model's source: for provenance comments and error messages."""
    file: str
    line: int
    text: str = ""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}" + (f"  {self.text.strip()}" if self.text else "")


_ids = itertools.count()


@dataclass(eq=False)
class Value:
    name: str
    type: Type = TENSOR
    id: int = field(default_factory=lambda: next(_ids))

    def __repr__(self) -> str:
        return f"%{self.name}"


@dataclass(eq=False)
class Block:
    inputs: list[Value] = field(default_factory=list)
    nodes: list["Node"] = field(default_factory=list)
    outputs: list[Value] = field(default_factory=list)


@dataclass(eq=False)
class Node:
    op: str  # qualified op with overload: "aten::add.Tensor", "prim::If", "prim::Constant"
    inputs: list[Value]
    outputs: list[Value]
    attrs: dict[str, Any] = field(default_factory=dict)
    blocks: list[Block] = field(default_factory=list)
    source: Optional[Source] = None
    uid: int = field(default_factory=lambda: next(_ids))

    @property
    def output(self) -> Value:
        assert len(self.outputs) == 1, self
        return self.outputs[0]


@dataclass(eq=False)
class Graph:
    """A function: the top block and its weights (constant tensors by name)."""
    body: Block
    weights: dict[str, torch.Tensor] = field(default_factory=dict)
    name: str = "forward"
    # weights that stay on the CPU in a GPU package: a model moved to the GPU whose plain tensor attributes stayed
    # on the CPU (torchvision's anchor sizes), which it combines with other CPU tensors (place_on_device.py)
    host_weights: set[str] = field(default_factory=set)
    # the NamedTuples in TorchScript's type of what the function returns (from_torchscript.py `named_tuples`),
    # which the package's signature names so that a runtime returns them as TorchScript does; None: none
    returns: Optional[dict] = None
    # the size symbols that are counts read from data (data_sizes.py): a kernel over one is not replayed from a
    # CUDA graph, which would bake the count in
    data_sizes: set[str] = field(default_factory=set)
    # value ids of tensors observed starting at an address not kernel_ir.ALIGNMENT-aligned (kernel_alignment.py)
    misaligned: set[int] = field(default_factory=set)

    @property
    def inputs(self) -> list[Value]:
        return self.body.inputs

    @property
    def outputs(self) -> list[Value]:
        return self.body.outputs

    def walk(self):
        """Every node, nested blocks included, in program order."""
        yield from walk_block(self.body)

    def __str__(self) -> str:
        return format_graph(self)


def readers(graph: Graph) -> dict[int, list[Optional[Node]]]:
    """value id -> what reads it: nodes, and None for each block or graph output it is (read from outside)."""
    found: dict[int, list[Optional[Node]]] = {}
    for node in graph.walk():
        for v in node.inputs:
            found.setdefault(v.id, []).append(node)
        for block in node.blocks:
            for v in block.outputs:
                found.setdefault(v.id, []).append(None)
    for v in graph.outputs:
        found.setdefault(v.id, []).append(None)
    return found


def opaque_symbols(t: Type) -> list[str]:
    """The opaque size symbols in a type: its tensor's, or its items' (a container's)."""
    found = [n for n in t.shape if isinstance(n, str)] if t.is_tensor and t.shape is not None else []
    for e in t.elems:
        found += opaque_symbols(e)
    return found


def defined(graph: Graph):
    """Every value the graph defines: its inputs, nested blocks' inputs and every node's outputs."""
    yield from graph.inputs
    for n in graph.walk():
        for b in n.blocks:
            yield from b.inputs
        yield from n.outputs


def undefined_reads(graph: Graph) -> list[Value]:
    """The values a node reads, or a block returns, that nothing before it in scope defines: a rewrite's dangling
    reference, which would otherwise fail only when the plan is built (pipeline.prepare checks each optional
    rewrite's graph with it)."""
    missing: list[Value] = []

    def visit(block: Block, scope: set[int]) -> None:
        scope = scope | {v.id for v in block.inputs}
        for node in block.nodes:
            missing.extend(v for v in node.inputs if v.id not in scope)
            for inner in node.blocks:
                visit(inner, scope)
            scope.update(v.id for v in node.outputs)
        missing.extend(v for v in block.outputs if v.id not in scope)

    visit(graph.body, set())
    return missing


def blocks(graph: Graph) -> list[Block]:
    """The graph's body and every nested block, outermost first: a pass that rewrites block by block takes the list
    before it starts, so the blocks it adds or drops do not disturb the iteration."""
    return [graph.body, *(b for n in graph.walk() for b in n.blocks)]


def literals(graph: Graph) -> dict[int, Any]:
    """value id -> the literal a constant node gives it (ints, floats, lists, None...)."""
    return {n.output.id: n.attrs[Attr.VALUE] for n in graph.walk()
            if n.op == "prim::Constant" and Attr.VALUE in n.attrs}


def weight_names(graph: Graph) -> dict[int, str]:
    """value id -> the name of the frozen weight a constant node gives it."""
    return {n.output.id: n.attrs[Attr.WEIGHT] for n in graph.walk()
            if n.op == "prim::Constant" and Attr.WEIGHT in n.attrs}


def walk_block(block: Block):
    for node in block.nodes:
        yield node
        for sub in node.blocks:
            yield from walk_block(sub)


def format_graph(graph: Graph) -> str:
    sig = ", ".join(f"{v!r}: {v.type}" for v in graph.inputs)
    lines = [f"graph {graph.name}({sig}):"]
    _format_block(graph.body, lines, "  ")
    lines.append(f"  return ({', '.join(map(repr, graph.outputs))})")
    return "\n".join(lines)


def _format_block(block: Block, lines: list[str], indent: str) -> None:
    for node in block.nodes:
        outs = ", ".join(f"{v!r}: {v.type}" for v in node.outputs)
        args = ", ".join(map(repr, node.inputs))
        attrs = ""
        if Attr.VALUE in node.attrs:
            attrs = f"[value={_short(node.attrs[Attr.VALUE])}]"
        elif Attr.WEIGHT in node.attrs:
            attrs = f"[weight={node.attrs[Attr.WEIGHT]}]"
        where = f"  # {node.source.file}:{node.source.line}" if node.source else ""
        lines.append(f"{indent}{outs + ' = ' if outs else ''}{node.op}{attrs}({args}){where}")
        for i, sub in enumerate(node.blocks):
            lines.append(f"{indent}  block{i}({', '.join(map(repr, sub.inputs))}):")
            _format_block(sub, lines, indent + "    ")
            lines.append(f"{indent}    -> ({', '.join(map(repr, sub.outputs))})")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


_IMMUTABLE = (str, int, float, bool, type(None), torch.dtype, torch.device, torch.memory_format, torch.layout)


def clone_graph(graph: Graph) -> Graph:
    """A copy to rewrite: new blocks, nodes and values that keep their value ids and node uids (so a refusal names
    the same node in every copy). What no pass changes in place is shared: types and sources (frozen), the weights
    (never written), attrs' immutable values (the rest, literal lists, are deep-copied). copy.deepcopy of the whole
    graph took most of fusion's time (1.2 million calls for a chain of 1,000 layers)."""
    values = {id(v): Value(v.name, v.type, v.id) for v in defined(graph)}
    memo: dict[int, Any] = {id(w): w for w in graph.weights.values()}
    memo.update(values)

    def block(b: Block) -> Block:
        return Block([values[id(v)] for v in b.inputs], [node(n) for n in b.nodes],
                     [values.get(id(v), v) for v in b.outputs])

    def node(n: Node) -> Node:
        attrs = {k: v if isinstance(v, _IMMUTABLE) else copy.deepcopy(v, memo) for k, v in n.attrs.items()}
        return Node(n.op, [values.get(id(v), v) for v in n.inputs], [values[id(v)] for v in n.outputs], attrs,
                    [block(b) for b in n.blocks], n.source, n.uid)

    # (every other field copied as it is: a field left out here is lost by every rewrite that works on a copy, as
    # host_weights once was, which put a GPU SSD's CPU anchor sizes on the GPU beside its CPU anchors)
    return dataclasses.replace(graph, body=block(graph.body), weights=dict(graph.weights),
                               host_weights=set(graph.host_weights), data_sizes=set(graph.data_sizes),
                               misaligned=set(graph.misaligned))


def provenance_line(node: Node) -> str:
    """A kernel's provenance line for a node it computes: the op and its source line."""
    where = f"  {node.source}" if node.source else ""
    return f"{node.op}{where}"
