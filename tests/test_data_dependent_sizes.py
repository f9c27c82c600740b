"""Data-dependent sizes: post-processing whose output sizes depend on the values (boolean-mask indexing, nonzero,
masked_select, unique, one-argument where, a split at a computed count, a slice or topk by a computed count, an NMS
written in TorchScript) converts and matches TorchScript on fresh inputs whose counts differ from the example's, in every backend. A size
the package fixed at conversion that then changes makes verification fail (kernels out), never pass with a note."""
from __future__ import annotations

import pytest
import torch

import jit2triton

from jit2triton.deploy.packaging.graph_regions import group_regions

from helpers import BACKENDS, assert_same, convert_for, to_cpu, to_device


@torch.jit.script
def positives(x):
    return torch.relu(x[x > 0] * 2 + 1).sin()


@torch.jit.script
def nonzero_rows(x):
    rows = torch.nonzero(x.sum(1) > 0).squeeze(1)
    return (x[rows] * 3).exp().sum(0), rows


@torch.jit.script
def selected(x, y):
    picked = torch.masked_select(x, y > 0.2)
    return picked * picked + 1, torch.where(y > 0.5)[0]


@torch.jit.script
def uniques(ids):
    values, counts = torch.unique(ids, return_counts=True)
    return values * 2, counts.float().softmax(0)


@torch.jit.script
def top_by_count(scores):
    k = int((scores > 0).sum()) + 1
    top = torch.topk(scores, k).values
    return top.sigmoid() * 2, scores[: k // 2 + 1].cos()


@torch.jit.script
def split_at(x, y):
    # split where a count says (ATen takes the split points on the CPU only, as a model that runs on CUDA has them)
    first, rest = torch.tensor_split(x, (y > 0).sum().reshape(1).cpu())
    return (first * 2).sin(), rest.exp() + 1


@torch.jit.script
def box_iou(a, b):
    lt = torch.max(a[:, None, :2], b[None, :, :2])
    rb = torch.min(a[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(2)
    area_a = (a[:, 2:] - a[:, :2]).prod(1)
    area_b = (b[:, 2:] - b[:, :2]).prod(1)
    return inter / (area_a[:, None] + area_b[None, :] - inter)


@torch.jit.script
def postprocess(boxes, scores):
    """A detection head's post-process: threshold, sort, keep the best 50, pairwise-IoU suppression."""
    keep = scores > 0.3
    boxes, scores = boxes[keep], scores[keep]
    order = scores.argsort(descending=True)[:50]
    boxes, scores = boxes[order], scores[order]
    iou = box_iou(boxes, boxes)
    suppressed = torch.zeros(boxes.shape[0], dtype=torch.bool, device=boxes.device)
    for i in range(boxes.shape[0]):
        if not bool(suppressed[i]):
            suppressed = suppressed | ((iou[i] > 0.5) & (torch.arange(boxes.shape[0], device=boxes.device) > i))
    return boxes[~suppressed] * 2.0, scores[~suppressed].sqrt()


def _boxes(n: int, generator: torch.Generator) -> torch.Tensor:
    corner = torch.rand(n, 2, generator=generator) * 100
    return torch.cat([corner, corner + 5 + torch.rand(n, 2, generator=generator) * 30], 1)


def _inputs(name: str, seed: int) -> tuple:
    g = torch.Generator().manual_seed(seed)
    if name == "positives":
        return (torch.randn(64, generator=g),)
    if name == "nonzero_rows":
        return (torch.randn(16, 8, generator=g),)
    if name == "selected":
        return torch.randn(8, 8, generator=g), torch.rand(8, 8, generator=g)
    if name == "uniques":
        return (torch.randint(0, 40, (24,), generator=g),)
    if name == "top_by_count":
        return (torch.randn(32, generator=g),)
    if name == "split_at":
        return torch.randn(32, 4, generator=g), torch.randn(32, generator=g)
    return _boxes(160, g), torch.rand(160, generator=g)


PROGRAMS = {"positives": positives, "nonzero_rows": nonzero_rows, "selected": selected, "uniques": uniques,
            "top_by_count": top_by_count, "split_at": split_at, "postprocess": postprocess}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_data_dependent_sizes_follow_the_data(name, backend):
    program = PROGRAMS[name]
    converted = convert_for(program, _inputs(name, 0), backend)
    verification = converted.summary()["verification"]
    # shape inference saw the counts vary: no kernel was fitted to the example's count for verification to take out
    assert verification["status"] == "passed" and not verification["kernels_removed"], verification
    device = converted.device
    sizes = set()
    for seed in range(1, 6):
        inputs = _inputs(name, seed)
        expected = program(*inputs)
        actual = to_cpu(converted(*to_device(inputs, device)))
        assert_same(actual, expected, f"{name} at seed {seed}")
        sizes.add(tuple(x.shape[0] for x in (expected if isinstance(expected, tuple) else (expected,))))
    assert len(sizes) > 1, "the draws must change the data-dependent sizes, or the test proves nothing"


def test_a_size_fixed_at_conversion_fails_verification(monkeypatch):
    """Without the other values shape inference runs on, and were the number `int(mask.sum())` not known to be read
    out of data (data_sizes.py, switched off here), topk's size would be the example's count: verification must
    catch that on the fresh draw (a refused or differently sized draw is a failure, not a note) and leave a package
    that follows the data."""
    from jit2triton import conversion
    from jit2triton.transpiler import data_sizes
    monkeypatch.setattr(conversion, "VALUE_SHIFTS", ())
    monkeypatch.setattr(data_sizes, "_reads_a_number", lambda *args: False)
    converted = jit2triton.convert(top_by_count, _inputs("top_by_count", 0))
    verification = converted.summary()["verification"]
    assert verification["kernels_removed"], verification
    for seed in (3, 4):
        x = _inputs("top_by_count", seed)
        assert_same(converted(*x), top_by_count(*x))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_count_that_never_varied_while_converting_still_follows_the_data(backend, monkeypatch):
    """With one other draw of values, unshifted, `argsort(...)[:50]` over the boxes above the threshold is 50 in
    every run conversion makes; a later input with a dozen boxes above it must still be right: sizes computed from a
    mask's count stay opaque (transpiler/data_sizes.py), whatever the draws saw."""
    from jit2triton import conversion
    monkeypatch.setattr(conversion, "VALUE_SHIFTS", (0.0,))
    converted = convert_for(postprocess, _inputs("postprocess", 0), backend)
    g = torch.Generator().manual_seed(5)
    boxes, scores = _boxes(160, g), torch.rand(160, generator=g) * 0.35  # ~14% above 0.3
    expected = postprocess(boxes, scores)
    assert expected[0].shape[0] < 50
    assert_same(to_cpu(converted(*to_device((boxes, scores), converted.device))), expected)


def test_a_size_changed_on_a_fresh_draw_is_a_mismatch_not_a_note():
    """The package raising SizeChangedError on inputs that fit its signature is a failure of the package."""
    from jit2triton.errors import SizeChangedError
    from jit2triton.verify import Verifier
    x = torch.randn(64)
    verifier = Verifier(positives, [x], [{"name": "x", "type": "Tensor", "dtype": "float32", "shape": [64]}],
                        torch.device("cpu"))

    def package(y):
        if not torch.equal(y, x):
            raise SizeChangedError("kernel input 0 has shape [30], but the package was converted for [33]")
        return positives(y)
    mismatches = verifier.check(package)
    assert [m.where for m in mismatches] == ["on fresh random inputs"] and not verifier.notes


class RelativeBias(torch.nn.Module):
    """Swin's relative position bias: a table indexed by a constant integer buffer, which freezing makes a constant
    list of tensors. Its size is the index's, not data's: what follows it fuses."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("index", torch.randint(0, 9, (16,)))

    def forward(self, table):
        return torch.sigmoid(table[self.index].view(4, 4, -1).permute(2, 0, 1)) * 16.0


def test_an_integer_index_frozen_into_a_constant_leaves_sizes_known() -> None:
    model = torch.jit.trace(RelativeBias().eval(), (torch.randn(9, 3),))
    converted = jit2triton.convert(model, (torch.randn(9, 3),), backend="cpp")
    assert converted.summary()["fallback_nodes"] == 0, converted.report()
    table = torch.randn(9, 3)
    torch.testing.assert_close(converted(table), model(table))


# --- what follows a mask runs in generated kernels, over the count read at run time -------------------------------

KERNEL_OPS = ("aten::sub.Tensor", "aten::div.Tensor", "aten::clamp", "aten::prod.dim_int", "aten::__and__.Tensor",
              "aten::mul.Scalar", "aten::sqrt")


def _scores_above(n: int, seed: int) -> tuple:
    """Boxes with exactly `n` scores above the threshold (0 and 160 included)."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.rand(160, generator=g) * 0.3
    scores[torch.randperm(160, generator=g)[:n]] += 0.31
    return _boxes(160, g), scores


@pytest.mark.parametrize("backend", BACKENDS)
def test_what_follows_a_mask_runs_in_kernels_over_the_count(backend, tmp_path, cpp_runtime):
    """The box arithmetic after `boxes[scores > t]`, the best 50 and the suppression loop's comparisons are
    generated kernels taking the counts the runtime reads from the ATen tensors that carry them (conversion's draws
    thinned the mask, so it saw which sizes are counts and which, the 4 and 2 coordinates, are not); every count
    from none to all 160, and fewer or more than 50, gives TorchScript's answer,."""
    converted = convert_for(postprocess, _inputs("postprocess", 0), backend)
    summary = converted.summary()
    assert summary["verification"]["status"] == "passed" and not summary["verification"]["kernels_removed"]
    fallen = {op: summary["fallback_reasons"][op] for op in KERNEL_OPS if op in summary["fallback_ops"]}
    assert not fallen, fallen
    assert converted.manifest["plan"].get("bound_dims"), "no count was read at run time"
    path = tmp_path / "postprocess.j2t"
    converted.save(path)
    package = jit2triton.load(path)
    for n in (0, 1, 7, 49, 50, 51, 160):
        inputs = _scores_above(n, seed=n)
        expected = postprocess(*inputs)
        assert_same(to_cpu(package(*to_device(inputs, converted.device))), expected, f"{n} above the threshold")


def test_a_kernel_over_a_count_stays_out_of_cuda_graph_regions():
    """A region is a CUDA graph per size it runs at, and a count takes a new size call after call: the kernels
    over a count read from data stay out of regions, and out of a whole-plan graph; other kernels group as before."""
    from jit2triton.deploy.packaging.graph_regions import capturable
    kernel = lambda node, sizes=(): {"kind": "kernel", "kernel": f"k{node}", "args": [["s", node]],  # noqa: E731
                                     "outs": [node + 1], "node": node, **({"sizes": list(sizes)} if sizes else {})}
    plan = {"inputs": [0], "steps": [kernel(i, ("s1",) if i == 5 else ()) for i in range(11)],
            "outputs": [["s", 11]], "num_slots": 12}
    nodes = [{"op": "kernel", "category": "pointwise"}] * 11
    grouped = group_regions(plan, nodes, counts=frozenset({"s1"}))
    regions = [[s["node"] for s in step["steps"]] for step in grouped["steps"] if step["kind"] == "graph"]
    assert regions == [[0, 1, 2, 3, 4], [6, 7, 8, 9, 10]], grouped["steps"]
    assert capturable(plan) and not capturable(plan, counts=frozenset({"s1"}))
    assert [s["kind"] for s in group_regions(plan, nodes)["steps"]] == ["graph"]  # (without counts: one region)


def _greedy_nms(boxes: torch.Tensor, scores: torch.Tensor, threshold: float) -> torch.Tensor:
    order = scores.argsort(descending=True)
    iou = box_iou(boxes, boxes)
    kept: list[int] = []
    for i in order.tolist():
        if all(float(iou[i, j]) <= threshold for j in kept):
            kept.append(i)
    return torch.tensor(kept, dtype=torch.int64, device=boxes.device)


def _nms_op():
    """torchvision's NMS, or (where torchvision is not installed) an op of its name and schema doing the same."""
    try:
        import torchvision  # noqa: F401
    except ImportError:
        if not hasattr(torch.ops.torchvision, "nms"):
            library = torch.library.Library("torchvision", "FRAGMENT")  # (other tests add their stand-ins)
            library.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
            library.impl("nms", _greedy_nms, "CPU")
            _nms_op.library = library  # (kept alive: the op goes with it)
    return torch.ops.torchvision.nms


def test_what_follows_nms_runs_in_kernels_over_its_count(request):
    """NMS's kept boxes are a count too: conversion's draws cut them to their best few, so what follows (the kept
    boxes scaled, their scores' sigmoid, the best 10 of them) is kernels over counts, right at every count."""
    _nms_op()

    @torch.jit.script
    def detect(boxes, scores):
        keep = torch.ops.torchvision.nms(boxes, scores, 0.3)[:10]
        return boxes[keep] * 0.5 + 1.0, torch.sigmoid(scores[keep]) * 2.0

    converted = jit2triton.convert(detect, _inputs("postprocess", 0), backend="cpp")
    summary = converted.summary()
    assert summary["verification"]["status"] == "passed" and not summary["verification"]["kernels_removed"]
    assert "aten::sigmoid" not in summary["fallback_ops"] and "aten::mul.Scalar" not in summary["fallback_ops"], \
        summary["fallback_reasons"]
    counts = set()
    for seed, spread in enumerate((0.02, 0.1, 1.0, 50.0)):  # boxes on top of each other .. far apart
        g = torch.Generator().manual_seed(seed)
        boxes = _boxes(160, g)
        boxes = boxes - boxes[:, :2].repeat(1, 2) * (1 - spread)
        inputs = (boxes, torch.rand(160, generator=g))
        expected = detect(*inputs)
        counts.add(expected[0].shape[0])
        assert_same(converted(*inputs), expected, f"boxes spread {spread}")
    assert len(counts) > 1, counts


@torch.jit.script
def few_positives(x):
    # (fuzz seeds 21074 and 31245: three elements, so the value draws may all count as many positives)
    top = torch.topk(x.reshape(-1), int((x > 0.0).sum()) + 1).values
    return torch.exp(top.clamp(-8.0, 8.0))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_size_set_by_a_number_read_out_of_data_follows_it(backend, monkeypatch):
    """topk's k is `int(count) + 1`, a number read out of the data: the size it sets follows each call's data even
    when every draw during conversion counted the same (here forced: no other values are drawn), and no kernel was
    fitted to the example's count for verification to take out."""
    from jit2triton import conversion
    monkeypatch.setattr(conversion, "VALUE_SHIFTS", ())
    example = (torch.tensor([[0.5], [-1.0], [2.0]]),)
    converted = convert_for(few_positives, example, backend)
    verification = converted.summary()["verification"]
    assert verification["status"] == "passed" and not verification["kernels_removed"], verification
    for x in ([[-0.5], [-1.0], [-2.0]], [[0.3], [-1.0], [-2.0]], [[0.5], [1.0], [-2.0]]):  # 0, 1, 2 positive
        x = torch.tensor(x) * (1 + torch.rand(3, 1))
        assert_same(to_cpu(converted(*to_device((x,), converted.device))), few_positives(x))


@torch.jit.script
def scaled_by_best(x, scores):
    """One number out of data-sized tensors (the best kept score, one label of unique's) scales and compares
    tensors of known sizes."""
    best = scores[scores > 0.3].max()
    first = torch.unique((scores * 4).long())[0]
    return (x / best + 1).relu(), (scores * 4).long() == first


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_0_dim_value_out_of_data_sizes_keeps_what_it_scales_in_kernels(backend):
    """A 0-dim tensor has no size for data to set: the ops that take one out of a mask's or unique's output as an
    operand keep their other operand's sizes, and run in kernels (they ran through ATen, their sizes opaque)."""
    draw = lambda seed: (torch.randn(6, 5, generator=torch.Generator().manual_seed(seed)),  # noqa: E731
                         torch.rand(40, generator=torch.Generator().manual_seed(seed + 1)) * 0.9 + 0.05)
    converted = convert_for(scaled_by_best, draw(0), backend)
    summary = converted.summary()
    fallen = {op: summary["fallback_reasons"][op] for op in ("aten::div.Tensor", "aten::relu", "aten::eq.Tensor")
              if op in summary["fallback_ops"]}
    assert not fallen, fallen
    for seed in range(1, 5):
        inputs = draw(seed)
        assert_same(to_cpu(converted(*to_device(inputs, converted.device))), scaled_by_best(*inputs), f"draw {seed}")
