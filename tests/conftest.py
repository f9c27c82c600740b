"""Fixtures shared by the tests: a small converted package."""
import os
import shutil

import pytest
import torch


def pytest_xdist_auto_num_workers(config):
    """`-n auto` (the README's test command, with `--dist loadfile`: a test file runs whole in one worker, so module
    fixtures such as a Ray server are made once): a worker per core this process may use, at most 4, since each
    holds torch and the models it converts."""
    return max(1, min(4, len(os.sched_getaffinity(0))))


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


@pytest.fixture(scope="session")
def cpp_runtime():
    """The C++ runtime's Python extension, built once (cached across runs)."""
    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler here: the C++ runtime cannot be built")
    from jit2triton.deploy.cpp_runtime import extension
    return extension()  # with a compiler here, a runtime that does not build is a failure, never a skip


@pytest.fixture
def steady_timing(monkeypatch):
    """Every timing counts as steady: a test that decides a timed choice by its margin (0 or 1e9) gets the timed
    answer on a busy machine too, where a timing that is not steady takes the fixed answer (transpiler/timing.py)."""
    from jit2triton.transpiler import timing
    monkeypatch.setattr(timing, "STEADY_SPREAD", float("inf"))
    monkeypatch.setattr(timing, "MIN_CPU_SHARE", 0.0)
