"""On CUDA each GEMM by a constant weight takes the ATen form the GPU ran fastest at convert time
(transpiler/gemm_forms.py). The rewrites themselves are device-independent ATen graphs, so here they are forced
(`MODE = <form>`) on the CPU and every package is checked against TorchScript on fresh inputs; the timed choice is
checked with the timings replaced, and on the GPU for real."""
import pytest
import torch
import torch.nn.functional as F

import jit2triton
from jit2triton.transpiler import gemm_forms, onednn_linear, timing
from jit2triton.transpiler.constant_gemm import ConstantGemm
from jit2triton.transpiler.ir import Type, Value
from jit2triton.transpiler.symbolic import SymSize
from helpers import BertFeedForward, assert_same, on_gpu


class Gemms(torch.nn.Module):
    """Each GEMM form the model may write, each read by something else: a pointwise op (which takes a bias in),
    a GEMM (which does not), and the caller."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(64, 96)
        self.plain = torch.nn.Linear(96, 96, bias=False)
        self.W = torch.nn.Parameter(torch.randn(96, 48) * 0.1)  # x @ W
        self.conv1d_weight = torch.nn.Parameter(torch.randn(48, 48) * 0.1)  # GPT-2's Conv1D: addmm(b, x, W)
        self.conv1d_bias = torch.nn.Parameter(torch.randn(48))
        self.out = torch.nn.Linear(48, 32)

    def forward(self, x):
        h = F.gelu(self.fc(x))  # the bias can join the GELU's kernel
        g = self.plain(h)
        s = torch.softmax(g @ g.transpose(-1, -2), -1)  # read by a GEMM: a bias would need its own kernel
        h = torch.tanh(h @ self.W)
        flat = torch.addmm(self.conv1d_bias, h.reshape(-1, 48), self.conv1d_weight)
        return s, self.out(flat)  # returned as it is


@pytest.fixture(autouse=True)
def no_onednn(monkeypatch):
    monkeypatch.setattr(onednn_linear, "MODE", "never")  # on the CPU it would take the GEMMs over
    monkeypatch.setattr(gemm_forms, "_timed", {})


def _gemms(converted) -> list[dict]:
    return [e for e in converted.manifest["nodes"] if e["op"] in ("aten::linear", "aten::matmul", "aten::addmm")]


@pytest.mark.parametrize("form", gemm_forms.FORMS)
def test_each_form_computes_what_torchscript_does(form, monkeypatch, tmp_path):
    monkeypatch.setattr(gemm_forms, "MODE", form)
    torch.manual_seed(0)
    make = lambda: torch.randn(3, 5, 64)
    traced = torch.jit.trace(Gemms().eval(), make())
    converted = jit2triton.convert(traced, (make(),))
    gemms = [e for e in _gemms(converted) if "from_ops" in e]  # the model's g @ g^T is no constant GEMM
    expected = {"linear": "aten::linear", "linear_add": "aten::linear", "kn": "aten::matmul"}[form]
    rewritten = {"linear": 2, "linear_add": 4, "kn": 4}[form]  # the model's own form stays as it is
    assert len(gemms) == rewritten and all(e["op"] == expected for e in gemms), gemms
    weights = converted._contents.weights
    stored_kn = {n for n, w in weights.items() if n.endswith(".t")}
    if form == "kn":  # linear's weights are stored transposed, the model's x @ W as it was
        assert stored_kn == {"self_fc_weight.t", "self_plain_weight.t", "self_out_weight.t"}, sorted(weights)
        assert "self_fc_weight" not in weights
    else:  # x @ W and the addmm's weight are stored as linear's
        assert stored_kn == {"self_W.t", "self_conv1d_weight.t"}, sorted(weights)
    path = tmp_path / "model.j2t"
    converted.save(path)
    loaded = jit2triton.load(path)
    for call in range(2):
        x = make()
        assert_same(loaded(x), traced(x), f"{form}, call {call}", {torch.float32: (1e-5, 1e-5)})


def test_a_bias_taken_out_of_the_gemm_joins_the_kernel_after_it(monkeypatch):
    monkeypatch.setattr(gemm_forms, "MODE", "linear_add")
    traced = torch.jit.trace(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU()).eval(), torch.randn(4, 32))
    converted = jit2triton.convert(traced, (torch.randn(4, 32),))
    kernels = [e for e in converted.manifest["nodes"] if e["category"] == "kernel"]
    assert len(kernels) == 1, kernels  # add and GELU in one kernel
    fused = [f["op"] for f in kernels[0]["fused"]]
    assert "aten::add.Tensor" in fused and "aten::gelu" in fused, fused


def _gemm(transposed=False, bias=True) -> ConstantGemm:
    tensor = lambda shape: Value("v", Type("Tensor", "float32", shape, "cuda"))  # noqa: E731
    return ConstantGemm(tensor((9, 768)), tensor((768, 3072) if transposed else (3072, 768)),
                        tensor((3072,)) if bias else None, transposed)


@pytest.mark.parametrize("times, bias_fuses, own, chosen", [
    ({"linear": 33.8, "linear_add": 19.8, "kn": 13.7}, True, False, "kn"),  # BERT's FFN out, on an H100
    ({"linear": 10.0, "linear_add": 9.9, "kn": 9.8}, True, False, "linear"),  # within the margin: the model's own
    ({"linear": 10.0, "linear_add": 6.0, "kn": 9.0}, False, False, "linear_add"),
    ({"linear": 5.0, "linear_add": 9.0, "kn": 9.0}, True, True, "linear"),  # x @ W whose transpose runs faster
    ({"linear": 9.7, "linear_add": 9.6, "kn": 9.8}, True, True, "kn"),  # ... but not by the margin
])
def test_the_choice_takes_the_fastest_form_by_a_margin(times, bias_fuses, own, chosen, monkeypatch):
    timed = []

    def time_forms(forms, *rest):
        timed.extend((form, rest[-1]) for form in forms)
        return {form: times[form] for form in forms}
    monkeypatch.setattr(gemm_forms, "_time_forms", time_forms)
    gemm = _gemm(transposed=own)
    assert gemm_forms.choose(gemm, bias_fuses, [{}]) == chosen
    assert {f for f, _ in timed} == set(gemm_forms.FORMS) and all(fuses == bias_fuses for _, fuses in timed)
    timed.clear()
    assert gemm_forms.choose(gemm, bias_fuses, [{}]) == chosen and not timed  # once per shape and process


def test_over_a_dynamic_range_the_form_never_far_behind_wins(monkeypatch):
    """Converted at 1024 rows, `linear` is fastest there by a hair, but 2.5x behind at the range's 16 rows: the
    package serves the whole range, so `kn`, never more than 5% behind, is taken (H100-like BERT FFN times)."""
    micros = {1024: {"linear": 10.0, "linear_add": 12.0, "kn": 10.5}, 16: {"linear": 33.8, "linear_add": 19.8,
              "kn": 13.7}, 32768: {"linear": 100.0, "linear_add": 103.0, "kn": 104.0}}
    timed_rows = []

    def time_forms(forms, rows, *rest):
        timed_rows.append(rows)
        return {form: micros[rows][form] for form in forms}
    monkeypatch.setattr(gemm_forms, "_time_forms", time_forms)
    rows = SymSize.symbol("b") * SymSize.symbol("s")
    gemm = ConstantGemm(Value("x", Type("Tensor", "float32", (rows, 768), "cuda")),
                        Value("w", Type("Tensor", "float32", (3072, 768), "cuda")),
                        Value("b", Type("Tensor", "float32", (3072,), "cuda")), False)
    points = timing.range_points({"b": (1, 64, 8), "s": (16, 512, 128)})
    assert points == [{"b": 8, "s": 128}, {"b": 1, "s": 16}, {"b": 64, "s": 512}]
    assert gemm_forms.choose(gemm, True, points) == "kn"
    assert timed_rows == [1024, 16, 32768]
    assert gemm_forms.choose(gemm, True, points[:1]) == "linear"  # at the example alone, as before


def test_a_form_that_cannot_be_timed_keeps_the_model_s_own(monkeypatch):
    def fail(forms, *rest):
        raise RuntimeError("CUDA out of memory")
    monkeypatch.setattr(gemm_forms, "_time_forms", fail)
    assert gemm_forms.choose(_gemm(), True, [{}]) == "linear"
    assert gemm_forms.choose(_gemm(transposed=True), True, [{}]) == "kn"


def test_a_generated_form_whose_timing_fails_leaves_aten_s_forms_chosen(monkeypatch):
    """The template's own timing raising (a Triton that cannot build it here) costs that form only: the GEMM still
    takes the fastest of ATen's forms, and conversion's other GEMMs their choices."""
    monkeypatch.setattr(gemm_forms, "_time_forms", lambda forms, *rest: {"linear": 33.8, "linear_add": 19.8,
                                                                          "kn": 13.7})

    def template(timed):
        if timed:
            raise TypeError("the template's timing failed")
        return None, {}
    assert gemm_forms.choose(_gemm(), True, [{}], template) == "kn"
    monkeypatch.setattr(gemm_forms, "_timed", {})
    assert gemm_forms.choose(_gemm(), True, [{}], lambda timed: (1e-6, {})) == gemm_forms.GENERATED


def test_without_a_bias_only_the_two_layouts_are_timed(monkeypatch):
    timed = []
    monkeypatch.setattr(gemm_forms, "_time_forms", lambda forms, *rest: timed.extend(forms) or dict.fromkeys(forms, 1.0))
    gemm_forms.choose(_gemm(bias=False), True, [{}])
    assert sorted(timed) == ["kn", "linear"]


def test_on_the_cpu_nothing_is_timed_or_rewritten(monkeypatch):
    monkeypatch.setattr(gemm_forms, "_time_forms", lambda *a: pytest.fail("timed on the CPU"))
    traced = torch.jit.trace(Gemms().eval(), torch.randn(2, 64))
    converted = jit2triton.convert(traced, (torch.randn(2, 64),))
    assert _gemms(converted) and not any("from_ops" in e for e in _gemms(converted))


@on_gpu
@pytest.mark.parametrize("dtype, rows", [(torch.float32, 9), (torch.float16, 256)])
def test_timed_forms_on_the_gpu_match_torchscript(dtype, rows, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)  # the reference runs without TF32 too

    torch.manual_seed(0)
    model = BertFeedForward().eval().cuda().to(dtype)
    traced = torch.jit.trace(model, torch.randn(1, rows, 768, device="cuda", dtype=dtype))
    converted = jit2triton.convert(traced, (torch.randn(1, rows, 768, device="cuda", dtype=dtype),), device="cuda")
    print(gemm_forms._timed)
    path = tmp_path / "m.j2t"
    converted.save(path)
    tolerance = {torch.float32: (1e-4, 1e-4), torch.float16: (2e-2, 2e-2)}
    loaded = jit2triton.load(path)
    for call in range(3):
        x = torch.randn(1, rows, 768, device="cuda", dtype=dtype)
        assert_same(loaded(x), traced(x), f"call {call}", tolerance)
