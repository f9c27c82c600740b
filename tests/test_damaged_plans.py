"""Manifest edits with recomputed checksums that crashed a runtime (SIGSEGV, heap corruption) or escaped as a raw
exception (issue 34, items 4 and 5) are refused by the runtime with a jit2triton error naming the damage, at
load where the plan shows it, else at the call that meets it. The mutation fuzz (tests/mutate_packages.py, its
structural edits in tests/mutate_structure.py) looks for more of their kind."""
from __future__ import annotations

import pytest
import torch

import jit2triton

from fuzz_packages import containers_package, damageable_package
from mutate_structure import steps_of
from package_tools import rewrite_package


class Planned(torch.nn.Module):
    """Static shapes and an intermediate two kernels read: a plan with an arena (the other packages have none: a
    dynamic batch, or kernel outputs kept in containers, which outlive the call)."""

    def forward(self, x, y):
        a = torch.sin(x) * y
        return (a @ y.t()).relu() + 1


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    folder = tmp_path_factory.mktemp("damaged")
    jit2triton.convert(torch.jit.script(Planned()), (torch.randn(3, 5), torch.randn(3, 5)),
                       backend="cpp").save(folder / "planned.j2t")
    return {"damageable": damageable_package(folder), "containers": containers_package(folder),
            "planned": str(folder / "planned.j2t")}


def _step(manifest: dict, **match) -> dict:
    return next(s for s in steps_of(manifest["plan"]) if all(s.get(k) == v for k, v in match.items()))


def _set(path: list, value):
    """An edit setting manifest[path...] to value."""
    def edit(manifest):
        target = manifest
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return edit


def _edit_step(match: dict, change):
    return lambda manifest: change(_step(manifest, **match))


def _last_kernel(change):
    """An edit of the plan's last kernel step (which kernels there are depends on timings taken while converting:
    the linear may fuse its tanh or not), whose inputs ATen made: it checks their layouts."""
    return lambda manifest: change([s for s in manifest["plan"]["steps"] if s["kind"] == "kernel"][-1])


CASES = {  # name: (package, edit, error, what the message says)
    "a_weight_a_kernel_reads_with_a_zero_dim_and_no_bytes": (
        "damageable", lambda m: m["weights"]["self_scale"].update(shape=[0], nbytes=0),
        jit2triton.CorruptPackageError, "reads weight 'self_scale'"),
    "an_output_with_a_zero_stride": (
        "damageable", _last_kernel(lambda s: s["out_types"][0].__setitem__(2, [32, 0])),
        jit2triton.CorruptPackageError, "allocates other outputs"),
    "an_output_with_a_zero_dim": (
        "damageable", _last_kernel(lambda s: s["out_types"][0].__setitem__(0, [32, 0])),
        jit2triton.CorruptPackageError, "allocates other outputs"),
    "kernel_input_strides_that_are_a_number": (
        "damageable", _last_kernel(lambda s: s["in_strides"].__setitem__(0, 1)),
        jit2triton.CorruptPackageError, "checks its inputs against other layouts"),
    "kernel_input_strides_that_are_a_dtype": (
        "damageable", _last_kernel(lambda s: s["in_strides"].__setitem__(0, "complex128")),
        jit2triton.CorruptPackageError, "checks its inputs against other layouts"),
    "an_if_with_an_output_its_branches_do_not_give": (
        "damageable", _edit_step({"kind": "if"}, lambda s: s["outs"].append(1)),
        jit2triton.CorruptPackageError, "if step gives another number of values"),
    "a_dynamic_dim_whose_range_is_not_a_number": (
        "damageable", _set(["signature", "dims", "b", "min"], [0, 0]),
        jit2triton.CorruptPackageError, "dim 'b''s range"),
    "a_dict_stored_into_itself": (
        "damageable", _edit_step({"op": "aten::_set_item.str"}, lambda s: s["args"].__setitem__(2, s["args"][0])),
        jit2triton.CorruptPackageError, "inside itself"),
    "an_arena_of_64_GiB": (
        "planned", _set(["plan", "arena", "bytes"], 1 << 36),
        jit2triton.CorruptPackageError, "arena is larger than the outputs planned into it"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_damaged_plan_is_refused_cleanly(case, packages, tmp_path, cpp_runtime) -> None:
    package, edit, error, message = CASES[case]
    edited = tmp_path / "edited.j2t"
    rewrite_package(packages[package], edited, edit_manifest=edit)
    with pytest.raises(error, match=message):
        module = jit2triton.load(edited)
        inputs = (torch.randn(4, 32), True) if package == "damageable" else (torch.randn(3, 5), torch.randn(3, 5))
        module(*inputs)


def test_the_undamaged_packages_run(packages, cpp_runtime) -> None:
    """The checks refuse only the damage: the same packages, unedited, load and agree with TorchScript."""
    from fuzz_packages import Containers, Damageable
    torch.manual_seed(0)
    model = torch.jit.script(Damageable())
    damageable = jit2triton.load(packages["damageable"])
    for flag in (True, False):
        x = torch.randn(5, 32)
        torch.testing.assert_close(damageable(x, flag), model(x, flag))
    containers = jit2triton.load(packages["containers"])
    x, y = torch.randn(3, 5), torch.randn(3, 5)
    torch.testing.assert_close(containers(x, y), torch.jit.script(Containers())(x, y))
