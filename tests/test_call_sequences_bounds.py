"""Memory safety as sizes move from fixed to per call: the programs of test_call_sequences.py converted for Triton
and called over their sequences under the bounds-checked interpreter (tests/bounds_checked_triton.py), so that a
generated kernel reading or writing past a tensor it was given, at any call's sizes, fails here as it would fault
on a GPU (there: `compute-sanitizer --tool memcheck python tests/gpu_call_sequences.py`)."""
import pytest
import torch

import jit2triton
from bounds_checked_triton import checked_loads
from helpers import TRITON_ON_CPU, assert_same
from call_programs import Bag, KVCache, LoopN, Streaming

pytestmark = pytest.mark.skipif(not TRITON_ON_CPU, reason="Triton kernels run on the CPU only under TRITON_INTERPRET=1")


def _calls(name: str, generator: torch.Generator) -> list[tuple[str, tuple]]:
    randn = lambda *shape: torch.randn(*shape, generator=generator)  # noqa: E731
    if name == "kv_cache":
        return [(m, (randn(1, 1, 16),) if m == "forward" else ()) for m in ["forward"] * 3 + ["reset", "forward"]]
    if name == "streaming":
        return [("forward", (randn(4, 8),)) for _ in range(5)]
    if name == "loop_n":
        return [("forward", (randn(2, 4), n)) for n in (1, 9, 3)]
    calls = []
    for count in (10, 7, 40):
        offsets = torch.sort(torch.randint(0, count, (3,), generator=generator)).values
        offsets[0] = 0
        calls.append(("forward", (torch.randint(0, 50, (count,), generator=generator), offsets)))
    return calls


PROGRAMS = {
    "kv_cache": (KVCache, {"forward": (torch.randn(1, 1, 16),), "reset": ()}, {}),
    "streaming": (Streaming, (torch.randn(4, 8),), {}),
    "loop_n": (LoopN, (torch.randn(2, 4), 5), {}),
    "bag": (Bag, (torch.randint(0, 50, (10,)), torch.tensor([0, 3, 7])),
            {"dynamic_shapes": {"ids": {0: jit2triton.Dim("ids", min=7, max=64)}}}),
}


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_kernels_stay_inside_their_tensors_over_calls(name):
    model_class, examples, options = PROGRAMS[name]
    torch.manual_seed(0)
    model = model_class().eval()
    reference = torch.jit.script(model)
    with checked_loads():
        converted = jit2triton.convert(torch.jit.script(model), examples, backend="triton", **options)
        assert converted.summary()["kernels"], "no generated kernel to check"
        for method, inputs in _calls(name, torch.Generator().manual_seed(2)):
            assert_same(getattr(converted, method)(*inputs), getattr(reference, method)(*inputs))
