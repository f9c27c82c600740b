"""Custom ops that crash the process natively on some values (a real SIGSEGV or SIGABRT, not a Python error):
models built on them stand for a TorchScript op that dies on an input conversion invented
(tests/test_conversion_survives.py). Registered with torch.library, so TorchScript calls them as torch.ops."""
import ctypes
import os

import torch

CRASH_ABOVE = 2.0  # |x| past this crashes; the tests' examples stay below it, a normal draw does not


@torch.library.custom_op("j2t_tests::segfault_above", mutates_args=())
def segfault_above(x: torch.Tensor) -> torch.Tensor:
    if bool(x.abs().max() > CRASH_ABOVE):
        ctypes.string_at(0)  # reads address 0: SIGSEGV
    return x * 2


@segfault_above.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("j2t_tests::abort_above", mutates_args=())
def abort_above(x: torch.Tensor) -> torch.Tensor:
    if bool(x.abs().max() > CRASH_ABOVE):
        os.abort()  # SIGABRT, as a failed C++ assertion ends a process
    return x + 1


@abort_above.register_fake
def _(x):
    return torch.empty_like(x)
