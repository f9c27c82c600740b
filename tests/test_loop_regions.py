"""A CUDA graph region never reads a scalar that changes from one iteration of a loop to the next
(deploy/packaging/graph_regions.py, _varying_scalars): a graph bakes in the scalars it reads, so such a region would be a graph
per value, captured (syncing the device) and evicted again call after call. Checked on CPU packages, whose plans the
grouping takes as a GPU package's."""
from __future__ import annotations

import os
import sys

import torch

import jit2triton
from jit2triton.deploy.packaging.graph_regions import group_regions

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
from host_programs import HOST_PROGRAMS  # noqa: E402


def walk(steps, inside=()):
    for step in steps:
        yield step, inside
        for block in step.get("blocks", ()):
            yield from walk(block["steps"], inside + (step,))
        yield from walk(step.get("steps", ()), inside + (step,))


def regions_in_loops(plan):
    return [(step, loops[-1]) for step, inside in walk(plan["steps"])
            if step["kind"] == "graph" for loops in [[s for s in inside if s["kind"] == "loop"]] if loops]


def test_no_region_in_nms_reads_the_box_counter() -> None:
    program = HOST_PROGRAMS["NMS post-process"]("cpu")
    manifest = jit2triton.convert(program.model, program.example, device="cpu").manifest
    plan = group_regions(manifest["plan"], manifest["nodes"])
    loop = next(step for step, _ in walk(plan["steps"]) if step["kind"] == "loop")
    counter = loop["blocks"][0]["inputs"][0]
    # the pointwise run of the body (iou[i] > 0.5, arange(n) > i, &, |) is one kernel over the box count, and it
    # reads i (as a 0-d tensor made from it): it runs step by step
    body = [s for s, _ in walk(loop["blocks"][0]["steps"])]
    assert [s.get("op") for s in body].count("aten::scalar_tensor") == 1
    assert any(s["kind"] == "kernel" for s in body)
    for region, _ in regions_in_loops(plan):
        assert ["s", counter] not in region["args"], region["args"]
    # the straight-line runs outside the loop are still regions
    assert any(step["kind"] == "graph" for step in plan["steps"])


class CountedSteps(torch.nn.Module):
    """A loop whose body scales by a number computed from the counter, then runs ATen ops that read only tensors."""

    def forward(self, x: torch.Tensor, n: int) -> torch.Tensor:
        for i in range(n):
            k = i * 2 + 1
            x = x * k
            x = x.flip(0).cummax(0)[0].flip(1).cummax(1)[0].flip(0)
        return x


def test_a_region_reads_no_value_computed_from_the_counter_but_keeps_the_tensor_work() -> None:
    model = torch.jit.script(CountedSteps().eval())
    manifest = jit2triton.convert(model, (torch.randn(4, 8), 3), device="cpu").manifest
    plan = group_regions(manifest["plan"], manifest["nodes"])
    loop = next(step for step, _ in walk(plan["steps"]) if step["kind"] == "loop")
    body = loop["blocks"][0]["steps"]
    kinds = [step["kind"] for step in body]
    assert kinds.count("graph") == 1, kinds
    # x * k (a kernel reading k as a 0-d tensor, the carried x typed as it enters): outside the region, before it
    scale = next(step for step in body if step["kind"] == "kernel")
    assert kinds.index("graph") > body.index(scale)
    region = body[kinds.index("graph")]
    assert region["launches"] >= 4
    assert not any(step["kind"] == "kernel" for step in region["steps"])
