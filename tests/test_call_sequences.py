"""Use over time: programs called again and again, with state whose shape changes between calls (a cache grown by
`cat`, a streaming encoder's memory), sizes set by values (`range(n)`, flat ids with offsets), and methods that
reset the state. Each is converted and called over a sequence of fresh inputs, beside the
TorchScript module called the same way; and verification itself must catch a package that is right on the first
call and wrong on the second."""
from typing import List, Optional

import pytest
import torch

import jit2triton
from call_programs import Bag, BeamSearch, EncodeThenDecode, KVCache, LoopN, RowsByValue, Streaming
from helpers import assert_same
from jit2triton import conversion, verify
from jit2triton.method_sequences import call_order, check_methods_in_order


def _loaded(converted, tmp_path):
    converted.save(tmp_path / "m.j2t")
    return jit2triton.load(tmp_path / "m.j2t")


def _scripted_twice(model_class):
    """The module to convert and a second copy of it, with the same weights, that TorchScript runs as reference."""
    torch.manual_seed(0)
    model = model_class().eval()
    return torch.jit.script(model), torch.jit.script(model)


CONVERSIONS = {  # name -> (model, example inputs, convert's other arguments)
    "kv_cache": (KVCache, {"forward": (torch.randn(1, 1, 16),), "reset": ()}, {}),
    "streaming": (Streaming, (torch.randn(4, 8),), {}),
    "loop_n": (LoopN, (torch.randn(2, 4), 5), {}),
    "beam_search": (BeamSearch, (torch.randn(1, 16), 1), {}),
    "bag": (Bag, (torch.randint(0, 50, (10,)), torch.tensor([0, 3, 7])),
            {"dynamic_shapes": {"ids": {0: jit2triton.Dim("ids", min=7, max=64)}}}),
}


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    """Each program converted once (path of its package, its report's verification, its TorchScript twin)."""
    made = {}

    def package(name: str):
        if name not in made:
            model_class, examples, options = CONVERSIONS[name]
            scripted, reference = _scripted_twice(model_class)
            converted = jit2triton.convert(scripted, examples, **options)
            path = tmp_path_factory.mktemp(name) / "m.j2t"
            converted.save(path)
            made[name] = (path, converted.summary()["verification"], reference)
        return made[name]
    return package


def test_a_cache_grown_by_cat_with_a_reset_method(packages):
    path, verification, reference = packages("kv_cache")
    assert verification["status"] == "passed" and verification["methods_in_order"].count("reset") == 1
    reference.reset()
    loaded = jit2triton.load(path)
    for method in ["forward"] * 3 + ["reset"] + ["forward"] * 4 + ["reset", "forward"]:
        if method == "reset":
            assert loaded.reset() is None and reference.reset() is None
            continue
        x = torch.randn(1, 1, 16)
        assert_same(loaded(x), reference(x))


def test_a_list_of_state_tensors_that_grows_to_a_maximum(packages):
    path, _, reference = packages("streaming")
    reference.memory, reference.chunks = [torch.zeros(0, 8)], 0  # (as saved: this module's tests share the twin)
    loaded = jit2triton.load(path)
    for _ in range(7):  # the memory grows for 3 chunks, then stays at 3 rows
        x = torch.randn(4, 8)
        assert_same(loaded(x), reference(x))


def test_a_loop_count_given_as_an_input(packages):
    path, _, reference = packages("loop_n")
    loaded = jit2triton.load(path)
    for n in (1, 9, 5, 3, 12, 2):
        x = torch.randn(2, 4)
        assert_same(loaded(x, n), reference(x, n))


def test_flat_ids_and_offsets_of_varying_total_length(packages):
    path, _, reference = packages("bag")
    loaded = jit2triton.load(path)
    generator = torch.Generator().manual_seed(3)
    for count in (10, 8, 12, 40, 64, 7):
        flat = torch.randint(0, 50, (count,), generator=generator)
        offsets = torch.sort(torch.randint(0, count, (3,), generator=generator)).values
        offsets[0] = 0
        assert_same(loaded(flat, offsets), reference(flat, offsets))


def test_a_beam_search_on_fresh_inputs(packages):
    path, _, reference = packages("beam_search")
    loaded = jit2triton.load(path)
    generator = torch.Generator().manual_seed(11)
    steps = set()
    for call in range(20):
        h0, bos = torch.randn(1, 16, generator=generator), call % 5
        want = reference(h0, bos)
        assert_same(loaded(h0, bos), want)
        steps.add(want[2])
    assert len(steps) > 2, "the inputs should end the search after different numbers of steps"


def test_verification_catches_a_package_wrong_from_the_second_call(monkeypatch, tmp_path):
    """With the sequence of calls hidden from shape inference (LATER_CALLS = 0), the cache's kernel is fitted to its
    first size: right on the first call, wrong from the second. Verification over a sequence of calls must take it
    out; with that sequence switched off too, the package ships wrong (the guard is what keeps it right)."""
    def converted_and_second_call_error():
        scripted, reference = _scripted_twice(KVCache)
        converted = jit2triton.convert(scripted, (torch.randn(1, 1, 16),))
        loaded = _loaded(converted, tmp_path)
        errors = []
        for _ in range(3):
            x = torch.randn(1, 1, 16)
            errors.append((loaded(x) - reference(x)).abs().max().item())
        return converted.summary()["verification"], errors

    monkeypatch.setattr(conversion, "LATER_CALLS", 0)
    verification, errors = converted_and_second_call_error()
    assert verification["kernels_removed"], "verification over a sequence of calls took no kernel out"
    assert max(errors) < 1e-4

    monkeypatch.setattr(verify, "SEQUENCE_CALLS", 1)
    verification, errors = converted_and_second_call_error()
    assert not verification["kernels_removed"] and errors[0] < 1e-4 and errors[1] > 1e-2


def test_methods_called_in_order_catch_a_method_that_does_not_reset(tmp_path):
    """The methods-in-order check compares the state after every call: a reset that does nothing is found."""
    from jit2triton.loaders import load_script

    torch.manual_seed(0)
    model = torch.jit.script(KVCache().eval())
    script = load_script(model, methods=["reset"])
    converted = jit2triton.convert(model, {"forward": (torch.randn(1, 1, 16),), "reset": ()})
    examples = {"forward": [torch.randn(1, 1, 16)], "reset": []}
    signatures = {"forward": converted._contents.manifest["signature"]["inputs"], "reset": []}

    def loaded() -> tuple:
        module = _loaded(converted, tmp_path)  # (from the saved state)
        return {"forward": module, "reset": module.reset}, module._runtime.attribute
    runtimes, attribute = loaded()
    assert check_methods_in_order(script, examples, signatures, runtimes, attribute, torch.device("cpu")) \
        == ([], [], "forward, forward, reset, forward, forward, forward")
    runtimes, attribute = loaded()
    runtimes["reset"] = lambda: None
    mismatches, _, _ = check_methods_in_order(script, examples, signatures, runtimes, attribute, torch.device("cpu"))
    assert mismatches and mismatches[0].where.startswith("state['k_cache'] on call 3 (reset)")


def test_the_call_order_calls_each_method_then_forward():
    assert call_order(["reset"]) == ["forward", "forward", "reset", "forward", "forward", "forward"]
    assert len(call_order([])) >= 6


@pytest.mark.parametrize("seed", [0, 1, 2, 5, 7, 10])  # (between them, every kind of state the fuzzer draws)
def test_stateful_fuzz(seed):
    """Random modules with caches, counters, in-place buffers, running means, lists and dicts as state, and a reset
    (tests/fuzz_stateful.py; a longer run: `python tests/fuzz_stateful.py --seeds 200`). Lists and dicts changed in
    place (`self.seen.append(y)`, seeds 5 and 10) once kept the example's size, aliased the arena and lost their
    type in the C++ runtime."""
    from fuzz_stateful import failure_of
    report = failure_of(seed)
    assert report is None, report


def test_an_int_the_model_ran_at_no_other_value_is_refused_at_the_boundary(tmp_path):
    scripted, reference = _scripted_twice(RowsByValue)
    converted = jit2triton.convert(scripted, (torch.randn(10), 5))
    loaded = _loaded(converted, tmp_path)
    x = torch.randn(10)
    assert_same(loaded(x, 5), reference(x, 5))
    with pytest.raises(jit2triton.InputError, match=r"input 1 \('n'\): the package serves only the value 5 .* got 2"):
        loaded(x, 2)  # (TorchScript runs n=2; the package's sizes were fitted to 5 rows)


def test_verification_runs_the_runtime_that_ships(monkeypatch):
    """Verification runs the package in the C++ runtime (what load() runs): where that runtime's outputs are wrong,
    the conversion is refused, even with every op through ATen."""
    scripted, reference = _scripted_twice(Streaming)
    converted = jit2triton.convert(scripted, (torch.randn(4, 8),))
    assert converted.summary()["verification"]["runtime"] == "cpp"
    assert "input sets in the cpp runtime" in converted.report()  # (the report names it)

    real_call = verify.PackageRunner.__call__

    def wrong(self, *xs):
        (output, memory), state = real_call(self, *xs)
        return (output + 1.0, memory), state
    monkeypatch.setattr(verify.PackageRunner, "__call__", wrong)
    scripted, reference = _scripted_twice(Streaming)
    with pytest.raises(jit2triton.ConversionError, match="does not match TorchScript"):
        jit2triton.convert(scripted, (torch.randn(4, 8),))


def test_a_forward_that_needs_another_method_first(tmp_path):
    """Conversion observes forward from the state `encode` leaves (from the saved state it raises, in TorchScript
    too); the package starts from the saved state, so forward before encode raises there as well; the methods are verified in the order encode, forward, ..."""
    scripted, reference = _scripted_twice(EncodeThenDecode)
    converted = jit2triton.convert(scripted, {"forward": (torch.randn(3, 4),), "encode": (torch.randn(3, 4),)})
    verification = converted.summary()["verification"]
    assert verification["status"] == "passed" and verification["methods_in_order"].startswith("encode, forward")
    loaded = _loaded(converted, tmp_path)
    with pytest.raises(jit2triton.ModelRaisedError, match="call encode first"):
        loaded(torch.randn(3, 4))
    for _ in range(3):
        x, y = torch.randn(3, 4), torch.randn(3, 4)
        assert_same(loaded.encode(x), reference.encode(x))
        assert_same(loaded(y), reference(y))


class TrimmedCache(torch.nn.Module):
    """A streaming cache, None until the first call, trimmed once it passes 20 rows: with a few rows per call, no
    call conversion makes reaches 20, and every run answers `c.shape[0] > 20` alike (False)."""
    cache: Optional[torch.Tensor]

    def __init__(self) -> None:
        super().__init__()
        self.cache = None

    def forward(self, x):
        c = self.cache
        if c is None:
            c = x
        else:
            c = torch.cat([c, x], 0)
        if c.shape[0] > 20:
            c = c[-20:]
        self.cache = c
        return torch.softmax(x @ c.t(), -1) @ c


def test_a_condition_on_a_size_no_conversion_run_reached_stays_a_condition(tmp_path):
    scripted, reference = _scripted_twice(TrimmedCache)
    converted = jit2triton.convert(scripted, (torch.randn(3, 8),),
                                   dynamic_shapes={"x": {0: jit2triton.Dim("rows", min=1, max=16)}})
    loaded = _loaded(converted, tmp_path)
    for rows in [2, 1, 5, 3, 4, 2, 6, 1, 9]:  # 23 rows at the seventh call: the first trim
        x = torch.randn(rows, 8)
        assert_same(loaded(x), reference(x))


class SplitBySizes(torch.nn.Module):
    """Jagged rows: a split by a list the caller gives, one row per part, stacked (as many rows as parts)."""

    def forward(self, x, n: int, splits: List[int]):
        parts = torch.split(x, splits)
        return torch.stack([p.sum(0) * n for p in parts]).relu() + torch.arange(n).float().sum()


def test_sizes_set_by_a_list_input_follow_each_calls_list(tmp_path):
    scripted, reference = _scripted_twice(SplitBySizes)
    loaded = _loaded(jit2triton.convert(scripted, (torch.randn(10, 4), 3, [4, 6])), tmp_path)
    for n, splits in [(5, [2, 3, 5]), (2, [10]), (4, [1, 1, 1, 7]), (3, [4, 6]), (1, [9, 1]), (6, [1] * 10)]:
        x = torch.randn(10, 4)
        assert_same(loaded(x, n, splits), reference(x, n, splits))


class MaskedSoftmax(torch.nn.Module):
    def forward(self, x, mask: Optional[torch.Tensor] = None, scale: float = 1.0):
        if mask is not None:
            x = x.masked_fill(mask, -1e4)
        return (x * scale).softmax(-1)


class NeedsMask(torch.nn.Module):  # typed Optional, but refuses None: the package keeps taking tensors only
    def forward(self, x, mask: Optional[torch.Tensor] = None):
        assert mask is not None, "a mask is required"
        return x.masked_fill(mask, 0.0).relu()


def test_an_optional_tensor_given_in_the_example_takes_none_as_torchscript_does(tmp_path):
    scripted, reference = _scripted_twice(MaskedSoftmax)
    converted = jit2triton.convert(scripted, (torch.randn(3, 5), torch.rand(3, 5) > 0.5, 2.0))
    assert converted.summary()["verification"]["status"] == "passed"
    loaded = _loaded(converted, tmp_path)
    assert "mask: Optional[bool[3, 5]] = None" in loaded.signature()
    for call in [(torch.randn(3, 5),), (torch.randn(3, 5), torch.rand(3, 5) > 0.5), (torch.randn(3, 5), None, 3.0),
                 (torch.randn(3, 5), torch.rand(3, 5) > 0.2, 0.5), (torch.randn(3, 5), None), (torch.randn(3, 5),)]:
        assert_same(loaded(*call), reference(*call))
    strict = _loaded(jit2triton.convert(torch.jit.script(NeedsMask()), (torch.randn(3, 5), torch.rand(3, 5) > 0.5)),
                     tmp_path)
    with pytest.raises(jit2triton.InputError, match=r"input 1 \('mask'\): expected a tensor bool\[3, 5\] on cpu, got"):
        strict(torch.randn(3, 5), None)
