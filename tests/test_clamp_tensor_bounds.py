"""`clamp` with tensor bounds (a per-row limit; an int bound the call gives, which a kernel reads as a 0-dim
tensor): a kernel computing ATen's max-then-min, NaN from any operand propagating, where it ran through ATen
before; and torchvision's clip_boxes_to_image after a threshold, whose `stack` along `boxes.dim()` failed to
lower while the rank was taken for a count."""
from __future__ import annotations

import pytest
import torch

from helpers import converted_and_loaded, fused_ops


def clip(boxes: torch.Tensor, height: torch.Tensor, width: torch.Tensor, limits: torch.Tensor):
    x = boxes[:, 0::2].clamp(min=torch.zeros_like(width), max=width)
    y = boxes[:, 1::2].clamp(min=torch.zeros_like(height), max=height)
    return torch.stack((x, y), dim=2).reshape(boxes.shape) * 1.5, (boxes * 2.0).clamp(max=limits)


def _inputs(generator: torch.Generator) -> tuple:
    boxes = torch.randn(64, 4, generator=generator) * 80 + 40
    boxes[3, 1] = float("nan")  # (ATen's clamp keeps a NaN input NaN)
    limits = torch.rand(64, 1, generator=generator) * 100
    limits[5] = float("nan")  # (and a NaN bound makes its row NaN)
    return boxes, torch.tensor(60.0), torch.tensor(90.0), limits


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_tensor_bounds_clamp_in_a_kernel_as_torchscript_does(backend, tmp_path) -> None:
    scripted = torch.jit.script(clip)
    module, loaded = converted_and_loaded(scripted, _inputs(torch.Generator().manual_seed(0)), tmp_path / "clip.j2t",
                                          backend=backend)
    fused = [op for kernel in module.summary()["kernels"] for op in kernel["ops"]]
    assert fused.count("aten::clamp.Tensor") == 3, module.summary()["fallback_reasons"]
    generator = torch.Generator().manual_seed(1)
    for _ in range(6):
        inputs = _inputs(generator)
        expected = scripted(*inputs)
        for runner in (module, loaded):
            for got, want in zip(runner(*inputs), expected):
                torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=0)


def clip_kept(boxes: torch.Tensor, scores: torch.Tensor, height: int, width: int):
    """torchvision's clip_boxes_to_image after a score threshold, as scripted: int bounds the call gives, and a
    `stack` along `boxes.dim()`, a rank (no count, though read off a tensor whose rows are one)."""
    boxes = boxes[scores > 0.5]
    dim = boxes.dim()
    x = boxes[..., 0::2].clamp(min=0, max=width)
    y = boxes[..., 1::2].clamp(min=0, max=height)
    return torch.stack((x, y), dim=dim).reshape(boxes.shape)


def test_clip_after_a_threshold_is_one_kernel_at_every_count_and_size(tmp_path) -> None:
    scripted = torch.jit.script(clip_kept)
    generator = torch.Generator().manual_seed(2)

    def draw(height: int, width: int) -> tuple:
        return torch.randn(50, 4, generator=generator) * 60 + 30, torch.rand(50, generator=generator), height, width
    module, loaded = converted_and_loaded(scripted, draw(40, 70), tmp_path / "clip_kept.j2t", backend="cpp")
    assert {"aten::clamp", "aten::stack"} <= fused_ops(module), module.summary()["fallback_reasons"]
    for height, width in ((40, 70), (10, 90), (64, 64), (1, 200), (40, 70), (33, 5)):
        inputs = draw(height, width)
        for runner in (module, loaded):
            torch.testing.assert_close(runner(*inputs), scripted(*inputs), rtol=0, atol=0)
