"""The C++ kernels that call float vector math have an AVX-512 twin in the same library (emitters/cpp_wide.py): the
package gives TorchScript's answers through the twin where the CPU has AVX-512 and through the AVX2 body where it
has not (`J2T_NO_AVX512=1` when the library loads stands for such a CPU), on fresh inputs."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import jit2triton
from jit2triton.emitters import cpp_wide
from jit2triton.emitters.compile_cpp import host_isa, wide_math_functions

WIDE = wide_math_functions(host_isa(), ("exp", "tanh"))
needs_wide = pytest.mark.skipif(len(WIDE) < 2, reason="no 16-lane vector expf and tanhf here (glibc's libmvec)")


def model(x, mask):
    scores = torch.softmax(x * 0.125, -1)  # (an exp of x - max: the prelude's helper)
    gate = torch.sigmoid(x) * torch.tanh(x)
    return scores + gate, torch.where(mask, torch.exp(x), x)  # (the second reads a bool mask: no twin)


def _inputs(seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(6, 200, generator=g) * 3, torch.rand(6, 200, generator=g) > 0.5


def _source(converted, tmp_path) -> str:
    from jit2triton.deploy.package import read_package
    path = tmp_path / "model.j2t"
    converted.save(str(path))
    return bytes(read_package(str(path)).files["kernels/kernels.cpp"]).decode()


@needs_wide
def test_kernels_calling_vector_math_get_a_twin_and_both_bodies_give_torchscripts_answer(tmp_path):
    traced = torch.jit.trace(model, _inputs(0))
    converted = jit2triton.convert(traced, _inputs(0), backend="cpp")
    source = _source(converted, tmp_path)
    twins = source.count("_avx512(void* const* buffers")
    assert twins >= 1 and "simdlen(16)" in source and "j2t_avx512 ?" in source
    assert twins < source.count("\nJ2T_KERNEL int ")  # (the kernel reading the mask has none)
    for seed in (1, 2, 3, 4, 5, 6):
        inputs = _inputs(seed)
        for got, want in zip(converted(*inputs), traced(*inputs)):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    # the AVX2 bodies, as a CPU without AVX-512 runs them: the package loaded in a process that refuses the twins
    torch.save([_inputs(seed) for seed in range(7, 13)], tmp_path / "inputs.pt")
    torch.jit.save(traced, str(tmp_path / "model.pt"))
    script = (f"import torch, jit2triton\n"
              f"package = jit2triton.load({str(tmp_path / 'model.j2t')!r})\n"
              f"model = torch.jit.load({str(tmp_path / 'model.pt')!r})\n"
              f"for inputs in torch.load({str(tmp_path / 'inputs.pt')!r}):\n"
              f"    for got, want in zip(package(*inputs), model(*inputs)):\n"
              f"        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)\n"
              f"print('ok')\n")
    run = subprocess.run([sys.executable, "-c", script], env={**os.environ, "J2T_NO_AVX512": "1"},
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-2000:]


def test_a_twin_keeps_the_kernels_entry_and_arguments():
    """The text transform itself: the exported entry chooses between the bodies with the kernel's own arguments,
    a shared body keeps its params, and a function calling no vector math (or reading a bool) is left alone."""
    kernel = ("// k1: fused\nJ2T_KERNEL int k1(void* const* buffers, const int64_t* sizes, int num_threads) {\n"
              "  #pragma omp simd\n  for (int i = 0; i < 8; ++i) y[i] = expf(x[i]);\n  return 0;\n}\nrest\n")
    twin, made = cpp_wide.with_twin(kernel, ("expf",), ("expf", "exp"))
    assert made and twin.startswith("// k1: fused\nstatic int k1_avx2(")
    assert "#pragma omp simd simdlen(16)\n" in twin and twin.endswith("\nrest\n")
    assert "J2T_KERNEL int k1(void* const* buffers, const int64_t* sizes, int num_threads) {\n  return j2t_avx512 ? " \
           "k1_avx512(buffers, sizes, num_threads) : k1_avx2(buffers, sizes, num_threads);\n}" in twin
    shared = kernel.replace("J2T_KERNEL int k1(void* const* buffers, const int64_t* sizes, int num_threads)",
                            "static int k1_shared(void* const* buffers, const int64_t* sizes, int num_threads, "
                            "const int64_t* params)")
    twin, made = cpp_wide.with_twin(shared, ("expf",), ("expf", "exp"))
    assert made and "k1_shared_avx512(buffers, sizes, num_threads, params)" in twin
    assert cpp_wide.with_twin(kernel.replace("expf(", "sqrtf("), ("expf",), ("expf", "exp")) == (
        kernel.replace("expf(", "sqrtf("), False)
    assert not cpp_wide.with_twin(kernel.replace("x[i]", "(bool)m[i] ? x[i] : 0"), ("expf",), ("expf",))[1]
    assert not cpp_wide.with_twin(kernel.replace("expf(", "exp("), ("expf",), ("expf", "exp"))[1]  # (no wide exp)
