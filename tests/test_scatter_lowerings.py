"""Scatters (`aten::scatter_add`, `aten::index_add`, `aten::scatter_reduce.two`: transpiler/lower_scatter.py) run in
generated kernels on both backends, as graph networks use them: a GCN layer (gather by the edge list, scale, sum
into the destination), GraphSAGE's mean aggregation (as scatter_reduce "mean", and as a sum over a count), GAT's
softmax over each node's edges (amax, exp, sum). Each model is written with plain torch ops as torch_geometric
traces them, traced, converted, and compared with TorchScript on fresh random graphs (indices repeat: more edges
than nodes), with no kernel taken out at verification; the gather and the message run inside the scatter's kernel.
An index out of range, or negative, raises as ATen's does; a dtype the atomics cannot take runs through ATen,
counted."""
from __future__ import annotations

import pytest
import torch

import jit2triton
from jit2triton.transpiler import lower_scatter

from helpers import BACKENDS, assert_matches_torchscript, convert_for, on_gpu

NODES, EDGES, FEATURES = 12, 40, 8


def graph(features: int = FEATURES):
    """x [nodes, features], edge_index [2, edges] (repeats and self loops allowed), an edge weight."""
    return (torch.randn(NODES, features), torch.randint(0, NODES, (2, EDGES)), torch.rand(EDGES) + 0.5)


class GCNLayer(torch.nn.Module):
    """GCNConv's propagate: x W gathered by the source, scaled by the symmetric norm, summed into the target."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(FEATURES, 16)

    def forward(self, x, edge_index, weight):
        row, col = edge_index[0], edge_index[1]
        degree = weight.new_zeros(x.size(0)).scatter_add_(0, col, weight)
        norm = degree.pow(-0.5)
        norm = norm.masked_fill(norm == float("inf"), 0.0)
        norm = norm.index_select(0, row) * weight * norm.index_select(0, col)
        h = self.lin(x)
        message = h.index_select(0, row) * norm.view(-1, 1)
        out = h.new_zeros(x.size(0), 16).scatter_add_(0, col.view(-1, 1).expand_as(message), message)
        return torch.relu(out)


class SAGELayer(torch.nn.Module):
    """SAGEConv's mean aggregation, both ways torch_geometric writes it."""

    def __init__(self) -> None:
        super().__init__()
        self.neighbours = torch.nn.Linear(FEATURES, 16)
        self.root = torch.nn.Linear(FEATURES, 16, bias=False)

    def forward(self, x, edge_index, weight):
        row, col = edge_index[0], edge_index[1]
        message = x.index_select(0, row)
        index = col.view(-1, 1).expand_as(message)
        mean = x.new_zeros(x.size(0), FEATURES).scatter_reduce_(0, index, message, "mean", include_self=False)
        total = x.new_zeros(x.size(0), FEATURES).scatter_add_(0, index, message)
        count = x.new_zeros(x.size(0)).scatter_add_(0, col, x.new_ones(col.size(0))).clamp(min=1)
        return self.neighbours(mean) + self.root(x), total / count.view(-1, 1)


class GATLayer(torch.nn.Module):
    """GATConv's attention: per edge a score, softmax over each target's edges (torch_geometric.utils.softmax:
    amax without the destination's zeros, exp, an index_add sum), the messages weighted and summed."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(FEATURES, 16, bias=False)
        self.att_src = torch.nn.Parameter(torch.randn(1, 2, 8))
        self.att_dst = torch.nn.Parameter(torch.randn(1, 2, 8))

    def forward(self, x, edge_index, weight):
        row, col = edge_index[0], edge_index[1]
        h = self.lin(x).view(-1, 2, 8)
        alpha = ((h * self.att_src).sum(-1).index_select(0, row) + (h * self.att_dst).sum(-1).index_select(0, col))
        alpha = torch.nn.functional.leaky_relu(alpha, 0.2)
        top = alpha.new_zeros(x.size(0), 2).scatter_reduce_(0, col.view(-1, 1).expand_as(alpha), alpha, "amax",
                                                             include_self=False)
        alpha = (alpha - top.index_select(0, col)).exp()
        total = alpha.new_zeros(x.size(0), 2).index_add_(0, col, alpha) + 1e-16
        alpha = alpha / total.index_select(0, col)
        message = h.index_select(0, row) * alpha.unsqueeze(-1)
        out = h.new_zeros(x.size(0), 2, 8).scatter_add_(0, col.view(-1, 1, 1).expand_as(message), message)
        return out.mean(1)


class SelfLoopGCN(torch.nn.Module):
    """GCNConv as torch_geometric traces it: self loops dropped by a mask and added back for every node, so the
    number of edges is a size the data sets (a dynamic dim): the degree (ones scattered into zeros) and the message
    sum scatter over it."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(FEATURES, 16)

    def forward(self, x, edge_index, weight):
        kept = edge_index[:, edge_index[0] != edge_index[1]]
        loops = torch.arange(x.size(0)).view(1, -1).repeat(2, 1)
        edge_index = torch.cat([kept, loops], 1)
        row, col = edge_index[0], edge_index[1]
        ones = torch.ones(col.size(0))
        degree = x.new_zeros(x.size(0)).scatter_add_(0, col, ones)
        norm = degree.pow(-0.5)
        norm = norm.masked_fill(norm == float("inf"), 0.0)
        norm = norm[row] * norm[col]
        h = self.lin(x)
        message = h.index_select(0, row) * norm.view(-1, 1)
        out = h.new_zeros(x.size(0), 16).scatter_add_(0, col.view(-1, 1).expand_as(message), message)
        return torch.relu(out + h)


def reductions(x, edge_index, weight):
    """Every reduction, with and without the destination's values, along dim 0 and 1, into an input and a fresh
    tensor; an in-place index_add through a slice (what functionalize.py turns into index_add + slice_scatter)."""
    row, col = edge_index[0], edge_index[1]
    src = x.index_select(0, row) * weight.view(-1, 1)
    index = col.view(-1, 1).expand_as(src)
    out = x.new_zeros(x.size(0), 2 * FEATURES)
    out[:, :FEATURES].index_add_(0, col, src)
    return (x.scatter_reduce(0, index, src, "amin", include_self=True),
            x.scatter_reduce(0, index, src, "amax", include_self=True),
            x.scatter_reduce(0, index, src, "amin", include_self=False),
            x.scatter_reduce(0, index, src, "mean", include_self=True),
            x.t().scatter_reduce(1, index.t(), src.t(), "sum", include_self=False),
            out)


def integers(x, edge_index, weight):
    """Integer scatters are exact: sums, a floored mean, max."""
    col = edge_index[1]
    values = (x * 10).long()
    index = col.view(-1, 1).expand(EDGES, FEATURES)
    src = values.index_select(0, edge_index[0])
    return (values.scatter_add(0, index, src), values.scatter_reduce(0, index, -src, "mean", include_self=False),
            values.scatter_reduce(0, index, src, "amax", include_self=True))


SCATTERS = {"aten::scatter_add", "aten::index_add", "aten::scatter_reduce.two"}
MODELS = {"gcn": (GCNLayer, {"aten::scatter_add"}), "self_loop_gcn": (SelfLoopGCN, {"aten::scatter_add"}), "sage": (SAGELayer, {"aten::scatter_add",
                                                                        "aten::scatter_reduce.two"}),
          "gat": (GATLayer, SCATTERS), "reductions": (lambda: reductions, SCATTERS - {"aten::scatter_add"}),
          "integers": (lambda: integers, {"aten::scatter_add", "aten::scatter_reduce.two"})}


def traced(name: str):
    torch.manual_seed(0)
    make, _ = MODELS[name]
    module = make()
    model = module.eval() if isinstance(module, torch.nn.Module) else module
    return torch.jit.trace(model, graph(), check_trace=False)


@pytest.fixture
def any_columns(monkeypatch):
    """On the GPU a scatter over fewer than MIN_GPU_COLUMNS columns stays ATen's (the faster there): these small
    graphs take the generated kernel anyway, so that its correctness is tested on the GPU too."""
    monkeypatch.setattr(lower_scatter, "MIN_GPU_COLUMNS", 0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(MODELS))
def test_scatters_run_in_kernels_and_match_torchscript(name: str, backend: str, any_columns) -> None:
    model = traced(name)
    torch.manual_seed(1)
    converted = convert_for(model, graph(), backend)
    summary = converted.summary()
    assert summary["verification"]["kernels_removed"] == [], converted.report()
    assert not SCATTERS & set(summary["fallback_ops"]), converted.report()
    in_kernels = {op for kernel in summary["kernels"] for op in kernel["ops"]}
    assert MODELS[name][1] <= in_kernels, converted.report()
    torch.manual_seed(2)
    assert_matches_torchscript(converted, model, graph, calls=3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_scatter_over_a_count_the_data_sets_stays_right_call_after_call(backend: str, tmp_path) -> None:
    """GCN with its self loops masked out: each fresh graph has another number of edges, which the scatters' kernels
    take per call (and a Triton sum's output is zeroed by its launcher each call, in memory the last call used). Six
    calls on fresh graphs in the runtime, against TorchScript."""
    model = traced("self_loop_gcn")
    converted = convert_for(model, graph(), backend)
    assert not SCATTERS & set(converted.summary()["fallback_ops"]), converted.report()  # (the kernels are tested)
    converted.save(tmp_path / "m.j2t")
    device = "cuda" if backend == "cuda" else "cpu"
    loaded = jit2triton.load(tmp_path / "m.j2t")
    torch.manual_seed(5)
    counts = set()
    for _ in range(6):
        x, edge_index, weight = graph()
        counts.add(int((edge_index[0] != edge_index[1]).sum()))
        got = loaded(x.to(device), edge_index.to(device), weight.to(device))
        torch.testing.assert_close(got.cpu(), model(x, edge_index, weight), rtol=1e-4, atol=1e-5)
    assert len(counts) > 1  # (the edge count did change between calls)


@on_gpu
def test_on_the_gpu_a_narrow_sum_is_a_kernel_and_a_narrow_max_stays_atens() -> None:
    """A graph network's few feature columns: a sum is update-parallel (its programs cover the edges), so it is
    generated at any width; a max owns columns, a handful of programs, so ATen's scatter runs it, and the report
    says why."""
    converted = convert_for(traced("gat"), graph(), "cuda")
    summary = converted.summary()
    assert "columns on the GPU" in summary["fallback_reasons"].get("aten::scatter_reduce.two", ""), converted.report()
    assert "aten::scatter_add" not in summary["fallback_ops"], converted.report()
    torch.manual_seed(2)
    assert_matches_torchscript(converted, traced("gat"), graph, calls=2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_gcn_message_runs_inside_the_scatters_kernel(backend: str, any_columns) -> None:
    """gather -> scale -> scatter_add is one kernel: the messages [edges, features] are never stored."""
    converted = convert_for(traced("gcn"), graph(), backend)
    kernels = [kernel["ops"] for kernel in converted.summary()["kernels"]]
    message = [ops for ops in kernels if "aten::scatter_add" in ops and "aten::index_select" in ops
               and "aten::mul.Tensor" in ops]
    assert message, kernels


def elu_gathered_per_edge(x, w, edge_index):
    """GraphSAGE's second layer's read: a node's ELU gathered for each of its edges (EDGES > NODES reads)."""
    h = torch.nn.functional.elu(x @ w + 1.0)
    return torch.zeros(NODES, w.shape[1]).index_add(0, edge_index[1], h.index_select(0, edge_index[0]))


@pytest.mark.parametrize("backend", BACKENDS[:2])  # (the CPU backends: on the GPU it stays fused)
def test_a_transcendental_gathered_per_edge_is_computed_once_per_node_on_the_cpu(backend: str) -> None:
    """The ELU's kernel is stored before the gather on the CPU (fuse.store_gathered_reduction), not recomputed in
    the gather's kernel for every edge; the package matches TorchScript."""
    def make():
        x, edge_index, _ = graph()
        return x, torch.randn(FEATURES, 6), edge_index
    model = torch.jit.trace(elu_gathered_per_edge, make())
    converted = convert_for(model, make(), backend)
    kernels = [kernel["ops"] for kernel in converted.summary()["kernels"]]
    gathering = [ops for ops in kernels if "aten::index_select" in ops]
    assert gathering and not any("aten::elu" in ops for ops in gathering), kernels
    assert any("aten::elu" in ops for ops in kernels), kernels
    assert_matches_torchscript(converted, model, make, calls=6)


ON_CPU = BACKENDS[:2]  # (on CUDA a bad index is a device-side assert, which ends the process's CUDA context)


@pytest.mark.parametrize("backend", ON_CPU)
@pytest.mark.parametrize("bad", [NODES, -1])
def test_an_index_out_of_range_raises(backend: str, bad: int) -> None:
    model = traced("gcn")
    converted = convert_for(model, graph(), backend)
    x, edge_index, weight = graph()
    edge_index[1, 3] = bad
    with pytest.raises(Exception, match="out of range|out of bounds"):
        model(x, edge_index, weight)  # (ATen refuses it too)
    with pytest.raises(Exception, match="index out of range"):
        converted(x, edge_index, weight)


def scatter_only(x, edge_index, src):
    """Indices only the scatters read (a gather of the same index would check it anyway)."""
    col = edge_index[1]
    return (x.scatter_add(0, col.view(-1, 1).expand_as(src), src),
            x.index_add(0, col, src), x.scatter_reduce(0, col.view(-1, 1).expand_as(src), src, "amax"))


@pytest.mark.parametrize("backend", ON_CPU)
@pytest.mark.parametrize("bad", [NODES, -1])
def test_a_scatters_index_out_of_range_raises(backend: str, bad: int) -> None:
    model = torch.jit.script(scatter_only)
    draw = lambda: (torch.randn(NODES, FEATURES), torch.randint(0, NODES, (2, EDGES)),  # noqa: E731
                    torch.randn(EDGES, FEATURES))
    converted = convert_for(model, draw(), backend)
    assert not SCATTERS & set(converted.summary()["fallback_ops"]), converted.report()
    x, edge_index, src = draw()
    edge_index[1, 5] = bad
    with pytest.raises(Exception, match="out of range|out of bounds"):
        model(x, edge_index, src)
    with pytest.raises(Exception, match="index out of range"):
        converted(x, edge_index, src)


def half_scatter(x, index, src):
    return x.scatter_add(0, index, src) * 2


def test_a_dtype_without_atomics_runs_through_aten_counted() -> None:
    model = torch.jit.script(half_scatter)
    draw = lambda: (torch.randn(4, 6).bfloat16(), torch.randint(0, 4, (9, 6)),  # noqa: E731
                    torch.randn(9, 6).bfloat16())
    converted = convert_for(model, draw(), "cpp")
    summary = converted.summary()
    assert summary["fallback_ops"] == {"aten::scatter_add": 1}, converted.report()
    assert "generated scatters take 32- and 64-bit numbers" in summary["fallback_reasons"]["aten::scatter_add"]
    assert_matches_torchscript(converted, model, draw)


def aggregations(x, edge_index, src, weight):
    col = edge_index[1]
    message = src * weight.view(-1, 1)
    index = col.view(-1, 1).expand_as(message)
    return (x.index_add(0, col, message), x.scatter_reduce(0, index, message, "mean", include_self=False),
            x.scatter_reduce(0, index, message, "amax"))


def test_a_cpp_scatter_adds_in_index_order_at_any_thread_count(tmp_path) -> None:
    """Threads own whole columns, each adding in index order as ATen's CPU kernels do: the same bits as ATen's,
    on one thread or two (work enough for the parallel loop)."""
    model = torch.jit.script(aggregations)
    draw = lambda: (torch.randn(512, 32), torch.randint(0, 512, (2, 2048)), torch.randn(2048, 32),  # noqa: E731
                    torch.rand(2048))
    converted = convert_for(model, draw(), "cpp")
    assert not SCATTERS & set(converted.summary()["fallback_ops"]), converted.report()
    converted.save(tmp_path / "m.j2t")
    inputs = draw()
    expected = model(*inputs)
    for threads in (1, 2):
        for got, want in zip(jit2triton.load(tmp_path / "m.j2t", num_threads=threads)(*inputs), expected):
            assert torch.equal(got, want), f"{threads} threads: {(got - want).abs().max().item()}"
