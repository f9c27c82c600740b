"""Sizes that change from one run of a loop's body to the next: a loop over a list of images of different sizes (a
torchvision detector's transform, its per-level anchors). Shape inference names such a size by what each iteration
saw (one symbol for the sizes that varied alike), the runtime binds it at each run of the body where the body first
makes it (here `images[i]`), and the ops after it in the body become kernels over it; before, each such op ran
through ATen. The list's tensors differed in shape, so the package serves those shapes in that order only: another
gets an InputError naming the item, where a size the package fixed (a detector's batched image) failed deep in
the plan before."""
from __future__ import annotations

from typing import List

import pytest
import torch

from helpers import converted_and_loaded, fused_ops
from jit2triton.errors import InputError

SHAPES = [(3, 24, 32), (3, 20, 28), (3, 30, 16)]


class PerImage(torch.nn.Module):
    """A detector's transform in small: each image normalised on its own, then a reduction per image, and a batch
    padded to the largest image (a size the example's images set)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor([0.485, 0.456, 0.406]))
        self.register_buffer("std", torch.tensor([0.229, 0.224, 0.225]))

    def forward(self, images: List[torch.Tensor]) -> List[torch.Tensor]:
        out: List[torch.Tensor] = []
        height = max([int(image.shape[1]) for image in images])
        width = max([int(image.shape[2]) for image in images])
        batch = images[0].new_zeros((len(images), 3, height, width))
        for i in range(len(images)):
            image = (images[i] - self.mean[:, None, None]) / self.std[:, None, None]
            image = torch.sigmoid(image * 2.0 + 1.0) * image
            out.append(image.amax(0) + 1.0)
            batch[i, :, : image.shape[1], : image.shape[2]].copy_(image)
        out.append(batch.sum(0))
        return out


def _images(generator: torch.Generator, shapes=SHAPES) -> list:
    return [torch.randn(shape, generator=generator) for shape in shapes]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    scripted = torch.jit.script(PerImage().eval())
    return (scripted, *converted_and_loaded(scripted, (_images(torch.Generator().manual_seed(0)),),
                                            tmp_path_factory.mktemp("loop_sizes") / "per_image.j2t", backend="cpp"))


def test_the_loops_ops_run_in_kernels_over_each_images_size(converted) -> None:
    _, module, _ = converted
    summary = module.summary()
    assert {"aten::sub.Tensor", "aten::div.Tensor", "aten::sigmoid", "aten::amax"} <= fused_ops(module), \
        summary["kernels"]
    assert not {"aten::sigmoid", "aten::amax"} & set(summary["fallback_ops"]), summary["fallback_reasons"]


def test_six_calls_on_fresh_images_give_torchscripts_answers(converted) -> None:
    scripted, module, loaded = converted
    generator = torch.Generator().manual_seed(5)
    for _ in range(6):
        images = _images(generator)
        expected = scripted(images)
        for runner in (module, loaded):
            got = runner(images)
            assert len(got) == len(expected)
            for g, e in zip(got, expected):
                torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shapes", [[(3, 24, 13), (3, 20, 28), (3, 30, 16)], SHAPES[::-1], SHAPES[:2]],
                         ids=["another size", "another order", "another length"])
def test_other_images_are_an_input_error_naming_the_list(converted, shapes) -> None:
    _, _, loaded = converted
    with pytest.raises(InputError, match=r"input 0 \('images'\).*whose tensors differed in shape|item \d: expected"):
        loaded(_images(torch.Generator().manual_seed(1), shapes))
