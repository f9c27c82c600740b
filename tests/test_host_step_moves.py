"""The C++ runtime moves an argument onto the op's stack where the step is its slot's last use (deploy/cpp/src/plan.cpp,
last_uses), and shares one stack across steps: a value read twice by its last step, a tensor written in place by
its last use, a list grown in a loop, and tensors of different shapes in a List[Tensor] input must all give
TorchScript's outputs on fresh inputs. Every op runs through ATen (backend "aten"), so every step is a call step."""
from typing import List

import pytest
import torch

import jit2triton
from helpers import assert_same


class ReadTwiceByItsLastUse(torch.nn.Module):
    def forward(self, x):
        y = x.sin()
        return torch.mul(y, y) + torch.add(x, x)  # y and x each read twice by the step that frees them


class WrittenInPlaceByItsLastUse(torch.nn.Module):
    def forward(self, x):
        y = x * 2.0
        z = y.add_(1.0)  # y's last use: moved onto the stack, written in place, returned as z
        return z, x


class ListGrownInALoop(torch.nn.Module):
    def forward(self, x, n: int):
        items: List[torch.Tensor] = []
        total = 0
        for i in range(n):
            items.append(x * float(i))
            total = total + i * 3 % 5
        return torch.stack(items).sum(0) + float(total), len(items)


class ListOfShapes(torch.nn.Module):
    def forward(self, xs: List[torch.Tensor]):
        return torch.cat([x.flatten() for x in xs]).cumsum(0), [x.sum() for x in xs]


def _shapes(seed: int):
    g = torch.Generator().manual_seed(seed)
    return ([torch.randn(2, 3, generator=g), torch.randn(5, generator=g), torch.randn(1, 4, generator=g)],)


CASES = {  # name -> (model, inputs of draw `seed`)
    "read_twice": (ReadTwiceByItsLastUse, lambda seed: (torch.randn(3, 4, generator=torch.Generator().manual_seed(seed)),)),
    "in_place": (WrittenInPlaceByItsLastUse, lambda seed: (torch.randn(5, generator=torch.Generator().manual_seed(seed)),)),
    "list_loop": (ListGrownInALoop, lambda seed: (torch.randn(3, generator=torch.Generator().manual_seed(seed)), 3 + seed % 4)),
    "list_of_shapes": (ListOfShapes, _shapes),
}


@pytest.mark.parametrize("name", list(CASES))
def test_moved_arguments_keep_torchscripts_outputs(name, tmp_path):
    model_class, draw = CASES[name]
    scripted = torch.jit.script(model_class().eval())
    jit2triton.convert(scripted, draw(0), backend="aten").save(tmp_path / "m.j2t")
    loaded = jit2triton.load(tmp_path / "m.j2t", runtime="cpp")
    for seed in (1, 2, 3):
        inputs = draw(seed)
        assert_same(loaded(*inputs), scripted(*inputs), f"{name}, draw {seed}")
