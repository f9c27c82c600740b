"""Load a package's C++ kernels: the shared library, checked, opened with ctypes; one launcher per kernel.

The library opened is exactly the bytes the package's checksums (and signature) were checked on: they are handed
to dlopen through a sealed anonymous file (deploy/verified_library.py), never through a file in a cache that
something could change in between. It is never compiled at load, unless this CPU lacks the instruction set it was
built for: then it is rebuilt from the bundled source, once, with a warning, or a clear error says what to install.
"""
from __future__ import annotations

import ctypes
import hashlib
import platform
import warnings
from typing import Callable, Optional

import torch

from jit2triton.emitters.compile_cpp import CompileFailed, compile_library, find_compiler, host_isa
from jit2triton.errors import CorruptPackageError, PackageDeviceError

from .package import PackageContents
from .policy import RECONVERT
from .sizes import is_dynamic, positional_size_function
from .verified_library import open_verified

_ELF_MACHINE = {"x86_64": 62, "AMD64": 62, "aarch64": 183, "arm64": 183}
_ISA_RANK = {"x86-64": 0, "x86-64-v3": 1}
_opened: dict[str, ctypes.CDLL] = {}  # by the library's sha256: one dlopen per content, for every load in this process


def load_kernels(contents: PackageContents, num_threads: Optional[int], device: torch.device) -> dict[str, Callable]:
    """The package's kernels on the CPU (the library runs nowhere else: `device` is the caller's to check)."""
    files = contents.files
    if "binaries/kernels.so" not in files or "kernels/kernels.cpp" not in files:
        raise CorruptPackageError("the package lists C++ kernels but holds no kernel library; " + RECONVERT)
    return load_cpp_kernels(files["binaries/kernels.so"], files["kernels/kernels.cpp"].decode(),
                            contents.manifest["cpp"]["isa"], contents.manifest["kernels"], num_threads)


def load_cpp_kernels(library: bytes, source: str, isa: str, kernels: list[dict],
                     num_threads: int | None = None) -> dict[str, Callable]:
    library = usable_library(library, source, isa)
    digest = hashlib.sha256(library).hexdigest()
    lib = _opened.get(digest)
    if lib is None:
        try:
            lib = open_verified(library, ctypes.CDLL, "jit2triton-kernels")
        except OSError as err:
            raise PackageDeviceError(f"the package's C++ kernel library cannot be opened here ({err}); "
                                     "convert the model again on this machine") from None
        _opened[digest] = lib
    threads = num_threads or torch.get_num_threads()
    launchers = {}
    for meta in kernels:
        try:
            fn = getattr(lib, meta["name"])
        except AttributeError:
            raise CorruptPackageError(f"the package's kernel library has no kernel {meta['name']!r}: it is not the "
                                      "library this package was built with; " + RECONVERT) from None
        if meta.get("by_value"):  # (C++ kernels read every input through a pointer)
            raise CorruptPackageError(f"C++ kernel {meta['name']!r} is listed as taking numbers by value, which C++ "
                                      f"kernels never do; {RECONVERT}")
        fn.argtypes = (ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int64), ctypes.c_int)
        fn.restype = ctypes.c_int
        launchers[meta["name"]] = _launcher(fn, meta, threads)
    return launchers


def _launcher(fn, meta: dict, threads: int) -> Callable:
    array_type = ctypes.c_void_p * meta["num_buffers"]
    sizes_type = ctypes.c_int64 * max(len(meta.get("sizes", ())), 1)
    no_sizes = sizes_type()  # a static kernel reads none: one array, made here, serves every call
    check = _input_check(meta)

    def launch(inputs: list, outputs: list, sizes: list = ()) -> None:
        """`sizes`: the call's values of the dynamic dims the kernel takes (meta["sizes"]), in that order."""
        check(inputs, sizes)
        if fn(array_type(*[t.data_ptr() for t in inputs], *[t.data_ptr() for t in outputs]),
              sizes_type(*sizes) if sizes else no_sizes, threads):
            raise ZeroDivisionError(f"integer division by zero in kernel {meta['name']} (from "
                                    f"{'; '.join(meta['provenance'])})")

    return launch


def _input_check(meta: dict) -> Callable[[list, list], None]:
    """What a kernel reads must be what it was built for (the kernel index's inputs: dtype, shape, strides on every
    dim longer than 1), or it reads past the buffer: the plan's checks at load and its relayout at call keep a valid
    package so; this holds it for every other (an argument edited to another value, an ATen op whose dtype an
    input changed). Static shapes are compared as built tuples; dynamic ones evaluated at the call's sizes."""
    expected = []
    for dtype, shape, strides in meta.get("inputs", ()):
        if len(shape) != len(strides):  # (else the comparison below stops at the shorter: cpu_kernels.cpp refuses it)
            raise CorruptPackageError("the package's kernel index is damaged (an input's strides); " + RECONVERT)
        shape_at = [positional_size_function(n, meta.get("sizes", [])) for n in shape]
        strides_at = [positional_size_function(n, meta.get("sizes", [])) for n in strides]
        static = not (is_dynamic(shape) or is_dynamic(strides))
        expected.append((getattr(torch, dtype), tuple(shape) if static else None, tuple(strides) if static else None,
                         shape_at, strides_at))
    name = meta["name"]

    def check(inputs: list, sizes: list) -> None:
        for i, (x, (dtype, shape, strides, shape_at, strides_at)) in enumerate(zip(inputs, expected)):
            if shape is None:
                shape, strides = tuple(f(sizes) for f in shape_at), tuple(f(sizes) for f in strides_at)
            if x.dtype != dtype or x.shape != shape or (x.stride() != strides and any(
                    n > 1 and s != t for n, s, t in zip(shape, x.stride(), strides))):
                raise ValueError(f"kernel {name} input {i} is {str(x.dtype).removeprefix('torch.')}{list(x.shape)} "
                                 f"with strides {list(x.stride())}; it was built for {str(dtype).removeprefix('torch.')}"
                                 f"{list(shape)} with strides {list(strides)}: the package is damaged: {RECONVERT}")

    return check


def usable_library(library: bytes, source: str, isa: str) -> bytes:
    """The library, or where it was built for another CPU, one rebuilt for this CPU from its source (the C++
    runtime's Python extension calls this too)."""
    if library[:4] != b"\x7fELF":
        raise CorruptPackageError("the package's kernel library is not a shared library (ELF); " + RECONVERT)
    machine = int.from_bytes(library[18:20], "little")
    expected = _ELF_MACHINE.get(platform.machine())
    here = host_isa()
    foreign = expected is not None and machine != expected
    missing_isa = _ISA_RANK.get(isa, 0) > _ISA_RANK.get(here, 0)
    if not (foreign or missing_isa):
        return library
    why = "another CPU architecture" if foreign else f"the {isa} instruction set, which this CPU lacks"
    if find_compiler() is None:
        raise PackageDeviceError(f"the package's C++ kernels were built for {why}, and no C++ compiler is here to "
                                 "rebuild them from the bundled source: install g++ (with OpenMP) or convert again")
    warnings.warn(f"jit2triton: the package's C++ kernels were built for {why}; rebuilding them from the bundled "
                  "source for this CPU (once; cached)", stacklevel=3)
    try:
        return compile_library(source, here)
    except CompileFailed as err:
        raise PackageDeviceError(f"rebuilding the package's C++ kernels for this CPU failed ({err}); convert the "
                                 "model again on this machine") from None

