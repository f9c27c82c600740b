"""A kernel input that starts at another address each call (row `i` of a matrix in a loop) is compiled for any
address and passed as it is, where a GPU kernel assumes 16-byte-aligned inputs and the runtime copied each such
view before every launch (Mask R-CNN: 1,000 copies a call). An input never seen unaligned keeps the assumption."""
from __future__ import annotations

import pytest
import torch

import jit2triton

from helpers import BACKENDS, assert_same, convert_for, on_gpu, to_cpu, to_device


@torch.jit.script
def rows_in_a_loop(x, n: int):
    acc = torch.zeros_like(x[0])
    for i in range(n):
        acc = acc + torch.tanh(x[i] * 1.5) * x[0]  # row i: 20 bytes apart; row 0: always aligned
    return acc


def _inputs(seed: int, n: int = 9) -> tuple:
    return torch.randn(9, 5, generator=torch.Generator().manual_seed(seed)), n



@pytest.mark.parametrize("backend", BACKENDS)
def test_a_row_picked_by_a_loop_counter_is_read_where_it_is(backend, tmp_path):
    converted = convert_for(rows_in_a_loop, _inputs(0), backend)
    assert converted.summary()["verification"]["status"] == "passed"
    if backend != "cpp":  # (the C++ kernels assume nothing of an address)
        entries = list(converted.manifest["triton"]["kernels"].values())
        marked = [e for e in entries if e.get("unaligned")]
        assert len(marked) == 1, entries
        # x[i] is unaligned at odd i; x[0] is the same address at every call, and keeps the assumption
        assert len(marked[0]["unaligned"]) == 1, marked
    path = tmp_path / "rows.j2t"
    converted.save(path)
    package = jit2triton.load(path)
    for seed, n in ((1, 9), (2, 4), (3, 1), (4, 0), (5, 8), (6, 2)):
        inputs = _inputs(seed, n)
        assert_same(to_cpu(package(*to_device(inputs, converted.device))), rows_in_a_loop(*inputs), f"{n} rows")


@on_gpu
def test_no_input_is_copied_to_an_aligned_address_on_the_gpu(tmp_path, cpp_runtime):
    converted = convert_for(rows_in_a_loop, _inputs(0), "cuda")
    path = tmp_path / "rows.j2t"
    converted.save(path)
    package = jit2triton.load(path, cuda_graphs=False)
    inputs = to_device(_inputs(4, 8), "cuda")
    package(*inputs)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out = package(*inputs)
        torch.cuda.synchronize()
    copies = [e.name for e in prof.events() if e.name in ("aten::clone", "aten::copy_")]
    assert not copies, copies
    assert_same(to_cpu(out), rows_in_a_loop(*to_cpu(inputs)), "8 rows", {torch.float32: (2e-5, 2e-5)})
