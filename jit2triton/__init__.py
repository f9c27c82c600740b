"""jit2triton: TorchScript models in, fused Triton / C++ kernels out, in a package that loads without a compiler.

    m = jit2triton.convert("model.pt", example_inputs=(x,))
    m.save("model.j2t")
    m = jit2triton.load("model.j2t")
    y = m(x)
"""
import os as _os

# Installed, the pipeline folders are subpackages (pyproject's package-dir mapping). Run from a source checkout, or
# installed by a setuptools too old for that mapping in editable mode, they sit beside this folder instead: let the
# package find them there.
_checkout = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if not _os.path.isdir(_os.path.join(__path__[0], "loaders")) and _os.path.isfile(
        _os.path.join(_checkout, "loaders", "__init__.py")):
    __path__.append(_checkout)

from .errors import (  # noqa: E402
    ConversionError,
    CorruptPackageError,
    InputError,
    Jit2TritonError,
    ModelLoadError,
    PackageDeviceError,
    PackageError,
    PackageVersionError,
    QuantizedEngineError,
    RuntimeUnavailableError,
    SignatureError,
    StepError,
    UnsafeCacheError,
)
from .version import __version__  # noqa: E402

__all__ = [
    "convert", "load", "Converted", "Dim", "__version__",
    "Jit2TritonError", "ModelLoadError", "ConversionError", "PackageError", "CorruptPackageError",
    "PackageVersionError", "PackageDeviceError", "QuantizedEngineError", "RuntimeUnavailableError", "SignatureError", "InputError", "StepError",
    "ModelRaisedError", "UnsafeCacheError", "PrecisionWarning",
    "SlowerPrecisionWarning",
]
_API = ("convert", "load", "Converted")


def __getattr__(name: str):
    """The API on first use: importing `jit2triton.errors` (as every stage does) or the CLI's `--help` loads no
    torch and no runtime."""
    if name in _API:
        from . import api
        return getattr(api, name)
    if name == "ModelRaisedError":  # a torch.jit.Error too: made when first asked for (errors.py)
        from .errors import ModelRaisedError
        return ModelRaisedError
    if name == "Dim":
        from .dims import Dim
        return Dim
    if name in ("PrecisionWarning", "SlowerPrecisionWarning"):  # with the precision rules (they import the
        from . import precision                                  # transpiler): on first use
        return getattr(precision, name)
    raise AttributeError(f"module 'jit2triton' has no attribute {name!r}")


def __dir__() -> list[str]:
    """What `dir(jit2triton)` and tab completion show: the public API, whether or not it has been loaded yet."""
    return sorted(set(__all__) | {name for name in globals() if not name.startswith("_")})
