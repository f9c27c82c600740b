"""A module the user ran through `torch.jit.optimize_for_inference` (CPU) converts: its MKL-DNN form (MKL-DNN tensor
constants, which have no storage, to_mkldnn/to_dense, prim::MKLDNN ops whose bounds sit on the node) is written back
as dense ATen ops by the loader (loaders/mkldnn_form.py), and the package matches the module. Conversion failed on
it with "Cannot access data pointer of Tensor that doesn't have storage"."""
from __future__ import annotations

import pytest
import torch

import jit2triton

from helpers import FRESH_SEED

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without MKL-DNN")

MKLDNN_OPS = {"prim::ConstantMKLDNNTensor", "prim::mkldnn_convolution", "aten::to_mkldnn", "prim::MKLDNNHardTanh_",
              "prim::MKLDNNHardSigmoid_", "prim::MKLDNNScalarMul_", "prim::MKLDNNClamp_", "prim::MKLDNNHardSwish_"}


class MobileBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1, self.b1 = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8)
        self.c2, self.c3 = torch.nn.Conv2d(8, 8, 3, padding=1, groups=2), torch.nn.Conv2d(8, 8, 1)
        with torch.no_grad():
            self.b1.running_mean.uniform_(-1, 1)
            self.b1.running_var.uniform_(0.5, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.relu6(self.b1(self.c1(x)))
        y = torch.nn.functional.hardsigmoid(self.c2(y)) * 2.0
        y = torch.nn.functional.hardswish(torch.clamp(self.c3(y), -0.5, 0.7))
        return y.mean((2, 3))


@pytest.mark.parametrize("backend", ["cpp", "aten"])
def test_a_module_optimized_for_inference_converts_and_matches(backend: str) -> None:
    torch.manual_seed(0)
    model = torch.jit.optimize_for_inference(torch.jit.script(MobileBlock().eval()))
    assert MKLDNN_OPS <= {node.kind() for node in model.graph.nodes()}  # (what the test is about is there)
    converted = jit2triton.convert(model, (torch.randn(2, 3, 16, 16),), backend=backend)
    assert converted.summary()["verification"]["status"] == "passed"
    assert not any("mkldnn" in op.lower() for op in converted.summary()["fallback_ops"]), converted.report()
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(FRESH_SEED))
    torch.testing.assert_close(converted(x), model(x), rtol=1e-5, atol=1e-5)
