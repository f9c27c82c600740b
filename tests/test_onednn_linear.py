"""GEMMs by constant weights run as oneDNN's linear on the CPU where it is faster (transpiler/onednn_linear.py), an
activation after one as its epilogue. Every package is checked against TorchScript on fresh inputs, in both
runtimes; the rewrite is forced (`MODE = "always"`) where a test is about its form, since the timed choice depends
on the machine."""
import pytest
import torch
import torch.nn.functional as F

import jit2triton
from jit2triton.transpiler import onednn_linear
from helpers import assert_runtimes_match, assert_same

pytestmark = pytest.mark.skipif(not onednn_linear._available(), reason="this torch has no oneDNN")


@pytest.fixture
def always(monkeypatch):
    monkeypatch.setattr(onednn_linear, "MODE", "always")


class Gemms(torch.nn.Module):
    """Each GEMM form the rewrite takes, each followed by an activation it can fold."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(64, 96)
        self.W = torch.nn.Parameter(torch.randn(96, 48) * 0.1)  # x @ W
        self.conv1d_weight = torch.nn.Parameter(torch.randn(48, 48) * 0.1)  # GPT-2's Conv1D: addmm(b, x, W)
        self.conv1d_bias = torch.nn.Parameter(torch.randn(48))

    def forward(self, x):
        h = F.gelu(self.fc(x))
        h = torch.tanh(h @ self.W)
        flat = torch.sigmoid(torch.addmm(self.conv1d_bias, h.reshape(-1, 48), self.conv1d_weight))
        return flat, torch.relu(torch.mm(flat, self.conv1d_weight))  # mm reads the weight transposed too


def _steps(converted, op=onednn_linear.OP) -> list[dict]:
    return [s for s in converted.manifest["plan"]["steps"] if s.get("op") == op]




def test_each_gemm_form_runs_as_onednn_with_its_activation_folded_in(always, tmp_path):
    torch.manual_seed(0)
    make = lambda: torch.randn(3, 5, 64)
    traced = torch.jit.trace(Gemms().eval(), make())
    converted = jit2triton.convert(traced, (make(),))
    nodes = [e for e in converted.manifest["nodes"] if e["op"] == onednn_linear.OP]
    assert sorted(tuple(e["from_ops"]) for e in nodes) == [
        ("aten::addmm", "aten::sigmoid"), ("aten::linear", "aten::gelu"), ("aten::matmul", "aten::tanh"),
        ("aten::mm", "aten::relu")], nodes
    kernels = [e for e in converted.manifest["nodes"] if e["category"] == "kernel"]
    assert not kernels, kernels  # every activation went into its GEMM: no kernel is left to run one
    assert converted.summary()["extern_nodes"] == 8  # four GEMMs and the four activations they took in
    assert_runtimes_match(converted, traced, make, tmp_path)


def test_a_transposed_weight_is_packaged_once_and_the_original_not_at_all(always):
    torch.manual_seed(0)
    traced = torch.jit.trace(Gemms().eval(), torch.randn(2, 64))
    weights = jit2triton.convert(traced, (torch.randn(2, 64),))._contents.weights
    assert "self_W.t" in weights and "self_W" not in weights and tuple(weights["self_W.t"].shape) == (48, 96)
    assert "self_conv1d_weight.t" in weights and "self_conv1d_weight" not in weights  # addmm's and mm's: once
    assert len(weights) == 5, sorted(weights)  # fc's weight and bias, W.t, the Conv1D's bias and weight.t


def test_each_weight_is_reordered_once_at_load_and_stored_plain(always, tmp_path):
    """The plan's packed list reorders each weight into oneDNN's layout once (addmm and mm share the Conv1D's), the
    steps read the packed forms, and the package keeps the plain tensors."""
    torch.manual_seed(0)
    make = lambda: torch.randn(3, 5, 64)
    traced = torch.jit.trace(Gemms().eval(), make())
    converted = jit2triton.convert(traced, (make(),))
    packed = converted.manifest["plan"]["packed"]
    assert [e["op"] for e in packed] == [onednn_linear.REORDER_OP] * 3, packed
    assert all(step["args"][1][0] == "p" for step in _steps(converted)), _steps(converted)
    assert all(not w.is_mkldnn for w in converted._contents.weights.values())
    assert_runtimes_match(converted, traced, make, tmp_path)


class TwoReaders(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x):
        y = self.fc(x)
        return F.gelu(y), y * 2  # gelu is not y's only reader: y itself must exist


def test_an_activation_stays_apart_when_the_gemm_output_has_another_reader(always, tmp_path):
    torch.manual_seed(0)
    model = torch.jit.trace(TwoReaders().eval(), torch.randn(4, 16))
    converted = jit2triton.convert(model, (torch.randn(4, 16),))
    (step,) = _steps(converted)
    assert converted.manifest["nodes"][step["node"]]["from_ops"] == ["aten::linear"]
    assert_runtimes_match(converted, model, lambda: torch.randn(4, 16), tmp_path)


def test_an_activation_in_a_branch_joins_the_gemm_outside_it(always):
    """The relu runs where the linear does (its value is the same there), whichever branch a call takes."""
    @torch.jit.script
    def branchy(x, w, flag: bool):
        y = F.linear(x, w)
        if flag:
            z = torch.relu(y)
        else:
            z = x * 2
        return z

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(8, 8))

        def forward(self, x, flag: bool):
            return branchy(x, self.w, flag)

    scripted = torch.jit.script(Model().eval())
    converted = jit2triton.convert(scripted, (torch.randn(3, 8), True))
    (step,) = _steps(converted)
    assert converted.manifest["nodes"][step["node"]]["from_ops"] == ["aten::linear", "aten::relu"]
    for flag in (True, False, True):
        x = torch.randn(3, 8)
        torch.testing.assert_close(converted(x, flag), scripted(x, flag), rtol=1e-5, atol=1e-5)


def test_addmm_with_other_scales_and_gemms_by_inputs_stay_aten(always):
    torch.manual_seed(0)
    w, b = torch.randn(8, 8), torch.randn(8)

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w, self.b = torch.nn.Parameter(w), torch.nn.Parameter(b)

        def forward(self, x, y):
            return torch.addmm(self.b, x, self.w, beta=0.5), x @ y  # a scaled bias; no constant weight

    traced = torch.jit.trace(Model().eval(), (torch.randn(4, 8), torch.randn(8, 8)))
    converted = jit2triton.convert(traced, (torch.randn(4, 8), torch.randn(8, 8)))
    assert not _steps(converted)
    x, y = torch.randn(4, 8), torch.randn(8, 8)
    assert_same(converted(x, y), traced(x, y))


def test_the_timed_choice_keeps_aten_where_onednn_is_not_faster(monkeypatch, steady_timing):
    """`auto` rewrites only where oneDNN takes at most MARGIN of ATen's time: with a margin nothing meets, ATen's
    linear stays; with one everything meets, oneDNN's runs."""
    torch.manual_seed(0)
    traced = torch.jit.trace(torch.nn.Linear(32, 24).eval(), torch.randn(6, 32))
    monkeypatch.setattr(onednn_linear, "_chosen", {})
    monkeypatch.setattr(onednn_linear, "MARGIN", 0.0)
    assert not _steps(jit2triton.convert(traced, (torch.randn(6, 32),)))
    monkeypatch.setattr(onednn_linear, "_chosen", {})
    monkeypatch.setattr(onednn_linear, "MARGIN", 1e9)
    converted = jit2triton.convert(traced, (torch.randn(6, 32),))
    assert len(_steps(converted)) == 1
    x = torch.randn(6, 32)
    torch.testing.assert_close(converted(x), traced(x), rtol=1e-5, atol=1e-5)


def test_a_dynamic_batch_runs_through_onednn_at_every_size(always, tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).eval()
    traced = torch.jit.trace(model, torch.randn(4, 32))
    batch = jit2triton.Dim("batch", min=1, max=256)
    converted = jit2triton.convert(traced, (torch.randn(4, 32),), dynamic_shapes={0: {0: batch}})
    assert len(_steps(converted)) == 2
    sizes = iter([1, 7, 256, 3])
    assert_runtimes_match(converted, traced, lambda: torch.randn(next(sizes), 32), tmp_path)
