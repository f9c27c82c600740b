"""Programs that are mostly host steps (ATen calls, list/dict/int ops, control flow, data-dependent size reads),
where a runtime's per-step cost decides the speed: issue 46's classes that ran slower than TorchScript. Each builder
returns a Program: the TorchScript model, convert's example inputs and the timed call's inputs; `reset` names a method
called before every timed run (a cache that grows call by call); `eager` is the module the TorchScript model was made
from (for torch.compile), `fresh` makes a new random input set of the same shapes (to check a package against).

Used by benchmarks/runtime_overhead.py (--programs host) and benchmarks/torchscript_programs.py.
"""
from __future__ import annotations

import os
import sys
from typing import Callable, List, NamedTuple, Optional

import torch
from torch import Tensor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from call_programs import BeamSearch, KVCache  # noqa: E402


def box_iou(a: Tensor, b: Tensor) -> Tensor:
    lt = torch.max(a[:, None, :2], b[None, :, :2])
    rb = torch.min(a[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(2)
    area_a = (a[:, 2:] - a[:, :2]).prod(1)
    area_b = (b[:, 2:] - b[:, :2]).prod(1)
    return inter / (area_a[:, None] + area_b[None, :] - inter)


class NmsPostprocess(torch.nn.Module):
    """A detection head's post-process in TorchScript: threshold, sort, keep the best 50, pairwise IoU, greedy
    suppression in a loop of size reads and boolean reads."""

    def forward(self, boxes: Tensor, scores: Tensor):
        keep = scores > 0.3
        boxes, scores = boxes[keep], scores[keep]
        order = scores.argsort(descending=True)[:50]
        boxes, scores = boxes[order], scores[order]
        iou = box_iou(boxes, boxes)
        suppressed = torch.zeros(boxes.shape[0], dtype=torch.bool, device=boxes.device)
        for i in range(boxes.shape[0]):
            if not bool(suppressed[i]):
                suppressed = suppressed | ((iou[i] > 0.5) & (torch.arange(boxes.shape[0], device=boxes.device) > i))
        return boxes[~suppressed] * 2.0, scores[~suppressed].sqrt()


class ListLoop(torch.nn.Module):
    """A scripted loop over a List[Tensor] input: per item a few pointwise ops and a reduction, results collected in
    a list and stacked."""

    def forward(self, xs: List[Tensor]) -> Tensor:
        outs: List[Tensor] = []
        total = torch.zeros_like(xs[0])
        for x in xs:
            y = torch.tanh(x * 1.5 + 0.5) - x.mean()
            total = total + y
            outs.append(y.sum(0))
        return torch.stack(outs) * 2.0 + total.sum()


class Refine(torch.nn.Module):
    """An iterative refinement: a small update applied until it stops changing much, at most `steps` times."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.update = torch.nn.Linear(dim, dim)

    def forward(self, x: Tensor, steps: int) -> Tensor:
        for _ in range(steps):
            delta = torch.tanh(self.update(x)) * 0.1
            x = x + delta
            if bool(delta.abs().max() < 1e-4):
                break
        return x


class TracedWithRefinement(torch.nn.Module):
    """A traced model around a scripted refinement loop (tracing keeps the scripted part's control flow)."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.encode = torch.nn.Linear(dim, dim)
        self.refine = torch.jit.script(Refine(dim))
        self.head = torch.nn.Linear(dim, 4)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.refine(torch.relu(self.encode(x)), 6)).softmax(-1)


class IntAndListOps(torch.nn.Module):
    """Host steps only: int arithmetic, a branch and a list append per iteration (TorchScript's interpreter runs each
    in tens of nanoseconds, so any per-step cost of a runtime shows here first)."""

    def forward(self, x: Tensor, n: int) -> Tensor:
        values: List[int] = []
        total = 0
        for i in range(n):
            v = (i * 7 + total) % 13
            if v > 6:
                total += v
            else:
                total -= 1
            values.append(v)
        return x * float(total) + float(len(values))


class AtenChain(torch.nn.Module):
    """200 ATen calls in a row on an 8-element tensor, none of which becomes a generated kernel (flip and cummax
    fall back, sort and topk are vendor calls): the runtime's cost per ATen step, and little else."""

    def forward(self, x: Tensor) -> Tensor:
        for _ in range(50):
            x = x.flip(0)
            x = x.cummax(0)[0]
            x = x.sort()[0]
            x = x.topk(8)[0]
        return x


class Program(NamedTuple):
    model: torch.jit.ScriptModule
    example: object  # convert's example_inputs (a dict per method for a model with several)
    inputs: tuple  # the timed call's inputs
    reset: Optional[str] = None
    eager: Optional[torch.nn.Module] = None  # the module before scripting or tracing, sharing its weights
    fresh: Optional[Callable[[], tuple]] = None  # a new random input set like `inputs`


def _boxes(n: int, generator: torch.Generator) -> Tensor:
    corner = torch.rand(n, 2, generator=generator) * 100
    return torch.cat([corner, corner + 5 + torch.rand(n, 2, generator=generator) * 30], 1)


def _eager(cls, device: str = "cpu") -> torch.nn.Module:
    torch.manual_seed(0)
    return cls().eval().to(device)


def _scripted_program(eager: torch.nn.Module, example: object, inputs: tuple, **more) -> Program:
    return Program(torch.jit.script(eager), example, inputs, eager=eager, **more)


def _nms_inputs(device: str, seed: int) -> tuple:
    g = torch.Generator().manual_seed(seed)
    return _boxes(160, g).to(device), torch.rand(160, generator=g).to(device)


def nms_postprocess(device: str) -> Program:
    inputs = _nms_inputs(device, 0)
    return _scripted_program(_eager(NmsPostprocess, device), inputs, inputs, fresh=lambda: _nms_inputs(device, 1))


def _list_inputs(device: str, seed: int) -> tuple:
    g = torch.Generator().manual_seed(seed)
    return ([torch.randn(4, 16, generator=g).to(device) for _ in range(8)],)


def list_loop(device: str) -> Program:
    inputs = _list_inputs(device, 0)
    return _scripted_program(_eager(ListLoop, device), inputs, inputs, fresh=lambda: _list_inputs(device, 1))


def traced_refinement(device: str) -> Program:
    model = _eager(TracedWithRefinement, device)
    x = torch.randn(8, 16, device=device)
    with torch.no_grad():
        traced = torch.jit.trace(model, (x,))
    return Program(traced, (x,), (x,), eager=model, fresh=lambda: (torch.randn(8, 16, device=device),))


def beam_search(device: str) -> Program:
    h0 = torch.randn(1, 16, generator=torch.Generator().manual_seed(4)).to(device)
    return _scripted_program(_eager(BeamSearch, device), (h0, 1), (h0, 1),
                             fresh=lambda: (torch.randn(1, 16, device=device), 1))


def kv_cache_decode(device: str) -> Program:
    eager = _eager(KVCache, device)
    eager.k_cache, eager.v_cache = eager.k_cache.to(device), eager.v_cache.to(device)  # (attributes, not buffers)
    x = torch.randn(1, 1, 16, device=device)
    return _scripted_program(eager, {"forward": (x,), "reset": ()}, (x,), reset="reset",
                             fresh=lambda: (torch.randn(1, 1, 16, device=device),))


def int_and_list_ops(device: str) -> Program:
    x = torch.randn(4, device=device)
    return _scripted_program(_eager(IntAndListOps, device), (x, 200), (x, 200),
                             fresh=lambda: (torch.randn(4, device=device), 200))


def aten_chain(device: str) -> Program:
    model = _eager(AtenChain, device)
    x = torch.randn(8, device=device)
    with torch.no_grad():
        traced = torch.jit.trace(model, (x,))  # (the loop unrolled: 200 nodes)
    return Program(traced, (x,), (x,), eager=model, fresh=lambda: (torch.randn(8, device=device),))


HOST_PROGRAMS: dict[str, Callable[[str], Program]] = {
    "NMS post-process": nms_postprocess,
    "loop over List[Tensor]": list_loop,
    "traced + scripted refinement": traced_refinement,
    "beam search": beam_search,
    "KV-cache decode step": kv_cache_decode,
    "int and list ops (200 iterations)": int_and_list_ops,
    "ATen chain (200 ops)": aten_chain,
}
