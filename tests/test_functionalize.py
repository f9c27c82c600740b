"""In-place writes that TorchScript's mutation removal leaves (transpiler/functionalize.py): rewritten as functional
ops where nothing else can see the written tensor change, left to ATen where something can. Every case is compared
with TorchScript on fresh inputs; the report says which way each went."""
from __future__ import annotations

from typing import List

import pytest
import torch

import jit2triton


def write_through_select(x):
    a = x * 2.0
    a[1].mul_(-3.0)  # through a view: a select_scatter
    return torch.sin(a)


def write_through_slice(x):
    a = x + 1.0
    a[:, 1:3].add_(x[:, :2])
    return a * a


def reads_itself(x):
    c = torch.tanh(x)
    c.mul_(c)  # TorchScript keeps this one: the written tensor is also read
    return c + 1.0


def view_taken_before_the_write(x):
    a = x * 2.0
    v = a[0]  # a second handle on a's memory, read after the write: it must see it
    a.mul_(3.0)
    return v + 1.0, a


def list_holds_it(x):
    a = x * 2.0
    keep: List[torch.Tensor] = [a]
    a.add_(1.0)
    return keep[0] - 1.0


def appended_before_the_write(x):
    a = x * 2.0
    keep: List[torch.Tensor] = []
    keep.append(a)  # the list keeps a handle: the write must reach it
    a.add_(1.0)
    return keep[0] * a


def written_in_a_loop(x, n: int):
    a = x * 2.0
    for _ in range(n):
        a[0].add_(1.0)  # a tensor made outside the loop, written inside it
    return a


def reshaped_through_a_view(x):
    a = x * 2.0
    a[0].t_()  # a new shape of the same data: nothing is written, so there is nothing to scatter back
    return a + 1.0


def written_through_an_unlisted_view(x):
    a = x * 2.0
    v = a[0]
    d = a.diagonal(0, 1, 2)  # a view the op table does not list; its schema says it aliases
    d.add_(1.0)
    return v + 1.0


def result_of_a_write_through_a_slice_read(x, y):
    a = torch.cat([x, x * 2.0], dim=1)
    b = a[:, :5]
    b += y  # GhostNet: the sliced half of a cat, added to in place, then returned
    return b * 1.5


def zeroed_through_a_slice(x):
    bias = x.clone()
    bias[2:4].zero_()  # Swin-V2: the key third of the qkv bias zeroed
    return bias + 1.0


def assigned_through_slices(x):
    mask = x.new_zeros((4, 6))
    count = 0
    for h in ((0, 2), (2, 4)):
        mask[h[0]:h[1], 1:3] = count + 1  # Swin's attention mask: a number copied into a window
        count += 1
    return mask * x


def result_of_a_write_viewed_later(x, y):
    a = x * 2.0
    b = a[:, 1:4].add_(y)
    return b.t() + 1.0, a  # a view of the written slice: it would need to alias a


def result_of_a_write_written_again(x, y):
    a = x * 2.0
    b = a[:, 1:4].add_(y)
    b.mul_(3.0)  # a second write through the first one's result must reach a
    return a


CASES = [
    (write_through_select, (torch.randn(4, 6),), "rewritten"),
    (write_through_slice, (torch.randn(4, 6),), "rewritten"),
    (reads_itself, (torch.randn(4, 6),), "rewritten"),
    (view_taken_before_the_write, (torch.randn(4, 6),), "kept"),
    (list_holds_it, (torch.randn(4, 6),), "kept"),
    (appended_before_the_write, (torch.randn(4, 6),), "kept"),
    (written_in_a_loop, (torch.randn(4, 6), 3), "kept"),
    (reshaped_through_a_view, (torch.randn(2, 3, 3),), "kept"),
    (written_through_an_unlisted_view, (torch.randn(2, 3, 3),), "kept"),
    (result_of_a_write_through_a_slice_read, (torch.randn(4, 3), torch.randn(4, 5)), "rewritten"),
    (zeroed_through_a_slice, (torch.randn(6),), "rewritten"),
    (assigned_through_slices, (torch.randn(4, 6),), "rewritten"),
    (result_of_a_write_viewed_later, (torch.randn(4, 6), torch.randn(4, 3)), "kept"),
    (result_of_a_write_written_again, (torch.randn(4, 6), torch.randn(4, 3)), "kept"),
]


@pytest.mark.parametrize("fn, example, expected", CASES, ids=[c[0].__name__ for c in CASES])
def test_in_place_writes_match_torchscript(fn, example, expected) -> None:
    scripted = torch.jit.script(fn)
    converted = jit2triton.convert(scripted, example_inputs=example)
    in_place = [op for op in converted.summary()["fallback_ops"] if op.split(".")[0].endswith("_")]
    if expected == "rewritten":
        assert not in_place, converted.report()
        assert converted.summary()["fallback_nodes"] == 0, converted.report()
    else:
        assert in_place, converted.report()
    torch.manual_seed(7)
    for _ in range(2):
        inputs = tuple(torch.randn_like(x) if isinstance(x, torch.Tensor) else x for x in example)
        expected_out = scripted(*[x.clone() if isinstance(x, torch.Tensor) else x for x in inputs])
        actual = converted(*inputs)
        for a, e in zip(actual if isinstance(actual, tuple) else (actual,),
                        expected_out if isinstance(expected_out, tuple) else (expected_out,)):
            torch.testing.assert_close(a, e, rtol=1e-6, atol=1e-6)
