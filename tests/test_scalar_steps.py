"""The C++ runtime's host steps on ints, floats, bools and lists (deploy/cpp/src/scalar_ops.h), which run on their
slots instead of through TorchScript's operators: each agrees with TorchScript's operator on the values where an
implementation could differ (negative operands of % and //, int64 overflow, NaN, negative and out-of-range list
indices, `is None` of a tensor and of None)."""
from __future__ import annotations

import math
from typing import List, Optional, Tuple

import pytest
import torch
from torch import Tensor

import jit2triton
from jit2triton.errors import StepError

BIG = 2 ** 62


class ScalarOps(torch.nn.Module):
    def forward(self, x: Tensor, a: int, b: int, f: float, g: float, i: int,
                y: Optional[Tensor] = None) -> Tuple[List[int], List[float], List[bool]]:
        ints: List[int] = [a + b, a - b, a * b, -a, a % 7, a % -7, a * 3 + 5, a - 2, a // 3, a // -4]
        floats: List[float] = [f + g, f - g, f * g, f * 2.5, f + 1.0]
        bools: List[bool] = [a == b, a != b, a < b, a <= b, a > b, a >= b, a < 3, f == g, f != g, f < g, f <= g,
                             f > g, f >= g, f > 0.5]
        p, q = a > 0, b > 0
        bools.append(p & q)
        bools.append(p | q)
        bools.append(p == q)
        bools.append(not p)
        bools.append(y is None)
        bools.append(y is not None)
        ints.append(len(ints))
        ints.append(ints[i])
        if bool(x.sum() > 0):
            ints.append(1)
        return ints, floats, bools


CASES = [(3, 4, 0.25, 0.5, 0), (-9, 2, -1.5, -1.5, -1), (0, -7, 0.0, -0.0, -3), (BIG, 3, math.inf, 1.0, 2),
         (-BIG, BIG, math.nan, 0.0, 10), (-2 ** 63, -1, -math.inf, math.nan, -11), (2 ** 63 - 1, 1, 1e300, 1e300, 1)]


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    scripted = torch.jit.script(ScalarOps().eval())
    example = (torch.randn(3), *CASES[0])
    path = tmp_path_factory.mktemp("scalar") / "scalar_ops.j2t"
    jit2triton.convert(scripted, example_inputs=example, device="cpu").save(path)
    return scripted, jit2triton.load(path, runtime="cpp")


def same(got, want) -> bool:
    if isinstance(want, float):
        return (math.isnan(got) and math.isnan(want)) or (got == want and math.copysign(1, got) == math.copysign(1, want))
    if isinstance(want, (list, tuple)):
        return len(got) == len(want) and all(same(g, w) for g, w in zip(got, want))
    return type(got) is type(want) and got == want


def test_the_package_runs_its_host_steps_in_the_cpp_runtime(package) -> None:
    _, loaded = package
    assert loaded.runtime == "cpp"


@pytest.mark.parametrize("case", CASES, ids=[str(c[:2]) for c in CASES])
def test_scalar_steps_agree_with_torchscript(package, case) -> None:
    scripted, loaded = package
    x = torch.ones(3)
    for y in (None, x):
        want = scripted(x, *case, y)
        got = loaded(x, *case, y)
        assert same(got, want), (got, want)


def test_an_index_past_the_list_raises_as_torchscript_does(package) -> None:
    scripted, loaded = package
    x = torch.ones(3)
    with pytest.raises(Exception, match="list index out of range"):
        scripted(x, 1, 2, 0.0, 0.0, 40, None)
    with pytest.raises(StepError, match="list index out of range"):
        loaded(x, 1, 2, 0.0, 0.0, 40, None)
