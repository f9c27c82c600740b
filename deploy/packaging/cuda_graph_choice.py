"""Whether a straight-line CUDA plan runs as one CUDA graph or step by step: decided at conversion by timing both
in the C++ runtime (the one that runs graphs, and what `jit2triton.load` runs) on the example inputs, recorded in
the manifest (and its report), so no runtime decides it. Conversion only: the runtimes never import this module."""
from __future__ import annotations

import os
import tempfile
from typing import Callable

import torch

from jit2triton.transpiler import timing

from .. import cpp_runtime
from ..package import PackageContents, save_package
from .build_manifest import set_cuda_graph, set_graph_regions

WHAT = "one CUDA graph or step by step"  # the timed choice, as the report names it
GRAPH_MARGIN = 0.97  # the graph stays unless the plan step by step takes under this share of its time...
HOST_HEADROOM = 0.75  # ... and the host queues a step-by-step call in under this share of it (the GPU is the limit)


def choose_cuda_graph(contents: PackageContents, inputs: list, target: torch.device,
                      say: Callable[[str], None]) -> None:
    """Whether a straight-line CUDA plan runs as one graph, or a plan with control flow runs its regions as graphs
    (graph_regions.py), by timing both on the example inputs, back to back. A
    graph saves the host's launches but copies every input in and output out of its buffers. Where the GPU is the
    limit (an MLP's 4096x1024x4096 fp16 GEMMs), the launches hide behind GPU work anyway and the copies are pure
    cost: there the plan runs step by step. Only with room to spare, though: a plan whose host work nearly fills
    the GPU's time becomes host-bound, and slower than the graph, as soon as the host is a little busier than it
    was while converting. Regions are timed the same way (each replay copies its inputs and outputs too), and put
    back as their steps where they do not pay. Recorded in the manifest (and its report), so no runtime decides it."""
    if timing.fixed():  # the graph, as the plan's shape decided
        timing.take_fixed(WHAT, "graph", "graph")
        return
    why = cpp_runtime.unavailable()
    if why is not None:
        say(f"CUDA graph: kept as the plan's shape decided, untimed ({why})")
        return
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "timed.j2t")
        save_package(contents, path)
        _time_and_choose(contents, path, inputs, target, say)


def _time_and_choose(contents: PackageContents, path: str, inputs: list, target: torch.device,
                     say: Callable[[str], None]) -> None:
    calls = 8
    batch = lambda runtime: lambda: [runtime(*inputs) for _ in range(calls)]  # noqa: E731
    try:
        graphed = cpp_runtime.CppRuntime(path, target)
        stepwise = cpp_runtime.CppRuntime(path, target, cuda_graphs=False)
        with torch.no_grad():
            graphed(*inputs)  # runs step by step; the next call captures
            measured = timing.measure({"graph": batch(graphed), "steps": batch(stepwise)}, rounds=10, budget_s=0.5,
                                      sync=torch.cuda.synchronize)
            timed = {label: seconds / calls for label, seconds in measured.seconds.items()}
            # the host's share: queueing the calls, timed without waiting for the GPU (after it drained)
            timed["host"] = timing.best_time(batch(stepwise), runs=5, budget_s=0.2, sync=lambda: None) / calls
            torch.cuda.synchronize()
    except Exception as err:  # noqa: BLE001 - a plan that cannot be timed keeps the decision made from its shape
        say(f"timing the CUDA graph failed ({type(err).__name__}); keeping it")
        return
    regions = not contents.manifest["cuda_graph"]
    if not regions and not graphed.uses_cuda_graph:
        return
    if not measured.steady:  # a busy host: the graph, as the plan's shape decided
        timing.take_busy(WHAT, "graph", "graph", measured)
        say(f"CUDA graph: kept, the machine is too busy to time it (spread {measured.spread:.0%})")
        return
    use_graph = timed["steps"] >= GRAPH_MARGIN * timed["graph"] or timed["host"] >= HOST_HEADROOM * timed["steps"]
    timed_us = {k: round(v * 1e6, 1) for k, v in timed.items()}
    (set_graph_regions if regions else set_cuda_graph)(contents, use_graph, timed_us)
    timing.record(timing.Choice(WHAT, "graph", "graph" if use_graph else "steps", GRAPH_MARGIN, timed_us,
                                **measured.steadiness()))
    graphs = "its regions as graphs" if regions else "one graph"
    say(f"CUDA graph: {timed['graph'] * 1e6:.0f} us a call with {graphs}, step by step {timed['steps'] * 1e6:.0f} us "
        f"(the host {timed['host'] * 1e6:.0f} us of it): " + (graphs if use_graph else "step by step"))
