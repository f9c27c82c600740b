"""Reflect, replicate and circular padding (transpiler/lower_padding.py) against TorchScript, through the views a
model wraps them in (torch.stft's centring pad views its input to 3-d and back), and the index math they compile to:
a border's index is bounded to its dim (kernel_ir.bounds of sub, abs, min, max, where), so the division and modulo a
view would add per element fold away (Spectrogram's pad kernel ran at half ATen's speed with them)."""
from __future__ import annotations

import itertools
import re

import pytest
import torch

from jit2triton.transpiler import kernel_ir as K
from jit2triton.transpiler.lower_padding import _reflect

from helpers import BACKENDS, assert_matches_torchscript, convert_for


class Centred(torch.nn.Module):
    """torch.stft's centring: (B, L) viewed to (1, B, L), padded along L, viewed back."""

    def __init__(self, mode: str, pad: int) -> None:
        super().__init__()
        self.mode, self.pad = mode, pad

    def forward(self, x):
        shape = x.size()
        y = x.reshape(-1, shape[-1])
        y = torch.nn.functional.pad(y.view([1] + list(y.shape)), [self.pad, self.pad], self.mode)
        return y.view(y.shape[-2:]) * 2 + 1


class Padded2d(torch.nn.Module):
    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode

    def forward(self, x):
        return torch.nn.functional.pad(x, [2, 1, 3, 0], self.mode).sin()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
def test_a_bordered_pad_through_views_matches_torchscript(mode, backend) -> None:
    for model, example in ((torch.jit.script(Centred(mode, 5)), (torch.randn(3, 40),)),
                           (torch.jit.script(Padded2d(mode)), (torch.randn(2, 3, 6, 7),))):
        converted = convert_for(model, example, backend)
        assert converted.summary()["native_nodes"] >= 2, converted.summary()
        assert_matches_torchscript(converted, model, lambda: (torch.randn(example[0].shape),))


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
def test_a_bordered_pads_index_keeps_no_division_per_element(mode) -> None:
    model = torch.jit.script(Centred(mode, 200))
    code = convert_for(model, (torch.randn(8, 1600),), "cpp").code
    kernel = code[code.index("J2T_KERNEL int k0_pad"):]
    kernel = kernel[:kernel.index("\n}\n")]
    assert not re.search(r"[/%] INT64_C", kernel), kernel


def _value(x: K.KExpr, env: dict) -> int:
    if x.op == "var":
        return env[x]
    if x.op == "const":
        return x.arg
    a = [_value(arg, env) for arg in x.args]
    return {"add": lambda: a[0] + a[1], "sub": lambda: a[0] - a[1], "mul": lambda: a[0] * a[1],
            "neg": lambda: -a[0], "abs": lambda: abs(a[0]), "minimum": lambda: min(a), "maximum": lambda: max(a),
            "lt": lambda: a[0] < a[1], "gt": lambda: a[0] > a[1],
            "where": lambda: a[1] if a[0] else a[2]}[x.op]()


def test_the_bounds_of_border_index_ops_hold_every_value_and_are_tight() -> None:
    i, j = K.var("i", 7), K.var("j", 5)
    c = lambda v: K.const(v, K.INT)  # noqa: E731
    cases = [K.op("sub", i, j), K.op("neg", i), K.op("abs", K.op("sub", i, c(3))), K.op("abs", K.op("sub", i, c(9))),
             K.op("minimum", i, K.op("add", j, c(2))), K.op("maximum", K.op("sub", i, c(4)), c(0)),
             K.op("where", K.op("lt", i, c(3)), j, K.op("add", i, c(10)))]
    for x in cases:
        values = [_value(x, {i: a, j: b}) for a, b in itertools.product(range(7), range(5))]
        assert K.bounds(x) == (min(values), max(values)), x
    # reflect's form for a dim of 5 padded by up to 4 on either side: exactly the dim's indices
    position = K.op("sub", K.var("p", 13), c(4))
    assert K.bounds(_reflect(position, 5)) == (0, 4)
