"""After fusion, on CUDA: each `torchvision::nms` over float32 boxes becomes ATen's sort, two generated kernels and
ATen's masked_select (emitters/triton_nms.py says why: torchvision's keep walk waits on a load and a barrier per
kept box, 3.7 ms for FCOS's 5,000 boxes).

    order  = sort(scores, stable, dim=0, descending=True).indices     (torchvision's own sort: the same order)
    sorted = index_select(boxes, 0, order)
    mask   = nms_mask(sorted)        the overlap bits, in torchvision's CUDA float arithmetic
    keep   = nms_walk(mask)          the kept flags, 64 boxes at a time
    kept   = masked_select(order, keep)

The kept indices are torchvision's, in its order, where the threshold is a constant, boxes [n, 4] and scores [n]
(n an int, a size bound at run time, or an opaque count the rewrite's sort binds). The walk's flags have no value
in ATen's plan, so verification runs torchvision's NMS on the package's own inputs to it (the masked_select's
Attr.FINISHES) and takes the kernels out where the answers differ; a node it took out (`refused`) stays
torchvision's. How torchvision sorts tied scores and rounds the overlap is asked of it on the device
(nms_facts.py); where it does neither as the kernels can, nothing is rewritten.
"""
from __future__ import annotations

from typing import Optional

from . import kernel_ir as K
from .ir import KERNEL_OP, Attr, Graph, Node, Type, Value, blocks, literals as literals_of, provenance_line
from .lowering import contiguous_strides
from .op_table import schema_of
from .symbolic import SymSize
from .nms_facts import torchvision_iou_form, torchvision_sorts_stably

NMS = "torchvision::nms"
# The mask buffer takes n * n + 8 * n bytes, 8x torchvision's (25 MB at 5,000 boxes, the largest single call of
# torchvision's detectors): a call that may hold more boxes than this stays torchvision's
MAX_BOXES = 32768
EXAMPLE_BOXES = 1000  # an opaque count's size where a kernel's launch is shown for people (the manifest's "grid")
MODE = "auto"  # "auto": CUDA packages whose kernels are Triton's; "never"; "generated": Triton's on any device (tests)


def gpu_nms(graph: Graph, device_type: str, refused: dict[int, str], triton: bool) -> int:
    """Rewrite in place; returns how many NMS calls became kernels."""
    if MODE == "never" or not triton or (MODE == "auto" and device_type != "cuda"):
        return 0
    literals = literals_of(graph)
    made = 0
    for block in blocks(graph):
        nodes: list[Node] = []
        for node in block.nodes:
            rewritten = _rewritten(node, literals, refused, made) if node.op == NMS else None
            if rewritten is None:
                nodes.append(node)
                continue
            nodes.extend(rewritten)
            made += 1
        block.nodes = nodes
    return made


def _rewritten(node: Node, literals: dict, refused: dict[int, str], number: int) -> Optional[list[Node]]:
    """The nodes standing for `node`; None where it stays torchvision's call (its NOT_LOWERED says why)."""
    boxes, scores, threshold = node.inputs
    count = _count(boxes.type, scores.type)
    stable = torchvision_sorts_stably(boxes.type.device) if count is not None else None
    form = torchvision_iou_form(boxes.type.device) if stable is not None else None
    why = ("verification took its kernels out" if node.uid in refused else
           "its boxes are not float32 [n, 4] and its scores [n] on one device, n a count the kernels can take "
           f"(got {boxes.type} and {scores.type})" if count is None else
           "its threshold is not a constant" if not isinstance(literals.get(threshold.id), float) else
           "torchvision's order of tied scores is neither ATen's stable nor its unstable sort's" if stable is None else
           "torchvision's overlap rounds in none of the forms the kernels compute (nms_facts.py)" if form is None
           else "")
    if why:
        node.attrs[Attr.NOT_LOWERED] = f"torchvision's NMS as kernels (gpu_nms.py): not taken, {why}"
        return None
    device, made = boxes.type.device, []
    # An opaque count (a cat of per-level candidates: FCOS, SSD) is bound by the sort, from its indices' size: the
    # kernels right after it take it as any bound count
    opaque = count if isinstance(count, str) else None
    count = SymSize.symbol(opaque) if opaque else count
    dims = {**K.dims(), **({opaque: (0, None, EXAMPLE_BOXES)} if opaque else {})}

    def add(op: str, inputs: list[Value], outputs: list[Value], **attrs) -> list[Value]:
        schema = {Attr.SCHEMA: schema_of(op)} if op.startswith("aten::") else {}
        made.append(Node(op, inputs, outputs, source=node.source, attrs={Attr.SYNTHETIC: True, **schema, **attrs}))
        return outputs

    def constant(name: str, value, kind: str) -> Value:
        return add("prim::Constant", [], [Value(f"{node.output.name}_{name}", Type(kind))], **{Attr.VALUE: value})[0]

    def tensor(name: str, dtype: str, shape: tuple) -> Value:
        return Value(f"{node.output.name}_{name}",
                     Type("Tensor", dtype, shape, device, strides=contiguous_strides(shape)))

    _, order = add("aten::sort.stable", [scores, constant("stable", stable, "bool"), constant("dim", 0, "int"),
                                         constant("descending", True, "bool")],
                   [tensor("sorted_scores", "float32", (count,)), tensor("order", "int64", (count,))],
                   **({Attr.BINDS: [(1, 0, opaque)]} if opaque else {}))
    (ranked,) = add("aten::index_select", [boxes, constant("dim0", 0, "int"), order],
                    [tensor("sorted_boxes", "float32", (count, 4))])
    words = tensor("nms_mask", "int8", (count * count + 8 * count,))
    keep = tensor("nms_keep", "bool", (count,))
    name = f"nms{number}"
    line = [provenance_line(node)]
    mask = K.NmsMaskKernel(f"{name}_mask", (), [_buffer(ranked)], [_buffer(words)], [], provenance=line,
                           dims=dims, threshold=float(literals[threshold.id]), iou_form=form)
    walk = K.NmsWalkKernel(f"{name}_walk", (), [_buffer(words)], [_buffer(keep)], [], provenance=line, dims=dims)
    for kernel, inputs, outputs in ((mask, [ranked], [words]), (walk, [words], [keep])):
        made.append(Node(KERNEL_OP, inputs, outputs, source=node.source,
                         attrs={Attr.KERNEL: kernel, Attr.FUSED: [node]}))
    binds = {Attr.BINDS: node.attrs[Attr.BINDS]} if Attr.BINDS in node.attrs else {}
    # (the kept count, bound where it was; a wrong keep flag shows first here, the NMS's own output)
    add("aten::masked_select", [order, keep], [node.output], **binds, **{Attr.FINISHES: (made[-1], node)})
    return made


def _count(boxes: Type, scores: Type):
    """n where boxes are float32 [n, 4] and scores float32 [n] on one device, n an int, a polynomial over sizes
    bound at run time or an opaque size (a str, which the rewrite binds); else None."""
    if not (boxes.is_tensor and scores.is_tensor and boxes.dtype == scores.dtype == "float32"
            and boxes.device == scores.device and boxes.shape is not None and scores.shape is not None
            and len(boxes.shape) == 2 and boxes.shape[1] == 4 and len(scores.shape) == 1):
        return None
    n = boxes.shape[0]
    if not isinstance(n, (int, SymSize, str)) or scores.shape[0] != n or _largest(n) > MAX_BOXES:
        return None
    return n


def _largest(n) -> int:
    """The most boxes `n` may count: itself, or its value at its dims' largest sizes (0 where one has no bound:
    a count read from data, which the detectors this is for keep to thousands)."""
    if isinstance(n, (int, str)):
        return n if isinstance(n, int) else 0
    dims = K.dims()
    largest = {name: dims[name][1] for name in n.names if name in dims}
    return n.evaluate(largest) if len(largest) == len(n.names) and None not in largest.values() else 0


def _buffer(value: Value) -> K.KernelBuffer:
    t = value.type
    return K.KernelBuffer(f"buf{value.id}", t.dtype, tuple(t.shape), tuple(t.strides))
