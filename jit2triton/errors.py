"""One exception family for everything jit2triton raises at its boundaries.

Every message says what was expected, what came, and what to do. This module is the one leaf that every stage
(loaders, transpiler, emitters, deploy) may import.
"""


class Jit2TritonError(Exception):
    """Base of every error jit2triton raises on purpose."""


class ModelLoadError(Jit2TritonError):
    """The model given to `convert` is missing, unreadable, or not TorchScript."""


class ConversionError(Jit2TritonError):
    """The TorchScript graph could not be turned into a runnable plan."""


class TimeBudgetError(ConversionError):
    """The conversion ran past its time budget (convert's `timeout`); the message names the stage."""


class PackageError(Jit2TritonError):
    """A `.j2t` package is missing, corrupted, or cannot run here."""


class CorruptPackageError(PackageError):
    """The package file is truncated, not a zip, or a member fails its checksum."""


class PackageVersionError(PackageError):
    """The package was written in a newer format, or by an incompatible torch/triton."""


class SignatureError(PackageError):
    """Trusted keys are set and the package is unsigned, signed by another key, or changed since it was signed;
    or a key file cannot be used."""


class PackageDeviceError(PackageError):
    """The package was built for a device this machine or this call cannot provide."""


class RuntimeUnavailableError(PackageDeviceError):
    """The C++ runtime, which runs every package, can neither be built on this machine (no compiler, no ninja) nor
    taken from the package (whose build is of another jit2triton, torch or Python)."""


class QuantizedEngineError(PackageDeviceError):
    """The package's quantized weights are packed for a quantized engine (x86, fbgemm, qnnpack, onednn) this torch
    does not have."""


class WriteError(Jit2TritonError, OSError):
    """A file jit2triton writes (a package, a benchmark's JSON) cannot be written at the path given: it names something
    that is not a regular file, its folder is missing or takes no new file, or the write failed; names the path and
    the system's reason."""


class InputError(Jit2TritonError, ValueError):
    """The inputs of a call do not match the signature the model was converted with."""


class SizeChangedError(InputError):
    """A size the package fixed at conversion changed at run time: a scalar input's value, a list input's length, or
    a count computed from the data that conversion did not see vary."""


class StepError(Jit2TritonError, RuntimeError):
    """An op failed while running the plan; names the op and the model source line it came from."""


def __getattr__(name: str):
    """ModelRaisedError, made on first use: it is a torch.jit.Error too, the class TorchScript raises a model's
    `raise` as (so code that catches that around a model's call keeps working), and importing torch here would load
    it for every stage and for the CLI's --help."""
    if name != "ModelRaisedError":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import torch

    class ModelRaisedError(Jit2TritonError, torch.jit.Error):
        """The model itself raised (a `raise` or `assert` in its TorchScript source)."""

    ModelRaisedError.__module__ = __name__
    ModelRaisedError.__qualname__ = "ModelRaisedError"  # (not __getattr__.<locals>.ModelRaisedError in tracebacks)
    globals()["ModelRaisedError"] = ModelRaisedError
    return ModelRaisedError


class UnsafeCacheError(Jit2TritonError):
    """The kernel cache folder (JIT2TRITON_CACHE, ~/.cache/jit2triton) is not private to this user: owned by
    another, or writable by others. Code is never loaded from it."""
