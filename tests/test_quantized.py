"""Quantized TorchScript models: quantize_dynamic's Linear, LSTM and GRU, a static-quantized conv net and 8-bit
embeddings convert and match TorchScript on fresh inputs. A quantized op's own output matches
exactly (the same ATen kernel over the same packed weights); where a generated float kernel follows, within float
rounding. Packed parameters are stored as their parts (integers, scales, zero points) and packed again at load; a
package whose packing engine is missing here, or whose packing step was edited, is refused clearly."""
from __future__ import annotations

import re

import pytest
import torch
from click.testing import CliRunner
from torch import nn

import jit2triton
from jit2triton.cli import main
from jit2triton.deploy.policy import RECONVERT
from jit2triton.errors import ConversionError, CorruptPackageError, QuantizedEngineError
from jit2triton.transpiler.packed_params import unpack

from helpers import EXAMPLE_SEED, FRESH_SEED, assert_same
from package_tools import manifest_of, rewrite_package
from quantized_models import dynamic_mlp, dynamic_rnn, quantized_embeddings, static_convnet

FLOAT_ROUNDING = {torch.float32: (1e-5, 1e-6)}  # a generated kernel after the quantized op: summation order only
CASES = {  # name -> (the quantized model, its inputs)
    "mlp": (dynamic_mlp, lambda: (torch.randn(8, 64),)),
    "lstm": (lambda: dynamic_rnn(nn.LSTM), lambda: (torch.randn(3, 7, 32),)),
    "gru": (lambda: dynamic_rnn(nn.GRU), lambda: (torch.randn(3, 7, 32),)),
    "lstm_fp16": (lambda: dynamic_rnn(nn.LSTM, dtype=torch.float16, bidirectional=True),
                  lambda: (torch.randn(3, 7, 32),)),
    "convnet": (static_convnet, lambda: (torch.randn(2, 3, 16, 16),)),
    "embeddings": (quantized_embeddings, lambda: (torch.randint(0, 100, (4, 6)),)),
}


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """(case, trace or script) -> (package path, the TorchScript module, its inputs), converted once per module."""
    made = {}

    def convert(case: str, how: str):
        if (case, how) not in made:
            build, inputs = CASES[case]
            torch.manual_seed(EXAMPLE_SEED)
            model, example = build(), inputs()
            script = torch.jit.trace(model, example) if how == "trace" else torch.jit.script(model)
            path = tmp_path_factory.mktemp(f"{case}_{how}") / "model.j2t"
            jit2triton.convert(script, example_inputs=example).save(path)
            made[case, how] = path, script, inputs
        return made[case, how]
    return convert


@pytest.mark.parametrize("case, how", [("mlp", "trace"), ("mlp", "script"), ("lstm", "trace"), ("lstm", "script"),
                                       ("gru", "trace"), ("lstm_fp16", "trace"), ("convnet", "trace"),
                                       ("convnet", "script"), ("embeddings", "trace")])
def test_a_quantized_model_matches_torchscript_in_the_runtime(case: str, how: str, converted, cpp_runtime) -> None:
    path, script, inputs = converted(case, how)
    torch.manual_seed(FRESH_SEED)
    draws = [inputs() for _ in range(3)]
    loaded = jit2triton.load(path)
    assert loaded.summary()["verification"]["status"] == "passed"
    for i, call in enumerate(draws):
        with torch.inference_mode():
            assert_same(loaded(*call), script(*call), f"draw {i}", FLOAT_ROUNDING)


def test_a_static_quantized_op_output_matches_torchscript_exactly(tmp_path, cpp_runtime) -> None:
    """The conv net's dequantized logits, with no kernel after them: bit for bit what TorchScript computes."""
    class Logits(nn.Module):
        def __init__(self, net: nn.Module) -> None:
            super().__init__()
            self.net = net

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            net = self.net
            y = net.relu1(net.bn1(net.conv1(net.quant(x))))
            z = net.pool(net.skip.add(y, net.relu2(net.bn2(net.conv2(y)))))
            return net.dequant(net.fc(net.gap(net.join.cat([z, z], 1)).flatten(1)))

    torch.manual_seed(EXAMPLE_SEED)
    traced = torch.jit.trace(Logits(static_convnet()), (torch.randn(2, 3, 16, 16),))
    path = tmp_path / "logits.j2t"
    jit2triton.convert(traced, example_inputs=(torch.randn(2, 3, 16, 16),)).save(path)
    torch.manual_seed(FRESH_SEED)
    loaded = jit2triton.load(path)
    for _ in range(3):
        x = torch.randn(2, 3, 16, 16) * 3
        assert torch.equal(loaded(x), traced(x))


def test_packed_parameters_are_stored_as_their_parts_and_packed_at_load(converted) -> None:
    path, _, _ = converted("convnet", "trace")
    manifest = manifest_of(path)
    packed = manifest["plan"]["packed"]
    ops = [entry["op"] for entry in packed]
    assert ops.count("quantized::conv2d_prepack") == 2 and ops.count("quantized::linear_prepack") == 1
    assert ops.count("aten::_make_per_channel_quantized_tensor") == 3  # the x86 qconfig: per-channel weights
    engines = {entry["engine"] for entry in packed if "prepack" in entry["op"]}
    assert engines == {torch.backends.quantized.engine}
    stored = {w["dtype"] for w in manifest["weights"].values()}
    assert {"int8", "float64", "int64", "float32"} <= stored  # integers, per-channel scales and zero points, biases
    steps = [step["op"] for step in manifest["plan"]["steps"] if step["kind"] == "call"]
    assert not any("prepack" in op or "_quantized_tensor" in op for op in steps), steps  # packed once, not per call
    assert manifest["report"]["packed_params"] == 3 and manifest["report"]["quantized_engine"] == engines.pop()
    assert "packed parameters: 3, stored as their integers" in jit2triton.load(path).report()


def test_quantized_tensors_never_enter_a_generated_kernel(converted) -> None:
    path, _, _ = converted("convnet", "trace")
    manifest = manifest_of(path)
    buffers = [b[0] for k in manifest["kernels"] for b in k["inputs"] + k["outputs"]]
    assert buffers and not any(dtype.startswith("q") for dtype in buffers), buffers
    summary = jit2triton.load(path).summary()
    fused = {op for k in summary["kernels"] for op in k["ops"]}
    assert {"aten::softmax.int", "aten::mul.Tensor"} <= fused  # the float ops after dequantize fuse as usual
    assert "quantized tensor" in summary["fallback_reasons"]["aten::max_pool2d"]  # over quint8: through ATen
    for op in ("aten::quantize_per_tensor", "aten::dequantize.self", "quantized::add", "quantized::cat"):
        assert summary["fallback_ops"][op] == 1, op
    assert summary["extern_nodes"] == 3  # two fused conv-relus and the linear: FBGEMM / oneDNN kernels


def test_a_package_packed_for_an_engine_this_torch_lacks_is_refused(converted, tmp_path, cpp_runtime) -> None:
    path, _, _ = converted("mlp", "trace")
    other = tmp_path / "other_engine.j2t"

    def pack_for_another_engine(manifest: dict) -> None:
        for entry in manifest["plan"]["packed"]:
            if "engine" in entry:
                entry["engine"] = "mobile_npu"
    rewrite_package(path, other, edit_manifest=pack_for_another_engine)
    with pytest.raises(QuantizedEngineError, match=r"packed for the mobile_npu quantized engine, which this torch "
                                                   r"does not have \(it has: .*x86.*\)"):
        jit2triton.load(other)


def test_a_packing_step_edited_to_another_op_is_refused(converted, tmp_path, cpp_runtime) -> None:
    path, _, _ = converted("mlp", "trace")
    edited = tmp_path / "edited.j2t"

    def call_another_op(manifest: dict) -> None:
        manifest["plan"]["packed"][0]["op"] = "aten::from_file"
    rewrite_package(path, edited, edit_manifest=call_another_op)
    with pytest.raises(CorruptPackageError, match="aten::from_file.*not an op that packs quantized weights"):
        jit2triton.load(edited)


def _drop_arguments(plan: dict) -> None:
    plan["packed"][-1]["args"] = []


def _read_an_unbuilt_constant(plan: dict) -> None:
    plan["packed"][-1]["args"][0] = ["p", "nowhere"]


def _step_reads_an_unbuilt_constant(plan: dict) -> None:
    step = next(s for s in plan["steps"] if any(r[0] == "p" for r in s["args"]))
    step["args"] = [["p", "nowhere"] if r[0] == "p" else r for r in step["args"]]


@pytest.mark.parametrize("damage", [_drop_arguments, _read_an_unbuilt_constant, _step_reads_an_unbuilt_constant])
def test_a_damaged_packed_list_is_refused_as_corrupt(damage, converted, tmp_path, cpp_runtime) -> None:
    path, _, _ = converted("lstm", "trace")  # RNN cells pack packed linears: entries read earlier entries
    damaged = tmp_path / "damaged.j2t"
    rewrite_package(path, damaged, edit_manifest=lambda manifest: damage(manifest["plan"]))
    with pytest.raises(CorruptPackageError, match=re.escape(RECONVERT)):
        jit2triton.load(damaged)


def test_a_torchscript_object_other_than_packed_parameters_is_refused_by_class() -> None:
    """Sparse packed weights (torch.ao.nn.sparse) have a class of the same short name as the dense ones."""
    previous = torch.backends.quantized.engine
    torch.backends.quantized.engine = "fbgemm"  # the only engine that packs sparse weights
    try:
        weight = torch.quantize_per_tensor(torch.randn(8, 16), 0.05, 0, torch.qint8)
        sparse = torch.ops.sparse.qlinear_prepack(weight, torch.randn(8), 1, 4)
    finally:
        torch.backends.quantized.engine = previous
    with pytest.raises(ConversionError, match=r"class __torch__\.torch\.classes\.sparse\.LinearPackedParamsBase; .*"
                                              r"rebuilds only the packed parameters of quantized ops"):
        unpack(sparse, "packed", None, {}, lambda name, taken: name)


def test_a_list_of_packed_parameters_is_built_from_its_items() -> None:
    """A constant list of packed objects (as an RNN's cell parameters are passed) becomes one list of the items'
    packings, typed by their class so the C++ runtime builds the list an op such as aten::quantized_lstm takes."""
    weight = torch.quantize_per_tensor(torch.randn(8, 16), 0.05, 0, torch.qint8)
    packed = [torch.ops.quantized.linear_prepack(weight, None) for _ in range(2)]
    weights: dict = {}
    nodes, made = unpack(packed, "cells", None, weights, lambda name, taken: name)
    assert [n.op for n in nodes].count("quantized::linear_prepack") == 2 and nodes[-1].op == "prim::ListConstruct"
    assert str(made.type) == "List[__torch__.torch.classes.quantized.LinearPackedParamsBase]"
    assert {str(w.dtype) for w in weights.values()} == {"torch.int8"}  # the integers; scale and zero point: literals


def test_the_cli_converts_a_saved_quantized_model_with_a_dynamic_batch(tmp_path) -> None:
    torch.manual_seed(EXAMPLE_SEED)
    model = tmp_path / "convnet.pt"
    torch.jit.save(torch.jit.script(static_convnet()), model)  # saved and loaded back: packed again by torch
    package = tmp_path / "convnet.j2t"
    runner = CliRunner()
    result = runner.invoke(main, ["convert", str(model), "-o", str(package), "--input", "2x3x16x16",
                                  "--dynamic-batch"])
    assert result.exit_code == 0, result.output
    for batch in (1, 5):
        result = runner.invoke(main, ["run", str(package), "--check", str(model), "--runs", "2",
                                      "--shape", f"batch={batch}"])
        assert result.exit_code == 0, result.output
        error = float(re.search(r"max abs error against .*: (\S+)", result.output).group(1))
        assert error < 1e-6, result.output


def test_a_quantized_model_converts_for_the_cpu_only() -> None:
    """torch's quantized kernels are CPU kernels: converting for CUDA is refused before anything runs (checked on
    the graph, so without a GPU)."""
    from jit2triton.loaders.torchscript import load_script
    from jit2triton.transpiler.from_torchscript import from_torchscript
    from jit2triton.transpiler.place_on_device import place_on_device

    script = load_script(torch.jit.trace(dynamic_mlp(), (torch.randn(2, 64),)))
    graph = from_torchscript(script.graph, script.input_names, script.name)
    with pytest.raises(ConversionError, match=r"quantized weights \(__torch__\.torch\.classes\.quantized\."
                                              r"LinearPackedParamsBase\) .*CPU only; convert it with device='cpu'"):
        place_on_device(graph, torch.device("cuda"))
    place_on_device(graph, torch.device("cpu"))
