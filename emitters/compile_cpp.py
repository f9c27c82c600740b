"""Compile a C++ translation unit into a shared library, with a content-addressed cache.

The cache key is a hash of the source, the flags and the compiler's version, so a cached library can never be a
stale one; converting the same model twice compiles once.
"""
from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile

import torch

from jit2triton.errors import ConversionError

from .cache import cache_dir, write_once
from .jobs import job_slot

# The instruction-set baseline is recorded in the package; a machine without it rebuilds from the bundled source.
ISA_FLAGS = {"x86-64-v3": ["-march=x86-64-v3"], "x86-64": ["-march=x86-64"], "native-arm": []}
# -fno-builtin-sin/cos: otherwise GCC merges sin(x) and cos(x) into one sincos call that has no vector variant.
# -ffp-contract=off: ATen's CPU kernels round after every op; an FMA fused across two of our ops does not, and
# x * 3 - mean(x * 3) over one element came out 4e-7 instead of 0 (a layer norm then scales that by 1/sqrt(eps)).
BASE_FLAGS = ["-O3", "-std=c++17", "-fopenmp", "-shared", "-fPIC", "-fno-math-errno", "-fno-trapping-math",
              "-ffp-contract=off", "-fvisibility=hidden", "-fno-builtin-sin", "-fno-builtin-cos", "-fno-builtin-sinf",
              "-fno-builtin-cosf"]
_VECTOR_PREFIX = {"x86-64-v3": "_ZGVdN{lanes}v_", "x86-64": "_ZGVbN{half}v_"}


def find_compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")


@functools.lru_cache(maxsize=None)
def compiler_version(compiler: str) -> str:
    out = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=False)
    return out.stdout.splitlines()[0] if out.stdout else compiler


class CompileFailed(Exception):
    """The generated C++ did not compile: a bug in a renderer, not in the model (conversion falls back to ATen)."""


def host_isa() -> str:
    """The best baseline this CPU runs: x86-64-v3 (AVX2, FMA, F16C) where torch's own CPU dispatch found AVX2."""
    import platform
    if platform.machine() not in ("x86_64", "AMD64"):
        return "native-arm"
    return "x86-64-v3" if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512") else "x86-64"


def compile_library(source: str, isa: str) -> bytes:
    """The bytes of a shared library built from `source` for the `isa` baseline; cached by content."""
    compiler = find_compiler()
    if compiler is None:
        raise ConversionError("the C++ backend needs a C++ compiler (g++ or clang++) with OpenMP; install one "
                              "(apt-get install g++) or convert with backend='aten'")
    flags = BASE_FLAGS + ISA_FLAGS[isa]
    key = hashlib.sha256("\0".join([source, " ".join(flags), compiler_version(compiler)]).encode()).hexdigest()
    cached = os.path.join(cache_dir("cpp"), f"{key}.so")
    if not os.path.exists(cached):
        with tempfile.TemporaryDirectory() as tmp:
            src, out = os.path.join(tmp, "kernels.cpp"), os.path.join(tmp, "kernels.so")
            with open(src, "w") as f:
                f.write(source)
            with job_slot():  # one of the machine's compile jobs (emitters/jobs.py)
                result = subprocess.run([compiler, *flags, src, "-o", out], capture_output=True, text=True)
            if result.returncode != 0:
                raise CompileFailed(f"compiling the generated C++ failed ({compiler}):\n{result.stderr[-4000:]}")
            with open(out, "rb") as f:
                write_once(cached, f.read())
    with open(cached, "rb") as f:
        return f.read()


def wide_math_functions(isa: str, names) -> tuple[str, ...]:
    """The float math functions (C names, "expf") with glibc's 16-lane AVX-512 form here, for the AVX-512 twins of
    an x86-64-v3 build's kernels (cpp_wide.py); none elsewhere."""
    if isa != "x86-64-v3":
        return ()
    import ctypes
    try:
        mvec = ctypes.CDLL("libmvec.so.1")
    except OSError:
        return ()
    return tuple(name + "f" for name in names if hasattr(mvec, f"_ZGVeN16v_{name}f"))


def vector_math_functions(isa: str, names) -> tuple[tuple[str, str], ...]:
    """(C name, C type) of the math functions (("sinf", "float"), ("exp", "double")) for which this machine's
    glibc has vector variants for `isa`."""
    import ctypes
    prefix = _VECTOR_PREFIX.get(isa)
    if prefix is None:
        return ()
    try:
        mvec = ctypes.CDLL("libmvec.so.1")
    except OSError:
        return ()
    found = []
    for name in names:
        for c_name, c_type, lanes in ((name + "f", "float", 8), (name, "double", 4)):
            symbol = prefix.format(lanes=lanes, half=lanes // 2) + c_name
            if hasattr(mvec, symbol):
                found.append((c_name, c_type))
    return tuple(found)
