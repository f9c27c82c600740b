"""Shape arithmetic folded to constants (transpiler/fold_shapes.py) as scripted torchvision models write it:
sizes unpacked from `x.shape`, a list of shifts the model changes under a condition on sizes, and a branch on such
a condition, which folds to the branch taken. Numbers that can change between calls at the same shapes (an int
input, a value read out of a tensor) must not fold. Each is compared with TorchScript on fresh inputs."""
from __future__ import annotations

from typing import List, Optional

import pytest
import torch
import torch.nn.functional as F

import jit2triton


class PaddedWindows(torch.nn.Module):
    """Swin's window partition: sizes unpacked from the padded tensor's shape, window sizes from a list attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.window: List[int] = [2, 4]

    def forward(self, x):
        B, H, W = x.shape
        ws = self.window
        x = F.pad(x, (0, (ws[1] - W % ws[1]) % ws[1], 0, (ws[0] - H % ws[0]) % ws[0]))
        _, pH, pW = x.shape
        x = torch.relu(x.view(B, pH // ws[0], ws[0], pW // ws[1], ws[1])).view(B, pH, pW)
        return x[:, :H, :W] * 2.0  # the padding cut off again


def shifts_changed_under_a_size_condition(x):
    shift: List[int] = [2, 1]
    B, H, W = x.shape
    if H <= 2:
        shift[0] = 0
    if W > 100:
        shift[1] = 0
    if sum(shift) > 0:
        x = torch.roll(x, [-shift[0], -shift[1]], [1, 2])
    if sum(shift) > 5:  # never taken at these shapes: no run gives its ops types, so they would stay on ATen
        x = torch.roll(x, [1], [1]) + 1.0
    return x * 2.0


def shifts_from_an_int_input(x, n: int):
    shift: List[int] = [1, 1]
    if n > 2:
        shift[0] = n
    return torch.roll(x, [shift[0], shift[1]], [1, 2]) * 2.0


def shift_read_out_of_a_tensor(x, s):
    shift: List[int] = [1, 1]
    shift[0] = int(s.sum() > 5.0)  # 0 on every draw conversion makes: only the taint keeps it from folding
    return torch.roll(x, [shift[0], shift[1]], [1, 2]) * 2.0


def shift_set_under_a_data_condition(x, s):
    shift: List[int] = [1, 1]
    if bool(s.sum() > 1e6):  # false on every draw conversion makes: only the taint keeps the shift from folding
        shift[0] = 2
    return torch.roll(x, [shift[0], shift[1]], [1, 2]) * 2.0


def ints(low: int, high: int):
    return lambda: int(torch.randint(low, high, ()))


CASES = [
    (torch.jit.script(PaddedWindows().eval()), (torch.randn,), True),
    (shifts_changed_under_a_size_condition, (torch.randn,), True),
    (shifts_from_an_int_input, (torch.randn, ints(0, 6)), False),
    (shift_read_out_of_a_tensor, (torch.randn, lambda: torch.randn(2) * 10.0), False),
    (shift_set_under_a_data_condition, (torch.randn, lambda: torch.randn(2) * 1e6), False),
]


@pytest.mark.parametrize("fn, makers, folds", CASES, ids=["padded_windows"] + [c[0].__name__ for c in CASES[1:]])
def test_shape_arithmetic_folds_only_where_shapes_fix_it(fn, makers, folds) -> None:
    scripted = fn if isinstance(fn, torch.jit.ScriptModule) else torch.jit.script(fn)

    def draw():
        return tuple(make(2, 5, 6) if make is torch.randn else make() for make in makers)

    torch.manual_seed(0)
    example = draw()
    if fn in (shift_read_out_of_a_tensor, shift_set_under_a_data_condition):
        example = (example[0], torch.tensor([-1.0, 2.0]))
    converted = jit2triton.convert(scripted, example_inputs=example, backend="cpp")
    summary = converted.summary()
    if folds:
        assert summary["fallback_nodes"] == 0, converted.report()
        kernel_ops = {op for kernel in summary["kernels"] for op in kernel["ops"]}
        assert "aten::add.Scalar" not in kernel_ops, "the branch never taken was kept:\n" + converted.report()
    else:
        assert "aten::roll" in summary["fallback_ops"], converted.report()  # its shifts are known only at run time
    for _ in range(4):
        inputs = draw()
        torch.testing.assert_close(converted(*inputs), scripted(*inputs), rtol=1e-6, atol=1e-6)


def written_in_a_branch_the_example_skips(x, k: int, flag: bool):
    v = (x * 2.0)[1]  # still virtual when the branch below is reached; read only after it
    attn = x[0] + 1.0
    if flag:
        mask = x.new_zeros((4, 6))
        mask[0:k] = 3.0  # a write with a bound known at run time: it stays in place, in the branch
        attn = attn + mask
    return attn @ v.t()


def test_a_value_made_before_a_branch_that_writes_is_made_before_it() -> None:
    """Made inside the branch, the value was missing where the example skipped it (a scripted Swin-V2 multiplied
    its attention by the wrong tensor)."""
    scripted = torch.jit.script(written_in_a_branch_the_example_skips)
    converted = jit2triton.convert(scripted, example_inputs=(torch.randn(2, 4, 6), 2, False), backend="cpp")
    assert converted.summary()["verification"]["kernels_removed"] == [], converted.report()
    torch.manual_seed(1)
    for flag in (False, True, False):
        x, k = torch.randn(2, 4, 6), int(torch.randint(1, 4, ()))
        torch.testing.assert_close(converted(x, k, flag), scripted(x, k, flag), rtol=1e-5, atol=1e-5)


def _plan_ops(converted) -> set:
    def walk(steps):
        for step in steps:
            yield step.get("op")
            for block in step.get("blocks", []):
                yield from walk(block["steps"])
    return set(walk(converted._contents.manifest["plan"]["steps"]))


def group_norm_then_optional(x, w, b):
    y = F.group_norm(x, 1, w, b, 1e-8)  # F.group_norm checks its sizes in a host loop on every call
    residual: Optional[torch.Tensor] = y * 2.0
    if residual is not None:  # a value an op made is never None
        y = y + residual
    return y


def optional_input(x, y: Optional[torch.Tensor]):
    if y is not None:  # a caller may pass either: this must not fold
        return x + y
    return x * 2.0


def test_host_loops_and_none_tests_of_made_values_fold_but_not_an_optional_input() -> None:
    scripted = torch.jit.script(group_norm_then_optional)
    example = (torch.randn(2, 4, 5), torch.randn(4), torch.randn(4))
    converted = jit2triton.convert(scripted, example_inputs=example, backend="cpp")
    assert not _plan_ops(converted) & {"prim::Loop", "prim::If"}, converted.report()  # a straight-line plan
    fresh = (torch.randn(2, 4, 5), torch.randn(4), torch.randn(4))
    torch.testing.assert_close(converted(*fresh), scripted(*fresh))
    scripted = torch.jit.script(optional_input)
    converted = jit2triton.convert(scripted, example_inputs=(torch.randn(3), None), backend="cpp")
    x, y = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(converted(x, None), scripted(x, None))
    torch.testing.assert_close(converted(x, y), scripted(x, y))
