"""The program's own types and features (issue 43, item 5): NamedTuple outputs come back as TorchScript returns
them, fork/wait run in order, isinstance on an Optional is evaluated per call; on fresh inputs.
And the refusals: an op the runtime does not run, and a file read, named with the model's source line."""

from typing import Dict, List, NamedTuple, Optional, Tuple, Union

import pytest
import torch

import jit2triton
from helpers import FRESH_SEED, assert_same


class Det(NamedTuple):
    boxes: torch.Tensor
    scores: torch.Tensor


class Part(NamedTuple):
    value: torch.Tensor
    mask: Optional[torch.Tensor]


class Outer(NamedTuple):
    det: Det
    parts: List[Part]
    by_name: Dict[str, Part]
    pair: Tuple[torch.Tensor, Part]


class Detector(torch.nn.Module):
    def forward(self, x) -> Det:
        return Det(x.relu() * 2, x.sigmoid().sum(1))


class Nested(torch.nn.Module):
    """NamedTuples inside a NamedTuple, a list (as long as the input's rows), a dict and a tuple; an Optional field
    that is None in some and a tensor in others."""

    def forward(self, x) -> List[Outer]:
        parts: List[Part] = []
        for i in range(x.size(0)):
            parts.append(Part(x[i] * i, None if i % 2 == 0 else x[i] > 0))
        outer = Outer(Det(x.tanh(), x.sum(1)), parts, {"first": Part(x[0], None), "last": Part(x[-1], x[-1] < 0)},
                      (x.exp(), Part(x.abs(), None)))
        return [outer, outer]


def assert_same_program_output(actual, expected, where: str = "output") -> None:
    """Values as assert_same; a NamedTuple by TorchScript's name and fields (its class is made per process)."""
    if isinstance(expected, tuple) and hasattr(type(expected), "_fields"):
        assert (type(actual).__name__, getattr(type(actual), "_fields", None)) == \
            (type(expected).__name__, type(expected)._fields), \
            f"{where}: got {type(actual).__name__} {getattr(type(actual), '_fields', None)}, expected " \
            f"{type(expected).__name__} {type(expected)._fields}"
        for field, a, e in zip(expected._fields, actual, expected):
            assert_same_program_output(a, e, f"{where}.{field}")
    elif isinstance(expected, (list, tuple)):
        assert type(actual) is type(expected) and len(actual) == len(expected), f"{where}: {actual!r}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same_program_output(a, e, f"{where}[{i}]")
    elif isinstance(expected, dict):
        assert type(actual) is dict and list(actual) == list(expected), f"{where}: {actual!r}"
        for key in expected:
            assert_same_program_output(actual[key], expected[key], f"{where}[{key!r}]")
    else:
        assert_same(actual, expected, where)


def converted_and_loaded(model: torch.nn.Module, example: tuple, tmp_path, **options):
    scripted = torch.jit.script(model.eval())
    jit2triton.convert(scripted, example, **options).save(tmp_path / "m.j2t")
    return scripted, jit2triton.load(tmp_path / "m.j2t")


def assert_matches_on_fresh_inputs(scripted, loaded, make_inputs, calls: int = 3) -> None:
    torch.manual_seed(FRESH_SEED)
    for call in range(calls):
        inputs = make_inputs()
        assert_same_program_output(loaded(*inputs), scripted(*inputs), f"call {call}")


def test_named_tuple_output_is_torchscripts(tmp_path):
    scripted, loaded = converted_and_loaded(Detector(), (torch.randn(3, 4),), tmp_path)
    assert_matches_on_fresh_inputs(scripted, loaded, lambda: (torch.randn(3, 4),))
    out = loaded(torch.randn(3, 4))
    assert type(out)._fields == ("boxes", "scores") and type(out).__name__ == "Det"
    torch.testing.assert_close(out.scores, out[1])
    assert type(loaded(torch.randn(3, 4))) is type(out)  # the class is made once, at load


def test_nested_and_optional_named_tuples(tmp_path):
    rows = jit2triton.Dim("rows", min=1, max=8)
    scripted, loaded = converted_and_loaded(Nested(), (torch.randn(3, 4),), tmp_path, dynamic_shapes={"x": {0: rows}})
    # more rows than the example: the list holds more Parts than conversion saw
    assert_matches_on_fresh_inputs(scripted, loaded, lambda: (torch.randn(5, 4),))


def test_signature_records_named_tuples(tmp_path):
    converted = jit2triton.convert(torch.jit.script(Detector()), (torch.randn(3, 4),))
    outputs = converted._contents.manifest["signature"]["outputs"]
    assert (outputs["name"], outputs["fields"]) == ("Det", ["boxes", "scores"])
    converted.save(tmp_path / "m.j2t")
    assert converted.signature().endswith("-> Det(boxes: float32[3, 4], scores: float32[3])")
    assert jit2triton.load(tmp_path / "m.j2t", runtime="cpp").signature() == converted.signature()


class Head(torch.nn.Module):
    def __init__(self, scale: float) -> None:
        super().__init__()
        self.linear, self.scale = torch.nn.Linear(4, 3), scale

    def forward(self, x):
        return torch.tanh(self.linear(x)) * self.scale


class Ensemble(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = Head(1.0), Head(2.0)

    def forward(self, x):
        fa = torch.jit.fork(self.a, x)
        fb = torch.jit.fork(self.b, x)
        return torch.jit.wait(fa) + torch.jit.wait(fb)


class EnsembleOfList(torch.nn.Module):
    """Futures kept in a list, waited on in a second loop."""

    def __init__(self) -> None:
        super().__init__()
        self.heads = torch.nn.ModuleList([Head(1.0), Head(2.0), Head(3.0)])

    def forward(self, x):
        futures = [torch.jit.fork(head, x) for head in self.heads]
        return torch.stack([torch.jit.wait(f) for f in futures]).sum(0)


@pytest.mark.parametrize("model", [Ensemble, EnsembleOfList])
def test_fork_wait_run_in_order(model, tmp_path):
    torch.manual_seed(0)
    scripted, loaded = converted_and_loaded(model(), (torch.randn(2, 4),), tmp_path)
    assert_matches_on_fresh_inputs(scripted, loaded, lambda: (torch.randn(2, 4),))


@torch.jit.script
def aggregate(message: Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    if isinstance(message, torch.Tensor):
        return message
    return message[0] * message[1]


@torch.jit.script
def with_edges(x: torch.Tensor, edges: Optional[torch.Tensor]) -> torch.Tensor:
    if isinstance(edges, torch.Tensor):
        return x + edges
    return x


class GraphLayer(torch.nn.Module):
    """A graph network's aggregation: isinstance over a Union (decided by the types once inlined) and over an
    Optional input (None on some calls, a tensor on others)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x, edges: Optional[torch.Tensor] = None):
        return with_edges(aggregate(self.linear(x)) + aggregate((x, x.sigmoid())), edges)


def test_isinstance_of_an_optional_is_evaluated_per_call(tmp_path):
    torch.manual_seed(0)
    scripted, loaded = converted_and_loaded(GraphLayer(), (torch.randn(2, 4), torch.randn(2, 4)), tmp_path)
    assert_matches_on_fresh_inputs(scripted, loaded, lambda: (torch.randn(2, 4), torch.randn(2, 4)))
    scripted, without = converted_and_loaded(GraphLayer(), (torch.randn(2, 4),), tmp_path)
    assert_matches_on_fresh_inputs(scripted, without, lambda: (torch.randn(2, 4),))
    assert_matches_on_fresh_inputs(scripted, without, lambda: (torch.randn(2, 4), None))


class TypeOfAUnionInput(torch.nn.Module):
    def forward(self, message: Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]):
        if isinstance(message, torch.Tensor):
            return message
        return message[0] * message[1]


def test_an_op_no_runtime_runs_is_refused_naming_it_and_its_line():
    with pytest.raises(jit2triton.ConversionError) as refused:
        jit2triton.convert(torch.jit.script(TypeOfAUnionInput()), (torch.randn(3),))
    message = str(refused.value)
    assert "prim::isinstance" in message and "does not support" in message
    assert "test_program_types.py\", line" in message and "does not exist in this torch" not in message


FILE_DATA = torch.arange(6, dtype=torch.float32)


class ReadsAConstantPath(torch.nn.Module):
    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def forward(self, x):
        return x + torch.from_file("/tmp/jit2triton-never-read.bin", size=6)


class ReadsAnAttributePath(ReadsAConstantPath):
    def forward(self, x):
        return x + torch.from_file(self.path, size=6)


@pytest.mark.parametrize("model", [ReadsAConstantPath, ReadsAnAttributePath])
def test_a_file_read_is_refused_not_baked_in(model, tmp_path):
    path = tmp_path / "data.bin"
    FILE_DATA.numpy().tofile(path)
    if model is ReadsAConstantPath:
        FILE_DATA.numpy().tofile("/tmp/jit2triton-never-read.bin")
    with pytest.raises(jit2triton.ConversionError, match=r"aten::from_file \(File .*test_program_types.py\", line"
                                                         r".*never reads files"):
        jit2triton.convert(torch.jit.script(model(str(path))), (torch.randn(6),))
