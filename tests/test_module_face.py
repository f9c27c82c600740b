"""The loaded module against torch.jit's, for what code calls besides forward: `.to` in its forms, `.half()` /
`.float()`, `.training`, the weights (`parameters()`, `state_dict()`), the attributes the model writes, the
package's `dir()`, and defaults in the signature. Each is held to what `torch.jit.load`'s module does."""
from typing import List

import pytest
import torch

import jit2triton
from jit2triton.errors import InputError


class Counts(torch.nn.Module):  # state: forward writes self.calls, as a torch.jit module shows it
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.lin = torch.nn.Linear(4, 4)
        self.table = torch.arange(4)  # an integer tensor: a buffer, not a parameter

    def forward(self, x, scale: float = 2.0):
        self.calls += 1
        return self.lin(x) * scale + self.table * self.calls


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    folder = tmp_path_factory.mktemp("face")
    torch.manual_seed(0)
    scripted = torch.jit.script(Counts().eval())
    scripted.save(str(folder / "model.pt"))
    x = torch.randn(2, 4)
    jit2triton.convert(scripted, (x,)).save(folder / "model.j2t")
    traced = torch.jit.trace(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval(), (x,))
    with pytest.warns(jit2triton.PrecisionWarning) if not _native_bf16() else _nothing():  # emulated on this CPU
        jit2triton.convert(traced, (x,), precision="bf16").save(folder / "bf16.j2t")
    return folder


def _native_bf16() -> bool:
    from jit2triton.precision import cpu_supports
    return cpu_supports("bfloat16")


def _nothing():
    import contextlib
    return contextlib.nullcontext()


def _load(folder, name="model.j2t"):
    return jit2triton.load(folder / name)


def test_to_takes_torch_jits_forms(packages):
    m, t = _load(packages), torch.jit.load(str(packages / "model.pt"))
    for args, kwargs in [((torch.float32,), {}), (("cpu", torch.float32), {}), (("cpu",), {"non_blocking": True}),
                         ((torch.float32,), {"non_blocking": True}), ((torch.zeros(1),), {}),
                         ((), {"device": "cpu", "dtype": torch.float32}), ((torch.device("cpu"),), {})]:
        assert t.to(*args, **kwargs) is t  # what torch.jit's module does with each form
        assert m.to(*args, **kwargs) is m, (args, kwargs)
    assert m.float() is m and m.cpu() is m
    for bad in [(torch.int64,), ("cpu", torch.int32)]:  # the same refusal as torch.jit's, of the same type
        with pytest.raises(TypeError) as ours:
            m.to(*bad)
        with pytest.raises(TypeError) as theirs:
            t.to(*bad)
        assert str(ours.value) == str(theirs.value)
    with pytest.raises(TypeError):
        m.to("cpu", "not a dtype")


def test_another_precision_is_a_clear_error(packages):
    m = _load(packages)
    for call in (lambda: m.to(torch.float16), m.half, lambda: m.to("cpu", torch.bfloat16, non_blocking=True)):
        with pytest.raises(InputError, match=r"computes in torch.float32 .*precision='(fp16|bf16)'"):
            call()
    with pytest.raises(InputError, match="float64 model itself"):
        m.double()
    reduced = _load(packages, "bf16.j2t")
    assert reduced.precision() == torch.bfloat16
    assert reduced.bfloat16() is reduced and reduced.to(torch.bfloat16) is reduced
    with pytest.raises(InputError, match="computes in torch.bfloat16"):
        reduced.float()


def test_training_is_false_as_after_eval(packages):
    m, t = _load(packages), torch.jit.load(str(packages / "model.pt"))
    assert m.training is False and m.training == t.training
    assert m.eval() is m and m.train(False) is m and not m.training
    with pytest.raises(InputError, match="inference only"):
        m.train()


def test_weights_are_copies_of_what_the_package_holds(packages):
    m, t = _load(packages), torch.jit.load(str(packages / "model.pt"))
    ours = dict(m.named_parameters())
    assert sorted(ours) == ["self_lin_bias", "self_lin_weight"]  # the package's names for lin.bias, lin.weight
    assert torch.equal(ours["self_lin_weight"], t.lin.weight) and torch.equal(ours["self_lin_bias"], t.lin.bias)
    assert [p.shape for p in m.parameters()] == [ours[n].shape for n in ours]
    assert dict(m.named_buffers()).keys() == {"self_table"} and torch.equal(next(m.buffers()), t.table)
    state = m.state_dict()
    assert list(state) == ["self_lin_bias", "self_lin_weight", "self_table"]
    for weight in state.values():  # a copy: changing it changes nothing the package runs
        weight.zero_()
    for weight in m.parameters():
        weight.fill_(7.0)
    x = torch.randn(2, 4)
    torch.testing.assert_close(m(x), t(x))
    assert torch.equal(dict(m.named_parameters())["self_lin_weight"], t.lin.weight)
    with pytest.raises(InputError, match="fixed at conversion"):
        m.load_state_dict(state)


def test_written_attributes_read_as_torch_jit_shows_them(packages):
    m, t = _load(packages), torch.jit.load(str(packages / "model.pt"))
    assert m.calls == t.calls == 0
    for n in range(1, 4):
        x = torch.randn(2, 4)
        torch.testing.assert_close(m(x), t(x))
        assert m.calls == t.calls == n
    with pytest.raises(AttributeError, match="no method 'nothing'"):
        m.nothing


class Remembers(torch.nn.Module):  # tensor state, and a list of tensors: the values read back are copies
    seen: List[torch.Tensor]

    def __init__(self) -> None:
        super().__init__()
        self.last = torch.zeros(2, 4)
        self.seen = []

    def forward(self, x):
        self.seen.append(x.sum(0))
        out = x + self.last
        self.last = x * 2
        return out


def test_tensor_state_reads_back_as_a_copy(tmp_path):
    torch.jit.script(Remembers()).save(str(tmp_path / "m.pt"))
    jit2triton.convert(str(tmp_path / "m.pt"), (torch.randn(2, 4),)).save(tmp_path / "m.j2t")
    m, t = jit2triton.load(tmp_path / "m.j2t"), torch.jit.load(str(tmp_path / "m.pt"))
    for _ in range(3):
        x = torch.randn(2, 4)
        torch.testing.assert_close(m(x), t(x))
        torch.testing.assert_close(m.last, t.last)
        assert len(m.seen) == len(t.seen)
        for ours, theirs in zip(m.seen, t.seen):
            torch.testing.assert_close(ours, theirs)
    m.last.fill_(100.0)  # changing the copy changes nothing the module runs
    x = torch.randn(2, 4)
    torch.testing.assert_close(m(x), t(x))


class Steps(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.steps = 0

    def forward(self, x):
        self.steps += 1
        return x * 2


class Outer(torch.nn.Module):  # state in a submodule: torch.jit shows it as m.inner.steps
    def __init__(self) -> None:
        super().__init__()
        self.inner = Steps()

    def forward(self, x):
        return self.inner(x) + 1


def test_a_submodules_written_attribute_reads_through_the_submodule(tmp_path):
    jit2triton.convert(torch.jit.script(Outer()), (torch.randn(3),)).save(tmp_path / "m.j2t")
    m, t = jit2triton.load(tmp_path / "m.j2t"), torch.jit.script(Outer())
    for n in range(1, 3):
        x = torch.randn(3)
        torch.testing.assert_close(m(x), t(x))
        assert m.inner.steps == t.inner.steps == n
    assert dir(m.inner) == ["steps"]
    with pytest.raises(AttributeError, match="submodule 'inner' has no attribute 'missing'"):
        m.inner.missing


def test_signature_shows_defaults(packages):
    m = _load(packages)
    assert m.signature() == "(x: float32[2, 4], scale: float = 2.0) -> float32[2, 4]"
    torch.testing.assert_close(m(torch.ones(2, 4)), m(torch.ones(2, 4), 2.0) - torch.arange(4))


def test_the_package_lists_its_api():
    listed = dir(jit2triton)
    for name in ("convert", "load", "Dim", "InputError", "ConversionError", "PrecisionWarning", "Converted"):
        assert name in listed and name in jit2triton.__all__
        assert getattr(jit2triton, name) is not None
