"""Programmatic dependent launch (emitters/dependent_launch.py): on Hopper and later each cubin waits first for the
kernel before it, and the C++ runtime launches it with PDL. On the CPU: the wait goes first in every kernel the
renderers write, and nothing else of the source moves. On the GPU: every kernel of an sm_90 package is so built,
its stored source is the rendered one, and chains of kernels between vendor calls match TorchScript over calls, in
CUDA graphs and step by step, 6 fresh draws each."""
import ast

import pytest
import torch

import jit2triton
from jit2triton.emitters import triton_gemm
from jit2triton.emitters.dependent_launch import enabled, waiting_source

from helpers import GPU_TOLERANCE, HAS_GPU, INTERPRETED, on_gpu, to_device
from package_tools import manifest_of, read_members


def chain(x, w):
    """Kernels between cuBLAS GEMMs and an ATen cumsum: each reads what the one before wrote."""
    h = torch.layer_norm(torch.sin(x) * 2.0, x.shape[-1:])
    h = torch.relu(h @ w) + 1.0
    h = torch.softmax(h * 0.5, -1).cumsum(-1)
    return (torch.tanh(h @ w.t()) - x).sum(-1)


def chain_inputs(seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(24, 64, generator=g), torch.randn(64, 96, generator=g) / 8


def first_statement(source: str, name: str) -> str:
    kernel = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == name)
    return ast.unparse(kernel.body[0])


def sources_of_a_package(tmp_path) -> dict[str, str]:
    traced = torch.jit.trace(chain, chain_inputs(0))
    path = tmp_path / "chain.j2t"
    device = "cpu" if INTERPRETED else "cuda"  # (where this process builds Triton kernels)
    jit2triton.convert(traced, to_device(chain_inputs(0), device), device=device, backend="triton").save(path)
    members = read_members(path)
    return {entry["function"]: members[entry["source"]].decode()
            for entry in manifest_of(path)["triton"]["kernels"].values()}


@pytest.mark.skipif(not INTERPRETED and not HAS_GPU, reason="needs the interpreter or a GPU to convert")
def test_the_wait_goes_first_in_every_kernel_and_nothing_else_moves(tmp_path):
    sources = sources_of_a_package(tmp_path)
    config = {"body": "rows", "stages": 4}
    sources["g_rows"] = triton_gemm.source("g_rows", 9, 64, 32, True, config, "# a GEMM", "out_a, out_b", "    pass\n")
    sources["g_dot"] = triton_gemm.source("g_dot", 9, 64, 32, False, dict(config, body="dot"), "# a GEMM")
    sources["wrapped"] = ("import triton\nimport triton.language as tl\n\n@triton.jit\ndef wrapped(a,\n        b,"
                          " N: tl.constexpr):  # a signature over lines\n    # a comment first\n    tl.store(b, "
                          "tl.load(a))\n")
    assert len(sources) >= 5, sorted(sources)
    for name, source in sources.items():
        waiting = waiting_source(source, name)
        assert first_statement(waiting, name) == "gdc_wait()", waiting
        assert "from triton.language.extra.cuda import gdc_wait" in waiting
        added = [line for line in waiting.splitlines() if "gdc_wait" in line]
        assert len(added) == 2 and [line for line in waiting.splitlines() if "gdc_wait" not in line] == \
            source.splitlines(), waiting
    with pytest.raises(ValueError, match="no `def other"):
        waiting_source(sources["wrapped"], "other")


def test_only_hopper_and_later_wait_and_the_environment_turns_it_off(monkeypatch):
    assert not enabled(80) and not enabled(89) and enabled(90) and enabled(100)
    monkeypatch.setenv("JIT2TRITON_PDL", "0")
    assert not enabled(90)


@on_gpu
@pytest.mark.parametrize("pdl", ["1", "0"])
def test_a_chain_of_kernels_launched_dependently_matches_torchscript(pdl, tmp_path, monkeypatch):
    monkeypatch.setenv("JIT2TRITON_PDL", pdl)
    traced = torch.jit.trace(chain, chain_inputs(0))
    path = tmp_path / "chain.j2t"
    jit2triton.convert(traced, to_device(chain_inputs(0), "cuda"), device="cuda").save(path)
    entries = manifest_of(path)["triton"]["kernels"]
    major, minor = torch.cuda.get_device_capability()
    want = pdl == "1" and major * 10 + minor >= 90
    assert len(entries) >= 3 and all(entry["pdl"] is want for entry in entries.values()), entries
    members = read_members(path)
    assert not any(b"gdc_wait" in members[entry["source"]] for entry in entries.values())  # (the rendered source)
    for graphs in (True, False):
        loaded = jit2triton.load(path, cuda_graphs=graphs)
        for seed in range(1, 7):
            inputs = chain_inputs(seed)
            torch.testing.assert_close(loaded(*to_device(inputs, "cuda")).cpu(), traced(*inputs),
                                       rtol=GPU_TOLERANCE, atol=GPU_TOLERANCE)
