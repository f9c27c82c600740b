"""The C++ backend's package: its library is checked at load, rebuilt when this CPU cannot run it, and refused
with a clear error when it is damaged or foreign."""
import re
import warnings

import pytest
import torch

import jit2triton
from package_tools import read_members, rewrite_package
from helpers import kernel_body
from jit2triton.deploy import cpp_kernels


def _package(tmp_path, name="model"):
    traced = torch.jit.trace(lambda x: torch.tanh(x) * 2 + 1, torch.randn(4, 8))
    path = tmp_path / f"{name}.j2t"
    jit2triton.convert(traced, example_inputs=(torch.randn(4, 8),)).save(path)
    return path, traced


def _replace_library(src, dst, change):
    rewrite_package(src, dst, edit_member=lambda members: ("binaries/kernels.so", change(members["binaries/kernels.so"])))


def test_package_holds_source_library_and_isa(tmp_path):
    path, traced = _package(tmp_path)
    module = jit2triton.load(path)
    assert module.manifest["cpp"]["isa"] in ("x86-64-v3", "x86-64", "native-arm")
    assert "-fopenmp" in module.manifest["cpp"]["flags"]
    assert "J2T_KERNEL int" in module.code and "aten::tanh" in module.code
    x = torch.randn(4, 8)
    torch.testing.assert_close(module(x), traced(x))


def test_library_that_is_not_elf_is_refused(tmp_path):
    path, _ = _package(tmp_path)
    bad = tmp_path / "bad.j2t"
    _replace_library(path, bad, lambda lib: b"#!/bin/sh\necho pwned\n" + lib[20:])
    with pytest.raises(jit2triton.CorruptPackageError, match="not a shared library"):
        jit2triton.load(bad)


def test_library_without_the_kernels_is_refused(tmp_path):
    path, _ = _package(tmp_path)
    traced = torch.jit.trace(lambda x: torch.sigmoid(x) - 3, torch.randn(4, 8))
    other = tmp_path / "other2.j2t"
    jit2triton.convert(traced, example_inputs=(torch.randn(4, 8),)).save(other)
    foreign = read_members(other)["binaries/kernels.so"]
    swapped = tmp_path / "swapped.j2t"
    _replace_library(path, swapped, lambda lib: foreign)
    with pytest.raises(jit2triton.CorruptPackageError, match="no kernel"):
        jit2triton.load(swapped)


def _as_foreign_architecture(lib: bytes) -> bytes:
    machine = 183 if int.from_bytes(lib[18:20], "little") != 183 else 62  # aarch64 <-> x86-64
    return lib[:18] + machine.to_bytes(2, "little") + lib[20:]


def test_library_for_another_cpu_is_rebuilt_from_the_bundled_source(tmp_path):
    path, traced = _package(tmp_path)
    foreign = tmp_path / "foreign.j2t"
    _replace_library(path, foreign, _as_foreign_architecture)
    with pytest.warns(UserWarning, match="rebuilding them from the bundled source"):
        module = jit2triton.load(foreign)
    assert module.runtime == "cpp"  # (the C++ runtime rebuilt it through its Python extension)
    x = torch.randn(4, 8)
    torch.testing.assert_close(module(x), traced(x))


def test_library_for_another_cpu_without_a_compiler_says_what_to_install(tmp_path, monkeypatch):
    path, _ = _package(tmp_path)
    foreign = tmp_path / "foreign.j2t"
    _replace_library(path, foreign, _as_foreign_architecture)
    monkeypatch.setattr(cpp_kernels, "find_compiler", lambda: None)
    with pytest.raises(jit2triton.PackageDeviceError, match="install g\\+\\+"):
        jit2triton.load(foreign)


def test_loading_never_compiles(tmp_path, monkeypatch):
    path, traced = _package(tmp_path)

    def refuse(*args, **kwargs):
        raise AssertionError("load ran the compiler")

    monkeypatch.setattr(cpp_kernels, "compile_library", refuse)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        module = jit2triton.load(path)
    x = torch.randn(4, 8)
    torch.testing.assert_close(module(x), traced(x))


def test_runs_on_one_thread_when_asked(tmp_path):
    path, traced = _package(tmp_path)
    module = jit2triton.load(path, num_threads=1)
    x = torch.randn(4, 8)
    torch.testing.assert_close(module(x), traced(x))


def test_a_layer_norm_passes_over_each_row_twice_with_simd_sums():
    """LayerNorm's one mean serves both the centring and the variance (it was computed twice, three passes over
    each row), and a row's sums run as `omp simd` reductions, lanes with partial sums (a serial chain of dependent
    adds is latency-bound). Then the values, against TorchScript."""
    import re
    torch.manual_seed(0)
    traced = torch.jit.trace(torch.nn.LayerNorm(48).eval(), torch.randn(4, 16, 48))
    converted = jit2triton.convert(traced, example_inputs=(torch.randn(4, 16, 48),))
    kernel = converted.code[converted.code.index("J2T_KERNEL int"):]
    assert len(re.findall(r"double sum\d+ = 0;", kernel)) == 2, kernel
    assert kernel.count("#pragma omp simd reduction(+:part") == 2, kernel  # (float lanes, added in double)
    for _ in range(2):
        x = torch.randn(4, 16, 48) * 3 + 5  # an offset a one-pass variance would lose digits to
        torch.testing.assert_close(converted(x), traced(x), rtol=1e-5, atol=1e-5)


class ReluMaxPool(torch.nn.Module):
    """ResNet's stem: a ReLU and a padded 3x3 max-pool over channels-last activations (channels innermost, so the
    padding test is one bool for the whole simd loop)."""

    def forward(self, x):
        x = x.contiguous(memory_format=torch.channels_last) * 1.5
        return torch.nn.functional.max_pool2d(torch.relu(x), 3, 2, 1), torch.nn.functional.avg_pool2d(x, 3, 2, 1)


def test_a_padded_pool_over_channels_vectorizes_and_keeps_nan_and_inf(tmp_path):
    """The kernel's masked loads read in bounds where the padding test fails (so GCC vectorizes them: ResNet's
    max-pool ran 6x slower than its vectorized form, scalar code branching on data), and max keeps torch's NaN
    propagation with its NaN test on the bits."""
    model = torch.jit.trace(ReluMaxPool(), (torch.randn(2, 16, 9, 10),))
    converted = jit2triton.convert(model, (torch.randn(2, 16, 9, 10),))
    assert converted.manifest["kernels"]
    assert "* (int64_t)" in converted.code and "j2t_if(" in converted.code  # the vectorizable form
    x = torch.randn(2, 16, 9, 10, generator=torch.Generator().manual_seed(7))
    x[0, 3, 0, 0], x[1, 5, 4, 4], x[1, 7, 8, 9], x[0, 0, 5, 5] = float("nan"), float("inf"), float("-inf"), 1e30
    converted.save(tmp_path / "m.j2t")
    got = jit2triton.load(tmp_path / "m.j2t")(x)
    torch.testing.assert_close(got, model(x), equal_nan=True)


def test_a_row_max_and_min_run_as_simd_lanes_and_keep_torch_s_nan_and_inf(tmp_path):
    """Max and min reductions keep a per-lane extreme and a per-lane NaN flag (`omp simd reduction`), so GCC
    vectorizes them (the flag an int: GCC leaves a loop with a bool `|` reduction scalar, 8x slower); a row of
    -inf, of +inf, with one NaN, of NaNs, or of -3e38 gives torch's answer."""
    model = torch.jit.trace(lambda x: (torch.amax(x * 1.0, -1), torch.amin(x * 1.0, -1)), (torch.randn(6, 37),))
    converted = jit2triton.convert(model, (torch.randn(6, 37),))
    assert "reduction(max:" in converted.code and "reduction(min:" in converted.code
    assert "int max" in converted.code and "bool max" not in converted.code  # (the NaN flags' type)
    y = torch.randn(6, 37, generator=torch.Generator().manual_seed(3))
    y[0], y[1], y[2, 5], y[3], y[4], y[5, 36] = float("-inf"), float("inf"), float("nan"), float("nan"), -3e38, \
        float("-inf")
    converted.save(tmp_path / "m.j2t")
    for got, expected in zip(jit2triton.load(tmp_path / "m.j2t")(y), model(y)):
        torch.testing.assert_close(got, expected, equal_nan=True, rtol=0, atol=0)


class SameKernelAtThreeSizes(torch.nn.Module):
    """Three ReLU(2x) kernels over different shapes (a conv net's activations at each stage) and one that scales by
    3, each over its own input and shape, so no two merge."""

    def forward(self, x, y, z, w):
        return torch.relu(x * 2), torch.relu(y * 2), torch.relu(z * 2), torch.relu(w * 3)


def test_kernels_that_differ_only_in_sizes_share_one_compiled_body(tmp_path):
    """The kernels at three shapes compile as one body taking their loop bounds as arguments, each kernel a wrapper
    passing its own; the x3 kernel differs in a float literal, so it keeps its own body. Each output against
    TorchScript's."""
    example = (torch.randn(4, 8), torch.randn(3, 16), torch.randn(5, 7), torch.randn(6, 8))
    traced = torch.jit.trace(SameKernelAtThreeSizes(), example)
    converted = jit2triton.convert(traced, example_inputs=example)
    assert len(converted.manifest["kernels"]) == 4 and converted.manifest["cpp"]["bodies"] == 2, converted.code
    assert converted.code.count("return k0_mul_relu_shared(buffers, sizes, num_threads, params);") == 3, converted.code
    converted.save(tmp_path / "m.j2t")
    fresh = tuple(torch.randn(x.shape) for x in example)
    for got, want in zip(jit2triton.load(tmp_path / "m.j2t")(*fresh), traced(*fresh)):
        torch.testing.assert_close(got, want)


def softmax_rows(x):
    return torch.softmax(x * 1.5, -1)


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_softmax_computes_each_exp_once(dynamic):
    """The sum of exp(x - max) stores each exp into the output as it goes, and the sweep after it reads them back
    and scales them by the sum's reciprocal, as ATen's CPU kernel does (it computed every exp twice: 0.60x
    TorchScript on 2x12x128x128). Then the values, against TorchScript."""
    torch.manual_seed(0)
    scripted = torch.jit.script(softmax_rows)
    options = {"dynamic_shapes": {0: {1: jit2triton.Dim("n", min=2, max=4096)}}} if dynamic else {}
    converted = jit2triton.convert(scripted, example_inputs=(torch.randn(8, 1000),), **options)
    kernel = kernel_body(converted.code)
    nests = kernel.count("= out_")  # (a dynamic kernel has two loop nests: one parallel, one not)
    assert nests in (1, 2) and len(re.findall(r"expf(_shifted)?\(", kernel)) == nests, kernel
    for n in ((1000,) * 6 if not dynamic else (1000, 2, 77, 4096, 513, 64)):
        x = torch.randn(8, n) * 4
        torch.testing.assert_close(converted(x), scripted(x), rtol=2e-6, atol=1e-7)


class MaskedAttentionScores(torch.nn.Module):
    """The three ways models mask attention scores before a softmax: a bool mask filled with -inf, an additive -1e4
    made from a comparison's `.float()`, and a log_softmax over scores pushed down by 1e4 where masked."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("causal", torch.ones(64, 64).triu(1).bool())

    def forward(self, scores, keep):
        filled = torch.softmax(scores.masked_fill(self.causal, float("-inf")), -1)
        added = torch.softmax(scores + (1.0 - (keep > 0).float()) * -10000.0, -1)
        return filled, added, torch.log_softmax(scores - 1e4 * (keep > 0.5).float(), -1)


def test_masked_softmaxes_match_torchscript_with_exact_zeros():
    """Each kernel reads the bool mask as bytes and casts a comparison to float through int (with `const bool*` or
    a bool -> float conversion GCC left the loop scalar: 0.2-0.3x ATen's time), and takes exp of x - max with the
    masked lanes' exact 0 put back (glibc's vector expf takes a slow scalar path for them). Masked probabilities
    come out exactly 0, as TorchScript's."""
    torch.manual_seed(0)
    model = torch.jit.script(MaskedAttentionScores().eval())
    make = lambda: (torch.randn(2, 4, 64, 64) * 3, torch.randn(2, 1, 1, 64))  # noqa: E731
    converted = jit2triton.convert(model, example_inputs=make())
    code = converted.code[converted.code.index("J2T_KERNEL int"):]
    assert "const bool*" not in code and "uint8_t* __restrict" in code, code
    assert "j2t_expf_shifted(" in code and "(float)(int)" in code, code
    for _ in range(6):
        inputs = make()
        for ours, theirs in zip(converted(*inputs), model(*inputs)):
            torch.testing.assert_close(ours, theirs, rtol=2e-6, atol=2e-6)
            assert torch.equal(ours == 0, theirs == 0) and torch.equal(torch.isinf(ours), torch.isinf(theirs))


class Int64Offsets(torch.nn.Module):
    """Scores plus an int64 tensor converted to float (an attention mask, token positions) inside one kernel."""

    def forward(self, scores, ids):
        positions = scores * 2.0 + ids[:, None, :].to(torch.float32)
        return positions, torch.softmax(scores + (1.0 - ids[:, None, :].to(torch.float32)) * -10000.0, -1)


@pytest.mark.parametrize("dynamic", [False, True])
def test_int64_inputs_converted_to_float_take_int32_where_they_fit(dynamic):
    """AVX2 converts int32 to float, not int64: the kernel checks its int64 inputs fit int32 and converts through it
    (an int64 mask in a softmax's kernel took 6x ATen's time); where a value does not fit, the exact body runs,
    rounding once as ATen does (2^53 + 2^29 + 1 to 2^53 + 2^30, where through double it is 2^53)."""
    model = torch.jit.trace(Int64Offsets(), (torch.randn(2, 3, 16), torch.ones(2, 16, dtype=torch.int64)))
    n = jit2triton.Dim("n", min=1, max=64)
    options = {"dynamic_shapes": {0: {2: n}, 1: {1: n}}} if dynamic else {}
    converted = jit2triton.convert(model, (torch.randn(2, 3, 16), torch.ones(2, 16, dtype=torch.int64)),
                                   choices="fixed", **options)
    assert "(float)(int32_t)" in converted.code and "j2t_fits" in converted.code
    cases = ((16, 2), (16, 2**40), (16, 2**53 + 2**29 + 1), (16, 2**62)) + (((1, 2), (40, 2**50)) if dynamic else ())
    for n, high in cases:
        x, ids = torch.randn(2, 3, n), torch.randint(0, 2, (2, n))
        ids[0, 0] = high  # (one value outside int32 takes the whole call to the exact body)
        (positions, probabilities), (want_positions, want_probabilities) = converted(x, ids), model(x, ids)
        assert torch.equal(positions, want_positions), (n, high)  # (the conversion bit for bit)
        torch.testing.assert_close(probabilities, want_probabilities, rtol=2e-6, atol=1e-7)
    probe = torch.tensor([2**53 + 2**29 + 1])
    assert int(probe.float().item()) == 2**53 + 2**30  # (what the exact body must give: ATen's rounding)
