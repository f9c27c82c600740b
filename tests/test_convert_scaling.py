"""Conversion grows with the model, not faster: a deep DenseNet-style block (every layer reads the concatenation of
all earlier features, torchvision's BN-ReLU-conv1x1-BN-ReLU-conv3x3) converts and matches TorchScript, and the work
that was quadratic in depth is counted at two depths (counts, not seconds: this machine is shared).
benchmarks/convert_scaling.py times the same families per pass.

The block converts with choices="fixed": what is counted here is structure, and a timed choice changes it (where
channels-last timed faster, its convolutions fuse with oneDNN, and the kernel counts of the two depths no longer
compare), so on a loaded machine the counts were at the mercy of one timing. The choices themselves are tested in
tests/test_timed_choices.py."""
from __future__ import annotations

import torch
from torch import nn

import jit2triton
from jit2triton.transpiler import infer_shapes, merge_kernels
from jit2triton.transpiler.fuse import clone_graph
from jit2triton.transpiler.ir import Block, Graph, Node, Value

GROWTH = 4


class DenseLayer(nn.Module):
    def __init__(self, cin: int) -> None:
        super().__init__()
        self.norm1, self.conv1 = nn.BatchNorm2d(cin), nn.Conv2d(cin, 2 * GROWTH, 1, bias=False)
        self.norm2, self.conv2 = nn.BatchNorm2d(2 * GROWTH), nn.Conv2d(2 * GROWTH, GROWTH, 3, padding=1, bias=False)

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        x = self.conv1(torch.relu(self.norm1(torch.cat(features, 1))))
        return self.conv2(torch.relu(self.norm2(x)))


class DenseBlock(nn.Module):
    def __init__(self, depth: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DenseLayer(8 + i * GROWTH) for i in range(depth))

    def forward(self, x):
        features = [x]
        for layer in self.layers:
            features.append(layer(features))
        return torch.cat(features, 1)


def _trained(model: nn.Module) -> nn.Module:
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
    return model.eval()


def _convert(depth: int, monkeypatch) -> tuple[dict, jit2triton.Converted, torch.jit.ScriptModule]:
    """Convert a dense block of `depth` layers, counting merge_kernels' host tests and the model's observed runs."""
    counts = {"joinable": 0, "observed_runs": 0}
    joinable, next_draw = merge_kernels._joinable, infer_shapes.ShapeRecorder.next_draw

    def counted_joinable(host, node):
        counts["joinable"] += 1
        return joinable(host, node)

    def counted_draw(recorder, sizes):
        counts["observed_runs"] += 1
        return next_draw(recorder, sizes)

    monkeypatch.setattr(merge_kernels, "_joinable", counted_joinable)
    monkeypatch.setattr(infer_shapes.ShapeRecorder, "next_draw", counted_draw)
    torch.manual_seed(0)
    example = (torch.randn(1, 8, 4, 4),)
    traced = torch.jit.trace(_trained(DenseBlock(depth)), example)
    converted = jit2triton.convert(traced, example_inputs=example, choices="fixed")
    return counts, converted, traced


def test_a_deep_dense_block_converts_with_work_linear_in_its_depth(monkeypatch):
    """At 12 and 24 layers: the package matches TorchScript; kernels grow with the layers, but the C++ bodies they
    compile to do not (a cat of more than 8 inputs is ATen's, and kernels that differ only in sizes share a body:
    the C++ grew with the square of the depth); merge_kernels tests a host per kernel at most (it tested every
    earlier kernel); a static conversion observes the model once in each of its two observations (it was five)."""
    rows = {}
    for depth in (12, 24):
        counts, converted, traced = _convert(depth, monkeypatch)
        for _ in range(2):
            x = torch.randn(1, 8, 4, 4)
            torch.testing.assert_close(converted(x), traced(x), rtol=1e-4, atol=1e-4)
        kernels = len(converted.manifest["kernels"])
        assert counts["joinable"] <= kernels, counts
        assert counts["observed_runs"] == 2, counts
        assert converted.summary()["verification"]["status"] == "passed"
        rows[depth] = (kernels, converted.manifest["cpp"]["bodies"], len(converted.code))
    (k12, b12, code12), (k24, b24, code24) = rows[12], rows[24]
    assert 1.8 * k12 <= k24 <= 2.2 * k12, rows
    assert b24 <= b12 + 2, rows
    assert code24 <= 2.2 * code12, rows


def test_the_report_says_how_long_each_pass_took(monkeypatch):
    _, converted, _ = _convert(2, monkeypatch)
    seconds = converted.summary()["pass_seconds"]
    for stage in ("load", "observe", "channels_last", "reobserve", "fuse", "kernels", "build_plan", "verify"):
        assert stage in seconds and seconds[stage] >= 0, seconds
    assert "conversion took" in converted.report()


def test_clone_graph_copies_the_structure_and_shares_only_what_is_never_changed():
    """fuse and channels_last rewrite a clone: every block, node, value and attrs dict is new (value ids and node
    uids kept), a literal list is copied, types, sources and weights are shared."""
    x, items, joined = Value("x"), Value("items"), Value("joined")
    dims = Value("dims")
    weight = torch.randn(3)
    graph = Graph(Block([x], [
        Node("prim::Constant", [], [dims], attrs={"value": [0, 1]}),
        Node("prim::ListConstruct", [x, x], [items]),
        Node("aten::cat", [items, dims], [joined], blocks=[Block([], [], [x])]),
    ], [joined]), weights={"w": weight})
    copy = clone_graph(graph)
    assert str(copy) == str(graph)
    assert copy.weights == graph.weights and copy.weights is not graph.weights and copy.weights["w"] is weight
    old, new = list(graph.walk()), list(copy.walk())
    for a, b in zip(old, new):
        assert a is not b and a.uid == b.uid and a.attrs is not b.attrs and a.source is b.source
        for u, v in zip(a.inputs + a.outputs, b.inputs + b.outputs):
            assert u is not v and u.id == v.id and u.type is v.type
    assert new[0].attrs["value"] == [0, 1] and new[0].attrs["value"] is not old[0].attrs["value"]
    assert new[1].inputs[0] is copy.inputs[0] and new[2].blocks[0].outputs[0] is copy.inputs[0]

