"""Container inputs (a List, Tuple or Dict of tensors or numbers): the runtime checks each item or element against
the signature as it checks a tensor input, so a wrong one is an InputError naming it at the call's boundary (it
was a SizeChangedError at the first kernel, a "package is damaged" kernel error, or TorchScript's internal assert),
and a list or dict of another length runs as TorchScript runs it."""
from __future__ import annotations

from typing import Dict, List, Tuple

import pytest
import torch

import jit2triton
from jit2triton.errors import InputError, SizeChangedError


class Loop(torch.nn.Module):
    def forward(self, xs: List[torch.Tensor]) -> torch.Tensor:
        out = xs[0] * 2
        for x in xs[1:]:
            out = out + x.sin()
        return out


class Pair(torch.nn.Module):
    def forward(self, t: Tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return t[0].relu() + t[1] * 3


class Named(torch.nn.Module):
    def forward(self, d: Dict[str, torch.Tensor]) -> torch.Tensor:
        return d["a"].relu() + d["b"] * 3


class Nested(torch.nn.Module):
    def forward(self, pair: Tuple[List[torch.Tensor], int]) -> torch.Tensor:
        xs, n = pair
        return torch.stack(xs).sum(0) * n


def _tensors(count: int, shape=(4, 8)) -> list:
    return [torch.randn(shape) for _ in range(count)]


EXAMPLES = {"loop": (Loop, lambda: _tensors(3)), "pair": (Pair, lambda: tuple(_tensors(2))),
            "named": (Named, lambda: dict(zip("ab", _tensors(2)))), "nested": (Nested, lambda: (_tensors(2), 3))}


@pytest.fixture(scope="module")
def packages(tmp_path_factory) -> dict:
    """Each model scripted, and its package loaded."""
    folder, out = tmp_path_factory.mktemp("containers"), {}
    for name, (model, draw) in EXAMPLES.items():
        scripted = torch.jit.script(model())
        path = str(folder / f"{name}.j2t")
        jit2triton.convert(scripted, (draw(),), backend="cpp").save(path)
        out[name] = scripted, jit2triton.load(path)
    return out


def test_container_inputs_match_torchscript_on_fresh_values(packages) -> None:
    torch.manual_seed(1)
    calls = [("loop", _tensors(3)), ("loop", _tensors(5)), ("loop", _tensors(1)), ("pair", tuple(_tensors(2))),
             ("named", dict(zip("ab", _tensors(2)))), ("named", dict(zip("bac", _tensors(3)))),
             ("nested", (_tensors(2), 3))]
    for name, value in calls:
        scripted, loaded = packages[name]
        torch.testing.assert_close(loaded(value), scripted(value), rtol=1e-5, atol=1e-5)


def test_a_size_a_lists_length_set_is_refused_not_wrong(packages) -> None:
    """`torch.stack(xs)` makes a size of the list's length, which the package fixed at the example's (2)."""
    with pytest.raises(SizeChangedError, match=r"has shape \[4, 4, 8\], .* \[2, 4, 8\]: .* a list input's length"):
        packages["nested"][1]((_tensors(4), 3))


def test_a_strided_element_is_made_dense_in_a_copy(packages) -> None:
    """Kernels read inputs as dense row-major tensors: a transposed element is copied so, into a new list; the
    caller's list keeps its own tensor."""
    scripted, loaded = packages["loop"]
    xs = [torch.randn(8, 4).t(), *_tensors(2)]
    torch.testing.assert_close(loaded(xs), scripted(xs), rtol=1e-5, atol=1e-5)
    assert not xs[0].is_contiguous()


WRONG = [
    ("loop", lambda: [*_tensors(2), torch.randn(5, 8)], "input 0 ('xs') element 2: expected float32[4, 8] on cpu, "
                                                        "got float32[5, 8] on cpu"),
    ("loop", lambda: _tensors(2) + [torch.randn(4, 8).double()], "element 2: expected float32[4, 8] on cpu, got "
                                                                 "float64[4, 8]"),
    ("loop", lambda: [torch.randn(4, 8), 1], "element 1: expected a tensor float32[4, 8] on cpu, got int"),
    ("loop", lambda: torch.randn(4, 8), "input 0 ('xs'): expected a list of float32[4, 8], got Tensor"),
    ("pair", lambda: tuple(_tensors(3)), "expected a tuple of 2 items (float32[4, 8], float32[4, 8]), got 3 items"),
    ("pair", lambda: (torch.randn(4, 8), torch.randn(4, 9)), "input 0 ('t') item 1: expected float32[4, 8] on cpu, "
                                                             "got float32[4, 9]"),
    ("named", lambda: {"a": torch.randn(4, 8), "b": torch.randn(2)}, "input 0 ('d') element 'b': expected "
                                                                      "float32[4, 8] on cpu, got float32[2]"),
    ("named", lambda: _tensors(2), "expected a dict of float32[4, 8], got list"),
    ("nested", lambda: ([torch.randn(4, 8), torch.randn(4, 8).int()], 3), "input 0 ('pair') item 0 element 1: "
                                                                          "expected float32[4, 8] on cpu, got int32"),
    ("nested", lambda: (_tensors(2), 2.5), "input 0 ('pair') item 1: expected int, got float"),
]


@pytest.mark.parametrize("name,value,message", WRONG)
def test_a_wrong_item_or_element_is_an_input_error_naming_it(packages, name, value, message) -> None:
    with pytest.raises(InputError) as raised:
        packages[name][1](value())
    assert message in str(raised.value)
