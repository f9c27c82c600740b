"""Use over time: programs called again and again, with state whose shape changes between calls (a cache grown by
`cat`, a streaming encoder's memory), sizes set by values (`range(n)`, flat ids with offsets), and methods that
reset the state. Each is converted and called over a sequence of fresh inputs in both runtimes, beside the
TorchScript module called the same way; and verification itself must catch a package that is right on the first
call and wrong on the second."""
from typing import List

import pytest
import torch

import jit2triton
from helpers import assert_same
from jit2triton import conversion, verify
from jit2triton.method_sequences import call_order, check_methods_in_order

RUNTIMES = ["python", "cpp"]


class KVCache(torch.nn.Module):
    """An incremental decoder's attention: keys and values appended to module buffers every call, a position
    counter, and a reset method."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v, self.out = (torch.nn.Linear(16, 16) for _ in range(4))
        self.k_cache = torch.zeros(1, 2, 0, 8)
        self.v_cache = torch.zeros(1, 2, 0, 8)
        self.pos = 0

    def forward(self, x):
        q = self.q(x).view(1, 1, 2, 8).transpose(1, 2)
        self.k_cache = torch.cat([self.k_cache, self.k(x).view(1, 1, 2, 8).transpose(1, 2)], 2)
        self.v_cache = torch.cat([self.v_cache, self.v(x).view(1, 1, 2, 8).transpose(1, 2)], 2)
        self.pos += 1
        attention = torch.softmax(q @ self.k_cache.transpose(-1, -2) / 8 ** 0.5, -1)
        y = (attention @ self.v_cache).transpose(1, 2).reshape(1, 1, 16)
        return self.out(y).relu() + float(self.pos)

    @torch.jit.export
    def reset(self) -> None:
        self.k_cache = self.k_cache[:, :, :0]  # (empty, on the cache's device)
        self.v_cache = self.v_cache[:, :, :0]
        self.pos = 0


class Streaming(torch.nn.Module):
    """A streaming encoder's state: a list of tensors whose memory grows by a row per chunk up to a maximum."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.memory: List[torch.Tensor] = [torch.zeros(0, 8)]
        self.chunks = 0

    def forward(self, x):
        h = self.lin(x).tanh()
        memory = torch.cat([self.memory[0], h.mean(0, keepdim=True)], 0)
        if memory.size(0) > 3:
            memory = memory[-3:]
        self.memory = [memory]
        self.chunks += 1
        return h + memory.sum(0), memory * 2


class LoopN(torch.nn.Module):
    """A size set by a value: the stack's length is the input `n`."""

    def forward(self, x, n: int):
        steps = []
        for _ in range(n):
            x = x.sin() * 1.1 + 0.1
            steps.append(x)
        return torch.stack(steps).relu() * 2 + 1


class Bag(torch.nn.Module):
    """Flat ids with offsets (KeyedJaggedTensor style): the ids' count varies per call."""

    def __init__(self) -> None:
        super().__init__()
        self.bag = torch.nn.EmbeddingBag(50, 8, mode="sum")

    def forward(self, ids, offsets):
        return self.bag(ids, offsets).relu() * 2


class BeamSearch(torch.nn.Module):
    """A scripted beam search: a GRU cell over an expanded initial state, top-k over beam x vocab, finished
    hypotheses and their length-normalised scores appended to lists, a break when enough are finished or every beam
    is dead, the step count returned. How many steps it takes, and so every size after the loop, depends on the
    values."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = torch.nn.GRUCell(8, 16)
        self.embed = torch.nn.Embedding(20, 8)
        self.project = torch.nn.Linear(16, 20)

    def forward(self, h0, bos: int):
        beam = 4
        h = h0.expand(beam, 16)
        tokens = torch.full([beam], bos, dtype=torch.long)
        scores = torch.zeros(beam)
        finished: List[torch.Tensor] = []
        finished_scores: List[float] = []
        step = 0
        while True:
            h = self.cell(self.embed(tokens), h)
            log_probs = torch.log_softmax(self.project(h) * 4, -1)
            total = log_probs[0] if step == 0 else (scores.unsqueeze(1) + log_probs).view(-1)
            top, index = total.topk(beam)
            tokens = index % 20
            h = h[torch.div(index, 20, rounding_mode="floor")]
            scores = top
            step += 1
            ended = tokens == 3
            if bool(ended.any()):
                for i in range(beam):
                    if bool(ended[i]):
                        finished.append(h[i])
                        finished_scores.append(float(scores[i]) / step)
                scores = scores.masked_fill(ended, -1e9)
            if len(finished) >= beam or bool((scores <= -1e9).all()) or step > 60:
                break
        if len(finished) == 0:
            return torch.zeros(1), torch.zeros(1, 16), step
        return torch.tensor(finished_scores), torch.stack(finished), step


def _loaded(converted, tmp_path, runtime: str):
    converted.save(tmp_path / "m.j2t")
    return jit2triton.load(tmp_path / "m.j2t", runtime=runtime)


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
    """Each program converted once (path of its package, its report's verification, its TorchScript twin), for
    both runtimes' tests."""
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


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_cache_grown_by_cat_with_a_reset_method(runtime, packages):
    path, verification, reference = packages("kv_cache")
    assert verification["status"] == "passed" and verification["methods_in_order"].count("reset") == 1
    reference.reset()
    loaded = jit2triton.load(path, runtime=runtime)
    for method in ["forward"] * 3 + ["reset"] + ["forward"] * 4 + ["reset", "forward"]:
        if method == "reset":
            assert loaded.reset() is None and reference.reset() is None
            continue
        x = torch.randn(1, 1, 16)
        assert_same(loaded(x), reference(x))


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_list_of_state_tensors_that_grows_to_a_maximum(runtime, packages):
    path, _, reference = packages("streaming")
    reference.memory, reference.chunks = [torch.zeros(0, 8)], 0  # (the other runtime's test called it)
    loaded = jit2triton.load(path, runtime=runtime)
    for _ in range(7):  # the memory grows for 3 chunks, then stays at 3 rows
        x = torch.randn(4, 8)
        assert_same(loaded(x), reference(x))


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_loop_count_given_as_an_input(runtime, packages):
    path, _, reference = packages("loop_n")
    loaded = jit2triton.load(path, runtime=runtime)
    for n in (1, 9, 5, 3, 12, 2):
        x = torch.randn(2, 4)
        assert_same(loaded(x, n), reference(x, n))


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_flat_ids_and_offsets_of_varying_total_length(runtime, packages):
    path, _, reference = packages("bag")
    loaded = jit2triton.load(path, runtime=runtime)
    generator = torch.Generator().manual_seed(3)
    for count in (10, 8, 12, 40, 64, 7):
        flat = torch.randint(0, 50, (count,), generator=generator)
        offsets = torch.sort(torch.randint(0, count, (3,), generator=generator)).values
        offsets[0] = 0
        assert_same(loaded(flat, offsets), reference(flat, offsets))


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_beam_search_on_fresh_inputs(runtime, packages):
    path, _, reference = packages("beam_search")
    loaded = jit2triton.load(path, runtime=runtime)
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
        loaded = _loaded(converted, tmp_path, "python")
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
    from jit2triton.api import python_runtimes
    from jit2triton.loaders import load_script

    torch.manual_seed(0)
    model = torch.jit.script(KVCache().eval())
    script = load_script(model, methods=["reset"])
    converted = jit2triton.convert(model, {"forward": (torch.randn(1, 1, 16),), "reset": ()})
    forward, methods = python_runtimes(converted._contents, "cpu")
    examples = {"forward": [torch.randn(1, 1, 16)], "reset": []}
    signatures = {"forward": converted._contents.manifest["signature"]["inputs"], "reset": []}
    runtimes = {"forward": forward, "reset": methods["reset"]}
    assert check_methods_in_order(script, examples, signatures, runtimes, forward.state.store, torch.device("cpu")) \
        == ([], [])
    runtimes["reset"] = lambda: None
    mismatches, _ = check_methods_in_order(script, examples, signatures, runtimes, forward.state.store,
                                           torch.device("cpu"))
    assert mismatches and mismatches[0].where.startswith("state['k_cache'] on call 3 (reset)")


def test_the_call_order_calls_each_method_then_forward():
    assert call_order(["reset"]) == ["forward", "forward", "reset", "forward", "forward", "forward"]
    assert len(call_order([])) >= 6


@pytest.mark.parametrize("seed", range(4))
def test_stateful_fuzz(seed):
    """Random modules with caches, counters, in-place buffers, running means and lists as state, and a reset
    (tests/fuzz_stateful.py; a longer run: `python tests/fuzz_stateful.py --seeds 200`)."""
    from fuzz_stateful import failure_of
    report = failure_of(seed)
    assert report is None, report


class RowsByValue(torch.nn.Module):
    """A size an int input sets, at values the model refuses near the example's: a reshape of 10 elements into
    `n` rows runs at n=5 but not at 4, 6 or 7, which conversion tries."""

    def forward(self, x, n: int):
        return (x.reshape(n, -1) * 2.0).relu().sum(1)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_an_int_the_model_ran_at_no_other_value_is_refused_at_the_boundary(runtime, tmp_path):
    scripted, reference = _scripted_twice(RowsByValue)
    converted = jit2triton.convert(scripted, (torch.randn(10), 5))
    loaded = _loaded(converted, tmp_path, runtime)
    x = torch.randn(10)
    assert_same(loaded(x, 5), reference(x, 5))
    with pytest.raises(jit2triton.InputError, match=r"input 1 \('n'\): the package serves only the value 5 .* got 2"):
        loaded(x, 2)  # (TorchScript runs n=2; the package's sizes were fitted to 5 rows)


def test_verification_runs_the_runtime_that_ships(monkeypatch, tmp_path):
    """Verification runs the C++ runtime too (what load() uses): where it differs from TorchScript and the Python
    runtime matches, the package is marked for the Python runtime, which load() then takes, and the C++ runtime
    refuses it with the reason."""
    scripted, reference = _scripted_twice(Streaming)
    converted = jit2triton.convert(scripted, (torch.randn(4, 8),))
    assert converted.summary()["verification"]["runtimes"] == ["python", "cpp"]

    real_call = verify._CppRunner.__call__
    monkeypatch.setattr(verify._CppRunner, "__call__", lambda self, *xs: real_call(self, *xs)[0] + 1.0)
    scripted, reference = _scripted_twice(Streaming)
    converted = jit2triton.convert(scripted, (torch.randn(4, 8),))
    verification = converted.summary()["verification"]
    assert verification["runtimes"] == ["python"]
    assert any("the C++ runtime differed from TorchScript" in note for note in verification["notes"])
    converted.save(tmp_path / "m.j2t")
    with pytest.warns(UserWarning, match="runs only in the Python runtime"):
        loaded = jit2triton.load(tmp_path / "m.j2t")
    x = torch.randn(4, 8)
    assert_same(loaded(x), reference(x))
    with pytest.raises(jit2triton.PackageDeviceError, match="runs only in the Python runtime"):
        jit2triton.load(tmp_path / "m.j2t", runtime="cpp")
