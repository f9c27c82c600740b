"""Helpers shared by test modules (a test module never imports another test module)."""
from __future__ import annotations

import os
import tempfile
from typing import Any, Callable

import pytest
import torch

import jit2triton


def _triton_interpreted() -> bool:
    if os.environ.get("TRITON_INTERPRET") != "1":
        return False
    try:
        from jit2triton.emitters.compile_triton import interpreter_active
        return interpreter_active()
    except ImportError:
        return False


TRITON_ON_CPU = _triton_interpreted()
TRITON_ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
# Where kernels are generated for: C++ on the CPU; Triton on the CPU under its interpreter (TRITON_INTERPRET=1);
# Triton compiled for a CUDA GPU (on the GPU machine, without TRITON_INTERPRET)
BACKENDS = ["cpp",
            pytest.param("triton", marks=pytest.mark.skipif(
                not TRITON_ON_CPU, reason="Triton kernels run on the CPU only under TRITON_INTERPRET=1")),
            pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
                not TRITON_ON_GPU, reason="needs a CUDA device and Triton's compiler (no TRITON_INTERPRET)")])]


def convert_for(model, example: tuple, backend: str, **options):
    """Convert for one of BACKENDS ("cuda": the Triton backend on the GPU, inputs moved there)."""
    if backend == "cuda":
        example = tuple(x.cuda() if isinstance(x, torch.Tensor) else x for x in example)
        return jit2triton.convert(model, example, device="cuda", **options)
    return jit2triton.convert(model, example, backend=backend, **options)


def to_device(inputs: tuple, device) -> tuple:
    return tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs)


def to_cpu(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.cpu()
    if isinstance(x, (tuple, list)):
        return type(x)(to_cpu(v) for v in x)
    if isinstance(x, dict):
        return {k: to_cpu(v) for k, v in x.items()}
    return x

TOLERANCE = {torch.float64: (1e-7, 1e-9), torch.float32: (2e-4, 2e-5), torch.float16: (1e-2, 1e-3),
             torch.bfloat16: (2e-2, 1e-2)}  # dtype -> (rtol, atol)


def assert_same(actual: Any, expected: Any, where: str = "output") -> None:
    """Same structure, dtypes, shapes; values within the dtype's tolerance (ints and bools exactly)."""
    assert type(actual) is type(expected), f"{where}: got {type(actual).__name__}, expected {type(expected).__name__}"
    if isinstance(expected, torch.Tensor):
        assert actual.dtype == expected.dtype and actual.shape == expected.shape, \
            f"{where}: {actual.dtype}{list(actual.shape)}, expected {expected.dtype}{list(expected.shape)}"
        rtol, atol = TOLERANCE.get(expected.dtype, (0, 0))
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True,
                                   msg=lambda m: f"{where}: {m}")
    elif isinstance(expected, (tuple, list)):
        assert len(actual) == len(expected), f"{where}: {len(actual)} items, expected {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same(a, e, f"{where}[{i}]")
    elif isinstance(expected, dict):
        assert list(actual) == list(expected), f"{where}: keys {list(actual)}, expected {list(expected)}"
        for key in expected:
            assert_same(actual[key], expected[key], f"{where}[{key!r}]")
    else:
        assert actual == expected, f"{where}: {actual!r}, expected {expected!r}"


def copied(inputs: tuple) -> tuple:
    return tuple(x.clone() if isinstance(x, torch.Tensor) else x for x in inputs)


def assert_matches_torchscript(converted, model: Callable, make_inputs: Callable[[], tuple], calls: int = 2) -> None:
    """The converted module, and the same package saved and loaded back, give TorchScript's outputs on `calls`
    fresh draws of `make_inputs`."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model.j2t")
        converted.save(path)
        loaded = jit2triton.load(path)
        device = converted.device
        for call in range(calls):
            inputs = make_inputs()
            expected = model(*copied(inputs))
            on_device = to_device(inputs, device)
            with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):  # the CPU reference has no TF32
                results = {"converted": converted(*copied(on_device)), "loaded": loaded(*copied(on_device))}
            for name, result in results.items():
                if device.type == "cuda":
                    assert_close_on_gpu(to_cpu(result), expected, f"{name}, call {call}")
                else:
                    assert_same(result, expected, f"{name}, call {call}")


def assert_close_on_gpu(actual: Any, expected: Any, where: str) -> None:
    """A GPU package against TorchScript on the CPU: the GPU's exp and reduction orders differ by a few ulp, which
    deep models grow; 1e-3 of each output's scale still catches every wrong kernel."""
    if isinstance(expected, (tuple, list)):
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_close_on_gpu(a, e, f"{where}[{i}]")
        return
    if not isinstance(expected, torch.Tensor) or not expected.is_floating_point():
        return assert_same(actual, expected, where)
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, where
    scale = expected.abs().max().clamp_min(1e-6)
    error = ((actual - expected).abs().max() / scale).item()
    assert error < 1e-3, f"{where}: max error {error:.3g} of the output's scale"
