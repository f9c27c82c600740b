"""A loop's per-slice masks are counted once before the loop (transpiler/loop_counts.py): each iteration's
`nonzero` becomes `nonzero_static` sized by the count read there, so on CUDA the loop no longer waits for the GPU
once per iteration. Checked against TorchScript on fresh inputs whose counts differ from the example's and from
one another (none to all of a slice), on both backends; left alone where the loop writes the tensor, or where a
comparison's operand is not the same for the whole tensor as for a slice. The pass runs for CUDA packages; these
tests run it for CPU packages too. And a loop's reads of integers out of a tensor it does not change (Mask R-CNN's
paste loop) read the tensor once before the loop, the arithmetic on them done on the host (every device), left
alone for floats and for a tensor the loop writes."""
from __future__ import annotations

import dataclasses
import os
import tempfile

import pytest
import torch
from torch import Tensor

import jit2triton
from jit2triton import Dim

from helpers import BACKENDS, convert_for, plan_ops


class PerClass(torch.nn.Module):
    """torchvision SSD's post-process: per class a threshold, the scores and boxes it keeps, their best few."""

    def forward(self, boxes: Tensor, scores: Tensor, thresh: float):
        out_boxes, out_scores, out_labels = [], [], []
        for label in range(1, scores.shape[1]):
            score = scores[:, label]
            keep = score > thresh
            score = score[keep]
            box = boxes[keep]
            score, order = score.topk(min(5, score.size(0)))
            out_boxes.append(box[order])
            out_scores.append(score)
            out_labels.append(torch.full_like(order, fill_value=label))
        return torch.cat(out_boxes), torch.cat(out_scores), torch.cat(out_labels)


class PerImagePerClass(torch.nn.Module):
    """SSD's shape: a loop over the images, in it the per-class loop over that image's scores (made in the outer
    loop, so counted once per image, before the inner loop)."""

    def forward(self, scores: Tensor, boxes: Tensor):
        kept: list[Tensor] = []
        for image in range(scores.shape[0]):
            image_scores = scores[image] * 1.5
            for label in range(1, image_scores.shape[1]):
                keep = image_scores[:, label] > 0.6
                kept.append(image_scores[:, label][keep] + boxes[image][keep].sum(1))
        return torch.cat(kept) if len(kept) > 0 else scores.new_zeros(0)


class Rows(torch.nn.Module):
    """A slice per row (dim 0, the loop's counter itself), compared with a 0-dim tensor; the mask read once."""

    def forward(self, x: Tensor, low: Tensor):
        total = torch.zeros(())
        for i in range(x.size(0)):
            total = total + x[i][torch.nonzero(x[i] <= low)[:, 0]].sum() * (i + 1)
        return total


class WrittenInLoop(torch.nn.Module):
    """The loop writes the scores it slices: each count must be read after the write, where the loop makes it.
    (Each mask read twice, so that shared_masks.py gives it a nonzero.)"""

    def forward(self, scores: Tensor):
        kept = []
        for label in range(scores.shape[1]):
            score = scores[:, label]
            keep = score > 0.5
            kept.append(score[keep].sum() + scores[keep].sum())
            scores[:, (label + 1) % scores.shape[1]] += 0.25
        return torch.stack(kept)


class PerRowThreshold(torch.nn.Module):
    """A threshold per element: the whole tensor's comparison would broadcast it otherwise than the slice's."""

    def forward(self, scores: Tensor, thresh: Tensor):
        kept = []
        for label in range(scores.shape[1]):
            score = scores[:, label]
            keep = score > thresh
            kept.append(score[keep].sum() + scores[keep].sum())
        return torch.stack(kept)


@pytest.fixture(autouse=True)
def on_the_cpu_too(monkeypatch):
    """The pass runs for CUDA packages only (on the CPU it saves no synchronisation and costs time); here it runs for
    CPU packages too, so that its rewrites are checked on this machine, under both CPU backends."""
    from jit2triton.transpiler import pipeline
    monkeypatch.setattr(pipeline, "PASSES", [dataclasses.replace(p, devices=pipeline.ALL_DEVICES)
                                             if p.name == "count_masks_before_loops" else p for p in pipeline.PASSES])


def _check(model, draw, backend: str, calls: int = 6, **options):
    """`calls` fresh draws against TorchScript in the module convert gives, then in the package saved and loaded."""
    device = "cuda" if backend == "cuda" else "cpu"
    scripted = torch.jit.script(model.to(device))
    torch.manual_seed(0)
    package = convert_for(scripted, draw(), backend, **options)
    runtimes = [package]
    with tempfile.TemporaryDirectory() as folder:
        package.save(os.path.join(folder, "m.j2t"))
        runtimes.append(jit2triton.load(os.path.join(folder, "m.j2t")))
    assert [r.runtime for r in runtimes] == ["cpp", "cpp"]
    for runtime in runtimes:
        for _ in range(calls):
            inputs = tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in draw())
            want = scripted(*[x.clone() if isinstance(x, torch.Tensor) else x for x in inputs])
            got = runtime(*inputs)
            for got_one, want_one in zip(got if isinstance(got, tuple) else (got,),
                                         want if isinstance(want, tuple) else (want,)):
                assert got_one.shape == want_one.shape  # (the counts)
                torch.testing.assert_close(got_one, want_one, rtol=1e-6, atol=1e-6)
    notes = package.summary()["verification"]["notes"]  # (a wrong rewrite is caught there, and taken out)
    assert not any("optional rewrites" in note for note in notes), notes
    return package


def _copies_back(package, inputs: tuple) -> list[str]:
    """The device-to-host copies of one warm call (each a wait for the GPU)."""
    from torch.profiler import ProfilerActivity, profile
    package(*inputs)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        package(*inputs)
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if "Memcpy DtoH" in e.name]


def _scores(rows: int = 40, classes: int = 6) -> Tensor:
    """Per class, a scale: one class keeps none above 0.5, one all, the others some."""
    return torch.rand(rows, classes) * torch.tensor([1.0, 0.4, 0.6, 1.0, 2.0, 0.9, 1.2, 0.8][:classes])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_per_class_loop_reads_its_counts_before_it(backend) -> None:
    package = _check(PerClass(), lambda: (torch.rand(40, 4), _scores(), 0.5), backend)
    ops = plan_ops(package)
    assert "aten::nonzero" not in ops and ops.count("aten::nonzero_static") == 1, ops
    assert ops.count("prim::tolist") == 1  # the counts, read once a call
    assert package.summary()["verification"]["kernels_removed"] == []


def test_the_counts_follow_a_threshold_passed_in_and_a_dynamic_number_of_boxes() -> None:
    n = Dim("N", min=3, max=60)
    draw = lambda: (lambda n: (torch.rand(n, 4), _scores(n), float(torch.rand(()) * 0.8)))(  # noqa: E731
        int(torch.randint(3, 60, ())))
    package = _check(PerClass(), draw, "cpp", calls=8, dynamic_shapes=[{0: n}, {0: n}, None])
    assert "aten::nonzero_static" in plan_ops(package)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_per_class_loop_inside_a_per_image_loop(backend) -> None:
    package = _check(PerImagePerClass(), lambda: (_scores(30, 6)[None].repeat(2, 1, 1) * torch.rand(2, 1, 1),
                                                  torch.rand(2, 30, 4)), backend)
    assert plan_ops(package).count("aten::nonzero_static") == 1  # (in the inner loop, counted before it)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_slice_by_the_loop_counter_compared_with_a_0_dim_tensor(backend) -> None:
    package = _check(Rows(), lambda: (torch.randn(7, 9), torch.randn(())), backend)
    assert "aten::nonzero_static" in plan_ops(package)


def test_a_tensor_the_loop_writes_is_counted_in_the_loop() -> None:
    package = _check(WrittenInLoop(), lambda: (torch.rand(20, 4),), "cpp")
    assert "aten::nonzero_static" not in plan_ops(package)


def test_a_threshold_per_element_is_counted_in_the_loop() -> None:
    package = _check(PerRowThreshold(), lambda: (torch.rand(20, 4), torch.rand(20)), "cpp")
    assert "aten::nonzero_static" not in plan_ops(package)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_per_class_loop_waits_for_the_gpu_once_a_call() -> None:
    """The device-to-host copies of a call: the counts once, where each class's nonzero copied its count back."""
    scripted = torch.jit.script(PerClass().cuda())
    draw = lambda: (torch.rand(400, 4, device="cuda"), _scores(400, 8).cuda(), 0.5)  # noqa: E731
    copies = _copies_back(convert_for(scripted, draw(), "cuda"), draw())
    assert len(copies) <= 2, copies  # (7 classes: 7 copies before)


class PerLabelNms(torch.nn.Module):
    """torchvision's batched NMS for many boxes (`_batched_nms_vanilla`): per label of `unique(labels)`, the boxes
    of that label, `where(labels == class_id)`; here their best two stand for the NMS."""

    def forward(self, scores: Tensor, labels: Tensor):
        keep = torch.zeros_like(scores, dtype=torch.bool)
        for class_id in torch.unique(labels):
            indices = torch.where(labels == class_id)[0]
            best = scores[indices].argsort(descending=True)[:2]
            keep[indices[best]] = True
        kept = torch.where(keep)[0]
        return kept[scores[kept].sort(descending=True)[1]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_loop_over_unique_labels_reads_each_labels_count_before_it(backend) -> None:
    package = _check(PerLabelNms(), lambda: (torch.rand(50), torch.randint(0, 6, (50,))), backend)
    ops = plan_ops(package)
    assert ops.count("aten::where") == 1 and ops.count("aten::nonzero_static") == 1, ops  # (the loop's; and after)
    assert ops.count("aten::searchsorted.Tensor") == 2


def test_float_labels_are_counted_in_the_loop() -> None:
    """Equality of floats: NaN equals nothing, which a count by sorted order would miss."""
    package = _check(PerLabelNms(), lambda: (torch.rand(50), torch.randint(0, 6, (50,)).float()), "cpp")
    assert "aten::nonzero_static" not in plan_ops(package)


# --- integers read out of a loop-invariant tensor (read_ints_before_loops) -----------------------------------------

def _paste_mask_in_image(mask: Tensor, box: Tensor, im_h: int, im_w: int):
    """torchvision's `paste_mask_in_image` (Mask R-CNN): ten reads of the box's corners, each a wait on CUDA."""
    w = max(int(box[2] - box[0] + 1), 1)
    h = max(int(box[3] - box[1] + 1), 1)
    mask = torch.nn.functional.interpolate(mask.expand((1, 1, -1, -1)), size=(h, w), mode="bilinear",
                                           align_corners=False)[0][0]
    im_mask = torch.zeros((im_h, im_w), dtype=mask.dtype, device=mask.device)
    x_0 = max(box[0], 0)
    x_1 = min(box[2] + 1, im_w)
    y_0 = max(box[1], 0)
    y_1 = min(box[3] + 1, im_h)
    im_mask[y_0:y_1, x_0:x_1] = mask[(y_0 - box[1]):(y_1 - box[1]), (x_0 - box[0]):(x_1 - box[0])]
    return im_mask


class Paste(torch.nn.Module):
    """torchvision's `paste_masks_in_image`: the boxes are scaled by writes into a new tensor before the loop (which
    `.to` may alias), then pasted."""

    def forward(self, masks: Tensor, boxes: Tensor, im_h: int, im_w: int):
        scaled = torch.zeros_like(boxes)
        scaled[:, 0] = boxes[:, 0] - 1.0
        scaled[:, 1] = boxes[:, 1] - 1.0
        scaled[:, 2:] = boxes[:, 2:] + 1.0
        boxes = scaled.to(dtype=torch.int64)
        pasted = [_paste_mask_in_image(m[0], b, im_h, im_w) for m, b in zip(masks, boxes)]
        return torch.stack(pasted, dim=0)[:, None]


class PasteFloatBoxes(torch.nn.Module):
    """The same reads of float corners: float32 arithmetic on the device is not the host's (doubles)."""

    def forward(self, masks: Tensor, boxes: Tensor, im_h: int, im_w: int):
        pasted = [torch.zeros(im_h, im_w)[: int(b[3] - b[1] + 1), : int(b[2] - b[0] + 1)].sum() + m.sum()
                  for m, b in zip(masks, boxes)]
        return torch.stack(pasted)


class WritesItsBoxes(torch.nn.Module):
    """The loop moves the boxes it reads: each read must see the move."""

    def forward(self, boxes: Tensor):
        boxes = boxes.to(dtype=torch.int64)
        widths: list[int] = []
        for i in range(boxes.shape[0]):
            widths.append(int(boxes[i][2] - boxes[i][0]))
            boxes[(i + 1) % boxes.shape[0]] += 1
        return torch.tensor(widths)


class FirstFew(torch.nn.Module):
    """A loop of three iterations over a tensor of many rows: reading every row first would cost more."""

    def forward(self, boxes: Tensor, n: int):
        boxes = boxes.to(dtype=torch.int64)
        widths: list[int] = []
        for i in range(n):
            widths.append(int(boxes[i][2] - boxes[i][0]))
        return torch.tensor(widths)


class PartlyRead(torch.nn.Module):
    """Two reads of one row: the first also reads a comparison (not int64 arithmetic) and stays in the loop, after
    reaching the row; the second is rewritten, and must not take the row the first one never made."""

    def forward(self, boxes: Tensor, scale: Tensor):
        boxes = boxes.to(dtype=torch.int64)
        out: list[int] = []
        for i in range(boxes.shape[0]):
            box = boxes[i]
            first = int(box[0] * (scale[i] > 0.5).long())
            out.append(first + int(box[2] - box[0]))
        return torch.tensor(out)


def _masks_and_boxes(n: int = 12) -> tuple:
    """Boxes over a 40 x 48 image, some partly outside it (negative corners, corners past its edges)."""
    corner = torch.rand(n, 2) * torch.tensor([39.0, 33.0]) - 3
    size = torch.rand(n, 2) * 11 + 4
    return torch.rand(n, 1, 14, 14), torch.cat([corner, corner + size], 1), 40, 48


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_loop_reading_box_corners_reads_the_boxes_once(backend) -> None:
    package = _check(Paste(), _masks_and_boxes, backend)
    ops = plan_ops(package)
    assert not {"aten::Int.Tensor", "aten::IntImplicit"} & set(ops), ops
    assert ops.count("prim::tolist") == 1


def test_a_paste_loop_over_a_number_of_boxes_set_per_call() -> None:
    n = Dim("N", min=1, max=30)
    draw = lambda: _masks_and_boxes(int(torch.randint(1, 30, ())))  # noqa: E731
    package = _check(Paste(), draw, "cpp", calls=6, dynamic_shapes=[{0: n}, {0: n}, None, None])
    assert not {"aten::Int.Tensor", "aten::IntImplicit"} & set(plan_ops(package))


def test_a_read_left_in_the_loop_leaves_no_row_to_the_next() -> None:
    ops = plan_ops(_check(PartlyRead(), lambda: (torch.rand(9, 4) * 50, torch.rand(9)), "cpp"))
    assert ops.count("aten::Int.Tensor") == 1 and ops.count("prim::tolist") == 1, ops


def test_a_few_reads_of_a_long_tensor_stay_in_the_loop() -> None:
    ops = plan_ops(_check(FirstFew(), lambda: (torch.rand(400, 4) * 50, 3), "cpp"))
    assert "aten::Int.Tensor" in ops and "prim::tolist" not in ops


def test_float_corners_and_boxes_the_loop_writes_are_read_in_the_loop() -> None:
    ops = plan_ops(_check(PasteFloatBoxes(), _masks_and_boxes, "cpp"))
    assert "aten::Int.Tensor" in ops and "prim::tolist" not in ops
    ops = plan_ops(_check(WritesItsBoxes(), lambda: (torch.rand(9, 4) * 50,), "cpp"))
    assert "aten::Int.Tensor" in ops and "prim::tolist" not in ops


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_paste_loop_waits_for_the_gpu_once_a_call() -> None:
    scripted = torch.jit.script(Paste().cuda())
    draw = lambda: tuple(x.cuda() if isinstance(x, Tensor) else x for x in _masks_and_boxes())  # noqa: E731
    copies = _copies_back(convert_for(scripted, draw(), "cuda"), draw())
    assert len(copies) <= 2, copies  # (12 boxes, ten reads each: 120 before)
