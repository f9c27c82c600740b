"""A count an `if` makes in a branch no example reaches: torchvision's `batched_nms` runs one NMS for few boxes and
a per-class loop (with an uncounted `unique`) for more than 4,000 coordinates, which random examples never reach.
That branch made the `if`'s output, and every op after it, opaque: a detector's box decoding, clipping and score
math ran through ATen. Now the `if`'s output keeps the size the taken branch gave it (counted by the thinned
draws), the runtime reads it from the output whichever branch ran, and the ops after it are kernels over it."""
from __future__ import annotations

from typing import List

import pytest
import torch

from helpers import converted_and_loaded, fused_ops


def post_process(boxes: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor):
    candidates = torch.where(scores > 0.25)[0]
    if candidates.numel() > 110:  # (as torchvision's batched_nms: a per-class path for many boxes)
        keep_mask = torch.zeros_like(scores, dtype=torch.bool)
        for label in torch.unique(labels):
            chosen = torch.where((labels == label) & (scores > 0.25))[0]
            keep_mask[chosen[: chosen.numel() - 1]] = True  # (each class's last dropped: another count)
        keep = torch.where(keep_mask)[0]
    else:
        keep = candidates
    kept = boxes[keep]
    sizes = (kept[:, 2:] - kept[:, :2]).clamp(min=0.0) * 0.5 + 1.0
    return sizes, torch.sigmoid(scores[keep] * 4.0 - 1.0)


COUNT = 120


def _draw(generator: torch.Generator, lowest: float = 0.0) -> tuple:
    """120 boxes; scores uniform from `lowest`: from 0 about 90 pass 0.25 (never more than 110 at conversion's
    draws), from 0.3 all do."""
    corners = torch.rand(COUNT, 2, generator=generator) * 100
    boxes = torch.cat([corners, corners + torch.rand(COUNT, 2, generator=generator) * 20], 1)
    scores = lowest + (1 - lowest) * torch.rand(COUNT, generator=generator)
    return boxes, scores, torch.randint(0, 5, (COUNT,), generator=generator)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    scripted = torch.jit.script(post_process)
    return (scripted, *converted_and_loaded(scripted, _draw(torch.Generator().manual_seed(0)),
                                            tmp_path_factory.mktemp("branch_counts") / "post.j2t", backend="cpp"))


def test_the_ops_after_the_if_are_kernels(converted) -> None:
    _, module, _ = converted
    assert {"aten::sub.Tensor", "aten::clamp", "aten::sigmoid"} <= fused_ops(module), \
        module.summary()["fallback_reasons"]


@pytest.mark.parametrize("lowest", [0.0, 0.3, 0.2], ids=["the branch conversion took", "the other", "either"])
def test_either_branch_gives_torchscripts_answers(converted, lowest) -> None:
    """Scores all above 0.25 take the branch no conversion run took: its count sizes the kernels after the `if`."""
    scripted, module, loaded = converted
    generator = torch.Generator().manual_seed(int(lowest * 10))
    for _ in range(6):
        inputs = _draw(generator, lowest)
        expected = scripted(*inputs)
        for runner in (module, loaded):
            got = runner(*inputs)
            for g, e in zip(got, expected):
                torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_either_branch_gives_torchscripts_answers(tmp_path) -> None:
    """On CUDA (Triton kernels, CUDA graph regions around what binds no size): the `if` binds the kept count
    whichever branch ran, six calls of each, converted and loaded."""
    scripted = torch.jit.script(post_process)
    cuda = [x.cuda() for x in _draw(torch.Generator().manual_seed(0))]
    module, loaded = converted_and_loaded(scripted, cuda, tmp_path / "post.j2t", device="cuda")
    assert {"aten::sub.Tensor", "aten::sigmoid"} <= fused_ops(module), module.summary()["fallback_reasons"]
    generator = torch.Generator().manual_seed(3)
    for lowest in (0.0, 0.3, 0.0, 0.3, 0.2, 0.3):
        inputs = [x.cuda() for x in _draw(generator, lowest)]
        expected = scripted(*inputs)
        for runner in (module, loaded):
            for g, e in zip(runner(*inputs), expected):
                torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-6)


def per_image(boxes: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor) -> List[torch.Tensor]:
    """The `if` inside a loop over images (torchvision's RPN filters each image's proposals so): each run of the
    body binds its image's count at the `if`."""
    out: List[torch.Tensor] = []
    for i in range(boxes.shape[0]):
        sizes, probabilities = post_process(boxes[i], scores[i], labels[i])
        out.append(sizes.sum(1) * probabilities)
    return out


def test_an_if_in_a_loop_binds_each_runs_count(tmp_path) -> None:
    scripted = torch.jit.script(per_image)
    generator = torch.Generator().manual_seed(0)
    example = [torch.stack(parts) for parts in zip(*(_draw(generator) for _ in range(3)))]
    module, loaded = converted_and_loaded(scripted, example, tmp_path / "per_image.j2t", backend="cpp")
    assert {"aten::sub.Tensor", "aten::sigmoid", "aten::sum.dim_IntList"} <= fused_ops(module), \
        module.summary()["fallback_reasons"]
    for lowest in ((0.0, 0.3, 0.2), (0.3, 0.3, 0.0), (0.2, 0.0, 0.3), (0.0, 0.0, 0.0), (0.3, 0.3, 0.3), (0.1,) * 3):
        inputs = [torch.stack(parts) for parts in zip(*(_draw(generator, low) for low in lowest))]
        expected = scripted(*inputs)
        for runner in (module, loaded):
            got = runner(*inputs)
            assert len(got) == len(expected)
            for g, e in zip(got, expected):
                torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
