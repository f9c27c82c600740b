"""How the installed torchvision's NMS orders boxes of equal scores, which a rewrite of it must keep: 0.26 sorts
scores stably, 0.28 built for torch 2.13 with ATen's unstable sort (native_ops.py's CPU kernel, gpu_nms.py's CUDA
kernels sort as it does)."""
from __future__ import annotations

import functools
from typing import Optional

import torch


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
