"""What the C++ runtime's extension asks of Python for a package's C++ kernels (deploy/cpp/python/bindings.cpp): the
kernel library as it is, or, where this CPU lacks the instruction set it was built for, rebuilt from the bundled
source, once, with a warning, or a clear error says what to install. The C++ runtime opens and calls the library
itself (cpu_kernels.cpp), from exactly the bytes the package's checksums (and signature) were checked on.
"""
from __future__ import annotations

import platform
import warnings

from jit2triton.emitters.compile_cpp import CompileFailed, compile_library, find_compiler, host_isa
from jit2triton.errors import CorruptPackageError, PackageDeviceError

from .policy import RECONVERT

_ELF_MACHINE = {"x86_64": 62, "AMD64": 62, "aarch64": 183, "arm64": 183}
_ISA_RANK = {"x86-64": 0, "x86-64-v3": 1}


def usable_library(library: bytes, source: str, isa: str) -> bytes:
    """The library, or where it was built for another CPU, one rebuilt for this CPU from its source."""
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

