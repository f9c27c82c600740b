"""jit2triton: TorchScript models in, fused Triton / C++ kernels out, in a package that loads without a compiler.

    m = jit2triton.convert("model.pt", example_inputs=(x,))
    m.save("model.j2t")
    m = jit2triton.load("model.j2t")
    y = m(x)
"""
from .errors import (
    ConversionError,
    CorruptPackageError,
    InputError,
    Jit2TritonError,
    ModelLoadError,
    PackageDeviceError,
    PackageError,
    PackageVersionError,
)
from .api import Converted, convert, load
from .version import __version__

__all__ = [
    "convert", "load", "Converted", "__version__",
    "Jit2TritonError", "ModelLoadError", "ConversionError", "PackageError", "CorruptPackageError",
    "PackageVersionError", "PackageDeviceError", "InputError",
]
