"""Run a whole plan as one CUDA graph: static input buffers, one capture on the first call, then a call is
"copy inputs in, replay, copy outputs out" with no per-step Python work.

A plan qualifies when it is straight-line GPU work: no `if`/`loop` steps and no op that reads a tensor's value on
the host (which would sync and could change the control flow between calls). Outputs are copied out of the
graph's memory unless the caller asks to alias them (then the next call overwrites them).
"""
from __future__ import annotations

from typing import Any, Callable

import torch

HOST_READS = {"aten::Int.Tensor", "aten::Float.Tensor", "aten::Bool.Tensor", "aten::item", "aten::nonzero",
              "aten::unique", "aten::_unique2", "aten::masked_select", "aten::tolist", "aten::equal",
              "aten::is_nonzero", "aten::allclose", "aten::ScalarImplicit", "prim::RaiseException"}


LAUNCH_US = 4.0  # what a replay saves per step: the host's launch cost, which a graph does not pay
COPY_BYTES_PER_US = 1.5e6  # what copying inputs in and outputs out of the graph's buffers costs
MIN_STEPS = 3


def capturable(plan: dict) -> bool:
    """Whether every step of the plan can live inside one CUDA graph."""
    return all(step["kind"] in ("call", "kernel") and step.get("op") not in HOST_READS for step in plan["steps"])


def worth_capturing(plan: dict, signature: dict) -> bool:
    """A graph saves each step's launch but costs a copy of every input and output: for a few steps, or for large
    tensors (sin(x)**2 + cos(x)**2 over 16M floats), the copies cost more than the launches they save."""
    copied = sum(_bytes(d) for d in signature["inputs"]) + _bytes(signature["outputs"])
    steps = len(plan["steps"])
    # a replay is itself a launch, and the copies in and out are two more: a plan of a few steps gains nothing
    return steps > MIN_STEPS and copied / COPY_BYTES_PER_US < LAUNCH_US * steps


def _bytes(desc: dict) -> int:
    if desc.get("type") == "Tensor":
        n = 1
        for d in desc["shape"]:
            n *= d
        return n * getattr(torch, desc["dtype"]).itemsize
    items = desc.get("items", [])
    return sum(_bytes(d) for d in (items.values() if isinstance(items, dict) else items))


MAX_GRAPHS = 8  # distinct values of the non-tensor inputs kept captured; beyond that, calls run step by step


class _Captured:
    def __init__(self, run: Callable[[list], list], inputs: list) -> None:
        self.inputs = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up outside the graph: lazy initialisation, allocator pools
                run(self.inputs)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.outputs = run(self.inputs)


class GraphRunner:
    """Scalars (ints, floats, bools) passed as inputs are baked into a graph when it is captured, so each distinct
    tuple of them gets its own graph.

    The first call with a tuple runs step by step and the second captures: a process that needs one answer (a
    cold start) never pays for warm-up runs and a capture it will not replay."""

    def __init__(self, run: Callable[[list], list], alias_outputs: bool = False) -> None:
        self.run = run
        self.alias_outputs = alias_outputs
        self.graphs: dict[tuple, _Captured] = {}
        self.seen: set[tuple] = set()

    def __call__(self, inputs: list) -> list:
        key = tuple(x for x in inputs if not isinstance(x, torch.Tensor))
        captured = self.graphs.get(key)
        if captured is None:
            if len(self.graphs) >= MAX_GRAPHS or key not in self.seen:
                self.seen.add(key)
                return self.run(inputs)
            captured = self.graphs[key] = _Captured(self.run, inputs)
        for static, value in zip(captured.inputs, inputs):
            if isinstance(static, torch.Tensor):
                static.copy_(value, non_blocking=True)
        captured.graph.replay()
        if self.alias_outputs:
            return list(captured.outputs)
        return [_copy_out(o) for o in captured.outputs]


def _copy_out(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (list, tuple)):
        return type(value)(_copy_out(v) for v in value)
    if isinstance(value, dict):
        return {k: _copy_out(v) for k, v in value.items()}
    return value
