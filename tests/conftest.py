"""Fixtures shared by the tests: a small converted package."""
import pytest
import torch


@pytest.fixture
def small_package(tmp_path):
    """A traced two-input model, converted and saved; returns (path, torchscript model)."""
    import jit2triton

    class Small(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 3)

        def forward(self, x, y):
            return torch.relu(self.linear(x)) + y

    torch.manual_seed(0)
    example = (torch.randn(2, 4), torch.randn(2, 3))
    traced = torch.jit.trace(Small().eval(), example)
    path = tmp_path / "small.j2t"
    jit2triton.convert(traced, example_inputs=example).save(path)
    return path, traced
