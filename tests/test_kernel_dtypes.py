"""The dtypes a generated kernel holds (transpiler/kernel_ir.py's DTYPES): every renderer has a type for each, and
a tensor of any other dtype (complex64, as an STFT gives) stays out of kernels, its ops through ATen, while the ops
around it still fuse. HDemucs pads its complex spectrogram: fusion made that pad a kernel, the C++ renderer had no
type for complex64, and the whole model lost its kernels (0 generated, 288 through ATen, on both backends)."""
from __future__ import annotations

import pytest
import torch

from jit2triton.emitters import cpp, triton, triton_math
from jit2triton.transpiler import kernel_ir as K

from helpers import BACKENDS, assert_matches_torchscript, convert_for


def test_every_renderer_has_a_type_for_every_kernel_dtype():
    for name, table in (("cpp CTYPES", cpp.CTYPES), ("triton POINTER_TYPES", triton.POINTER_TYPES),
                        ("triton TL_TYPES", triton_math.TL_TYPES)):
        assert set(table) == K.DTYPES, f"{name}: {sorted(set(table) ^ K.DTYPES)}"


class PaddedSpectrum(torch.nn.Module):
    """HDemucs's `_ispec`: a complex tensor padded (twice, as it does), then back to real, with real pointwise work
    before and after that fuses."""

    def forward(self, x):
        z = torch.view_as_complex(torch.relu(x * 2.0 + 1.0).contiguous())
        z = torch.nn.functional.pad(torch.nn.functional.pad(z, [0, 0, 0, 1]), [2, 2])
        return torch.sigmoid(torch.view_as_real(z)) * 3.0


def _draw():
    return (torch.randn(1, 4, 6, 5, 2),)


@pytest.mark.parametrize("backend", BACKENDS)
def test_complex_tensors_stay_out_of_kernels_and_the_rest_fuses(backend):
    model = torch.jit.trace(PaddedSpectrum().eval(), _draw())
    converted = convert_for(model, _draw(), backend)
    report = converted.manifest["report"]
    assert "generation_failed" not in report, report["generation_failed"]
    kernels = [[f["op"] for f in e["fused"]] for e in converted.manifest["nodes"] if e["category"] == "kernel"]
    assert any("aten::relu" in ops for ops in kernels) and any("aten::sigmoid" in ops for ops in kernels), kernels
    assert not any("aten::pad" in ops for ops in kernels), kernels
    assert report["fallback_ops"].get("aten::pad") == 2, report["fallback_ops"]
    assert "complex64 tensor, which no generated kernel holds" in report["fallback_reasons"]["aten::pad"]
    assert_matches_torchscript(converted, model, _draw)
