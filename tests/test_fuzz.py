"""The differential fuzzer on fixed seeds (tests/fuzz_programs.py): random programs of views, pointwise ops,
reductions, externs and in-place writes, traced and scripted, must convert, pass verification without any kernel
taken out, and match TorchScript on fresh inputs after a save/load round trip; in dynamic mode, at other sizes of a
dynamic first dim too. A longer run is one command: `python tests/fuzz_programs.py --seeds 2000 [--dynamic]`."""
from __future__ import annotations

import pytest

from fuzz_programs import check_seed, draw_program
from helpers import LONG_TESTS, TRITON_ON_CPU

SHARE = 1 if LONG_TESTS else 2  # CI runs every other Triton and dynamic seed (its 20 minutes); JIT2TRITON_LONG_TESTS=1
CPP_SEEDS = range(0, 48)  # runs them all (the C++ seeds always: every op family is among them)
TRITON_SEEDS = range(1000, 1016, SHARE)  # the interpreter is slow: fewer, other programs
DYNAMIC_CPP_SEEDS = range(3000, 3024, SHARE)  # the first input's first dim dynamic (fuzz_programs.py --dynamic)
DYNAMIC_TRITON_SEEDS = range(4000, 4008, SHARE)


@pytest.mark.parametrize("seed", CPP_SEEDS)
def test_fuzz_cpp(seed: int) -> None:
    report = check_seed(seed, "cpp")
    assert report is None, report


@pytest.mark.skipif(not TRITON_ON_CPU, reason="Triton kernels run on the CPU only under TRITON_INTERPRET=1")
@pytest.mark.parametrize("seed", TRITON_SEEDS)
def test_fuzz_triton(seed: int) -> None:
    report = check_seed(seed, "triton")
    assert report is None, report


@pytest.mark.parametrize("seed", DYNAMIC_CPP_SEEDS)
def test_fuzz_dynamic_cpp(seed: int) -> None:
    report = check_seed(seed, "cpp", dynamic=True)
    assert report is None, report


@pytest.mark.skipif(not TRITON_ON_CPU, reason="Triton kernels run on the CPU only under TRITON_INTERPRET=1")
@pytest.mark.parametrize("seed", DYNAMIC_TRITON_SEEDS)
def test_fuzz_dynamic_triton(seed: int) -> None:
    report = check_seed(seed, "triton", dynamic=True)
    assert report is None, report


def test_programs_cover_the_op_families() -> None:
    """The seeds CI runs draw from every family the fuzzer knows, so a family cannot silently drop out."""
    text = "".join(draw_program(seed).source() for seed in CPP_SEEDS)
    for marker in (".permute(", ".unbind(", ".select(", ".sum(", "softmax", "layer_norm", "matmul",
                   "scaled_dot_product_attention", "conv", "torch.cat(", "gather", "embedding", ".clone()",
                   "torch.where(", ".float()", "unique", "> 0.0]", "masked_select"):
        assert marker in text, f"no program among the CI seeds uses {marker}"
