"""Never a wrong answer, never a crash: the failures users met, as regressions, on both backends; and the safety
nets behind them (a lowering that raises, a kernel that computes the wrong thing, out-of-range indices).

Every test compares the package with the TorchScript model on fresh random inputs, never with our own output.
"""
from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import jit2triton
from jit2triton import Dim

from helpers import BACKENDS, assert_matches_torchscript, break_lowering, convert_for, to_device


class QkvAttention(nn.Module):
    """A vision transformer's attention block: one linear makes q, k and v, split by reshape/permute/unbind."""

    def __init__(self, dim: int = 48, heads: int = 3) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x):
        B, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        return F.scaled_dot_product_attention(q, k, v)


class UnbindInput(nn.Module):
    def forward(self, t):
        q, k, v = t.permute(2, 0, 3, 1, 4).unbind(0)
        return F.scaled_dot_product_attention(q, k, v)


class MaskIndices(nn.Module):
    """GPT-2's attention-mask code: one index tensor viewed several ways."""

    def forward(self, x):
        q = torch.arange(x.shape[1])
        mask = q[None, None, :, None] >= q[None, None, None, :]
        return torch.where(mask, x, torch.full_like(x, -1e4)).softmax(-1)


def softmax_then_sum(a):
    return torch.softmax(a, 0).sum(1)


def standardised_sum(a):
    return (a / a.std(0)).sum(1)


class Mixer(nn.Module):
    """MLP-Mixer: a token-mixing MLP over transposed patches, LayerNorm over channels."""

    def __init__(self, tokens: int = 6, channels: int = 8) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(channels), nn.LayerNorm(channels)
        self.tokens = nn.Sequential(nn.Linear(tokens, 12), nn.GELU(), nn.Linear(12, tokens))
        self.channels = nn.Sequential(nn.Linear(channels, 16), nn.GELU(), nn.Linear(16, channels))

    def forward(self, x):
        x = x + self.tokens(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return (x + self.channels(self.norm2(x))).softmax(1).sum(2)


def single_chunk(x):
    """A list of one item unpacked (found by the fuzzer: the runtime stored the list, not its item)."""
    return torch.minimum(x.sum(0, keepdim=True).chunk(2, 0)[0], x)


def layer_norm_of_single_elements(x):
    """Each row normalised over one element must be exactly 0 (found by the fuzzer: the C++ compiler fused
    x * 3 - mean(x * 3) into one FMA, whose unrounded product left 4e-7, scaled by 1/sqrt(eps))."""
    return torch.nn.functional.layer_norm(x * 3.0, [1])


def int_row_max(x):
    """An integer row's max (found by the fuzzer: Triton's NaN-carrying row max made an int64 row float)."""
    return (x.amax(0) * 3) // 2


REGRESSIONS = {
    "qkv_unbind_attention": (lambda: torch.jit.trace(QkvAttention().eval(), torch.randn(2, 5, 48)),
                             lambda: (torch.randn(2, 5, 48),)),
    "unbind_input_attention": (lambda: torch.jit.trace(UnbindInput(), torch.randn(2, 5, 3, 2, 4)),
                               lambda: (torch.randn(2, 5, 3, 2, 4),)),
    "mask_indices": (lambda: torch.jit.trace(MaskIndices(), torch.randn(2, 6, 6)), lambda: (torch.randn(2, 6, 6),)),
    "softmax_then_sum": (lambda: torch.jit.script(softmax_then_sum), lambda: (torch.randn(6, 5),)),
    "standardised_sum": (lambda: torch.jit.script(standardised_sum), lambda: (torch.randn(6, 5),)),
    "mixer": (lambda: torch.jit.trace(Mixer().eval(), torch.randn(2, 6, 8)), lambda: (torch.randn(2, 6, 8),)),
    "single_chunk": (lambda: torch.jit.trace(single_chunk, torch.randn(5)), lambda: (torch.randn(5),)),
    "layer_norm_of_single_elements": (lambda: torch.jit.script(layer_norm_of_single_elements),
                                      lambda: (torch.randn(64, 1),)),
    "int_row_max": (lambda: torch.jit.trace(int_row_max, torch.randint(-4, 9, (6, 1))),
                    lambda: (torch.randint(-4, 9, (6, 1)),)),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(REGRESSIONS))
def test_regression_matches_torchscript(name: str, backend: str) -> None:
    make_model, make_inputs = REGRESSIONS[name]
    torch.manual_seed(0)
    model = make_model()
    converted = convert_for(model, make_inputs(), backend)
    summary = converted.summary()
    assert summary["verification"]["kernels_removed"] == [], converted.report()
    assert summary["fallback_nodes"] == 0, converted.report()  # each failure was closed, not routed around
    assert_matches_torchscript(converted, model, make_inputs)


class Embed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Embedding(50, 4)

    def forward(self, ids, rows):
        return self.table(ids) * 2, torch.index_select(self.table.weight, 0, rows).sum(1)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad", [50, 4000, -1])
def test_out_of_range_index_raises_like_aten(backend: str, bad: int) -> None:
    model = torch.jit.trace(Embed().eval(), (torch.randint(0, 50, (2, 3)), torch.randint(0, 50, (4,))))
    converted = convert_for(model, (torch.randint(0, 50, (2, 3)), torch.randint(0, 50, (4,))), backend)
    assert_matches_torchscript(converted, model, lambda: (torch.randint(0, 50, (2, 3)), torch.randint(0, 50, (4,))))
    if backend == "cuda":  # a device-side assert, as in ATen's CUDA kernels: it ends the process's CUDA context
        assert "aten::_assert_async.msg" in str(converted.manifest["plan"])
        return
    ids = torch.randint(0, 50, (2, 3))
    ids[1, 2] = bad
    with pytest.raises(RuntimeError, match="index out of range"):
        model(ids, torch.randint(0, 50, (4,)))  # what TorchScript does
    with pytest.raises(jit2triton.Jit2TritonError, match="index out of range in self: %ids"):
        converted(ids, torch.randint(0, 50, (4,)))
    rows = torch.randint(0, 50, (4,))
    rows[0] = bad
    with pytest.raises(jit2triton.Jit2TritonError, match="index out of range in self: %rows"):
        converted(torch.randint(0, 50, (2, 3)), rows)


# --- the safety nets: a broken lowering is found and taken out, never shipped -------------------------------------

def pointwise_chain(x, y):
    a = torch.relu(x) * y
    b = torch.softmax(a, -1) + 1
    return torch.tanh(b @ y.t()) * 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_lowering_that_raises_falls_back_to_aten(monkeypatch, backend: str) -> None:
    break_lowering(monkeypatch, "aten::softmax.int", "raise")
    model = torch.jit.script(pointwise_chain)
    converted = convert_for(model, (torch.randn(4, 8), torch.randn(4, 8)), backend)
    summary = converted.summary()
    assert summary["fallback_ops"] == {"aten::softmax.int": 1}
    assert "KeyError: 'an injected bug'" in summary["fallback_reasons"]["aten::softmax.int"]
    assert summary["native_nodes"] >= 3  # the rest still fuses
    assert_matches_torchscript(converted, model, lambda: (torch.randn(4, 8), torch.randn(4, 8)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_wrong_kernel_is_found_at_convert_time_and_taken_out(monkeypatch, backend: str) -> None:
    break_lowering(monkeypatch, "aten::softmax.int", "wrong")
    model = torch.jit.script(pointwise_chain)
    converted = convert_for(model, (torch.randn(4, 8), torch.randn(4, 8)), backend)
    verification = converted.summary()["verification"]
    assert verification["status"] == "passed"
    removed, = verification["kernels_removed"]
    assert "aten::softmax.int" in removed["ops"] and removed["error"] > 0.1
    assert "softmax.int" in converted.summary()["fallback_ops"] or "aten::softmax.int" in converted.summary()[
        "fallback_ops"]
    assert "taken out: kernel" in converted.report()
    assert_matches_torchscript(converted, model, lambda: (torch.randn(4, 8), torch.randn(4, 8)))


def test_without_verification_the_wrong_kernel_ships(monkeypatch) -> None:
    """The check above is what protects users: without it the injected bug reaches the package."""
    break_lowering(monkeypatch, "aten::softmax.int", "wrong")
    model = torch.jit.script(pointwise_chain)
    converted = jit2triton.convert(model, (torch.randn(4, 8), torch.randn(4, 8)), verify=False)
    assert converted.summary()["verification"]["status"] == "skipped"
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    assert not torch.allclose(converted(x, y), model(x, y), atol=1e-3)


def test_a_kernel_that_fails_to_build_costs_only_its_nodes(monkeypatch) -> None:
    """An exception while a kernel is built from fused nodes (not in one lowering) refuses those nodes only."""
    from jit2triton.transpiler import fuse as fuse_module
    original = fuse_module._Fuser.build_kernel

    def build_kernel(self, v, box, out):
        if any(n.op == "aten::softmax.int" for n in box.nodes):
            raise AssertionError("an injected bug")
        return original(self, v, box, out)

    monkeypatch.setattr(fuse_module._Fuser, "build_kernel", build_kernel)
    model = torch.jit.script(pointwise_chain)
    converted = jit2triton.convert(model, (torch.randn(4, 8), torch.randn(4, 8)))
    summary = converted.summary()
    assert "aten::softmax.int" in summary["fallback_ops"]
    assert "AssertionError: an injected bug" in summary["fallback_reasons"]["aten::softmax.int"]
    assert summary["kernels"], "the nodes the failure did not touch still fuse"
    assert_matches_torchscript(converted, model, lambda: (torch.randn(4, 8), torch.randn(4, 8)))


def test_random_models_are_not_compared(monkeypatch) -> None:
    def noisy(x):
        return x + torch.rand_like(x)

    converted = jit2triton.convert(torch.jit.script(noisy), (torch.randn(3),))
    verification = converted.summary()["verification"]
    assert verification["status"] == "not compared" and "vary between calls" in verification["notes"][0]


def test_a_renderer_that_fails_leaves_every_op_to_aten_and_says_why(monkeypatch) -> None:
    import dataclasses

    from jit2triton.emitters import backends

    def broken(kernels):
        raise RuntimeError("an injected renderer bug")

    monkeypatch.setitem(backends.BACKENDS, "cpp", dataclasses.replace(backends.BACKENDS["cpp"], render=broken))
    model = torch.jit.script(pointwise_chain)
    converted = jit2triton.convert(model, (torch.randn(4, 8), torch.randn(4, 8)))
    assert converted.manifest["backend"] == "aten" and not converted.summary()["kernels"]
    assert "RuntimeError: an injected renderer bug" in converted.report()
    assert_matches_torchscript(converted, model, lambda: (torch.randn(4, 8), torch.randn(4, 8)))


def test_the_reference_runs_in_torchscripts_plain_interpreter() -> None:
    """TorchScript's optimizing executor compiles fusion groups from the second call on (minutes for a DenseNet on
    CUDA); verification needs only the model's semantics, so the reference runs unoptimized."""
    from jit2triton.verify import Verifier

    seen = []

    def reference(x):
        seen.append(torch._C._get_graph_executor_optimize())
        return x * 2

    Verifier(reference, [torch.randn(3)], [{"name": "x", "type": "Tensor", "dtype": "float32", "shape": [3]}],
             torch.device("cpu"))
    assert seen and not any(seen) and torch._C._get_graph_executor_optimize()


def _unsteady_reference(example: torch.Tensor):
    """x * 2, but on inputs other than `example` an extra 1 on the first run only: TorchScript giving another answer
    when run again (a GPU top-k among tied scores), where two runs of the example agree."""
    runs = {"other": 0}

    def reference(x):
        if torch.equal(x, example):
            return x * 2
        runs["other"] += 1
        return x * 2 + (1.0 if runs["other"] == 1 else 0.0)
    return reference


def test_a_case_torchscript_answers_two_ways_is_not_held_against_the_package() -> None:
    from jit2triton.verify import Verifier

    example = torch.randn(3)
    signature = [{"name": "x", "type": "Tensor", "dtype": "float32", "shape": [3]}]
    verifier = Verifier(_unsteady_reference(example), [example], signature, torch.device("cpu"))
    assert verifier.compared == 2
    assert verifier.check(lambda x: x * 2)  # the fresh case's first answer was x * 2 + 1
    assert verifier.drop_unsteady() == ["fresh random inputs"] and verifier.compared == 1
    assert not verifier.check(lambda x: x * 2) and "differ between runs" in verifier.notes[-1]
    # a package that differs from a TorchScript that answers one way stays a mismatch
    steady = Verifier(lambda x: x * 2, [example], signature, torch.device("cpu"))
    assert steady.check(lambda x: x * 3) and steady.drop_unsteady() == [] and steady.check(lambda x: x * 3)


def _rounds_through_tf32(x: torch.Tensor, noise: float) -> torch.Tensor:
    """x * 2, as a TF32 convolution would give it: plus `noise` * sin(x) while cuDNN's TF32 is on (each run's rounding
    in the algorithm cuDNN picks), exact with it off. The same op in TorchScript and in the package (through ATen)."""
    return x * 2 + (noise * torch.sin(x) if torch.backends.cudnn.allow_tf32 else 0.0)


@pytest.mark.parametrize("package_threshold, passes", [
    (0.5, True),    # the package's arithmetic is TorchScript's: its TF32 rounding differs, and is not compared
    (0.25, False),  # a wrong threshold: found, however TF32 would have moved the count
])
def test_where_tf32_would_round_both_sides_are_verified_in_exact_float32(monkeypatch, package_threshold, passes):
    """On CUDA with TF32 convolutions, two runs part by what TF32's rounding makes, in the algorithms cuDNN picks per
    call (Mask R-CNN's masks: 7e-3 to 1e-2 with every op through ATen), and a detector's box count moves with it.
    Verification runs TorchScript and the package with TF32 off, so a right package passes and a wrong one fails.
    (An earlier rule took the cases whose count TF32 moved out of verification, and a wrong package passed on none.)"""
    from jit2triton.verify import Verifier

    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    example = torch.randn(64)
    signature = [{"name": "x", "type": "Tensor", "dtype": "float32", "shape": [64]}]

    def reference(x):  # TorchScript: its TF32 rounding moves the count above the threshold
        y = _rounds_through_tf32(x, 1e-2)
        return y, (y > 0.5).nonzero()

    def package(x):  # the same ops, the convolution rounding another way under TF32, and its own threshold
        y = _rounds_through_tf32(x, -1e-2)
        return y, (y > package_threshold).nonzero()

    plain = Verifier(reference, [example], signature, torch.device("cpu"))
    assert plain.check(package)  # (compared as torch is set, even the right package parts from TorchScript)
    verifier = Verifier(reference, [example], signature, torch.device("cpu"), tf32="TF32 is on")
    assert bool(verifier.check(package)) != passes
    assert verifier.compared == 2 and verifier.notes == ["TF32 is on"]
    assert torch.backends.cudnn.allow_tf32  # put back after each run


class PermutedNormThenLinear(nn.Module):
    """ConvNeXt's block: a depthwise conv, a permute to channels-last, LayerNorm, then the MLP's linear."""

    def __init__(self):
        super().__init__()
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.ln = nn.LayerNorm(8)
        self.fc = nn.Linear(8, 32)

    def forward(self, x):
        return self.fc(self.ln(self.dw(x).permute(0, 2, 3, 1)))


def test_a_kernel_only_a_gemm_reads_is_stored_row_major_for_it(monkeypatch) -> None:
    """A kernel keeps a same-shape input's permuted memory order (channels-last stays channels-last), but one that
    only a linear reads is stored row-major: on ConvNeXt's LayerNorm over a permuted conv output, the kept order
    made linear 1.4-1.7x slower than on the row-major tensor ATen's layer_norm gives (0.80x -> 1.25x torch.jit on
    a transformers ConvNeXt on the CPU)."""
    from jit2triton import conversion
    from jit2triton.transpiler import fuse
    kernels = []
    build_kernels = conversion.build_kernels
    monkeypatch.setattr(conversion, "build_kernels", lambda found, *rest: kernels.extend(found) or
                        build_kernels(found, *rest))
    # as if every 4-d kernel had a channels-first input of its shape to follow (what the conv gave in ConvNeXt)
    monkeypatch.setattr(fuse._Fuser, "memory_order_for",
                        lambda self, box, inputs: [0, 3, 1, 2] if len(box.shape) == 4 else list(range(len(box.shape))))
    torch.manual_seed(0)
    x = torch.randn(2, 8, 6, 6)
    traced = torch.jit.trace(PermutedNormThenLinear().eval(), x)
    converted = jit2triton.convert(traced, example_inputs=(x,))
    norm = next(k for k in kernels if "layer_norm" in k.name)
    assert norm.outputs[0].strides == (288, 48, 8, 1), norm.outputs[0].strides
    fresh = torch.randn(2, 8, 6, 6)
    torch.testing.assert_close(converted(fresh), traced(fresh), rtol=1e-5, atol=1e-5)


class ConvNextStages(nn.Module):
    """ConvNeXt's stem LayerNorm over channels (a permute, layer_norm, a permute back: channels-last memory in a
    channels-first shape), then two blocks whose residual adds keep that layout, as TorchScript runs them."""

    def __init__(self, c=8):
        super().__init__()
        self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.ln = nn.LayerNorm(c, eps=1e-6)
        self.fc1, self.fc2 = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)
        self.gamma = nn.Parameter(torch.randn(c))
        self.stem = nn.LayerNorm(c, eps=1e-6)

    def forward(self, x):
        x = self.stem(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        for _ in range(2):
            y = self.ln(self.dw(x).permute(0, 2, 3, 1))
            y = self.fc2(nn.functional.gelu(self.fc1(y)))
            x = x + (self.gamma * y).permute(0, 3, 1, 2)
        return x


def test_a_kernel_writes_the_layout_torchscript_gave_so_no_input_is_copied() -> None:
    """A kernel that replaces ATen ops writes its output in the memory order ATen gave that value while converting,
    so the ATen ops after it see the layouts they were observed with. Before, the stem's and the residual adds'
    kernels wrote row-major where TorchScript's ops had given channels-last; the next depthwise conv then returned a row-major
    output and every kernel reading it copied it into the layout it was generated for, each call (a transformers
    ConvNeXt on the CPU: 0.95x -> 1.25x torch.jit, four copies a call fewer). Checked in the runtime's own run, every
    step observed (Module::observe): each kernel input arrives in the strides the kernel indexes with."""
    from jit2triton.deploy.cpp_runtime import CppRuntime
    torch.manual_seed(0)
    traced = torch.jit.trace(ConvNextStages().eval(), torch.randn(2, 8, 12, 12))
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "convnext.j2t")
        jit2triton.convert(traced, example_inputs=(torch.randn(2, 8, 12, 12),)).save(path)
        loaded = jit2triton.load(path)
        for _ in range(2):
            x = torch.randn(2, 8, 12, 12)
            torch.testing.assert_close(loaded(x), traced(x), rtol=1e-4, atol=1e-4)
        seen = dict(CppRuntime(path, cuda_graphs=False).module.observe([torch.randn(2, 8, 12, 12)], 1))
    current = dict.fromkeys(loaded.manifest["plan"]["inputs"])  # slot -> what it holds (inputs: the boundary's)
    copies, kernels = [], 0
    for step in loaded.manifest["plan"]["steps"]:  # (slots are reused: followed in the order the steps run)
        if step["kind"] == "kernel":
            kernels += 1
            for ref, strides in zip(step["args"], step.get("in_strides", ())):
                x = current.get(ref[1]) if ref[0] == "s" else None
                if strides is not None and x is not None and any(
                        n > 1 and s != t for n, s, t in zip(x.shape, x.stride(), strides)):
                    copies.append(step["kernel"])
        current.update(zip(step["outs"], seen[step["node"]]))
    assert kernels >= 5
    assert not copies, f"kernel inputs copied into another layout on every call: {copies}"


@torch.jit.script
def _expanded_through_aten(x, y):
    v = (y.float() * 0.5).unsqueeze(0).expand(3, 4)  # a kernel writes the expanded value out, densely...
    first = v.chunk(2, 1)[0]  # ... an ATen op takes a view of it (ATen's own run gave it stride 0)...
    return torch.nn.functional.gelu(first) + x  # ... and a kernel reads it, generated for stride 0


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_kernel_generated_for_a_broadcast_input_reads_one_laid_out_densely(backend, dynamic, tmp_path):
    make = lambda n=2: (torch.randn(n, 3, 2), torch.randint(-5, 5, (4,)))  # noqa: E731
    options = {"dynamic_shapes": {"x": {0: Dim("n", min=1, max=6)}}} if dynamic else {}
    converted = convert_for(_expanded_through_aten, make(), backend, **options)
    assert converted.manifest["report"]["verification"]["kernels_removed"] == [], "a kernel disagreed with ATen"
    assert converted.manifest["kernels"], "the test needs generated kernels"
    path = tmp_path / "m.j2t"
    converted.save(path)
    loaded = jit2triton.load(path)
    for n in ((2, 5) if dynamic else (2, 2)):
        args = make(n)
        got = loaded(*(to_device(args, "cuda") if backend == "cuda" else args))
        torch.testing.assert_close(got.cpu(), _expanded_through_aten(*args), rtol=1e-5, atol=1e-5)


class LastOfEachHead(torch.nn.Module):
    """Falcon's multi-query split, `fused[..., [-1], :]`: traced, the index list [None, None, tensor([-1])] is frozen
    into one constant that mixes None and a tensor (it was refused: "holds tensors nested in containers")."""

    def forward(self, x):
        return x[..., [-1], :] * 2 + x[:, [0, 2]].sum(1, keepdim=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_constant_list_of_tensors_and_none_converts(backend, tmp_path):
    make = lambda: (torch.randn(2, 3, 4, 5),)  # noqa: E731
    model = torch.jit.trace(LastOfEachHead(), make())
    converted = convert_for(model, make(), backend)
    path = tmp_path / "m.j2t"
    converted.save(path)
    loaded = jit2triton.load(path)
    for _ in range(2):
        args = make()
        got = loaded(*(to_device(args, "cuda") if backend == "cuda" else args))
        torch.testing.assert_close(got.cpu(), model(*args))


class Positions(nn.Module):
    """A transformer's embeddings: token ids from the caller, positions from a buffer sliced to the length, token
    types all zero."""

    def __init__(self, bad_position: bool = False):
        super().__init__()
        self.words, self.places, self.types = nn.Embedding(50, 4), nn.Embedding(32, 4), nn.Embedding(2, 4)
        positions = torch.arange(32).unsqueeze(0)
        if bad_position:  # past the table, but beyond what a call of 8 tokens reads
            positions[0, 20] = 99
        self.register_buffer("positions", positions)

    def forward(self, ids):
        return self.words(ids) + self.places(self.positions[:, : ids.shape[1]]) + self.types(torch.zeros_like(ids))


@pytest.mark.parametrize("bad_position", [False, True])
def test_an_index_read_from_a_weight_is_checked_once_at_conversion(bad_position: bool) -> None:
    make = lambda: (torch.randint(0, 50, (2, 8)),)  # noqa: E731
    model = torch.jit.trace(Positions(bad_position).eval(), make())
    converted = jit2triton.convert(model, make())
    assert_matches_torchscript(converted, model, make)
    checks = str(converted.manifest["plan"]).count("aten::_assert_async.msg")
    assert checks == (2 if bad_position else 1)  # the ids always; the positions only where the buffer fails


def test_boolean_masks_combined_with_and_or_lower() -> None:
    """transformers' masking utilities combine masks with `&` (aten::__and__.Tensor): a kernel, not ATen."""
    def masks(x, y):
        return ((x > 0) & (y < 0.5)) | (x < -1), torch.bitwise_and(x > y, y > 0)
    model = torch.jit.trace(masks, (torch.randn(3, 5), torch.randn(3, 5)))
    make = lambda: (torch.randn(3, 5), torch.randn(3, 5))  # noqa: E731
    converted = jit2triton.convert(model, make())
    assert converted.summary()["fallback_nodes"] == 0, converted.report()
    assert_matches_torchscript(converted, model, make)


@torch.jit.script
def read_twice(x, rows):
    # one index read by integer indexing (a negative counts from the end) and by index_select (it may not)
    return x[rows] * 2.0 + torch.index_select(x, 0, rows).sin()


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_index_read_twice_is_checked_once_as_strictly_as_its_strictest_reader(backend: str) -> None:
    """GCN checked each edge list once per reader (four asserts and four reductions a layer on the GPU); one check
    at the first reader, with the least value index_select allows, raises where either reader would."""
    make = lambda: (torch.randn(8, 3), torch.randint(0, 8, (5,)))  # noqa: E731
    converted = convert_for(read_twice, make(), backend)
    assert_matches_torchscript(converted, read_twice, make)
    assert str(converted.manifest["plan"]).count("aten::_assert_async.msg") == 1
    if backend == "cuda":
        return
    for bad in (8, -1):  # (-1 is a valid index for x[rows], not for index_select: TorchScript raises there)
        x, rows = make()
        rows[3] = bad
        with pytest.raises(RuntimeError, match="out of (range|bounds)"):
            read_twice(x, rows)
        with pytest.raises(jit2triton.Jit2TritonError, match="index out of range in self: %rows"):
            converted(x, rows)


@torch.jit.script
def complex_rows(x, rows):
    return torch.view_as_real(torch.index_select(torch.view_as_complex(x), 0, rows)) * 2.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_index_only_aten_reads_is_left_to_aten_to_check(backend: str) -> None:
    """A complex tensor's index_select runs through ATen, which checks its indices: no check of ours before it."""
    make = lambda: (torch.randn(8, 3, 2), torch.randint(0, 8, (5,)))  # noqa: E731
    converted = convert_for(complex_rows, make(), backend)
    assert_matches_torchscript(converted, complex_rows, make)
    assert "aten::_assert_async.msg" not in str(converted.manifest["plan"])
    if backend == "cuda":
        return
    x, rows = make()
    rows[3] = 8
    with pytest.raises(jit2triton.Jit2TritonError, match="index out of range"):
        converted(x, rows)
