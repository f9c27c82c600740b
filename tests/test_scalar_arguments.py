"""A host number a Triton kernel reads (a loop counter, `float(total)`, an `int` input) is the kernel's argument,
passed by value by the runtime's launchers (KernelBuffer.by_value), where an `aten::scalar_tensor` step made a 0-d
tensor of it first: on a GPU, a fill launch per number per call (823 a call in Mask R-CNN v2, 46 in an NMS loop).
The C++ backend's kernels still read a 0-d tensor (no launch on the CPU). A kernel taking numbers stays out of
CUDA graphs, which would replay the numbers they were captured with."""
from __future__ import annotations

import hashlib
import json

import pytest
import torch
from typing import List

import jit2triton
from jit2triton.errors import CorruptPackageError

from helpers import BACKENDS, assert_same, convert_for, on_gpu, to_cpu, to_device
from package_tools import read_members, write_members


@torch.jit.script
def counted(x, n: int):
    values: List[int] = []
    total = 0
    for i in range(n):
        v = (i * 7 + total) % 13
        total = total + v if v > 6 else total - 1
        values.append(v)
    return x * float(total) + float(len(values)) - n


@torch.jit.script
def loop_counter(x, n: int):
    seen = torch.zeros(x.shape[0], dtype=torch.bool, device=x.device)
    for i in range(n):  # a kernel per iteration, reading i
        seen = seen | ((x > 0.1 * i) & (torch.arange(x.shape[0], device=x.device) > i))
    return seen, x * (n + 0.5)


PROGRAMS = {"counted": (counted, lambda seed, n: (torch.randn(4, generator=torch.Generator().manual_seed(seed)), n)),
            "loop_counter": (loop_counter,
                             lambda seed, n: (torch.randn(12, generator=torch.Generator().manual_seed(seed)), n))}


def _ops(steps: list) -> list[str]:
    out = []
    for step in steps:
        out.append(step.get("op") or step["kind"])
        for block in step.get("blocks", ()):
            out += _ops(block["steps"])
        out += _ops(step.get("steps", ()))
    return out


@pytest.mark.parametrize("name", PROGRAMS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_kernel_takes_the_host_numbers_it_reads(name, backend, tmp_path):
    model, make = PROGRAMS[name]
    converted = convert_for(model, make(0, 9), backend)
    assert converted.summary()["verification"]["status"] == "passed"
    assert converted.summary()["verification"]["runtime"] == "cpp"
    ops = _ops(converted.manifest["plan"]["steps"])
    numbers = [k["by_value"] for k in converted.manifest["kernels"] if k.get("by_value")]
    if backend == "cpp":
        assert not numbers and "aten::scalar_tensor" in ops
    else:
        assert numbers and "aten::scalar_tensor" not in ops, ops
    path = tmp_path / f"{name}.j2t"
    converted.save(path)
    saved = json.loads(read_members(str(path))["manifest.json"])  # (an older reader refuses what it cannot run)
    assert ("scalar_arguments" in saved.get("requires", ())) == (backend != "cpp")
    # (on the CPU a Triton kernel's launch goes from the C++ plan to Triton's interpreter, the numbers as 64-bit words)
    package = jit2triton.load(path)
    assert package.runtime == "cpp"
    for seed, n in ((1, 9), (2, 0), (3, 5), (4, 11), (5, 1), (6, 7)):
        inputs = make(seed, n)
        assert_same(to_cpu(package(*to_device(inputs, converted.device))), model(*inputs), f"n={n}")


def _with_manifest(path, tmp_path, edit) -> str:
    members = read_members(str(path))
    manifest = json.loads(members["manifest.json"])
    edit(manifest)
    members["manifest.json"] = json.dumps(manifest).encode()
    members["checksums.json"] = json.dumps({name: hashlib.sha256(blob).hexdigest() for name, blob in members.items()
                                            if name != "checksums.json"}).encode()
    damaged = tmp_path / "damaged.j2t"
    write_members(str(damaged), members)
    return str(damaged)


def _kernel_steps(steps: list):
    for step in steps:
        if step["kind"] == "kernel":
            yield step
        for block in step.get("blocks", ()):
            yield from _kernel_steps(block["steps"])


@pytest.mark.parametrize("damage", ["step", "kernel index"])
def test_a_step_passing_other_numbers_than_its_kernel_takes_is_refused(damage, tmp_path, request):
    """A number where a kernel reads a pointer (or the reverse) is refused at load by the runtime that runs the
    package: the plan check compares the step with the kernel index, the launchers the index with the kernel."""
    backend = "cuda" if torch.cuda.is_available() else "triton"
    if backend == "triton":
        from helpers import TRITON_ON_CPU
        if not TRITON_ON_CPU:
            pytest.skip("Triton kernels run on the CPU only under TRITON_INTERPRET=1")
    converted = convert_for(counted, PROGRAMS["counted"][1](0, 9), backend)
    path = tmp_path / "counted.j2t"
    converted.save(path)

    def edit(manifest: dict) -> None:
        if damage == "step":
            for step in _kernel_steps(manifest["plan"]["steps"]):
                step.pop("by_value", None)
        else:
            for kernel in manifest["kernels"]:
                kernel.pop("by_value", None)
    request.getfixturevalue("cpp_runtime")
    with pytest.raises(CorruptPackageError, match="by value"):
        jit2triton.load(_with_manifest(path, tmp_path, edit))


@on_gpu
def test_no_fill_launch_makes_a_number_a_tensor_on_the_gpu(tmp_path, cpp_runtime):
    """And with CUDA graphs on: a kernel taking a number is never replayed with another call's number."""
    for name, (model, make) in PROGRAMS.items():
        converted = convert_for(model, make(0, 9), "cuda")
        path = tmp_path / f"{name}.j2t"
        converted.save(path)
        package = jit2triton.load(path)
        assert package.runtime == "cpp"
        for seed, n in ((1, 9), (2, 3), (3, 9), (4, 0)):
            inputs = to_device(make(seed, n), "cuda")
            assert_same(to_cpu(package(*inputs)), model(*to_cpu(inputs)), f"{name}, n={n}",
                        {torch.float32: (2e-5, 2e-5)})
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            package(*inputs)
            torch.cuda.synchronize()
        fills = [e.name for e in prof.events() if e.name in ("aten::scalar_tensor", "aten::fill_")]
        assert not fills, (name, fills)


def test_a_kernel_taking_numbers_stays_out_of_cuda_graph_regions():
    """A graph replays the numbers it was captured with: a kernel step taking one runs outside, between regions."""
    from jit2triton.deploy.packaging.graph_regions import capturable, group_regions
    steps = [{"kind": "kernel", "kernel": f"k{i}", "args": [["s", i]], "outs": [i + 1], "node": i} for i in range(9)]
    steps[4]["by_value"] = [0]
    plan = {"steps": steps, "outputs": [["s", 9]], "inputs": [0]}
    nodes = [{"op": "j2t::kernel", "category": "kernel"}] * 9
    grouped = group_regions(plan, nodes)["steps"]
    assert [s["kind"] for s in grouped] == ["graph", "kernel", "graph"], grouped
    assert grouped[1] is steps[4] and not capturable(plan)
