"""Fusion and every rewrite that works on a copy take `ir.clone_graph`'s: a Graph field it leaves out is lost to
them. It once dropped `host_weights`, so a scripted SSD converted for CUDA had its CPU anchor sizes placed on the
GPU beside anchors TorchScript makes on the CPU, failed every build with the rewrites, and ran wholly through ATen."""
from __future__ import annotations

import dataclasses

import torch

from jit2triton.loaders import load_script
from jit2triton.transpiler import pipeline
from jit2triton.transpiler.from_torchscript import from_torchscript
from jit2triton.transpiler.ir import Graph, clone_graph


class Anchored(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.randn(4))
        self.sizes = torch.randn(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale + self.sizes


def _graph() -> Graph:
    script = load_script(torch.jit.script(Anchored().eval()))
    return from_torchscript(script.graph, script.input_names, script.name)


def test_every_field_survives_the_copy():
    graph = _graph()
    assert graph.weights, "the model's tensors should be weights of the graph"
    # every field given a value no default has, so that a field the copy leaves at its default shows
    graph.host_weights = set(graph.weights)
    graph.name = "not_the_default"
    graph.returns = {"named": ["a"]}
    copy = clone_graph(graph)
    for f in dataclasses.fields(Graph):
        if f.name == "body":
            continue
        assert getattr(copy, f.name) == getattr(graph, f.name), f"clone_graph loses Graph.{f.name}"
    assert copy.body is not graph.body and copy.host_weights is not graph.host_weights  # (a pass may change them)


def test_the_fused_plan_keeps_the_weights_a_gpu_plan_holds_on_the_cpu():
    """What a GPU conversion of a model whose tensor attributes stayed on the CPU leaves: the plan after fusion
    (a copy) still names them, so both runtimes keep them on the CPU at load."""
    graph = _graph()
    graph.host_weights = set(graph.weights)
    ctx = pipeline.Context(device=torch.device("cpu"), example_inputs=[], run_plan=None)
    fused = pipeline.lower(graph, ctx)
    assert fused is not graph  # (fusion works on a copy: the case this guards)
    plan = pipeline.plan(fused).plan
    assert sorted(plan.get("host_weights", ())) == sorted(graph.weights)
