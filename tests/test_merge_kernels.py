"""Sibling kernels merge into one (transpiler/merge_kernels.py) only where moving the later one up is sound: never
past a write it could read, never above what defines its inputs. Each model is checked against TorchScript on fresh
inputs, on every backend this machine runs."""
import pytest
import torch

from helpers import BACKENDS, assert_matches_torchscript, convert_for, kernel_body


def _kernel_steps(converted) -> list[dict]:
    return [s for s in converted.manifest["plan"]["steps"] if s["kind"] == "kernel"]


def _trace(fn, *example):
    return torch.jit.trace(fn, example, strict=False)


def siblings(x, y):
    return {"sum": x + y, "max": torch.maximum(x, y), "sin": torch.sin(x), "flag": x > y}


@torch.jit.script
def behind_a_write(x, y):
    a = x * 2
    y.add_(1)  # visible to the caller: it stays an in-place write
    return a, y * 3  # reads the same IR value `y` after the write: must not move above it


def behind_a_producer(x, w):
    a = torch.sin(x)
    m = a @ w  # ATen, between the two kernels
    return a, torch.cos(m) + 1  # reads m: cannot join sin's kernel, which runs before m exists


@pytest.mark.parametrize("backend", BACKENDS)
def test_siblings_over_one_space_run_as_one_kernel_with_an_output_each(backend):
    pair = lambda: (torch.randn(6, 10), torch.randn(6, 10))
    traced = _trace(siblings, *pair())
    converted = convert_for(traced, pair(), backend)
    steps = _kernel_steps(converted)
    assert len(steps) == 1 and len(steps[0]["outs"]) == 4, steps
    assert_matches_torchscript(converted, traced, pair)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_kernel_never_moves_above_an_in_place_write(backend):
    pair = lambda: (torch.randn(5, 7), torch.randn(5, 7))
    converted = convert_for(behind_a_write, pair(), backend)
    assert len(_kernel_steps(converted)) == 2
    assert_matches_torchscript(converted, behind_a_write, pair)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_kernel_never_moves_above_what_defines_its_inputs(backend):
    inputs = lambda: (torch.randn(8, 8), torch.randn(8, 8))
    traced = _trace(behind_a_producer, *inputs())
    converted = convert_for(traced, inputs(), backend)
    assert len(_kernel_steps(converted)) == 2
    assert_matches_torchscript(converted, traced, inputs)


def test_small_static_kernels_enter_no_parallel_region_and_dynamic_ones_choose_per_call():
    """`#pragma omp parallel for if(false)` still enters libgomp, about 0.4 us a region (a 3x5 kernel made three):
    a static kernel below the threshold has no parallel region; a dynamic one has both loops and picks per call."""
    import jit2triton
    small = _trace(lambda x: torch.sin(x) + 1, torch.randn(3, 5))
    code = jit2triton.convert(small, (torch.randn(3, 5),)).code
    assert "omp parallel" not in code and "#pragma omp simd" in code
    batch = jit2triton.Dim("batch", min=1, max=4096)
    wide = _trace(lambda x: torch.sin(x) + 1, torch.randn(4, 64))
    dynamic = jit2triton.convert(wide, (torch.randn(4, 64),), dynamic_shapes={0: {0: batch}})
    kernel = kernel_body(dynamic.code)
    assert kernel.count("omp parallel for") == 1 and "} else {" in kernel, kernel
    for rows in (1, 3, 1000):
        x = torch.randn(rows, 64)
        torch.testing.assert_close(dynamic(x), wide(x))
