"""Whether a model's outputs depend discretely on its float values: a box picked by a score threshold, a top-k, NMS,
an argmax, a count of a mask, a branch taken on a tensor's value.

Such a model is frozen without torch.jit.freeze's numerics-changing folding (conv-BatchNorm, conv-add, conv-mul):
folding rounds differently from the model the user runs, and a threshold turns a last-bit difference into another
box, label or count (issue 46: FCOS and Mask R-CNN returned the frozen model's boxes, not the user's). A model
without such decisions keeps folding: a rounding difference there stays a rounding difference in its outputs.

The analysis follows values from the model's tensors (its inputs and parameters), cut where only a size is read, and
marks a decision where such a value meets a sort (its indices used), NMS, a nonzero, or a comparison whose mask
indexes, is counted, or becomes a Python bool or number; and where a number taken from such a tensor is compared.
"""
from __future__ import annotations

import torch

# ops whose result is a choice among the input's elements (for those with (values, indices) outputs: the indices)
CHOOSING = frozenset("aten::argmax aten::argmin aten::argsort aten::nonzero aten::nonzero_numpy aten::nonzero_static "
                     "aten::argwhere aten::masked_select aten::unique_consecutive aten::_unique2 aten::unique_dim "
                     "aten::searchsorted aten::bucketize aten::histc torchvision::nms".split())
CHOOSING_BY_INDICES = frozenset("aten::topk aten::sort aten::max aten::min aten::kthvalue aten::median "
                                "aten::nanmedian aten::mode aten::cummax aten::cummin".split())
COMPARISONS = frozenset("aten::gt aten::lt aten::ge aten::le aten::eq aten::ne aten::greater aten::less "
                        "aten::greater_equal aten::less_equal aten::not_equal".split())
# a mask (a comparison's result) used here decides: which elements are kept, how many, or which branch runs
MASK_DECIDES = frozenset("aten::index aten::index_put aten::index_put_ aten::Bool aten::is_nonzero aten::item "
                         "aten::Int aten::Float aten::ScalarImplicit aten::any aten::all aten::sum "
                         "aten::count_nonzero prim::If".split())
# a mask stays a mask through these (logic, views, lists of index tensors)
MASK_KEEPS = frozenset("aten::logical_and aten::logical_or aten::logical_xor aten::logical_not aten::__and__ "
                       "aten::__or__ aten::__xor__ aten::__iand__ aten::__ior__ aten::bitwise_and aten::bitwise_or "
                       "aten::bitwise_xor aten::bitwise_not aten::__invert__ aten::to aten::view aten::reshape "
                       "aten::flatten aten::squeeze aten::unsqueeze aten::expand aten::expand_as aten::permute "
                       "aten::transpose aten::t aten::contiguous aten::clone aten::detach aten::select aten::slice "
                       "prim::ListConstruct aten::stack aten::cat aten::__getitem__".split())
# ops that read only a tensor's size, type or place: their result does not depend on its values
SIZE_ONLY = frozenset("aten::size aten::sym_size aten::dim aten::numel aten::len aten::__len__ prim::device "
                      "prim::dtype prim::layout prim::shape aten::is_floating_point aten::zeros_like aten::ones_like "
                      "aten::empty_like aten::new_zeros aten::new_ones aten::new_empty".split())


def discrete_decisions(graph: torch._C.Graph) -> list[str]:
    """The ops at which `graph`'s (inlined) outputs depend discretely on its tensors' values, sorted; [] if none."""
    walk = _Walk()
    walk.taint.update(v.unique() for v in graph.inputs() if _holds_tensors(v))
    walk.block(graph.block())
    return sorted(walk.decisions)


def _holds_tensors(value) -> bool:
    return "Tensor" in str(value.type())


class _Walk:
    def __init__(self) -> None:
        self.taint: set[int] = set()  # values computed from the model's tensors' values
        self.mask: set[int] = set()  # of those, comparison results (and logic, views, lists of them)
        self.decisions: set[str] = set()

    def block(self, block) -> None:
        for node in block.nodes():
            self.node(node)

    def node(self, node) -> None:
        kind = node.kind()
        inputs = list(node.inputs())
        tainted = any(v.unique() in self.taint for v in inputs)
        if kind == "prim::Loop":  # (twice: a value the body carries round takes its taint from the last pass)
            body = next(node.blocks())
            carried = list(body.inputs())[1:]
            for _ in range(2):
                for param, given, returned in zip(carried, inputs[2:], list(body.outputs())[1:]):
                    if given.unique() in self.taint or returned.unique() in self.taint:
                        self.taint.add(param.unique())
                self.block(body)
        else:
            for inner in node.blocks():
                self.block(inner)
        if kind == "prim::GetAttr":
            tainted = _holds_tensors(node.output())
        elif kind in SIZE_ONLY:
            tainted = False
        elif not tainted:
            tainted = any(v.unique() in self.taint for b in node.blocks() for v in b.outputs())
        if tainted:
            self.taint.update(v.unique() for v in node.outputs())
        self.decide(node, kind, inputs, tainted)

    def decide(self, node, kind: str, inputs: list, tainted: bool) -> None:
        masked = any(v.unique() in self.mask for v in inputs)
        if tainted and kind in CHOOSING:
            self.decisions.add(kind)
        elif tainted and kind in CHOOSING_BY_INDICES and node.outputsSize() > 1 and node.outputsAt(1).uses():
            self.decisions.add(kind)
        elif tainted and kind in COMPARISONS:
            if any(_holds_tensors(v) for v in inputs):
                self.mask.update(v.unique() for v in node.outputs())
            else:  # a number taken from a tensor, compared: a Python decision on the model's values
                self.decisions.add(kind)
        elif masked and kind in MASK_DECIDES:
            self.decisions.add(kind)
        elif masked and kind in MASK_KEEPS:
            self.mask.update(v.unique() for v in node.outputs())
        elif kind == "aten::where" and len(inputs) == 1 and tainted:  # where(condition): nonzero's indices
            self.decisions.add(kind)
