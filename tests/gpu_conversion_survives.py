"""On the GPU machine: conversions whose invented draws used to end in a device-side assert end in a package or a
clean ConversionError, and the converting process's CUDA context survives (issue 44). Not collected by pytest.

- an EmbeddingBag model with dims on batch and bag count (its offsets redrawn: sorted and within the indices now);
- a graph network whose edge_index indexes a node count that is a Dim (edge_index drawn within the node count);
- a model whose custom op aborts on large values: the draw that crashes is skipped and named;
- a model whose own index runs past its table at a range end: the CPU copy's error text, never a device assert.

    python tests/gpu_conversion_survives.py
"""
from __future__ import annotations

import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
import crashing_ops  # noqa: E402,F401
import jit2triton  # noqa: E402
from jit2triton import ConversionError, Dim  # noqa: E402


class Bags(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bag = torch.nn.EmbeddingBag(1000, 32, mode="mean")

    def forward(self, ids, offsets):
        return self.bag(ids, offsets)


class Graph(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)

    def forward(self, x, edge_index):
        messages = self.linear(x).index_select(0, edge_index[0])
        return torch.zeros_like(x).index_add(0, edge_index[1], messages)


class Fragile(torch.nn.Module):
    def forward(self, x):
        return torch.relu(torch.ops.j2t_tests.abort_above(x))


class Positions(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Embedding(64, 8)

    def forward(self, x):
        return x + self.table(torch.arange(x.size(1), device=x.device))


def _case(name, build) -> None:
    started = time.perf_counter()
    try:
        converted = build()
        verification = converted.summary()["verification"]
        print(f"{name}: package, {verification['input_sets']} input sets, notes {verification['notes']}, "
              f"draws {verification.get('draws')} ({time.perf_counter() - started:.1f} s)")
    except ConversionError as err:
        print(f"{name}: ConversionError: {err} ({time.perf_counter() - started:.1f} s)")
    torch.ones(4, device="cuda").sum().item()  # the process's CUDA context is still usable


def main() -> None:
    cuda = torch.device("cuda")
    _case("embedding_bag", lambda: jit2triton.convert(
        torch.jit.script(Bags().to(cuda)), (torch.randint(0, 1000, (40,), device=cuda),
                                            torch.tensor([0, 7, 19, 30], device=cuda)), device="cuda",
        dynamic_shapes={"ids": {0: Dim("n", min=1, max=4096)}, "offsets": {0: Dim("bags", min=1, max=256)}}))
    nodes = Dim("nodes", min=2, max=2048)
    _case("graph network", lambda: jit2triton.convert(
        torch.jit.script(Graph().to(cuda)), (torch.randn(100, 16, device=cuda),
                                             torch.randint(0, 100, (2, 400), device=cuda)), device="cuda",
        dynamic_shapes={"x": {0: nodes}, "edge_index": {1: Dim("edges", min=1, max=8192)}}))
    _case("custom op that aborts", lambda: jit2triton.convert(
        torch.jit.script(Fragile()), (torch.rand(64, 64, device=cuda),), device="cuda"))
    _case("positions past the table", lambda: jit2triton.convert(
        torch.jit.script(Positions().to(cuda)), (torch.randn(2, 16, 8, device=cuda),), device="cuda",
        dynamic_shapes={"x": {1: Dim("seq", min=1, max=128)}}))


if __name__ == "__main__":
    main()
