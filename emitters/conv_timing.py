"""The convolution templates timed alone (emitters/cpp_conv.py renders them): transpiler/onednn_conv.py's hook, for
each kernel a call of the template at its shape on random channels-last operands. Above the renderer and the
build in the flow (it compiles what they render), so neither imports the other back."""
from __future__ import annotations

import ctypes
import dataclasses
import os
import tempfile
from typing import Callable, Optional

import torch

from jit2triton.transpiler import kernel_ir as K
from jit2triton.transpiler.conv_templates import pack, shape_key

from .build import compile_library, host_isa, render_cpp


def conv_templates(kernels: list[K.ConvKernel]) -> list[Optional[Callable[[], object]]]:
    """transpiler/onednn_conv.py's hook: for each kernel, a call of the template alone (no epilogue) at its shape on
    random channels-last operands, for timing; None where it does not compile here or does not compute the
    convolution (checked against ATen's first). The shapes not seen before compile together, in one library."""
    new = {shape_key(k): k for k in kernels if shape_key(k) + (torch.get_num_threads(),) not in _runners}
    if new:
        named = [dataclasses.replace(k, name=f"t{i}_{k.kind}_conv") for i, k in enumerate(new.values())]
        library = _library(render_cpp(named))
        for key, kernel in zip(new, named):
            _runners[key + (torch.get_num_threads(),)] = _runner(library, kernel) if library is not None else None
    return [_runners[shape_key(k) + (torch.get_num_threads(),)] for k in kernels]


_runners: dict[tuple, Optional[Callable[[], object]]] = {}  # shape_key + threads -> the call (this process's)


def _library(source: str) -> Optional[ctypes.CDLL]:
    try:
        binary = compile_library(source, host_isa())
    except Exception:  # noqa: BLE001 - no compiler, or one that refuses: the template is not offered
        return None
    with tempfile.NamedTemporaryFile(suffix=".so", delete=False) as f:
        f.write(binary)
    try:
        return ctypes.CDLL(f.name)
    finally:
        os.unlink(f.name)  # (open: the mapping stays)


def _runner(library: ctypes.CDLL, kernel: K.ConvKernel) -> Optional[Callable[[], object]]:
    fn = getattr(library, kernel.name)
    fn.argtypes = (ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int64), ctypes.c_int)
    fn.restype = ctypes.c_int
    layout = torch.channels_last
    x = torch.randn(kernel.inputs[0].shape).contiguous(memory_format=layout)
    groups = kernel.cin if kernel.kind == "depthwise" else 1
    weight = torch.randn(kernel.cout, kernel.cin // groups, *kernel.kernel_size) / (kernel.cin // groups) ** 0.5
    bias = torch.randn(kernel.cout) if kernel.bias else None
    y = torch.empty(kernel.outputs[0].shape).contiguous(memory_format=layout)
    operands = [x, pack(kernel.kind, weight)] + ([bias] if bias is not None else []) + [y]
    pointers = (ctypes.c_void_p * len(operands))(*[t.data_ptr() for t in operands])
    sizes, threads = (ctypes.c_int64 * 1)(), torch.get_num_threads()

    def run() -> None:
        fn(pointers, sizes, threads)

    run()
    expected = torch.nn.functional.conv2d(x, weight, bias, kernel.stride, kernel.padding, kernel.dilation, groups)
    if not torch.allclose(y, expected, rtol=1e-4, atol=1e-4):
        return None  # never chosen where it computes something else
    run.operands = operands  # (held while the runner lives)
    return run
