"""Fusion: lower every node the op table can lower into virtual tensor boxes, and realize a box into one generated
kernel only where its value must exist in memory.

Walking each block in order, a lowerable node only composes index functions (nothing is emitted). A box is
realized, as a `j2t::kernel` node placed just before the first node that needs it, when:
  - a node that is not lowered (extern, host, fallback, control flow) reads it, or a nested block does;
  - it is a block or graph output;
  - it has several users and holds a reduction or a chain of RECOMPUTE_LIMIT nodes or more (computed once,
    stored, rather than recomputed by every user's kernel);
  - a node is about to mutate memory (everything pending is realized first, so no kernel reads stale data).
A `prim::ListConstruct` of tensors that nothing changes after it is built hands its items to the lowered ops
reading it (cat, stack); one read only by those is never built at all, unless one of them does not lower.
Fusion is thus a property of data flow: a pointwise chain after a matmul, a softmax, a layer norm with its
residual add, each becomes one kernel.
"""
from __future__ import annotations

import itertools
import math
from collections import Counter
from typing import Any, Optional

import torch

from . import kernel_ir as K
from .alias_analysis import fixed_tensor_lists, mutated_views, writes
from .decompositions import kernel_pieces_outside_kernels, undo_refused
from .drop_unread import drop_unread
from .ir import (Attr, KERNEL_OP, QUANTIZED_DTYPES, Block, Graph, Node, Type, Value, clone_graph,
                 provenance_line, walk_block)
from .lowering import (RUNTIME_SIZE, CannotLower, LowerContext, RunsAsExtern, TensorBox, contiguous_strides,
                       get_lowering, realized_box, strides_in_order)
from .lower_scatter import ScatterBox
from .op_table import is_view, lookup
from .symbolic import SymSize

__all__ = ["KERNEL_OP", "FusionFailed", "fuse"]
RECOMPUTE_LIMIT = 3  # a value of this many fused nodes or more is stored once rather than recomputed per user
REPEAT_LIMIT = 4  # a reduction a kernel would compute this many times over per result is stored once (CPU) ...
REPEAT_EXTENT = 256  # ... when it reduces at least this many elements


class FusionFailed(Exception):
    """Building a kernel from these nodes failed (a bug in a lowering or in fusion, not in the model): they run
    through ATen on the next attempt (transpiler/fallbacks.py)."""

    def __init__(self, nodes: list[Node], reason: str) -> None:
        super().__init__(reason)
        self.nodes, self.reason = nodes, reason


def fuse(graph: Graph, device_type: str, refused: Optional[dict[int, str]] = None,
         dims: Optional[dict[str, tuple]] = None, scalars_by_value: bool = False) -> Graph:
    """-> a copy of `graph` in which lowered nodes have disappeared into `j2t::kernel` nodes.

    `refused` maps node uids to the reason they must run through ATen (a kernel that failed to build or to verify).
    A kernel that fails while being built here raises FusionFailed naming its nodes: transpiler/fallbacks.py refuses
    them and fuses again, so a bug in one lowering costs that node its kernel, never the conversion.

    `dims` (name -> (min, max, example size)) lets kernels take dynamic dims as arguments: values whose sizes are
    polynomials over them lower like static ones. Without it only static shapes lower.

    `scalars_by_value`: kernels take the host numbers they read (a loop counter, `float(total)`) as arguments (the
    backend's launchers pass them), where otherwise an `aten::scalar_tensor` step makes each a 0-d tensor first:
    on a GPU, a fill launch per number per call.

    An op a rewrite wrote as pieces for kernels (decompositions.py) whose pieces do not all reach kernels (refused,
    or not lowered) runs through ATen as the one op it was: fused again with it put back."""
    refused = dict(refused or {})
    while True:
        work = clone_graph(graph)
        refused.update(undo_refused(work, refused))
        K.fresh_scope(dims)
        _Fuser(work, device_type, refused, dims is not None, scalars_by_value).block(work.body, top=True)
        drop_unread(work)
        outside = kernel_pieces_outside_kernels(work, refused)
        if not outside:
            return work
        refused.update(outside)


_CARRIED_SCALARS = {"int": "int64", "float": "float64", "bool": "bool"}  # runtime scalar -> its 0-d tensor's dtype
_SCALAR_TENSOR_SCHEMA = ("aten::scalar_tensor(Scalar s, *, ScalarType? dtype=None, Layout? layout=None, "
                         "Device? device=None, bool? pin_memory=None) -> Tensor")


def _static_tensor(t: Type, device_type: str, symbolic: bool = False) -> bool:
    """A tensor a kernel can index: known dtype and device, every dim an int (or, with `symbolic`, a polynomial
    over the dynamic dims; an opaque size never)."""
    return (t.is_tensor and t.dtype in K.DTYPES and t.shape is not None and t.device == device_type
            and all(isinstance(d, int) or (symbolic and isinstance(d, SymSize)) for d in t.shape))


def _why_not_static(types: list[Type], device_type: str, symbolic: bool) -> str:
    """What keeps outputs of these types out of a kernel, in the report's words."""
    for t in types:
        if not t.is_tensor or t.dtype is None or t.shape is None:
            return "an output's type or shape is not known (a value no run produced)"
        if t.dtype not in K.DTYPES:
            return f"an output is {_no_kernel_dtype(t.dtype)}"
        if t.device != device_type:
            return f"an output is on {t.device}, not on the package's device ({device_type})"
        if any(isinstance(d, str) for d in t.shape):
            return ("an output's size is opaque: it depends on the data (a mask's count, nonzero's) or on the "
                    "dynamic dims in a way no polynomial explains (a strided convolution's floor division)")
        if not symbolic and any(isinstance(d, SymSize) for d in t.shape):
            return "an output's size depends on a dynamic dim, and this backend's kernels take none"
    return "an output has no static shape on this device"


def _no_kernel_dtype(dtype: str) -> str:
    """A tensor of a dtype no kernel holds, in the report's words."""
    if dtype in QUANTIZED_DTYPES:
        return f"a quantized tensor ({dtype}): quantized ops run through ATen's quantized kernels"
    return f"a {dtype} tensor, which no generated kernel holds: its ops run through ATen"


def _read_only_as_gemm_rows(graph: Graph) -> set[int]:
    """Ids of values that only GEMMs read, each as the operand whose rows it multiplies."""
    gemm, other = set(), set()
    for node in graph.walk():
        for position, v in enumerate(node.inputs):
            (gemm if lookup(node.op).gemm_rows == position else other).add(v.id)
        for block in node.blocks:
            other.update(v.id for v in block.outputs)
    other.update(v.id for v in graph.outputs)
    return gemm - other


def _layout_bound(graph: Graph) -> set[int]:
    """Ids of values whose memory layout is part of what the model gives: the graph's outputs and the items of the
    containers it builds (a caller sees their strides), and `contiguous` / `clone` results (asked for a layout)."""
    bound = {v.id for v in graph.outputs}
    for node in graph.walk():
        info = lookup(node.op)
        if info.builds_container:
            bound.update(v.id for v in node.inputs)
        elif info.asks_layout:
            bound.add(node.outputs[0].id)
    return bound


def _observed_order(v: Value, box: TensorBox) -> Optional[list[int]]:
    """The dims of `v` outermost first in the memory ATen gave it when the model ran on the example inputs, when
    that memory is dense: a kernel that replaces ATen's ops writes its output as they did. Downstream ATen ops then
    see the layouts they saw while converting (a convolution fed the row-major tensor where TorchScript's add had
    given it a channels-last one returned a row-major output, and every kernel reading that output paid a copy
    into the layout it was generated for), and the choice TensorIterator made between mixed layouts stands."""
    strides = v.type.strides if v.type.is_tensor else None
    if strides is None or len(strides) != len(box.shape) or len(box.shape) < 2:
        return None
    order = sorted(range(len(box.shape)), key=lambda d: (-K.hint(strides[d]), d))
    return order if strides_in_order(box.shape, order) == tuple(strides) else None  # else not dense


class _Fuser:
    def __init__(self, graph: Graph, device_type: str, refused: dict[int, str], symbolic: bool = False,
                 scalars_by_value: bool = False) -> None:
        self.graph = graph
        self.scalars_by_value = scalars_by_value
        self.by_value: set[str] = set()  # the buffers that are host numbers kernels take as arguments
        self.symbolic = symbolic
        self.device_type = device_type
        self.refused = refused
        self.boxes: dict[int, TensorBox] = {}
        self.literals: dict[int, Any] = {}
        self.buffers: dict[str, Value] = {}  # buffer name -> the runtime value it is
        self.box_value: dict[int, Value] = {}  # box id -> the IR value it computes
        self.reductions: dict[int, tuple[TensorBox, Node]] = {}  # a reduce's tag -> its box and the node it is of
        # (a tensor read for its shape only, expand_as's second, is no user: it is never recomputed for that read)
        self.users = Counter(v.id for n in graph.walk() for i, v in enumerate(n.inputs)
                             if not (v.type.is_tensor and i in lookup(n.op).size_args))
        self.users.update(v.id for n in graph.walk() for b in n.blocks for v in b.outputs)
        self.users.update(v.id for v in graph.outputs)
        self.gemm_only = _read_only_as_gemm_rows(graph)
        self.layout_bound = _layout_bound(graph)
        # values whose boxes are virtual, by id, in creation order (a dict: one is dropped as it is stored, and a
        # list's scan for it made fusion quadratic in a long chain of kernels)
        self.pending: dict[int, Value] = {}
        self.kernel_names = itertools.count()
        self.pinned = mutated_views(graph)
        self.lists, self.unbuilt = fixed_tensor_lists(graph)  # list value id -> its ListConstruct; ids not built yet
        self.carried: dict[tuple[int, int], TensorBox] = {}  # (scalar value id, block) -> its 0-d tensor's box
        self.uncommitted: list[tuple[Value, TensorBox]] = []  # scalars the lowering under way reads
        self.current_out: list[Node] = []
        for v in graph.inputs:
            self.define_realized(v)

    # --- boxes ------------------------------------------------------------------------------------------------

    def define_realized(self, v: Value) -> None:
        t = v.type
        if _static_tensor(t, self.device_type, self.symbolic):
            name = f"buf{v.id}"
            strides = t.strides if t.strides is not None else contiguous_strides(t.shape)
            self.boxes[v.id] = realized_box(name, t.shape, t.dtype, strides)
            self.buffers[name] = v

    def argument(self, v: Value) -> Any:
        if v.id in self.literals:
            return self.literals[v.id]
        if v.id in self.lists:
            return [self.argument(item) for item in self.lists[v.id].inputs]
        box = self.boxes.get(v.id)
        if box is None and v.type.kind in _CARRIED_SCALARS:
            return self.scalar_box(v)
        if box is None:
            if v.type.kind == "List":
                raise CannotLower(f"its list %{v.name} is not a prim::ListConstruct that nothing changes later (it is "
                                  "appended to, passed into a loop or a container, or made by another op)")
            if v.type.is_tensor and v.type.dtype is not None and v.type.dtype not in K.DTYPES:
                raise CannotLower(f"input %{v.name} is {_no_kernel_dtype(v.type.dtype)}")
            raise CannotLower(f"input %{v.name} is not a static tensor or a constant")
        return box

    def shape_argument(self, node: Node, position: int, v: Value) -> Any:
        """A size list whose values the op's output shape already holds (a view's target shape). Over dynamic dims
        it is often computed at run time (`x.view(b * s, -1)` with `b, s = x.shape`), which no kernel can take as
        an argument; the output's shape, fitted by shape inference, stands for it (and the sizes are never carried
        into the kernel as scalars it would not read). A slice's or an iota's end computed at run time comes as
        RUNTIME_SIZE, for the lowering to accept only where the output's length is dynamic."""
        if not self.symbolic:
            return self.argument(v)
        if lookup(node.op).size_is_output_shape:
            return list(node.outputs[0].type.shape)
        return self.literals[v.id] if v.id in self.literals else RUNTIME_SIZE

    def scalar_box(self, v: Value) -> TensorBox:
        """A scalar known only at run time (an input, or computed on the host) as a 0-d tensor a kernel loads: an
        `aten::scalar_tensor` step makes it just before the kernel, once per block. It promotes as the Python
        scalar it stands for (float32 * a float stays float32)."""
        kind = v.type.kind
        if self.scalars_by_value and kind != "bool":  # (a kernel's argument, read wherever it is in scope)
            box = realized_box(f"scalar{v.id}", (), _CARRIED_SCALARS[kind], ())
            box.wrapped = kind
            self.boxes[v.id] = box
            self.buffers[box.buffer] = v
            self.by_value.add(box.buffer)
            return box
        key = (v.id, id(self.current_out))
        box = self.carried.get(key)
        if box is None:
            box = realized_box(f"scalar{v.id}_{len(self.carried)}", (), _CARRIED_SCALARS[kind], ())
            box.wrapped = kind
            self.carried[key] = box
            self.uncommitted.append((v, box))
        return box

    def emit_carriers(self, out: list[Node]) -> None:
        """The `aten::scalar_tensor` steps of the runtime scalars a lowering just used."""
        for v, box in self.uncommitted:
            constants = [Value(f"{v.name}_{what}") for what in ("dtype", "layout", "device", "pin")]
            values = [getattr(torch, box.dtype), None, torch.device(self.device_type), None]
            for c, value in zip(constants, values):
                c.type = Type("Any")
                out.append(Node("prim::Constant", [], [c], attrs={Attr.VALUE: value}))
            tensor = Value(f"{v.name}_tensor", Type("Tensor", box.dtype, (), self.device_type, strides=()))
            out.append(Node("aten::scalar_tensor", [v, *constants], [tensor], source=None,
                            attrs={Attr.SCHEMA: _SCALAR_TENSOR_SCHEMA, Attr.SCALAR_CARRIER: True,
                                   Attr.SYNTHETIC: True}))
            self.buffers[box.buffer] = tensor
            self.boxes[tensor.id] = box
        self.uncommitted = []

    # --- walking blocks ---------------------------------------------------------------------------------------

    def block(self, block: Block, top: bool = False) -> None:
        out: list[Node] = []
        if not top:  # a loop's counter and carried values, as each iteration (or branch) sees them: kernel inputs
            for v in block.inputs:
                self.define_realized(v)
        for node in block.nodes:
            if node.op == "prim::Constant":
                self.constant(node)
                out.append(node)
            elif node.op == "prim::ListConstruct" and node.output.id in self.unbuilt:
                continue  # built where a reader that does not lower needs it (see `realize`), or never
            elif not self.lower(node, out):
                self.run_elsewhere(node, out)
        for v in block.outputs:
            self.realize(v, out)
        block.nodes = out

    def constant(self, node: Node) -> None:
        value = node.output
        if Attr.WEIGHT in node.attrs:
            self.define_realized(value)
        elif Attr.VALUE in node.attrs:
            self.literals[value.id] = node.attrs[Attr.VALUE]

    def lower(self, node: Node, out: list[Node]) -> bool:
        fn = get_lowering(node.op)
        if fn is None:
            return False
        self.current_out, self.uncommitted = out, []
        self.store_gathered_reduction(node, out)
        try:
            if node.uid in self.refused:
                raise CannotLower(self.refused[node.uid])
            if node.attrs.get(Attr.BINDS):
                raise CannotLower("the runtime reads a count from its output (bind_sizes.py), so ATen makes it")
            if node.uid in self.pinned:
                raise CannotLower("its result is mutated in place later, so it must stay an ATen view")
            if any(not _static_tensor(v.type, self.device_type, self.symbolic) for v in node.outputs):
                raise CannotLower(_why_not_static([v.type for v in node.outputs], self.device_type, self.symbolic))
            ctx = LowerContext(node.op, [v.type.dtype for v in node.outputs], [v.type.shape for v in node.outputs],
                               self.device_type)
            result = fn(ctx, *[self.shape_argument(node, i, v) if i in lookup(node.op).size_args else
                               self.argument(v) for i, v in enumerate(node.inputs)])
            boxes = result if isinstance(result, tuple) else (result,)
            for box, v in zip(boxes, node.outputs):
                if box.shape != tuple(v.type.shape) or box.dtype != v.type.dtype:
                    raise CannotLower(f"lowering gave {box.dtype}{list(box.shape)}, TorchScript {v.type}")
        except CannotLower as why:
            node.attrs[Attr.NOT_LOWERED] = str(why) or "unsupported arguments"
            if isinstance(why, RunsAsExtern):
                node.attrs[Attr.EXTERN] = True
            self.forget_uncommitted()
            return False
        except Exception as err:  # a bug in a lowering (or one written for a constant met a runtime scalar)
            node.attrs[Attr.NOT_LOWERED] = f"its lowering failed: {type(err).__name__}: {err}"
            self.forget_uncommitted()
            return False
        self.emit_carriers(out)
        self.reductions.update((tag, (made, node)) for tag, made in ctx.reductions.items())
        if isinstance(result, ScatterBox):
            self.build_scatter(node, result, out)
            return True
        absorbed = [self.lists[v.id] for v in node.inputs if v.id in self.unbuilt]
        for box, v in zip(boxes, node.outputs):
            for n in absorbed + [node]:
                if n not in box.nodes:
                    box.nodes.append(n)
            self.boxes[v.id] = box
            self.box_value[box.id] = v
            self.pending[v.id] = v
            heavy = len(box.nodes) >= RECOMPUTE_LIMIT and not all(is_view(n.op) for n in box.nodes)
            if self.users[v.id] > 1 and (heavy or _has_reduction(box)):
                self.realize(v, out)  # several users would each recompute it: store it once instead
            elif node.attrs.get(Attr.STORE):
                self.realize(v, out)  # a pass asked for it stored (transpiler/split_norms.py: partial sums)
        return True

    def store_gathered_reduction(self, node: Node, out: list[Node]) -> None:
        """A gather that reads more elements than its source holds, from a source holding a reduction or (on the
        CPU) a transcendental function, would redo it at every read: the source is stored first. (GAT's per-node
        attention scores, gathered per edge, were summed again for every edge: 4x the work on a Cora-sized graph;
        on one CPU thread GraphSAGE's second layer computed its ELU once per edge, 3.9 times per node: 1.1x
        TorchScript, 1.5x stored. On the GPU an exp is cheap beside another kernel's launch: not measured there,
        left fused.)"""
        source = node.inputs[0] if lookup(node.op).gather and node.inputs else None
        box = self.boxes.get(source.id) if source is not None else None
        shape = node.outputs[0].type.shape if node.outputs and node.outputs[0].type.is_tensor else None
        if (box is None or box.realized or not shape or not all(isinstance(n, int) for n in (*shape, *box.shape))
                or math.prod(shape) <= box.numel):
            return
        if not (_has_reduction(box) or self.device_type == "cpu" and _has_transcendental(box)):
            return
        self.realize(source, out)

    def forget_uncommitted(self) -> None:
        for v, box in self.uncommitted:
            del self.carried[(v.id, id(self.current_out))]
        self.uncommitted = []

    def run_elsewhere(self, node: Node, out: list[Node]) -> None:
        if writes(node) == "tensor":  # a virtual value may read the written tensor: store each as it is now
            for v in list(self.pending.values()):
                self.realize(v, out)
        for v in node.inputs:
            self.realize(v, out)
        for sub in node.blocks:
            for v in _outer_reads(sub):
                self.realize(v, out)
        # a write inside a block stores every value still virtual then (above); one made out here must be stored
        # out here, or only the branch that writes would make it
        if any(writes(n) == "tensor" for sub in node.blocks for n in walk_block(sub)):
            for v in list(self.pending.values()):
                self.realize(v, out)
        for sub in node.blocks:
            self.block(sub)
        out.append(node)
        for v in node.outputs:
            self.define_realized(v)

    # --- realizing ------------------------------------------------------------------------------------------

    def realize(self, v: Value, out: list[Node]) -> None:
        if v.id in self.unbuilt:  # a list a node that does not lower reads: build it now, from stored items
            self.unbuilt.discard(v.id)
            node = self.lists[v.id]
            for item in node.inputs:
                self.realize(item, out)
            out.append(node)
            return
        box = self.boxes.get(v.id)
        if box is None or box.realized:
            return
        try:
            self.build_kernel(v, box, out)
        except FusionFailed:
            raise
        except Exception as err:
            raise FusionFailed(list(box.nodes), f"building its kernel failed: {type(err).__name__}: {err}") from err

    def build_kernel(self, v: Value, box: TensorBox, out: list[Node]) -> None:
        if self.realize_as_views(box, out):
            return
        logical = tuple(K.var(f"i{d}", n) for d, n in enumerate(box.shape))
        value = box(list(logical))
        value = self.split_nested_reductions(value, box, logical, out)
        value = self.store_repeated_reductions(value, box, logical, out)
        name = f"buf{v.id}"
        inputs = sorted(K.loads_in(value), key=lambda b: self.buffers[b].id)
        # Every value on the CPU; on CUDA only values whose layout the model's caller sees or asked for: there the
        # observed orders of intermediates moved a small ConvNeXt's fp32 outputs by 1.2e-4 against TorchScript
        # (tests/test_real_models.py on the H100), not yet understood.
        observed = _observed_order(v, box) if self.device_type == "cpu" or v.id in self.layout_bound else None
        order = (list(range(len(box.shape))) if v.id in self.gemm_only else
                 observed or self.memory_order_for(box, inputs))
        strides = strides_in_order(box.shape, order)
        kernel = K.Kernel(
            name=f"k{next(self.kernel_names)}_{_short_name(box.nodes)}",
            ranges=tuple(logical[d] for d in order),  # swept in memory order: the innermost loop is stride 1
            index=logical,
            inputs=[self.kernel_buffer(b) for b in inputs],
            outputs=[K.KernelBuffer(name, box.dtype, box.shape, strides)],
            values=[K.cast(value, box.dtype)],
            provenance=[provenance_line(n) for n in box.nodes],
            dims=K.dims(),
        )
        node = Node(KERNEL_OP, [self.buffers[b] for b in inputs], [v],
                    attrs={Attr.KERNEL: kernel, Attr.FUSED: box.nodes})
        out.append(node)
        box.realize_as(name, strides)
        self.buffers[name] = v
        v.type = Type("Tensor", box.dtype, box.shape, self.device_type, strides=strides)
        self.pending.pop(v.id, None)

    def build_scatter(self, node: Node, box: ScatterBox, out: list[Node]) -> None:
        """A scatter's kernel, stored at once: its values are no index function a reader could take in. An input
        holding a reduction is stored first (a scatter's loop has no place for one); a mean's kernel also writes
        the count per element, into a value nothing reads."""
        for v in node.inputs:
            if v.id in self.boxes and not self.boxes[v.id].realized and _has_reduction(self.boxes[v.id]):
                self.realize(v, out)
        v = node.output
        box.nodes = []
        for read in node.inputs:
            source = self.boxes.get(read.id)
            if source is not None and not source.realized:
                box.nodes.extend(n for n in source.nodes if n not in box.nodes)
        box.nodes.append(node)
        number = next(self.kernel_names)
        shape, strides = box.shape, contiguous_strides(box.shape)
        out_vars = tuple(K.var(f"o{number}_{d}", n) for d, n in enumerate(shape))
        sources = tuple(K.var(f"e{number}_{d}", n) for d, n in enumerate(box.source_shape))
        values = [box.init(list(out_vars)), box.update(list(sources)), K.cast(box.target(list(sources)), K.INT)]
        inputs = sorted(set().union(*(K.loads_in(x) for x in values)), key=lambda b: self.buffers[b].id)
        name = f"buf{v.id}"
        outputs, results = [K.KernelBuffer(name, box.dtype, shape, strides)], [v]
        if box.reduce == "mean":
            count = Value(f"{v.name}_count", Type("Tensor", "int32", shape, self.device_type, strides=strides))
            outputs.append(K.KernelBuffer(f"buf{count.id}", "int32", shape, strides))
            results.append(count)
        flat = K.var(f"scatter{number}", math.prod(shape))
        kernel = K.ScatterKernel(
            name=f"k{number}_{_short_name(box.nodes)}", ranges=(flat,), index=(flat,),
            inputs=[self.kernel_buffer(b) for b in inputs], outputs=outputs, values=values,
            provenance=[provenance_line(n) for n in box.nodes], dims=K.dims(), out_vars=out_vars, sources=sources,
            dim=box.dim, reduce=box.reduce, include_self=box.include_self)
        out.append(Node(KERNEL_OP, [self.buffers[b] for b in inputs], results,
                        attrs={Attr.KERNEL: kernel, Attr.FUSED: box.nodes}))
        box.realize_as(name, strides)
        self.boxes[v.id] = box
        self.box_value[box.id] = v
        self.buffers[name] = v
        v.type = Type("Tensor", box.dtype, shape, self.device_type, strides=strides)

    def memory_order_for(self, box: TensorBox, inputs: list[str]) -> list[int]:
        """The dims of a kernel's output, outermost first in memory: the layout of an input of the same shape in a
        permuted dense layout (channels-last activations stay channels-last), else of such an input of the same
        rank (a pooled channels-last image stays channels-last, as ATen keeps it), else row-major."""
        sources = [self.boxes[self.buffers[name].id] for name in inputs]
        for same_shape in (True, False):
            for source in sources:
                if (len(source.shape) != len(box.shape) or len(box.shape) < 2
                        or (source.shape == box.shape) != same_shape):
                    continue
                order = sorted(range(len(box.shape)), key=lambda d: (-K.hint(source.strides[d]), d))
                if order != sorted(order) and strides_in_order(source.shape, order) == tuple(source.strides):
                    return order
        return list(range(len(box.shape)))

    def realize_as_views(self, box: TensorBox, out: list[Node]) -> bool:
        """A box that only re-indexes a buffer (slices, transposes, reshapes) is made by running its view nodes
        through ATen instead: an alias costs nothing, where a kernel would copy. Its values then read through the
        strides the views had when the plan ran on the example inputs."""
        nodes = box.nodes
        if not nodes or not all(is_view(n.op) and n.output.type.strides is not None for n in nodes):
            return False
        for node in nodes:
            if all(self.boxes[v.id].realized for v in node.outputs):
                continue  # shared by several boxes (one permute under three unbind items): emitted once
            node.attrs[Attr.ATEN_VIEW] = True
            out.append(node)
            for value in node.outputs:
                t = value.type
                self.boxes[value.id].realize_as(f"buf{value.id}", t.strides)
                self.buffers[f"buf{value.id}"] = value
                self.pending.pop(value.id, None)
        return True

    def split_nested_reductions(self, value: K.KExpr, box: TensorBox, ranges, out: list[Node]) -> K.KExpr:
        """A reduction nested in another whose result varies with the outer one's loop (e.g. a column mean inside
        a row sum) would be recomputed on every outer step: realize it as its own kernel first."""
        for _ in range(16):
            culprit = None
            for red in K.reductions_in(value):
                for inner in K.reductions_in(red.args[0]):
                    if inner is not red and K.free_vars(inner) & frozenset(red.arg[1]):
                        culprit = inner
                        break
                if culprit is not None:
                    break
            if culprit is None:
                return value
            inner_value = self.box_value.get(culprit.arg[2]) or self.value_holding(culprit, box)
            if inner_value is None:
                raise FusionFailed(list(box.nodes), "a nested reduction could not be stored as a value of its own")
            self.realize(inner_value, out)
            value = box(list(ranges))
        return value

    def store_repeated_reductions(self, value: K.KExpr, box: TensorBox, ranges, out: list[Node]) -> K.KExpr:
        """A reduction whose result varies with a kernel dim only through a floor division (a group norm's statistics,
        read for every channel of its group) would be computed again for each index that divides to the same result:
        HDemucs' GroupNorm(4, 1536) + GLU kernel summed each group's 24,192 values for each of its 384 channels, 2.3x
        slower than TorchScript on the CPU. Such a reduction is stored first, as its own kernel over its results (a
        few numbers), and the kernel reads them. On the CPU (on CUDA, split_norms.py stores few-row norms' sums)."""
        if self.device_type != "cpu":
            return value
        for _ in range(16):
            culprit = next((r for r in K.reductions_in(value) if r.arg[2] in self.reductions
                            and not self.reductions[r.arg[2]][0].realized and _repeats(r) >= REPEAT_LIMIT
                            and _extent(r) >= REPEAT_EXTENT), None)
            if culprit is None:
                return value
            made, node = self.reductions[culprit.arg[2]]
            made.nodes = [node]  # (its kernel's provenance: the node whose lowering made it)
            made.dtype = K.compute_dtype(made.dtype)  # stored as exact as it was computed: a half's stats in float32
            stored = Value(f"{self.box_value[box.id].name if box.id in self.box_value else 'r'}_r{made.id}",
                           Type("Tensor", made.dtype, made.shape, self.device_type))
            self.boxes[stored.id], self.box_value[made.id] = made, stored
            self.build_kernel(stored, made, out)
            value = box(list(ranges))
        return value

    def value_holding(self, reduction: K.KExpr, box: TensorBox) -> Optional[Value]:
        """The earliest still-virtual IR value fused into `box` whose expression holds `reduction` (made inside a
        composite: softmax's row max, std's mean), so storing that value stores the reduction."""
        tag = reduction.arg[2]
        for node in box.nodes:
            for v in node.outputs:
                inner = self.boxes.get(v.id)
                if inner is None or inner is box or inner.realized:
                    continue
                index = [K.var(f"i{d}", n) for d, n in enumerate(inner.shape)]
                if any(r.arg[2] == tag for r in K.reductions_in(inner(index))):
                    return v
        return None

    def kernel_buffer(self, name: str) -> K.KernelBuffer:
        box = self.boxes[self.buffers[name].id]
        return K.KernelBuffer(name, box.dtype, box.shape, box.strides, by_value=name in self.by_value)


def _repeats(reduction: K.KExpr) -> float:
    """How many times over a kernel computes `reduction` per distinct result: its free loop variables' sizes over
    the values they reach it with, where a variable read only as `var // k` reaches it with size / k values."""
    inside = K.nodes_in(reduction.args[0])
    repeats = 1.0
    for v in K.free_vars(reduction):
        size = v.arg[1]
        if type(size) is not int:
            return 1.0
        uses = [n for n in inside if any(a is v for a in n.args)]
        divisors = [n.args[1].arg for n in uses if n.op == "index_div" and n.args[0] is v and n.args[1].op == "const"]
        if uses and len(divisors) == len(uses) and all(type(k) is int and k > 0 for k in divisors):
            repeats *= size / math.ceil(size / min(divisors))
    return repeats


def _extent(reduction: K.KExpr) -> int:
    """How many points the reduction sums, at the example's sizes where a dim is dynamic."""
    return math.prod(K.hint(v.arg[1]) for v in reduction.arg[1])


def _value(box: TensorBox) -> K.KExpr:
    """The box's value at a point of its loop variables."""
    return box([K.var(f"i{d}", n) for d, n in enumerate(box.shape)])


def _has_reduction(box: TensorBox) -> bool:
    return bool(K.reductions_in(_value(box)))


TRANSCENDENTAL = frozenset("exp exp2 log log2 log1p expm1 sin cos tan tanh erf sigmoid pow".split())


def _has_transcendental(box: TensorBox) -> bool:
    """Whether the box's value calls a function that costs many multiply-adds an element (exp, erf, tanh, ...)."""
    return any(n.op in TRANSCENDENTAL for n in K.nodes_in(_value(box)))


def _outer_reads(block: Block) -> list[Value]:
    defined = {v.id for v in block.inputs}
    reads: list[Value] = []
    for node in walk_block(block):
        defined.update(v.id for v in node.outputs)
        for sub in node.blocks:
            defined.update(v.id for v in sub.inputs)
    for node in walk_block(block):
        reads += [v for v in node.inputs if v.id not in defined]
        for sub in node.blocks:
            reads += [v for v in sub.outputs if v.id not in defined]
    reads += [v for v in block.outputs if v.id not in defined]
    return reads


def _short_name(nodes: list[Node]) -> str:
    names = [n.op.split("::")[-1].split(".")[0] for n in nodes]
    interesting = [n for n in names if n not in ("view", "reshape", "expand", "permute", "transpose", "unsqueeze",
                                                  "squeeze", "slice", "select", "to", "contiguous", "detach",
                                                  "ListConstruct")]
    chosen = (interesting or names)[-3:]
    return "_".join(dict.fromkeys(chosen)) or "copy"
