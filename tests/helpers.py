"""Helpers shared by test modules (a test module never imports another test module)."""
from __future__ import annotations

import dataclasses
import os
import re
import tempfile
from typing import Any, Callable, Optional

import pytest
import torch

import jit2triton
from jit2triton.transpiler import kernel_ir as K
from jit2triton.transpiler.lowering import load_lowerings
from jit2triton.transpiler.op_table import OP_TABLE

from models import MODELS, ModelSpec

EXAMPLE_SEED = 0  # the draw that makes a model's weights and example inputs (what conversion sees)
FRESH_SEED = 1234  # the draws of the inputs a package is checked on, which conversion never saw


def _triton_interpreted() -> bool:
    """Whether this process's Triton runs kernels in its interpreter (TRITON_INTERPRET was set before triton was
    imported). Without TRITON_INTERPRET it cannot be, and Triton is not imported to find out."""
    if not os.environ.get("TRITON_INTERPRET"):
        return False
    try:
        from jit2triton.emitters.compile_triton import interpreter_active
        return interpreter_active()
    except ImportError:
        return False


INTERPRETED = _triton_interpreted()
HAS_GPU = torch.cuda.is_available()
TRITON_ON_CPU = INTERPRETED
TRITON_ON_GPU = HAS_GPU and not INTERPRETED
GPU_TOLERANCE = 2e-5  # tl.exp is the GPU's fast exp (about 7 ulp); TorchScript's reference runs on the CPU

# Long tests (the sanitized fuzz's builds and mutations, serving under load, the rest of the fuzz seeds, the Triton
# interpreter's fallback models) run with JIT2TRITON_LONG_TESTS=1: CI's 20 minutes on two cores hold the rest
LONG_TESTS = os.environ.get("JIT2TRITON_LONG_TESTS") == "1"
long_test = pytest.mark.skipif(not LONG_TESTS, reason="a long test: set JIT2TRITON_LONG_TESTS=1 to run it")

on_cpu = pytest.mark.skipif(not INTERPRETED, reason="Triton kernels run on the CPU only under its interpreter: "
                                                    "start Python with TRITON_INTERPRET=1")


def kernel_body(code: str, name: str = "") -> str:
    """A C++ kernel's function in a module's code (kernel `name`, else the first): its AVX2 body where it has an
    AVX-512 twin (emitters/cpp_wide.py), from its signature to its closing brace."""
    kernel = re.escape(name) if name else r"\w+"
    found = re.search(rf"static int {kernel}_avx2\(", code) or re.search(rf"J2T_KERNEL int {kernel}\(", code)
    if not name:  # (the first kernel: its AVX2 body comes before its entry)
        starts = [m for m in (re.search(r"static int \w+_avx2\(", code), re.search(r"J2T_KERNEL int \w+\(", code))
                  if m]
        found = min(starts, key=lambda m: m.start()) if starts else None
    assert found is not None, f"no kernel {name or ''} in the code"
    end = code.find("\n}", found.start())
    return code[found.start():end + 2 if end >= 0 else len(code)]


def on_gpu(test):
    """Marks a test `gpu` and skips it without a CUDA device or with Triton in its interpreter (which cannot
    compile for the GPU)."""
    skip = pytest.mark.skipif(not TRITON_ON_GPU,
                              reason="needs a CUDA device and Triton's compiler (start Python without TRITON_INTERPRET)")
    return pytest.mark.gpu(skip(test))
# Where kernels are generated for: C++ on the CPU; Triton on the CPU under its interpreter (TRITON_INTERPRET=1);
# Triton compiled for a CUDA GPU (on the GPU machine, without TRITON_INTERPRET)
BACKENDS = ["cpp",
            pytest.param("triton", marks=pytest.mark.skipif(
                not TRITON_ON_CPU, reason="Triton kernels run on the CPU only under TRITON_INTERPRET=1")),
            pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
                not TRITON_ON_GPU, reason="needs a CUDA device and Triton's compiler (no TRITON_INTERPRET)")])]


def convert_for(model, example: tuple, backend: str, **options):
    """Convert for one of BACKENDS ("cuda": the Triton backend on the GPU, inputs moved there)."""
    if backend == "cuda":
        example = tuple(x.cuda() if isinstance(x, torch.Tensor) else x for x in example)
        return jit2triton.convert(model, example, device="cuda", **options)
    return jit2triton.convert(model, example, backend=backend, **options)


def converted_and_loaded(model, example, path, **options) -> tuple:
    """(the converted module, its package saved at `path` and loaded again): the two a user runs."""
    module = jit2triton.convert(model, example, **options)
    module.save(str(path))
    return module, jit2triton.load(str(path))


def fused_ops(converted) -> set[str]:
    """The TorchScript ops the package's generated kernels compute."""
    return {op for kernel in converted.summary()["kernels"] for op in kernel["ops"]}


def plan_ops(package) -> list[str]:
    """The op of every step of a package's plan, in order, inside blocks and graph regions too ("kernel" for a
    kernel step)."""
    found: list[str] = []

    def walk(steps):
        for step in steps:
            found.append(step.get("op") or "kernel")
            for block in step.get("blocks") or []:
                walk(block["steps"])
            walk(step.get("steps") or [])

    walk(package.manifest["plan"]["steps"])
    return found


def to_device(inputs: tuple, device) -> tuple:
    return tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs)


def to_cpu(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.cpu()
    if isinstance(x, (tuple, list)):
        return type(x)(to_cpu(v) for v in x)
    if isinstance(x, dict):
        return {k: to_cpu(v) for k, v in x.items()}
    return x

TOLERANCE = {torch.float64: (1e-7, 1e-9), torch.float32: (2e-4, 2e-5), torch.float16: (1e-2, 1e-3),
             torch.bfloat16: (2e-2, 1e-2)}  # dtype -> (rtol, atol)


def assert_same(actual: Any, expected: Any, where: str = "output", tolerances: Optional[dict] = None) -> None:
    """Same structure, dtypes, shapes; values within `tolerances` (dtype -> (rtol, atol); default TOLERANCE), and
    exactly for every dtype it does not name (ints and bools)."""
    tolerances = TOLERANCE if tolerances is None else tolerances
    assert type(actual) is type(expected), f"{where}: got {type(actual).__name__}, expected {type(expected).__name__}"
    if isinstance(expected, torch.Tensor):
        assert actual.dtype == expected.dtype and actual.shape == expected.shape, \
            f"{where}: {actual.dtype}{list(actual.shape)}, expected {expected.dtype}{list(expected.shape)}"
        rtol, atol = tolerances.get(expected.dtype, (0, 0))
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True,
                                   msg=lambda m: f"{where}: {m}")
    elif isinstance(expected, (tuple, list)):
        assert len(actual) == len(expected), f"{where}: {len(actual)} items, expected {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same(a, e, f"{where}[{i}]", tolerances)
    elif isinstance(expected, dict):
        assert list(actual) == list(expected), f"{where}: keys {list(actual)}, expected {list(expected)}"
        for key in expected:
            assert_same(actual[key], expected[key], f"{where}[{key!r}]", tolerances)
    else:
        assert actual == expected, f"{where}: {actual!r}, expected {expected!r}"


def copied(inputs: tuple) -> tuple:
    return tuple(x.clone() if isinstance(x, torch.Tensor) else x for x in inputs)


def assert_matches_torchscript(converted, model: Callable, make_inputs: Callable[[], tuple], calls: int = 2) -> None:
    """The converted module, and the same package saved and loaded back, give TorchScript's outputs on `calls`
    fresh draws of `make_inputs`."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model.j2t")
        converted.save(path)
        loaded = jit2triton.load(path)
        device = converted.device
        for call in range(calls):
            inputs = make_inputs()
            expected = model(*copied(inputs))
            on_device = to_device(inputs, device)
            with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):  # the CPU reference has no TF32
                results = {"converted": converted(*copied(on_device)), "loaded": loaded(*copied(on_device))}
            for name, result in results.items():
                if device.type == "cuda":
                    assert_close_on_gpu(to_cpu(result), expected, f"{name}, call {call}")
                else:
                    assert_same(result, expected, f"{name}, call {call}")


def assert_close_on_gpu(actual: Any, expected: Any, where: str) -> None:
    """A GPU package against TorchScript on the CPU: the GPU's exp and reduction orders differ by a few ulp, which
    deep models grow; 1e-3 of each output's scale still catches every wrong kernel."""
    if isinstance(expected, (tuple, list)):
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_close_on_gpu(a, e, f"{where}[{i}]")
        return
    if not isinstance(expected, torch.Tensor) or not expected.is_floating_point():
        return assert_same(actual, expected, where)
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, where
    # infinities and NaNs where TorchScript has them, and the error measured over the finite rest (an inf in the scale
    # made every error NaN)
    actual, expected = actual.cpu(), expected.cpu()
    assert torch.equal(torch.isnan(actual), torch.isnan(expected)), f"{where}: NaN at other places"
    inf = torch.isinf(expected)
    assert torch.equal(torch.isinf(actual), inf) and torch.equal(actual[inf], expected[inf]), \
        f"{where}: infinities at other places"
    finite = torch.isfinite(expected)
    if not finite.any():
        return
    actual, expected = actual[finite], expected[finite]
    scale = expected.abs().max().clamp_min(1e-6)
    error = ((actual - expected).abs().max() / scale).item()
    assert error < 1e-3, f"{where}: max error {error:.3g} of the output's scale"


# --- the zoo of tests/models.py ----------------------------------------------------------------------------------


def build(spec: ModelSpec, tmp_path) -> tuple[Any, Any, tuple]:
    """-> (what to convert, the TorchScript reference to compare against, the example inputs)."""
    torch.manual_seed(EXAMPLE_SEED)
    model, example = spec.build()
    if not spec.from_file:
        return model, model, example
    path = tmp_path / f"{spec.name}.pt"
    torch.jit.save(model, str(path))
    return path, torch.jit.load(str(path)), example


def fresh_calls(spec: ModelSpec, example: tuple) -> list[tuple]:
    """The spec's fresh inputs (drawn from FRESH_SEED), checked to differ from the example's."""
    torch.manual_seed(FRESH_SEED)
    calls = spec.fresh_inputs()
    example_tensors = [x for x in example if isinstance(x, torch.Tensor)]
    for call in calls:
        tensors = [x for x in call if isinstance(x, torch.Tensor)]
        assert not all(torch.equal(a, b) for a, b in zip(tensors, example_tensors)), "fresh inputs repeat the example"
    return calls


def assert_same_outputs(actual: Any, expected: Any, spec: ModelSpec, where: str = "output") -> None:
    """A zoo model's outputs: floating values within the spec's rtol/atol, the rest exactly."""
    floating = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128)
    assert_same(actual, expected, f"{spec.name} {where}", {dtype: (spec.rtol, spec.atol) for dtype in floating})


def cuda_zoo():
    """Every zoo model, with and without CUDA graphs."""
    for spec in MODELS:
        for graphs in (True, False):
            yield pytest.param(spec, graphs, id=f"{spec.name}-{'graphs' if graphs else 'no_graphs'}")


def assert_matches_on_cuda(loaded, spec: ModelSpec, example: tuple, reference) -> None:
    """A GPU package against the CPU TorchScript reference on fresh inputs, three calls each (with CUDA graphs:
    step by step, then captured, then replayed)."""
    tolerant = type(spec)(**{**spec.__dict__, "rtol": max(spec.rtol, GPU_TOLERANCE),
                             "atol": max(spec.atol, GPU_TOLERANCE)})
    for call in fresh_calls(spec, example):
        expected = reference(*copied(call))
        for _ in range(3):
            assert_same_outputs(to_cpu(loaded(*to_device(call, "cuda"))), expected, tolerant)


# --- the op table's lowerings and their samples (tests/op_samples) ------------------------------------------------


def lowered_ops() -> list[str]:
    """Every op the op table lowers (the lowerings register themselves in OP_TABLE when loaded)."""
    load_lowerings()
    return sorted(op for op, info in OP_TABLE.items() if info.lowering is not None)


LOWERED = lowered_ops()
OP_TOLERANCES = {torch.float32: (1e-5, 1e-5), torch.float64: (1e-7, 1e-7), torch.bfloat16: (1.6e-2, 1e-2),
                 torch.float16: (1e-3, 1e-3)}  # (rtol, atol) of one op's output; every other dtype exactly


def assert_same_op_output(actual: Any, expected: Any, where: str) -> None:
    """One op's outputs against TorchScript's, within OP_TOLERANCES (tighter than TOLERANCE, which allows for a
    whole model's rounding)."""
    assert_same(actual, expected, where, OP_TOLERANCES)


def assert_ran_in_a_kernel(op: str, converted: jit2triton.Converted) -> None:
    """`op` ran in a generated kernel: not through ATen, and in some kernel's fused ops."""
    summary = converted.summary()
    assert op not in summary["fallback_ops"], (
        f"{op} ran through ATen ({summary['fallback_reasons'][op]}):\n{converted.report()}")
    assert op in {o for kernel in summary["kernels"] for o in kernel["ops"]}, (
        f"{op} is in no generated kernel (does the sample call this overload?):\n{converted.report()}")


def permuted(call: tuple) -> tuple:
    """The same values, with every matrix-like input as a non-contiguous (transposed-storage) view."""
    views = tuple(x.mT.contiguous().mT if isinstance(x, torch.Tensor) and x.dim() >= 2 and min(x.shape[-2:]) > 1
                  else x for x in call)
    assert any(isinstance(x, torch.Tensor) and not x.is_contiguous() for x in views), "no input to permute"
    return views


def assert_runtimes_match(converted, model, make_input, tmp_path, calls: int = 2, tolerance: float = 1e-5) -> None:
    """The package saved and loaded, called `calls` times on fresh inputs, against TorchScript
    (float32 within `tolerance`, relative and absolute)."""
    path = tmp_path / "model.j2t"
    converted.save(path)
    loaded = jit2triton.load(path)
    for call in range(calls):
        x = make_input()
        with torch.no_grad():
            assert_same(loaded(x), model(x), f"call {call}", {torch.float32: (tolerance, tolerance)})


def record_built_kernels(monkeypatch) -> list:
    """A list that fills with every kernel the conversions after this call build (their kernel IR)."""
    from jit2triton import conversion
    kernels: list = []
    build_kernels = conversion.build_kernels
    monkeypatch.setattr(conversion, "build_kernels",
                        lambda found, *rest: kernels.extend(found) or build_kernels(found, *rest))
    return kernels


def compile_for_hopper(kernel):
    """Triton's compiled kernel for sm_90 from the kernel's rendered source, with the bundled ptxas: the GPU code
    path checked on a machine without a GPU. -> (the compiled kernel, the rendered one)."""
    from triton import compile as triton_compile
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from jit2triton.emitters.backends import BACKENDS
    from jit2triton.emitters.compile_triton import FP_FUSION, kernel_function
    rendered = BACKENDS["triton"].render([kernel])[0]  # a GEMM template's renderer, or the expressions'
    fn = kernel_function(rendered.source, rendered.name)
    config = rendered.configs[0]
    signature = dict(zip(fn.arg_names, rendered.arg_types)) | {c: "constexpr" for c in config["constants"]}
    constants = {(fn.arg_names.index(c),): v for c, v in config["constants"].items()}
    compiled = triton_compile(ASTSource(fn, signature, constexprs=constants), target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": config["num_warps"], "enable_fp_fusion": FP_FUSION})
    return compiled, rendered


class BertFeedForward(torch.nn.Module):
    """BERT-base's feed-forward block with its residual add and LayerNorm: at batch 1, the GEMM shapes whose forms
    differ most on the GPU."""

    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(768, 3072), torch.nn.Linear(3072, 768)
        self.norm = torch.nn.LayerNorm(768)

    def forward(self, x):
        return self.norm(x + self.down(torch.nn.functional.gelu(self.up(x))))


class LinearGeluNorm(torch.nn.Module):
    """The serving tests' model: a linear layer, GELU and LayerNorm over `features`."""

    def __init__(self, features: int):
        super().__init__()
        self.linear = torch.nn.Linear(features, features)
        self.norm = torch.nn.LayerNorm(features)

    def forward(self, x):
        return self.norm(torch.nn.functional.gelu(self.linear(x)))


def replace_pass(monkeypatch, name: str, run: Callable, **changes) -> None:
    """Run `run(graph, ctx)` in place of the pipeline's pass `name` (other fields of its record changed too, e.g.
    `devices=` to force a CUDA pass on a CPU conversion), for this test."""
    import dataclasses

    from jit2triton.transpiler import pipeline
    assert any(p.name == name for p in pipeline.PASSES), name
    monkeypatch.setattr(pipeline, "PASSES", [dataclasses.replace(p, run=run, **changes) if p.name == name else p
                                             for p in pipeline.PASSES])


def break_lowering(monkeypatch, op: str, how: str) -> None:
    """Make `op`'s lowering raise ("raise"), or give its values negated ("wrong"), to watch a ladder take it out."""
    load_lowerings()
    original = OP_TABLE[op]

    def broken(ctx, *args):
        if how == "raise":
            raise KeyError("an injected bug")
        box = original.lowering(ctx, *args)
        correct = box.fn
        box.fn = lambda index: K.op("neg", correct(index))
        return box
    monkeypatch.setitem(OP_TABLE, op, dataclasses.replace(original, lowering=broken))
