"""Reduced precision (#33): a float32 model converted with precision="fp16"/"bf16" computes in that type but where
float32 is kept by rule (softmax, norms' statistics, large sums) or for accuracy, meets `accuracy` against the
float32 TorchScript model on fresh inputs, keeps its inputs' and outputs' dtypes, and says what stayed float32.

Run the Triton half under TRITON_INTERPRET=1 (its interpreter runs float16/bfloat16 kernels on the CPU)."""
from __future__ import annotations

import warnings

import pytest
import torch

import jit2triton
from jit2triton import precision as face
from jit2triton.errors import ConversionError
from jit2triton.transpiler import pipeline, precision_search
from jit2triton.transpiler.from_torchscript import from_torchscript
from jit2triton.transpiler.precision import PrecisionPlan
from jit2triton.loaders import load_script
from jit2triton.conversion import _run_plan

from helpers import (BACKENDS, FRESH_SEED, INTERPRETED, compile_for_hopper, convert_for,
                     record_built_kernels)


class Classifier(torch.nn.Module):
    """A linear layer, layer norm and softmax: statistics that must stay float32; two outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(32, 10)
        self.norm = torch.nn.LayerNorm(10)

    def forward(self, x):
        hidden = self.norm(self.linear(x))
        return torch.softmax(hidden, -1), hidden


class Overflowing(torch.nn.Module):
    """Values past float16's largest (65504) between two ops no rule keeps float32: only accuracy can find them."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(16, 16) / 4)

    def forward(self, x):
        big = x * 1000.0
        square = big * big  # past float16's range (constants it can hold: no rule keeps these float32)
        h = square @ self.w
        return torch.tanh(h * 1e-6 + x)


def _traced(module: torch.nn.Module, *example):
    torch.manual_seed(0)
    return torch.jit.trace(module.eval(), example)


def _fresh(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(FRESH_SEED))


def _convert(model, example, backend="cpp", **options):
    """Converted for one of BACKENDS ("cuda": inputs and package on the GPU)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", face.PrecisionWarning)  # float16 on this CPU is emulated
        return convert_for(model, example, backend, **options)


def _on(backend: str, x: torch.Tensor) -> torch.Tensor:
    return x.cuda() if backend == "cuda" else x


def _reduced_graph(model, example, dtype: str, keep=None):
    """The model's graph through the prepare passes with a precision plan: typed after the rewrite."""
    script = load_script(model)
    graph = from_torchscript(script.graph, script.input_names, script.name, False)
    ctx = pipeline.Context(torch.device("cpu"), list(example), _run_plan(torch.device("cpu")))
    ctx.precision = PrecisionPlan(dtype, dict(keep or {}))
    pipeline.prepare(graph, ctx, generate_kernels=False)
    return graph, ctx.precision


def _node(graph, op: str):
    return next(n for n in graph.walk() if n.op == op)


def test_every_float32_rule_names_an_op_of_the_table():
    from jit2triton.transpiler.lowering import load_lowerings
    from jit2triton.transpiler.op_table import OP_TABLE, ops_where
    load_lowerings()
    keeps_fp32 = ops_where("keeps_fp32")
    assert keeps_fp32 and set(keeps_fp32) <= set(OP_TABLE)
    assert all(OP_TABLE[name].keeps_fp32 == why for name, why in keeps_fp32.items())  # kept by lowering registration


def test_softmax_and_layer_norm_stay_float32_and_the_linear_runs_reduced():
    example = (torch.randn(4, 32),)
    graph, plan = _reduced_graph(_traced(Classifier(), *example), example, "float16")
    norm, softmax, linear = (_node(graph, op) for op in ("aten::layer_norm", "aten::softmax.int", "aten::linear"))
    assert linear.inputs[0].type.dtype == linear.inputs[1].type.dtype == linear.output.type.dtype == "float16"
    assert norm.inputs[0].type.dtype == "float32" and norm.output.type.dtype == "float32"
    assert norm.inputs[2].type.dtype == "float32"  # its weight, read by no reduced node, stays float32
    assert softmax.inputs[0].type.dtype == softmax.output.type.dtype == "float32"
    assert [t.dtype for t in graph.outputs[0].type.elems] == ["float32", "float32"]  # the model's, at the boundary
    assert {n["op"]: n["why"] for n in plan.fp32_nodes} == {
        "aten::layer_norm": "rule: normalization statistics (mean, variance)",
        "aten::softmax.int": "rule: sums exponentials"}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_reduced_package_meets_its_accuracy_on_fresh_inputs(backend, precision):
    example = (torch.randn(4, 32),)
    model = _traced(Classifier(), *example)
    converted = _convert(model, example, backend=backend, precision=precision)
    x = _fresh(4, 32)
    probabilities, hidden = (y.cpu() for y in converted(_on(backend, x)))
    expected = model(x)
    assert probabilities.dtype == hidden.dtype == torch.float32
    rtol, atol = face._tolerance(face.PRECISIONS[precision], None)
    for actual, reference in zip((probabilities, hidden), expected):
        assert (actual - reference).abs().max() <= atol + rtol * reference.abs().max()
        assert not torch.equal(actual, reference)  # it did compute in the reduced type
    weights = converted._contents.weights
    assert weights["self_linear_weight"].dtype == getattr(torch, face.PRECISIONS[precision])
    report = converted.manifest["report"]["precision"]
    assert report["dtype"] == face.PRECISIONS[precision]
    assert [o["output"] for o in report["outputs"]] == ["output[0]", "output[1]"]
    assert report["outputs"][0]["top1_agreement"] == 1.0
    assert {n["op"] for n in report["fp32_nodes"]} == {"aten::layer_norm", "aten::softmax.int"}
    assert "float32 by rule: aten::layer_norm x1" in converted.report()


@pytest.mark.parametrize("backend", BACKENDS)
def test_accuracy_moves_the_overflowing_nodes_back_to_float32(backend):
    example = (torch.randn(4, 16),)
    model = torch.jit.script(Overflowing().eval())
    converted = _convert(model, example, backend=backend, precision="fp16")
    moved = [n for n in converted.manifest["report"]["precision"]["fp32_nodes"] if n["why"].startswith("accuracy")]
    lines = [n["source"] for n in moved]
    assert any("square = big * big" in line for line in lines) and any("h = square @ self.w" in line for line in lines)
    x = _fresh(4, 16)
    assert (converted(_on(backend, x)).cpu() - model(x)).abs().max() <= 1e-3 + 1e-2 * model(x).abs().max()
    assert "float32 for accuracy: aten::mul.Tensor at" in converted.report()


def test_without_the_search_the_overflow_breaks_the_outputs():
    """The control for the test above: unverified, nothing moves back and the outputs are wrong."""
    example = (torch.randn(4, 16),)
    model = torch.jit.script(Overflowing().eval())
    converted = _convert(model, example, backend="cpp", precision="fp16", verify=False)
    assert not [n for n in converted.manifest["report"]["precision"]["fp32_nodes"] if n["why"].startswith("accuracy")]
    x = _fresh(4, 16)
    assert (converted(x) - model(x)).abs().nan_to_num(nan=float("inf")).max() > 0.1


class Attention(torch.nn.Module):
    def forward(self, q, k, v):
        return torch.softmax(q @ k.transpose(-2, -1) / 8, -1) @ v


def test_attention_softmax_stays_reduced_so_it_fuses_into_sdpa():
    """The fused attention kernel computes its softmax in float32: a cast around it would only hide the pattern."""
    example = tuple(torch.randn(2, 4, 16, 8) for _ in range(3))
    model = torch.jit.trace(Attention(), example)
    converted = _convert(model, example, backend="cpp", precision="fp16")
    assert "aten::scaled_dot_product_attention" in {entry["op"] for entry in converted.manifest["nodes"]}
    assert not converted.manifest["report"]["precision"]["fp32_nodes"]
    fresh = tuple(_fresh(2, 4, 16, 8) + i for i in range(3))
    assert torch.allclose(converted(*fresh), model(*fresh), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_io_precision_takes_and_gives_the_reduced_type(backend):
    example = (torch.randn(4, 32),)
    model = _traced(Classifier(), *example)
    converted = _convert(model, example, backend=backend, precision="bf16", io_precision="bf16")
    assert converted.signature() == "(x: bfloat16[4, 32]) -> Tuple[bfloat16[4, 10], bfloat16[4, 10]]"
    x = _fresh(4, 32)
    for actual, reference in zip(converted(_on(backend, x.bfloat16())), model(x)):
        assert actual.dtype == torch.bfloat16
        assert (actual.cpu().float() - reference).abs().max() <= 1e-2 + 5e-2 * reference.abs().max()


def test_a_search_that_cannot_meet_the_accuracy_says_what_to_do(monkeypatch):
    monkeypatch.setattr(precision_search, "MAX_MOVED", 1)  # the overflowing model needs three nodes moved
    example = (torch.randn(4, 16),)
    with pytest.raises(ConversionError, match="still misses accuracy.*1 nodes moved back.*looser accuracy="):
        _convert(torch.jit.script(Overflowing().eval()), example, precision="fp16")


def test_control_flow_converts_in_reduced_precision():
    @torch.jit.script
    def branchy(x, n: int):
        y = x * 2
        if bool(x.sum() > 0):
            y = y + 1
        for _ in range(n):
            y = torch.relu(y @ x.t() / 8) @ x
        return y

    example = (torch.randn(4, 4, generator=torch.Generator().manual_seed(0)), 2)
    converted = _convert(branchy, example, backend="cpp", precision="bf16")
    x = _fresh(4, 4)
    actual, expected = converted(x, 3), branchy(x, 3)
    assert actual.dtype == torch.float32
    assert (actual - expected).abs().max() <= 1e-2 + 5e-2 * expected.abs().max()  # the package's guarantee


def test_cpu_without_native_support_warns_and_emulates(monkeypatch):
    monkeypatch.setattr(face, "cpu_supports", lambda dtype: False)
    example = (torch.randn(4, 32),)
    with pytest.warns(face.PrecisionWarning, match="bf16.*avx512_bf16 or amx_bf16.*slower"):
        converted = jit2triton.convert(_traced(Classifier(), *example), example, precision="bf16")
    assert converted.manifest["report"]["precision"]["dtype"] == "bfloat16"
    monkeypatch.setattr(face, "cpu_supports", lambda dtype: True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", face.PrecisionWarning)
        jit2triton.convert(_traced(Classifier(), *example), example, precision="bf16")


def test_precision_may_be_named_as_torch_names_it():
    example = (torch.randn(4, 32),)
    converted = _convert(_traced(Classifier(), *example), example, precision=torch.bfloat16, io_precision="bfloat16")
    assert converted.signature() == "(x: bfloat16[4, 32]) -> Tuple[bfloat16[4, 10], bfloat16[4, 10]]"


@pytest.mark.parametrize("options, message", [
    ({"precision": "int8"}, "precision='int8' is not known"),
    ({"precision": ["fp16"]}, r"precision=\['fp16'\] is not known"),
    ({"precision": "fp16", "accuracy": {"rtol": 1e-2, "tol": 1}}, "accuracy takes 'rtol' and 'atol', not tol"),
    ({"precision": "fp16", "accuracy": {"rtol": -1}}, r"accuracy\['rtol'\] must be a non-negative number"),
    ({"accuracy": {"rtol": 1e-2}}, "accuracy= applies to a reduced-precision package"),
    ({"io_precision": "fp16"}, "io_precision= applies to a reduced-precision package"),
    ({"precision": "fp16", "io_precision": "bf16"}, "io_precision='bf16': inputs and outputs either keep"),
])
def test_bad_precision_options_are_refused(options, message):
    example = (torch.randn(4, 32),)
    with pytest.raises(ConversionError, match=message):
        _convert(_traced(Classifier(), *example), example, **options)


def test_cli_converts_in_reduced_precision(tmp_path):
    from click.testing import CliRunner
    from jit2triton.cli import main
    example = (torch.randn(4, 32),)
    path = tmp_path / "classifier.pt"
    _traced(Classifier(), *example).save(str(path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", face.PrecisionWarning)
        result = CliRunner().invoke(main, ["convert", str(path), "--input", "4x32", "--precision", "fp16",
                                           "--rtol", "0.02"])
    assert result.exit_code == 0, result.output
    assert "precision float16, held to rtol 0.02, atol 0.001" in result.output
    assert jit2triton.load(tmp_path / "classifier.j2t").manifest["report"]["precision"]["dtype"] == "float16"


@pytest.mark.skipif(INTERPRETED, reason="compiling needs Triton's compiler: start Python without TRITON_INTERPRET")
def test_reduced_kernels_compile_to_hopper_cubins(monkeypatch):
    """float16/bfloat16 loads, float32 math and rounding stores compile for sm_90 with this Triton's ptxas."""
    pytest.importorskip("triton")
    kernels = record_built_kernels(monkeypatch)
    example = (torch.randn(4, 32),)
    for precision in ("fp16", "bf16"):
        _convert(_traced(Classifier(), *example), example, precision=precision)
    assert {b.dtype for k in kernels for b in k.inputs + k.outputs} >= {"float16", "bfloat16", "float32"}
    for kernel in kernels:
        compiled, _ = compile_for_hopper(kernel)
        assert compiled.asm["cubin"][:4] == b"\x7fELF"


class MaskedScores(torch.nn.Module):
    """transformers' attention mask: `torch.where(mask, 0.0, torch.finfo(torch.float32).min)`, a constant float16
    cannot hold (ATen refused to convert it: 'value cannot be converted to type c10::Half without overflow')."""

    def forward(self, scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        bias = torch.where(mask, torch.tensor(0.0), torch.finfo(torch.float32).min)
        return torch.softmax(scores * 0.5 + bias, dim=-1)


def test_a_constant_beyond_the_reduced_range_keeps_its_node_float32():
    scores, mask = torch.randn(2, 4, 8), torch.rand(2, 4, 8) > 0.3
    mask[..., 0] = True  # every row attends somewhere
    model = _traced(MaskedScores(), scores, mask)
    graph, plan = _reduced_graph(model, (scores, mask), "float16")
    kept = {n["op"]: n["why"] for n in plan.fp32_nodes}
    assert any(op.startswith("aten::where") and "beyond float16's range" in why for op, why in kept.items()), kept
    converted = _convert(model, (scores, mask), precision="fp16")
    fresh_scores, fresh_mask = _fresh(2, 4, 8), torch.rand(2, 4, 8, generator=torch.Generator().manual_seed(3)) > 0.3
    fresh_mask[..., 0] = True
    torch.testing.assert_close(converted(fresh_scores, fresh_mask), model(fresh_scores, fresh_mask), rtol=1e-2,
                               atol=1e-3)
