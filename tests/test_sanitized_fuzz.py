"""The mutation fuzz of package loading under AddressSanitizer and UBSan: zip metadata bytes,
random bytes, manifest edits and structure-aware manifest edits with recomputed checksums (tests/mutate_packages.py)
of four packages (a small traced one, control flow with a dynamic dim, a kernel reading weights with a branch, lists
and dicts), each with its kernel library rebuilt from its own source with the sanitizers, so that a kernel reading
or writing past a buffer is caught too. The C++ runtime runs as built with `-DJIT2TRITON_SANITIZE=ON` (the j2t-fuzz
driver), and from Python through its extension with the sanitizer preloaded. Every package must be refused with a jit2triton error or
load and run; a crash, an out-of-bounds access, undefined behaviour or a raw exception fails the test. The same
mutations run without sanitizers in tests/test_package_hardening.py."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from jit2triton.deploy.cpp_runtime import ROOT
from jit2triton.emitters.compile_cpp import BASE_FLAGS, ISA_FLAGS, find_compiler

from fuzz_packages import containers_package, damageable_package, looped_package, small_package
from helpers import long_test
from package_tools import read_members, write_members

MUTATE = os.path.join(os.path.dirname(__file__), "mutate_packages.py")
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer"]
# allocator_may_return_null: a damaged shape asking for 64 GB gets torch's out-of-memory error, as without ASan
ASAN_OPTIONS = "detect_leaks=0:abort_on_error=0:allocator_may_return_null=1"
pytestmark = long_test  # (two sanitized builds and 8,200 mutations: about 170 s; the same mutations run unsanitized
#                          in test_package_hardening.py)


@pytest.fixture(scope="module")
def fuzz_driver(tmp_path_factory):
    if shutil.which("cmake") is None or (shutil.which("c++") is None and shutil.which("g++") is None):
        pytest.skip("needs CMake and a C++ compiler")
    # JIT2TRITON_SANITIZED_BUILD: a folder to build in and keep, so a later run only rebuilds what changed
    build = os.environ.get("JIT2TRITON_SANITIZED_BUILD") or tmp_path_factory.mktemp("sanitized")
    configure = ["cmake", "-S", ROOT, "-B", str(build), "-DJIT2TRITON_SANITIZE=ON", "-DCMAKE_BUILD_TYPE=Debug",
                 f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}"]
    for command in (configure, ["cmake", "--build", str(build), "-j", str(os.cpu_count() or 2), "--target",
                                "j2t-fuzz"]):
        done = subprocess.run(command, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return os.path.join(build, "j2t-fuzz")


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    """The fuzzed packages, each with its kernel library built with the sanitizers."""
    if find_compiler() is None:
        pytest.skip("needs a C++ compiler")
    folder = tmp_path_factory.mktemp("fuzzed")
    made = {"small": small_package(folder), "looped": looped_package(folder), "damageable": damageable_package(folder),
            "containers": containers_package(folder)}
    return {name: _sanitized_kernels(path, folder / f"sanitized-{name}.j2t") for name, path in made.items()}


def _sanitized_kernels(package, destination) -> str:
    members = read_members(package)
    isa = json.loads(members["manifest.json"])["cpp"]["isa"]
    source, library = destination.with_suffix(".cpp"), destination.with_suffix(".so")
    source.write_bytes(members["kernels/kernels.cpp"])
    subprocess.run([find_compiler(), *BASE_FLAGS, *ISA_FLAGS[isa], *SANITIZE, str(source), "-o", str(library)],
                   check=True)
    members["binaries/kernels.so"] = library.read_bytes()
    members["checksums.json"] = json.dumps({n: hashlib.sha256(d).hexdigest() for n, d in members.items()
                                            if n != "checksums.json"}).encode()
    write_members(destination, members)
    return str(destination)


def _fuzz(driver, package: str, folder, count: int, first: int = 0, trusted_key=None) -> None:
    mutations = folder / f"mutations-{first}"
    subprocess.run([sys.executable, MUTATE, "--package", package, "--first", str(first), "--count", str(count),
                    "--write-dir", str(mutations)], check=True, capture_output=True)
    env = dict(os.environ, JIT2TRITON_CACHE=str(folder / "cache"), ASAN_OPTIONS=ASAN_OPTIONS,
               UBSAN_OPTIONS="print_stacktrace=1")
    env.pop("JIT2TRITON_TRUSTED_KEYS", None)
    command = [str(driver), str(mutations)] + (["--trusted-key", str(trusted_key)] if trusted_key else [])
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1200)
    lines = done.stdout.splitlines()
    tried = [line for line in lines if line.startswith("package ")]
    assert done.returncode == 0 and lines and lines[-1].startswith(f"{count} packages:"), (
        done.returncode, [line for line in lines if line.startswith("FAIL")][:5], "last package:", tried[-1:],
        done.stderr[-3000:])
    shutil.rmtree(mutations)


COUNTS = {"small": 3000, "looped": 1500, "damageable": 1500, "containers": 1000}  # j2t-fuzz (from Python: 300)


@pytest.mark.parametrize("package", sorted(COUNTS))
def test_sanitized_cpp_runtime_survives_mutations(package, fuzz_driver, packages, tmp_path) -> None:
    _fuzz(fuzz_driver, packages[package], tmp_path, COUNTS[package])


def test_sanitized_cpp_runtime_checks_signatures_of_mutated_packages(fuzz_driver, packages, tmp_path) -> None:
    """Signed without loading it here: its kernels need the sanitizer's runtime, which this process lacks."""
    from jit2triton.deploy.signing import SIGNATURE_MEMBER, generate_keys, sign
    private, public = generate_keys(tmp_path / "keys")
    members = read_members(packages["damageable"])
    members[SIGNATURE_MEMBER] = sign(members["checksums.json"], private)
    signed = tmp_path / "signed.j2t"
    write_members(signed, members)
    _fuzz(fuzz_driver, str(signed), tmp_path, 1000, trusted_key=public)


@pytest.mark.parametrize("package", sorted(COUNTS))
def test_sanitized_runtime_from_python_survives_mutations(package, packages, tmp_path) -> None:
    """The runtime's Python extension (and the kernels it launches) with ASan preloaded: libstdc++ too, so that ASan's
    interceptor of C++ throws finds it (python itself does not link it)."""
    libraries = [subprocess.run([find_compiler(), f"-print-file-name={name}"], capture_output=True,
                                text=True).stdout.strip() for name in ("libasan.so", "libstdc++.so")]
    if not all(os.path.isabs(path) and os.path.exists(path) for path in libraries):
        pytest.skip("needs the compiler's libasan and libstdc++")
    env = dict(os.environ, LD_PRELOAD=" ".join(libraries), ASAN_OPTIONS=ASAN_OPTIONS, UBSAN_OPTIONS="print_stacktrace=1",
               JIT2TRITON_CACHE=str(tmp_path / "cache"))
    env.pop("JIT2TRITON_TRUSTED_KEYS", None)
    done = subprocess.run([sys.executable, MUTATE, "--package", packages[package], "--count",
                           "300"], capture_output=True, text=True, env=env, timeout=1200)
    lines = done.stdout.splitlines()
    assert done.returncode == 0, ([line for line in lines if line.startswith("FAIL")][:5], "last mutation:",
                                  [line for line in lines if line.startswith("seed ")][-1:], done.stderr[-3000:])
