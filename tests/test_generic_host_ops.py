"""TorchScript's generic container ops (`t`, `t[]`, `Dict(str, t)` schemas: str(i), OrderedDict(zip(...)), dict
pop/update/setdefault, list sort/reverse/repeat) run in the runtime as TorchScript runs them (and in conversion's
reference interpreter: torch.ops cannot bind a type variable from a Python value, so it has its own); torchvision's
detection models use them all (FPN's OrderedDict, SSD's str keys, roi_align's isinstance on a Union)."""
from collections import OrderedDict
from typing import Dict, List, Union

import pytest
import torch

import jit2triton

from helpers import assert_same


class Containers(torch.nn.Module):
    def forward(self, x):
        names = [str(i) for i in range(3)]
        features = OrderedDict([(k, x * (i + 1)) for i, k in enumerate(names)])
        extra: Dict[str, torch.Tensor] = {}
        extra.update(features)
        first = extra.pop("0")
        default = extra.setdefault("9", x.sum(0, keepdim=True).expand_as(x))
        order = [3, 1, 2]
        order.sort()
        order.reverse()
        repeated = order * 2
        return first + default, [features[k] for k in sorted(list(features.keys()))], repeated, len(extra)


def roi_like(boxes: Union[torch.Tensor, List[torch.Tensor]]) -> torch.Tensor:
    if isinstance(boxes, (list, tuple)):
        return torch.cat(boxes, 0)
    return boxes


class Rois(torch.nn.Module):
    def forward(self, x):
        return roi_like(x) * 2  # after inlining, isinstance(x, (list, tuple)) has a known answer


@pytest.mark.parametrize("model", [Containers, Rois], ids=lambda m: m.__name__)
def test_generic_container_ops(model, tmp_path):
    scripted = torch.jit.script(model().eval())
    converted = jit2triton.convert(scripted, (torch.randn(2, 3),))
    assert converted.summary()["verification"]["status"] == "passed"
    converted.save(tmp_path / "m.j2t")
    loaded = jit2triton.load(tmp_path / "m.j2t")
    for _ in range(2):
        x = torch.randn(2, 3)
        assert_same(loaded(x), scripted(x))


class Tensors(torch.nn.Module):  # torchvision's transform: torch.as_tensor(self.image_mean, dtype=..., device=...)
    def __init__(self) -> None:
        super().__init__()
        self.mean = [0.5, 0.25, 0.125]

    def forward(self, x):
        mean = torch.as_tensor(self.mean, dtype=x.dtype, device=x.device)
        scale = torch.tensor([[1, 2, 3]], dtype=torch.float64)
        return (x - mean) * scale.to(x.dtype)


def test_tensors_from_lists(tmp_path):
    scripted = torch.jit.script(Tensors().eval())
    jit2triton.convert(scripted, (torch.randn(2, 3),)).save(tmp_path / "m.j2t")
    loaded = jit2triton.load(tmp_path / "m.j2t")
    x = torch.randn(2, 3)
    assert_same(loaded(x), scripted(x))


class UnpacksSizes(torch.nn.Module):  # `h, w = x.shape` folds to a constant list, which unpack_splits must leave
    def forward(self, x):
        h, w = x.shape
        a, b = x.chunk(2, 1)
        return a * h + b * w


def test_unpacking_a_folded_size_list_leaves_every_rewrite_on():
    converted = jit2triton.convert(torch.jit.script(UnpacksSizes()), (torch.randn(3, 4),))
    assert not converted.summary()["verification"]["notes"]  # no pass failed
    x = torch.randn(3, 4)
    assert_same(converted(x), UnpacksSizes()(x))


def test_a_list_of_images_gets_fresh_draws():
    """Verification draws fresh inputs for a List[Tensor] input (a detection model's images), not only the example."""
    model = torch.jit.script(Images())
    converted = jit2triton.convert(model, ([torch.randn(3, 4), torch.randn(2, 2)],))
    assert converted.summary()["verification"]["input_sets"] == 2


class Images(torch.nn.Module):
    def forward(self, images: List[torch.Tensor]):
        return [x.relu() * 2 for x in images]
