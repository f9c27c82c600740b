"""What a rewrite of the installed torchvision's NMS must keep, asked of torchvision itself once per device:

- the order of boxes of equal scores: 0.26 sorts scores stably, 0.28 built for torch 2.13 with ATen's unstable sort
  (native_ops.py's CPU kernel and gpu_nms.py's kernels sort as it does);
- how its overlap rounds: torchvision's CUDA `devIoU` computes `inter / (Sa + Sb - inter)` in float, and which of
  those products its compiler fused into an FMA decides boxes whose overlap sits on the threshold (on an H200 with
  0.26, the later box's area into the earlier's; the CPU kernel rounds every op). gpu_nms.py's kernels compute the
  form found here, and no form, no kernels.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

# The forms of `Sa + Sb - inter` (Sa the earlier box's area, wa * ha; Sb the later's, wb * hb) the probe tells apart
IOU_FORMS = ("plain", "fma_earlier", "fma_later")
PROBE_PAIRS = 50000  # box pairs drawn on the threshold, each moved a few float32 steps to where forms disagree
STEPS = 16  # ... at most this many steps of the later box's right edge either way


@functools.lru_cache(maxsize=None)
def torchvision_sorts_stably(device: str) -> Optional[bool]:
    """Whether torchvision's nms on `device` orders tied scores as ATen's stable sort (True) or its unstable sort
    (False) does; None where neither, or where the op is missing. Asked once: 512 disjoint boxes (all kept, in
    score order) of four scores shared by 128 each. Where both sorts give its order, stable (torchvision's CUDA
    code asks for a stable sort)."""
    corner = torch.arange(512, dtype=torch.float32, device=device)[:, None] * 10
    boxes = torch.cat([corner, corner, corner + 5, corner + 5], 1)
    scores = (torch.arange(512, device=device) % 4).float() / 4
    try:
        kept = torch.ops.torchvision.nms(boxes, scores, 0.5)
    except (AttributeError, RuntimeError):
        return None
    for stable in (True, False):
        if torch.equal(kept, torch.sort(scores, descending=True, stable=stable)[1]):
            return stable
    return None


@functools.lru_cache(maxsize=None)
def torchvision_iou_form(device: str) -> Optional[str]:
    """The form of IOU_FORMS torchvision's nms rounds its overlap by on `device` (iou_form_of); None where the op is
    missing."""
    try:
        nms = torch.ops.torchvision.nms
    except (AttributeError, RuntimeError):
        return None
    return iou_form_of(nms, device)


def iou_form_of(nms, device: str) -> Optional[str]:
    """The one form of IOU_FORMS whose decisions are `nms`'s on `device`, on pairs of boxes whose overlap is within
    a few float32 steps of the threshold and on which the forms disagree; None where no form or more than one
    agrees."""
    threshold = 0.5
    earlier, later = telling_pairs(PROBE_PAIRS, threshold, torch.Generator().manual_seed(0), device)
    decided = {form: suppressed(earlier, later, threshold, form) for form in IOU_FORMS}
    count = len(earlier)
    if count == 0:
        return None
    scores = torch.cat([torch.full((count,), 2.0), torch.full((count,), 1.0)]).to(device)
    try:
        kept = nms(torch.cat([earlier, later]), scores, threshold)
    except RuntimeError:
        return None
    theirs = torch.ones(count, dtype=torch.bool, device=device)
    theirs[kept[kept >= count] - count] = False
    agreeing = [form for form in IOU_FORMS if torch.equal(decided[form], theirs)]
    return agreeing[0] if len(agreeing) == 1 else None


def suppressed(earlier: torch.Tensor, later: torch.Tensor, threshold: float, form: str) -> torch.Tensor:
    """Whether each later box overlaps its earlier one by more than `threshold`, in float32 as `form` rounds (an
    FMA through float64, whose product of two floats is exact)."""
    width = (torch.minimum(earlier[:, 2], later[:, 2]) - torch.maximum(earlier[:, 0], later[:, 0])).clamp(min=0)
    height = (torch.minimum(earlier[:, 3], later[:, 3]) - torch.maximum(earlier[:, 1], later[:, 1])).clamp(min=0)
    inter = width * height
    wa, ha = earlier[:, 2] - earlier[:, 0], earlier[:, 3] - earlier[:, 1]
    wb, hb = later[:, 2] - later[:, 0], later[:, 3] - later[:, 1]
    if form == "plain":
        total = wa * ha + wb * hb
    elif form == "fma_earlier":
        total = (wa.double() * ha.double() + (wb * hb).double()).float()
    else:
        total = (wb.double() * hb.double() + (wa * ha).double()).float()
    overlap = (inter.double() / (total - inter).double()).float()  # (a float32 quotient, rounded once)
    return overlap > torch.tensor(threshold, dtype=torch.float32, device=earlier.device)


def telling_pairs(k: int, threshold: float, generator: torch.Generator,
                  device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Of k threshold_pairs, those whose later box, its right edge moved by at most STEPS float32 steps, is
    suppressed in one form and kept in another (moved so): (earlier, later), [m, 4] each, on `device`."""
    earlier, later = (pairs.to(device) for pairs in threshold_pairs(k, threshold, generator))
    found = torch.zeros(k, dtype=torch.bool, device=device)
    chosen = later.clone()
    edge = later[:, 2]
    step = torch.nextafter(edge, torch.full_like(edge, float("inf"))) - edge
    for moved in range(-STEPS, STEPS + 1):
        candidate = later.clone()
        candidate[:, 2] = edge + moved * step
        decided = [suppressed(earlier, candidate, threshold, form) for form in IOU_FORMS]
        apart = ~found & ((decided[1] != decided[0]) | (decided[2] != decided[0]))
        chosen[apart] = candidate[apart]
        found |= apart
    return earlier[found], chosen[found]


def threshold_pairs(k: int, threshold: float, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """k pairs of boxes (earlier [k, 4], later [k, 4]) whose overlap is within a few float32 steps of `threshold`,
    each pair 1,000 units from the others, so no box overlaps another pair's."""
    x0, y0 = torch.rand(k, generator=generator) * 300, torch.rand(k, generator=generator) * 300
    w, h = torch.rand(k, generator=generator) * 200 + 1, torch.rand(k, generator=generator) * 200 + 1
    earlier = torch.stack([x0, y0, x0 + w, y0 + h], 1)
    s = (1 - threshold) / (1 + threshold)
    dx = w * s * torch.rand(k, generator=generator)
    dy = h - (threshold * 2 * w * h / (1 + threshold) / (w - dx)).clamp(max=h)
    later = earlier + torch.stack([dx, dy, dx, dy], 1)
    later = later + torch.randint(-3, 4, later.shape, generator=generator) * 1.2e-7 * later.abs()
    cell = torch.arange(k, dtype=torch.float32)
    offset = torch.stack([(cell % 150) * 1000, (cell // 150) * 1000] * 2, 1)
    return earlier + offset, later + offset
