"""Run a whole plan as one CUDA graph: static input buffers, one capture on the first call, then a call is
"copy inputs in, replay, copy outputs out" with no per-step Python work.

A plan qualifies when it is straight-line GPU work: no `if`/`loop` steps and no op that reads a tensor's value on
the host (which would sync and could change the control flow between calls). Outputs are copied out of the
graph's memory unless the caller asks to alias them (then the next call overwrites them).
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch

HOST_READS = {"aten::Int.Tensor", "aten::Float.Tensor", "aten::Bool.Tensor", "aten::item", "aten::nonzero",
              "aten::unique", "aten::_unique2", "aten::masked_select", "aten::tolist", "aten::equal",
              "aten::is_nonzero", "aten::allclose", "prim::RaiseException"}


def capturable(plan: dict) -> bool:
    """Whether every step of the plan can live inside one CUDA graph."""
    return all(step["kind"] in ("call", "kernel") and step.get("op") not in HOST_READS for step in plan["steps"])


class GraphRunner:
    def __init__(self, run: Callable[[list], list], alias_outputs: bool = False) -> None:
        self.run = run
        self.alias_outputs = alias_outputs
        self.graph: Optional[torch.cuda.CUDAGraph] = None
        self.static_inputs: list = []
        self.static_outputs: list = []

    def __call__(self, inputs: list) -> list:
        if self.graph is None:
            self.capture(inputs)
        for static, value in zip(self.static_inputs, inputs):
            if isinstance(static, torch.Tensor):
                static.copy_(value, non_blocking=True)
        self.graph.replay()
        if self.alias_outputs:
            return list(self.static_outputs)
        return [_copy_out(o) for o in self.static_outputs]

    def capture(self, inputs: list) -> None:
        self.static_inputs = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up outside the graph: lazy initialisation, allocator pools, autotuning
                self.run(self.static_inputs)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.static_outputs = self.run(self.static_inputs)
        self.graph = graph


def _copy_out(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (list, tuple)):
        return type(value)(_copy_out(v) for v in value)
    if isinstance(value, dict):
        return {k: _copy_out(v) for k, v in value.items()}
    return value
