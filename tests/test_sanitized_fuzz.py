"""The mutation fuzz of package loading, run through the C++ runtime built with AddressSanitizer and UBSan
(`-DJIT2TRITON_SANITIZE=ON`, the j2t-fuzz driver): zip metadata bytes, random bytes and manifest edits with
recomputed checksums (tests/mutate_packages.py). Every package must be refused with a jit2triton::Error or load
and run; a crash, an out-of-bounds access, undefined behaviour or a raw exception fails the test. The Python
runtime gets the same mutations in tests/test_package_hardening.py."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch

import jit2triton
from jit2triton.deploy.cpp_runtime import ROOT

MUTATE = os.path.join(os.path.dirname(__file__), "mutate_packages.py")


@pytest.fixture(scope="module")
def fuzz_driver(tmp_path_factory):
    if shutil.which("cmake") is None or (shutil.which("c++") is None and shutil.which("g++") is None):
        pytest.skip("needs CMake and a C++ compiler")
    build = tmp_path_factory.mktemp("sanitized")
    configure = ["cmake", "-S", ROOT, "-B", str(build), "-DJIT2TRITON_SANITIZE=ON", "-DCMAKE_BUILD_TYPE=Debug",
                 f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}"]
    for command in (configure, ["cmake", "--build", str(build), "-j", str(os.cpu_count() or 2), "--target",
                                "j2t-fuzz"]):
        done = subprocess.run(command, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return build / "j2t-fuzz"


def _looped_package(folder) -> str:
    """A scripted model with a loop, a branch and a dynamic dim: the plan's control flow and dims get mutated too."""
    class Looped(torch.nn.Module):
        def forward(self, x, n: int):
            y = x
            for _ in range(n):
                if bool(y.sum() > 0):
                    y = torch.relu(y) * 2 - 1
                else:
                    y = y.exp() + 1
            return y.sin()

    path = str(folder / "looped.j2t")
    batch = jit2triton.Dim("b", min=1, max=64)
    jit2triton.convert(torch.jit.script(Looped()), (torch.randn(4, 8), 3),
                       dynamic_shapes=[{0: batch}, None]).save(path)
    return path


def _fuzz(driver, package: str, folder, count: int, first: int = 0, trusted_key=None) -> None:
    mutations = folder / f"mutations-{first}"
    subprocess.run([sys.executable, MUTATE, "--package", package, "--first", str(first), "--count", str(count),
                    "--write-dir", str(mutations)], check=True, capture_output=True)
    # allocator_may_return_null: a damaged shape asking for 64 GB gets torch's out-of-memory error, as without ASan
    env = dict(os.environ, JIT2TRITON_CACHE=str(folder / "cache"),
               ASAN_OPTIONS="detect_leaks=0:abort_on_error=0:allocator_may_return_null=1", UBSAN_OPTIONS="print_stacktrace=1")
    env.pop("JIT2TRITON_TRUSTED_KEYS", None)
    command = [str(driver), str(mutations)] + (["--trusted-key", str(trusted_key)] if trusted_key else [])
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1200)
    lines = done.stdout.splitlines()
    tried = [line for line in lines if line.startswith("package ")]
    assert done.returncode == 0 and lines and lines[-1].startswith(f"{count} packages:"), (
        done.returncode, [line for line in lines if line.startswith("FAIL")][:5], "last package:", tried[-1:],
        done.stderr[-3000:])
    shutil.rmtree(mutations)


def test_sanitized_runtime_survives_5000_mutations_of_a_package(fuzz_driver, small_package, tmp_path) -> None:
    _fuzz(fuzz_driver, str(small_package[0]), tmp_path, 5000)


def test_sanitized_runtime_survives_mutations_of_control_flow_and_dynamic_dims(fuzz_driver, tmp_path) -> None:
    _fuzz(fuzz_driver, _looped_package(tmp_path), tmp_path, 2000)


def test_sanitized_runtime_checks_signatures_of_mutated_packages(fuzz_driver, small_package, tmp_path) -> None:
    from jit2triton.deploy.signing import generate_keys
    private, public = generate_keys(tmp_path / "keys")
    signed = str(tmp_path / "signed.j2t")
    jit2triton.load(small_package[0], runtime="python").save(signed, signing_key=private)
    _fuzz(fuzz_driver, signed, tmp_path, 1000, trusted_key=public)
