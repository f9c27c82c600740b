"""The Triton backend: generated `@triton.jit` kernels, on the CPU under Triton's interpreter and on CUDA as cubins
launched through the CUDA driver.

Triton decides when it is imported whether it interprets or compiles, so one pytest process runs one half:
    TRITON_INTERPRET=1 python -m pytest tests/test_triton_backend.py    # the CPU half, under the interpreter
    python -m pytest tests/test_triton_backend.py                       # the compiler half: kernels compiled for
                                                                         # sm_90 anywhere; on a GPU, the gpu tests
Every zoo model and every op of the op table (its samples, tests/op_samples) runs on the CPU half; the largest zoo
model (100k elements) takes under a second under the interpreter, so nothing is skipped for speed.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
import warnings

import pytest
import torch

import jit2triton
from jit2triton.transpiler import kernel_ir as K

from helpers import (EXAMPLE_SEED, FRESH_SEED, GPU_TOLERANCE, HAS_GPU, INTERPRETED, LOWERED, assert_matches_on_cuda,
                     assert_ran_in_a_kernel, assert_same_op_output, assert_same_outputs, build, compile_for_hopper,
                     copied, cuda_zoo, fresh_calls, on_cpu, on_gpu, permuted, record_built_kernels, to_device)
from models import MODELS
from op_samples import SAMPLES

pytest.importorskip("triton")
from jit2triton.emitters import compile_triton  # noqa: E402
from jit2triton.emitters import triton as triton_renderer  # noqa: E402
from jit2triton.emitters.triton import render_kernel  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")  # numpy, on masked-off lanes


def zoo():
    return [pytest.param(spec, id=spec.name) for spec in MODELS]


def run_package(source, example, device: str, tmp_path, name: str = "model"):
    """Convert with the triton backend, save, and load the package back."""
    path = tmp_path / f"{name}.j2t"
    jit2triton.convert(source, example_inputs=example, device=device, backend="triton").save(path)
    return jit2triton.load(path)


# --- the CPU, under the interpreter ------------------------------------------------------------------------------


@on_cpu
def test_a_flat_kernel_reads_a_buffer_laid_out_as_its_loop_nest_at_xindex(tmp_path):
    """No // and % to take the flat index apart and sum it up again; a strided read still takes it apart."""
    model = torch.jit.trace(lambda x, b, y: (torch.sin(x + b) * 2, torch.cos(y[:, ::2]) + 1),
                            (torch.randn(6, 5, 4), torch.randn(4), torch.randn(6, 10)))
    make = lambda: (torch.randn(6, 5, 4), torch.randn(4), torch.randn(6, 10))  # noqa: E731
    converted = jit2triton.convert(model, make(), backend="triton")
    sources = [data.decode() for name, data in converted._contents.files.items() if name.startswith("kernels/")]
    straight = [s for s in sources if "sin" in s.splitlines()[0]]  # by the kernel's name (the source line has both)
    transposed = [s for s in sources if "cos" in s.splitlines()[0]]
    assert len(straight) == len(transposed) == 1, sources
    assert "in_" in straight[0] and "//" not in straight[0], straight[0]  # b's index is xindex % 4
    assert "//" in transposed[0], transposed[0]
    for _ in range(2):
        args = make()
        for got, want in zip(converted(*args), model(*args)):
            torch.testing.assert_close(got, want)


@on_cpu
@pytest.mark.parametrize("spec", zoo())
def test_zoo_model_matches_torchscript_under_the_interpreter(spec, tmp_path):
    source, reference, example = build(spec, tmp_path)
    loaded = run_package(source, example, "cpu", tmp_path, spec.name)
    assert loaded.manifest["backend"] == "triton"
    for call in fresh_calls(spec, example):
        pristine = copied(call)
        assert_same_outputs(loaded(*call), reference(*copied(call)), spec)
        for i, (after, before) in enumerate(zip(call, pristine)):
            if isinstance(before, torch.Tensor):
                assert torch.equal(after, before), f"the package modified input {i} in place"


@on_cpu
@pytest.mark.parametrize("op", LOWERED)
def test_every_lowered_op_matches_torchscript_under_the_interpreter(op):
    if op not in SAMPLES:
        pytest.skip(f"{op} has no sample (test_ops.py reports it)")
    for i, sample in enumerate(SAMPLES[op]):
        torch.manual_seed(EXAMPLE_SEED)
        example = sample.make_inputs()
        model = sample.build(example)
        converted = jit2triton.convert(model, example_inputs=example, device="cpu", backend="triton")
        assert_ran_in_a_kernel(op, converted)
        torch.manual_seed(FRESH_SEED + i)
        fresh = sample.make_inputs()
        expected = model(*fresh)
        assert_same_op_output(converted(*fresh), expected, f"{op} sample {i}")
        assert_same_op_output(converted(*permuted(fresh)), expected, f"{op} sample {i}, inputs permuted")


def decomposed_ops(x, y, n, e):
    """Every op Triton renders through a kernel-IR decomposition (emitters/decompose.py)."""
    return (torch.expm1(x), torch.log1p(x.abs() - 0.5), torch.tanh(x), torch.round(x * 2.5), torch.div(x * 3, 1.7, rounding_mode="trunc"),
            torch.sign(x), torch.tan(x), torch.pow(y, e), torch.pow(n, 3), torch.sign(n))


@on_cpu
def test_decomposed_ops_match_torch_at_their_edges():
    """Values where the formulas need care: 0 and tiny (Kahan's expm1/log1p), saturation (tanh), halves (round
    to even), negative bases with odd, even and fractional exponents, 0**0, 1**nan, inf and nan."""
    edges = [0.0, -0.0, 1e-7, -1e-7, 1e-3, 0.5, -0.5, 1.5, 2.5, -2.5, 20.0, -20.0, 100.0, float("inf"),
             float("-inf"), float("nan"), 3.0, -3.0]
    x = torch.tensor(edges)
    y = torch.tensor([2.0, -2.0, 0.0, 1.0, -1.0, 3.0, -3.0, 0.5, -0.5, 1.5, 2.0, 0.0, -2.0, 2.0, 3.0, 0.0, 1.0,
                      -1.0])
    e = torch.tensor([3.0, 3.0, 0.0, float("nan"), 2.0, 0.5, 2.0, -1.0, 1.5, 2.0, 0.5, float("nan"), 0.25, 1.0,
                      -2.0, 2.5, 7.0, 4.0])
    n = torch.arange(-9, 9)
    model = torch.jit.trace(decomposed_ops, (x, y, n, e))
    converted = jit2triton.convert(model, example_inputs=(x, y, n, e), device="cpu", backend="triton",
                                   verify=False)
    assert converted.summary()["fallback_nodes"] == 0, converted.report()
    for i, (got, expected) in enumerate(zip(converted(x, y, n, e), model(x, y, n, e))):
        torch.testing.assert_close(got, expected, rtol=2e-6, atol=1e-6, equal_nan=True,
                                   msg=lambda m: f"output {i}: {m}")


def long_rows(x, w):
    """Rows past the one-tile limit: looped reductions (sum, max, argmax with NaN and ties) and a looped sweep."""
    centered = x - x.mean()  # a global mean, then a sweep over 3 x 5000 elements
    values, where = x.max(dim=1)
    return torch.softmax(x * w, dim=-1), centered, values, where, (x > 0).any(dim=1), x.sum(dim=0)


def long_rows_inputs():
    x = torch.randn(3, 5000)
    x[0, 4321] = float("nan")
    x[0, 4444] = float("nan")  # the first NaN wins
    x[1, 17] = x[1, 4999] = 50.0  # a tie: the first index wins
    return x, torch.randn(5000)


ONE_KERNEL_MODELS = {"0-d": (lambda x: torch.sin(x) + torch.cos(x), (torch.randn(()),)),
                     "inputs out of order": (lambda a, b: torch.exp(b) * a, (torch.randn(3, 4), torch.randn(3, 4)))}


@on_cpu
@pytest.mark.parametrize("name", list(ONE_KERNEL_MODELS))
def test_a_one_kernel_plan_returns_fresh_outputs(name, tmp_path):
    fn, example = ONE_KERNEL_MODELS[name]
    model = torch.jit.trace(fn, example)
    loaded = run_package(model, example, "cpu", tmp_path)
    call = tuple(torch.randn_like(x) for x in example)
    first, second = loaded(*call), loaded(*call)
    assert first.data_ptr() != second.data_ptr()  # each call's output is its own
    torch.testing.assert_close(first, model(*call))
    torch.testing.assert_close(second, model(*call))


@on_cpu
def test_looped_reductions_and_sweeps_match_torchscript(tmp_path):
    torch.manual_seed(0)
    example = long_rows_inputs()
    model = torch.jit.trace(long_rows, example)
    loaded = run_package(model, example, "cpu", tmp_path)
    assert "for r" in loaded.code and "for y_start in range" in loaded.code, "the looped paths were not exercised"
    fresh = long_rows_inputs()
    for actual, expected in zip(loaded(*fresh), model(*fresh)):
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5, equal_nan=True)


def integer_division(a, b):
    return torch.div(a, b, rounding_mode="trunc"), a // b, a % b, torch.fmod(a, b)


@on_cpu
def test_integer_division_truncates_floors_and_takes_the_divisors_sign_exactly_past_2_to_the_24():
    a = torch.tensor([2 ** 40 + 7, -7, 7, -2 ** 50 - 3, 0])
    b = torch.tensor([3, 2, -2, 5, -3])
    model = torch.jit.script(integer_division)
    converted = jit2triton.convert(model, example_inputs=(a, b), backend="triton")
    for actual, expected in zip(converted(a, b), model(a, b)):
        assert torch.equal(actual, expected), (actual, expected)


def half_precision(x, y):
    return torch.nn.functional.layer_norm(x, (16,)) * y + 1, (x.float() * 3).to(torch.bfloat16).sum(-1)


@on_cpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_loads_compute_in_float32_and_round_on_store(dtype, tmp_path):
    example = (torch.randn(4, 16).to(dtype), torch.randn(16).to(dtype))
    model = torch.jit.trace(half_precision, example)
    loaded = run_package(model, example, "cpu", tmp_path)
    assert ".to(tl.float32)" in loaded.code
    fresh = (torch.randn(4, 16).to(dtype), torch.randn(16).to(dtype))
    for actual, expected in zip(loaded(*fresh), model(*fresh)):
        torch.testing.assert_close(actual, expected, rtol=2e-2, atol=2e-2)


@pytest.mark.skipif(not INTERPRETED and not HAS_GPU, reason="needs the interpreter or a GPU to convert")
def test_each_kernel_source_starts_with_the_nodes_and_lines_it_came_from():
    example = (torch.randn(4, 8), torch.randn(8))
    model = torch.jit.trace(lambda x, b: torch.softmax(torch.relu(x + b), dim=-1), example)
    device = "cpu" if INTERPRETED else "cuda"
    converted = jit2triton.convert(model, example_inputs=to_device(example, device), device=device, backend="triton")
    sources = dict(part.split("\n", 1) for part in converted.code.split("# ---- ")[1:])
    assert converted.manifest["kernels"]
    for kernel in converted.manifest["kernels"]:
        source = sources[f"kernels/{kernel['name']}.py"]
        lines = source.splitlines()
        assert lines[0] == f"# {kernel['name']}: fused from {len(kernel['provenance'])} TorchScript node(s)"
        assert any("aten::softmax" in line and "test_triton_backend.py" in line for line in lines), lines[:6]
        assert f"def {kernel['name']}(" in source and "@triton.jit" in source


def test_index_math_moves_to_int64_when_an_offset_passes_int32():
    i0, i1 = K.var("i0", 3), K.var("i1", 4)
    huge = 2 ** 31  # a stride past int32: 2 * 2**31 overflows 32-bit offsets
    value = K.load("buf0", i0 * huge + i1, "float32")
    kernel = K.Kernel("k_huge", (i0, i1), [K.KernelBuffer("buf0", "float32", (3, 4), (huge, 1))],
                      [K.KernelBuffer("buf1", "float32", (3, 4), (4, 1))], [value])
    assert "tl.program_id(0).to(tl.int64)" in render_kernel(kernel).source
    small = K.Kernel("k_small", (i0, i1), [K.KernelBuffer("buf0", "float32", (3, 4), (4, 1))],
                     [K.KernelBuffer("buf1", "float32", (3, 4), (4, 1))], [K.load("buf0", i0 * 4 + i1, "float32")])
    assert "int64" not in render_kernel(small).source


@pytest.mark.skipif(INTERPRETED, reason="compiling needs Triton's compiler: start Python without TRITON_INTERPRET")
def test_zoo_kernels_compile_to_hopper_cubins_on_any_machine(monkeypatch):
    """Triton compiles for a named GPU with its bundled ptxas, so the GPU code path is checked without a GPU."""
    kernels = record_built_kernels(monkeypatch)
    for spec in MODELS:
        torch.manual_seed(0)
        model, example = spec.build()
        jit2triton.convert(model, example_inputs=example, backend="cpp")
    assert len(kernels) > 20
    for kernel in kernels:
        compiled, rendered = compile_for_hopper(kernel)
        assert compiled.asm["cubin"][:4] == b"\x7fELF" and compiled.metadata.name == rendered.name


@pytest.mark.skipif(not INTERPRETED, reason="checks the message a process without the interpreter gives")
def test_cpu_package_without_the_interpreter_says_how_to_enable_it(tmp_path):
    example = (torch.randn(3, 5),)
    path = tmp_path / "cpu_triton.j2t"
    jit2triton.convert(torch.jit.trace(torch.sin, example), example_inputs=example, backend="triton").save(path)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = f"import jit2triton; jit2triton.load({str(path)!r})"
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "PackageDeviceError" in result.stderr and "TRITON_INTERPRET=1" in result.stderr, result.stderr[-2000:]


# --- CUDA: cubins through the driver -----------------------------------------------------------------------------


@on_gpu
@pytest.mark.parametrize("spec, cuda_graphs", cuda_zoo())
def test_zoo_model_on_cuda_matches_torchscript(spec, cuda_graphs, tmp_path, monkeypatch):
    # cuDNN's RNNs and convolutions default to TF32 (10-bit mantissa); the comparison with the CPU reference is
    # about the conversion, so the GPU computes in full float32 here
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    source, reference, example = build(spec, tmp_path)
    path = tmp_path / f"{spec.name}.j2t"
    jit2triton.convert(source, example_inputs=to_device(example, "cuda"), device="cuda").save(path)
    loaded = jit2triton.load(path, cuda_graphs=cuda_graphs)
    manifest = loaded.manifest
    assert manifest["backend"] == "triton"
    major, minor = torch.cuda.get_device_capability()
    assert not manifest["kernels"] or manifest["triton"]["target"]["arch"] == major * 10 + minor
    assert_matches_on_cuda(loaded, spec, example, reference)


@on_gpu
def test_loading_and_calling_a_gpu_package_never_runs_the_triton_compiler(tmp_path, monkeypatch):
    example = (torch.randn(64, 300, device="cuda"),)
    model = torch.jit.trace(lambda x: torch.softmax(x, -1) * torch.tanh(x), (example[0].cpu(),))
    path = tmp_path / "m.j2t"
    jit2triton.convert(model, example_inputs=example, device="cuda").save(path)
    import triton
    import triton.compiler.compiler as compiler

    def forbidden(*args, **kwargs):
        raise AssertionError("the Triton compiler ran at load time")

    monkeypatch.setattr(triton, "compile", forbidden)
    monkeypatch.setattr(compiler, "compile", forbidden)
    loaded = jit2triton.load(path, cuda_graphs=False)
    x = torch.randn(64, 300)
    torch.testing.assert_close(loaded(x.cuda()).cpu(), model(x), rtol=GPU_TOLERANCE, atol=GPU_TOLERANCE)


@on_gpu
def test_gpu_of_another_architecture_rebuilds_from_source_with_one_warning(tmp_path):
    from package_tools import rewrite_package
    example = (torch.randn(8, 32),)
    model = torch.jit.trace(lambda x: torch.nn.functional.gelu(x) - x.mean(-1, keepdim=True), example)
    built = tmp_path / "built.j2t"
    jit2triton.convert(model, example_inputs=to_device(example, "cuda"), device="cuda").save(built)
    foreign = tmp_path / "foreign.j2t"

    def pretend_older_gpu(manifest):
        for entry in manifest["triton"]["kernels"].values():
            entry["arch"] = 70

    rewrite_package(built, foreign, edit_manifest=pretend_older_gpu)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = jit2triton.load(foreign)
    rebuilt = [w for w in caught if "rebuilding them from the bundled sources" in str(w.message)]
    assert len(rebuilt) == 1, [str(w.message) for w in caught]
    assert loaded.runtime == "cpp"  # (rebuilt through the C++ runtime's Python extension: no fallback)
    x = torch.randn(8, 32)
    torch.testing.assert_close(loaded(x.cuda()).cpu(), model(x), rtol=GPU_TOLERANCE, atol=GPU_TOLERANCE)


@on_gpu
def test_unaligned_input_is_copied_before_launch(tmp_path):
    example = (torch.randn(5, 7),)
    model = torch.jit.trace(lambda x: torch.exp(x) + 1, example)
    path = tmp_path / "m.j2t"
    jit2triton.convert(model, example_inputs=to_device(example, "cuda"), device="cuda").save(path)
    loaded = jit2triton.load(path, cuda_graphs=False)
    storage = torch.randn(1 + 35, device="cuda")
    x = storage[1:].view(5, 7)  # contiguous, but 4 bytes past an aligned address
    assert x.data_ptr() % 16
    torch.testing.assert_close(loaded(x), torch.exp(x) + 1)


@on_gpu
def test_big_kernels_are_autotuned_and_stay_correct(tmp_path, monkeypatch):
    rendered, compiled = {}, {}  # kernel name -> (its kernel IR, the rendered kernel); -> the configs compiled
    render, compile_config = triton_renderer.render_kernel, compile_triton.compile_config

    def recording_render(kernel):
        rendered[kernel.name] = (kernel, render(kernel))
        return rendered[kernel.name][1]

    def recording_compile(r, config, device):
        compiled.setdefault(r.name, []).append(config)
        return compile_config(r, config, device)

    monkeypatch.setattr(triton_renderer, "render_kernel", recording_render)  # (the backend record imports it per call)
    monkeypatch.setattr(compile_triton, "compile_config", recording_compile)
    monkeypatch.setenv("JIT2TRITON_CACHE", str(tmp_path / "cache"))  # no choice remembered from an earlier run
    example = (torch.randn(1024, 2048),)
    model = torch.jit.trace(lambda x: torch.softmax(x, -1) + torch.sigmoid(x), example)
    path = tmp_path / "m.j2t"
    converted = jit2triton.convert(model, example_inputs=to_device(example, "cuda"), device="cuda")
    converted.save(path)
    entries = converted.manifest["triton"]["kernels"]
    assert entries and set(entries) == set(rendered), (sorted(entries), sorted(rendered))
    for name, entry in entries.items():
        kernel, r = rendered[name]
        work = sum(math.prod(b.shape) for b in kernel.inputs + kernel.outputs)
        assert work >= compile_triton.TUNE_MIN_ELEMENTS, f"{name} is too small to be tuned: the test lost its point"
        # every candidate the renderer offers was compiled (and timed), and the one kept is one of them
        tried = [c for i, c in enumerate(compiled[name]) if c not in compiled[name][:i]]
        assert tried == r.configs, (name, tried, r.configs)
        chosen = {"constants": entry["constants"], "num_warps": entry["num_warps"]}
        assert chosen in r.configs, (name, chosen, r.configs)
        # the grid covers the iteration space (a row per softmax row, or an element each) with no idle program
        assert r.items in (1024, 1024 * 2048), (name, r.items)
        block = entry["constants"]["XBLOCK"]
        assert entry["grid"][1:] == [1, 1] and (entry["grid"][0] - 1) * block < r.items <= entry["grid"][0] * block, \
            (name, entry["grid"], block, r.items)
    assert any(len(r.configs) > 1 for _, r in rendered.values()), "no kernel had a choice of configs to tune"
    x = torch.randn(1024, 2048)
    torch.testing.assert_close(jit2triton.load(path)(x.cuda()).cpu(), model(x), rtol=GPU_TOLERANCE, atol=1e-6)
    # converting again reads each choice from the tuning cache: only the chosen configuration is compiled
    compiled.clear()
    again = jit2triton.convert(model, example_inputs=to_device(example, "cuda"), device="cuda")
    for name, entry in again.manifest["triton"]["kernels"].items():
        chosen = {"constants": entry["constants"], "num_warps": entry["num_warps"]}
        assert compiled[name] == [chosen] and chosen == {k: entries[name][k] for k in ("constants", "num_warps")}


class RepeatedLayers(torch.nn.Module):
    """Three identical layers, then one of another width: three twin kernels and one of its own."""

    def __init__(self):
        super().__init__()
        self.weights = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(32, 32) / 6) for _ in range(3)])
        self.last = torch.nn.Parameter(torch.randn(32, 48) / 6)

    def forward(self, x):
        for w in self.weights:
            x = torch.tanh(torch.mm(x, w)) * 0.5 + x.softmax(-1)
        return torch.tanh(torch.mm(x, self.last)) * 0.5


def _rendered_kernels(model, example) -> list:
    from jit2triton import conversion
    found = []
    build_kernels = conversion.build_kernels
    try:
        conversion.build_kernels = lambda kernels, *rest: found.extend(kernels) or build_kernels(kernels, *rest)
        jit2triton.convert(model, example_inputs=example, backend="cpp", verify=False)
    finally:
        conversion.build_kernels = build_kernels
    return [render_kernel(k) for k in found]


def test_kernels_identical_but_for_names_comments_and_buffer_numbers_share_one_identity():
    example = (torch.randn(16, 32),)
    rendered = _rendered_kernels(torch.jit.trace(RepeatedLayers(), example), example)
    identities = [compile_triton.kernel_identity(r) for r in rendered]
    assert len(rendered) == 4 and len(set(r.source for r in rendered)) == 4
    assert identities[0] == identities[1] == identities[2] != identities[3], [r.source for r in rendered]
    # a kernel that differs in one constant is not a twin
    changed = rendered[1]
    changed.source = changed.source.replace("0.5", "0.25")
    assert compile_triton.kernel_identity(changed) != identities[0]


@on_gpu
def test_repeated_layers_compile_once_and_share_a_binary(tmp_path, monkeypatch):
    from jit2triton.transpiler import gemm_forms
    monkeypatch.setattr(gemm_forms, "MODE", "never")  # (16 rows: the GEMMs would be template kernels, and twins too)
    example = (torch.randn(16, 32),)
    model = torch.jit.trace(RepeatedLayers(), example)
    path = tmp_path / "m.j2t"
    converted = jit2triton.convert(model, example_inputs=to_device(example, "cuda"), device="cuda")
    converted.save(path)
    entries = converted.manifest["triton"]["kernels"]
    twins = [name for name, entry in entries.items() if "same_as" in entry]
    assert len(entries) == 4 and len(twins) == 2, entries
    from package_tools import read_members
    binaries = [m for m in read_members(path) if m.startswith("binaries/")]
    assert len(binaries) == 2 and all(m.removeprefix("binaries/").removesuffix(".cubin") in entries for m in binaries)
    loaded = jit2triton.load(path)
    x = torch.randn(16, 32)
    torch.testing.assert_close(loaded(x.cuda()).cpu(), model(x), rtol=GPU_TOLERANCE, atol=GPU_TOLERANCE)


@on_gpu
def test_a_launch_bound_plan_runs_as_one_cuda_graph(tmp_path, monkeypatch):
    example = torch.randn(4, 4)
    model = torch.jit.trace(lambda x: torch.cos(torch.sin(x @ x) @ x) @ x, (example,))
    path = tmp_path / "small.j2t"
    jit2triton.convert(model, example_inputs=(example.cuda(),), device="cuda").save(path)
    graphed, stepped = jit2triton.load(path), jit2triton.load(path, cuda_graphs=False)
    assert graphed._runtime.uses_cuda_graph and not stepped._runtime.uses_cuda_graph
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)  # the CPU reference has no TF32
    for _ in range(3):
        x = torch.randn(4, 4)
        expected = model(x)
        torch.testing.assert_close(graphed(x.cuda()).cpu(), expected, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(stepped(x.cuda()).cpu(), expected, rtol=1e-4, atol=1e-4)


@on_gpu
@pytest.mark.parametrize("graph_wins", [True, False])
def test_conversion_times_the_cuda_graph_and_the_runtime_follows_its_choice(graph_wins, tmp_path, monkeypatch,
                                                                            cpp_runtime, steady_timing):
    from jit2triton.deploy.packaging import cuda_graph_choice
    # the margins force the choice either way, whatever the timings (steps >= 0 * graph; steps < 1e9 * graph and
    # host < 1e9 * steps)
    monkeypatch.setattr(cuda_graph_choice, "GRAPH_MARGIN", 0.0 if graph_wins else 1e9)
    monkeypatch.setattr(cuda_graph_choice, "HOST_HEADROOM", 1e9)
    model = torch.jit.trace(torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256),
                                                torch.nn.LayerNorm(256)).eval(), (torch.randn(64, 256),))
    path = tmp_path / "mlp.j2t"
    converted = jit2triton.convert(model, example_inputs=(torch.randn(64, 256).cuda(),), device="cuda")
    report = converted.manifest["report"]["cuda_graph"]
    assert converted.manifest["cuda_graph"] is graph_wins and report["chosen"] is graph_wins
    assert report["graph_us"] > 0 and report["steps_us"] > 0 and report["host_us"] > 0
    converted.save(path)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)  # the CPU reference has no TF32
    loaded = jit2triton.load(path)
    for _ in range(3):  # the second call captures a graph, where one is chosen
        x = torch.randn(64, 256)
        torch.testing.assert_close(loaded(x.cuda()).cpu(), model(x), rtol=1e-4, atol=1e-4)
    assert loaded._runtime.uses_cuda_graph is graph_wins  # the runtime follows the choice


@on_gpu
def test_ops_with_weights_fuse_on_cuda_as_on_the_cpu(monkeypatch):
    from jit2triton.demo import build_demo_model
    from jit2triton.transpiler import attention_kernels, gemm_forms, onednn_conv, onednn_linear
    # the GEMM, attention and convolution rewrites each device has (oneDNN's epilogues, a bias out of cuBLAS, the
    # GPU's attention template) change what fuses: not here
    monkeypatch.setattr(attention_kernels, "MODE", "never")
    monkeypatch.setattr(onednn_linear, "MODE", "never")
    monkeypatch.setattr(onednn_conv, "MODE", "never")
    monkeypatch.setattr(gemm_forms, "MODE", "never")
    traced, example = build_demo_model()
    on_gpu_summary = jit2triton.convert(traced, example_inputs=(example.cuda(),), device="cuda").summary()
    on_cpu_summary = jit2triton.convert(traced, example_inputs=(example,), device="cpu").summary()
    assert on_gpu_summary["fallback_nodes"] == 0, on_gpu_summary["fallback_reasons"]
    assert on_gpu_summary["native_nodes"] == on_cpu_summary["native_nodes"]


@on_gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("where", ["cuda:1", torch.device("cuda", 1), {"cuda": "cuda:1"}, {"cuda:0": "cuda:1"}])
def test_a_gpu_package_loads_onto_another_gpu_of_the_same_architecture(where, tmp_path, cpp_runtime):
    example = (torch.randn(64, 300),)
    model = torch.jit.trace(lambda x: torch.softmax(x, -1) * torch.tanh(x), example)
    path = tmp_path / "m.j2t"
    jit2triton.convert(model, example_inputs=to_device(example, "cuda:0"), device="cuda:0").save(path)
    loaded = jit2triton.load(path, map_location=where)
    assert loaded.device == torch.device("cuda", 1)
    for _ in range(3):  # past CUDA graph capture
        x = torch.randn(64, 300)
        out = loaded(x.to("cuda:1"))
        assert out.device == torch.device("cuda", 1)
        torch.testing.assert_close(out.cpu(), model(x), rtol=GPU_TOLERANCE, atol=GPU_TOLERANCE)
