"""Every method: a module's `@torch.jit.export`ed methods convert beside forward, each with its own examples and
signature, and the loaded package calls them as TorchScript's module does (`m.encode(x)`),
sharing the module's state. What deployed code calls on a torch.jit module (.eval(), .forward, .to) works."""
from __future__ import annotations

import pytest
import torch

import jit2triton
from jit2triton import ConversionError, InputError, PackageDeviceError

from helpers import assert_same


class Seq2Seq(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.nn.Linear(6, 16)
        self.decoder = torch.nn.Linear(16, 6)
        self.encoded = 0  # written by encode, read by decode: the methods share the module's state

    @torch.jit.export
    def encode(self, x):
        self.encoded += 1
        return torch.nn.functional.gelu(self.encoder(x)) * 2

    @torch.jit.export
    def decode(self, h, temperature: float = 2.0):
        return (self.decoder(h) / temperature).softmax(-1) + self.encoded

    def forward(self, x):
        return self.decode(self.encode(x), 2.0)


def _pair():
    torch.manual_seed(0)
    model = torch.jit.script(Seq2Seq().eval())
    reference = torch.jit.script(Seq2Seq().eval())
    reference.load_state_dict(model.state_dict())
    return model, reference


EXAMPLES = {"forward": (torch.randn(4, 6),), "encode": (torch.randn(4, 6),), "decode": (torch.randn(4, 16),)}


def test_exported_methods_match_torchscript_call_after_call(tmp_path):
    model, reference = _pair()
    converted = jit2triton.convert(model, EXAMPLES)
    assert converted.signature("decode") == "(h: float32[4, 16], temperature: float = 2.0) -> float32[4, 6]"
    converted.save(tmp_path / "m.j2t")
    loaded = jit2triton.load(tmp_path / "m.j2t")
    for _ in range(2):
        x, h = torch.randn(4, 6), torch.randn(4, 16)
        assert_same(loaded.encode(x), reference.encode(x), "encode")
        assert_same(loaded.decode(h), reference.decode(h), "decode")  # sees encode's write
        assert_same(loaded.decode(h, temperature=0.5), reference.decode(h, 0.5), "decode by name")
        assert_same(loaded.forward(x), reference.forward(x), "forward")
        assert_same(loaded(x), reference(x), "call")


def test_a_method_without_examples_is_named_when_called():
    model, _ = _pair()
    converted = jit2triton.convert(model, {"forward": EXAMPLES["forward"], "encode": EXAMPLES["encode"]})
    with pytest.raises(AttributeError, match="method 'decode' of the model was not converted: no example inputs"):
        converted.decode(torch.randn(4, 16))
    with pytest.raises(AttributeError, match="no method 'decoder_v2'; its methods are forward, encode"):
        converted.decoder_v2


def test_examples_for_a_method_the_model_lacks_are_refused():
    model, _ = _pair()
    with pytest.raises(ConversionError, match="no method 'summarise' .* its methods are forward, decode, encode"):
        jit2triton.convert(model, {"forward": EXAMPLES["forward"], "summarise": EXAMPLES["encode"]})


def test_what_deployed_code_calls_on_a_torchscript_module(tmp_path):
    model, reference = _pair()
    converted = jit2triton.convert(model, EXAMPLES["forward"])
    assert converted.eval() is converted and converted.train(False) is converted
    assert converted.to("cpu") is converted and converted.cpu() is converted
    with pytest.raises(InputError, match="inference only"):
        converted.train()
    x = torch.randn(4, 6)
    assert_same(converted.eval().forward(x), reference(x))
    if not torch.cuda.is_available():
        return
    with pytest.raises(PackageDeviceError, match="convert the model again with device='cuda'"):
        converted.cuda()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_package_without_kernels_moves_with_to():
    """backend='aten' generates no kernels, so the package runs wherever its ATen ops can: .cuda() loads it there,
    as map_location would, methods and state included."""
    model, reference = _pair()
    moved = jit2triton.convert(model, EXAMPLES, backend="aten").cuda()
    x = torch.randn(4, 6)
    assert_same(moved.encode(x.cuda()).cpu(), reference.encode(x))
    assert_same(moved(x.cuda()).cpu(), reference(x))
