"""The generated attention for short sequences (emitters/triton_attention.py, transpiler/attention_kernels.py): forced
on the CPU (`attention_kernels.MODE = "generated"`, Triton's interpreter) every package is checked against
TorchScript on fresh inputs; on the GPU the template is timed against ATen's attention and the runtime's answers
checked the same way."""
import pytest
import torch
import torch.nn.functional as F

import jit2triton
from jit2triton.emitters import triton_attention
from jit2triton.transpiler import attention_kernels, gemm_forms, onednn_linear
from helpers import TOLERANCE, assert_same, on_gpu

HALF = {torch.float16: (2e-3, 2e-3)}


class SelfAttention(torch.nn.Module):
    """BERT's self-attention: q, k and v are views of one projection's output (heads strided, no copy), the padding
    mask additive and broadcast over heads and queries, the heads' outputs read back as rows through a view."""

    def __init__(self, heads: int = 4, head_dim: int = 16) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.qkv = torch.nn.Linear(heads * head_dim, 3 * heads * head_dim)
        self.out = torch.nn.Linear(heads * head_dim, heads * head_dim)

    def forward(self, x, keep):
        b, n, _ = x.shape
        qkv = self.qkv(x).view(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        mask = (1.0 - keep[:, None, None, :]) * -10000.0
        attended = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], attn_mask=mask)
        return self.out(attended.transpose(1, 2).reshape(b, n, self.heads * self.head_dim))


class Masked(torch.nn.Module):
    """q against k and v of another length (a decoder's few queries, an encoder's keys), with each kind of mask."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def forward(self, q, k, v, mask):
        if self.kind == "boolean":
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask > 0)
        if self.kind == "causal":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True) * mask.sum()
        if self.kind == "scaled":
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)
        return F.scaled_dot_product_attention(q, k, v) + mask.mean()


@pytest.fixture(autouse=True)
def generated_form(monkeypatch):
    monkeypatch.setattr(onednn_linear, "MODE", "never")  # (the GEMMs stay ATen's: the attention is under test)
    monkeypatch.setattr(gemm_forms, "MODE", "never")
    monkeypatch.setattr(attention_kernels, "MODE", "generated")


def _attention_kernels(converted) -> list[str]:
    return [k["name"] for k in converted.summary()["kernels"] if k["name"].endswith("_attention")]


def _bert_inputs(dtype=torch.float32, device="cpu", tokens=9, width=64):
    keep = (torch.rand(2, tokens, device=device) > 0.3).to(dtype)
    keep[:, 0] = 1
    return torch.randn(2, tokens, width, device=device, dtype=dtype), keep


def test_bert_s_attention_reads_the_projection_s_heads_in_place_and_computes_what_torchscript_does(tmp_path):
    torch.manual_seed(0)
    traced = torch.jit.trace(SelfAttention().eval(), _bert_inputs())
    converted = jit2triton.convert(traced, _bert_inputs(), backend="triton")
    assert _attention_kernels(converted) == ["a0_attention"], converted.report()
    code = converted.code
    assert "aten::scaled_dot_product_attention" in code and "F.scaled_dot_product_attention(qkv[0]" in code  # provenance
    assert "rows[:, None] * 192" in code  # q read through the projection's output, 3 x 64 wide per token
    path = tmp_path / "model.j2t"
    converted.save(path)
    loaded = jit2triton.load(path)
    for call in range(3):
        inputs = _bert_inputs()
        assert_same(loaded(*inputs), traced(*inputs), f"call {call}")


@pytest.mark.parametrize("kind, queries, keys, rank", [("boolean", 5, 37, 4), ("causal", 12, 12, 4),
                                                       ("scaled", 3, 20, 3), ("none", 16, 9, 3)])
def test_each_mask_and_length_computes_what_torchscript_does(kind, queries, keys, rank):
    batch = (2, 3)[:rank - 2]
    make = lambda: (torch.randn(*batch, queries, 32), torch.randn(*batch, keys, 32),  # noqa: E731
                    torch.randn(*batch, keys, 24), torch.randn(queries, keys))
    torch.manual_seed(1)
    traced = torch.jit.trace(Masked(kind).eval(), make())
    converted = jit2triton.convert(traced, make(), backend="triton")
    assert _attention_kernels(converted), converted.report()
    for call in range(2):
        inputs = make()
        assert_same(converted(*inputs), traced(*inputs), f"{kind} call {call}")


def test_a_query_whose_every_key_is_masked_out_gets_zeros_as_from_aten():
    make = lambda: (torch.randn(1, 2, 4, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8),  # noqa: E731
                    torch.randn(4, 6) + torch.tensor([0.0, -9.0, 0.0, 0.0])[:, None])  # query 1: all False
    traced = torch.jit.trace(Masked("boolean").eval(), make())
    converted = jit2triton.convert(traced, make(), backend="triton")
    assert _attention_kernels(converted), converted.report()
    inputs = make()
    expected = traced(*inputs)
    assert expected[:, :, 1].abs().max() == 0  # (what the test stands on: ATen's answer for such a query)
    assert_same(converted(*inputs), expected, "a masked-out query")


def test_an_attention_kernel_that_disagrees_with_aten_is_taken_out(monkeypatch):
    monkeypatch.setattr(triton_attention, "_TEMPLATE", triton_attention._TEMPLATE.replace(
        "running_sum * rescale + tl.sum(p, axis=1)", "running_sum * rescale + tl.sum(p, axis=1) * 1.5"))
    torch.manual_seed(0)
    traced = torch.jit.trace(SelfAttention().eval(), _bert_inputs())
    converted = jit2triton.convert(traced, _bert_inputs(), backend="triton")
    assert not _attention_kernels(converted)
    assert "taken out: kernel a0_attention" in converted.report()
    inputs = _bert_inputs()
    assert_same(converted(*inputs), traced(*inputs), "after the culprit search")


class Copied(torch.nn.Module):
    """The attention's output copied into another layout (its heads' dims swapped, made contiguous), and, with
    `twice`, also returned as it is: a product read twice keeps its own store."""

    def __init__(self, twice: bool = False) -> None:
        super().__init__()
        self.twice = twice

    def forward(self, q, k, v):
        attended = F.scaled_dot_product_attention(q, k, v)
        moved = attended.transpose(-1, -2).contiguous().view(2, 3, -1)
        return (moved, attended) if self.twice else moved


@pytest.mark.parametrize("twice, dtype", [(False, torch.float32), (False, torch.bfloat16), (True, torch.float32)])
def test_a_copy_of_the_attention_s_output_into_another_layout_is_stored_by_the_attention(twice, dtype):
    # (a half type's copy loads, computes in float32 and rounds back: a copy still)
    make = lambda: (torch.randn(2, 3, 5, 8, dtype=dtype), torch.randn(2, 3, 7, 8, dtype=dtype),  # noqa: E731
                    torch.randn(2, 3, 7, 4, dtype=dtype))
    traced = torch.jit.trace(Copied(twice).eval(), make())
    converted = jit2triton.convert(traced, make(), backend="triton")
    kernels = {k["name"]: k["ops"] for k in converted.summary()["kernels"]}
    assert "aten::contiguous" in kernels["a0_attention"] and len(kernels) == 1 if not twice else \
        "aten::contiguous" not in kernels["a0_attention"] and len(kernels) == 2, converted.report()
    for call in range(2):
        inputs = make()
        assert_same(converted(*inputs), traced(*inputs), f"call {call}", {**TOLERANCE, torch.bfloat16: (2e-2, 2e-2)})


@pytest.mark.parametrize("wrong", [False, True])
def test_timing_keeps_only_configurations_that_compute_aten_s_answer(wrong, monkeypatch):
    """The GPU's timing path, run on the CPU (the template under the interpreter, the graph timing faked): every
    configuration is checked against ATen's call before it is timed beside it, and one that is wrong never is."""
    from jit2triton.transpiler import timing
    timed = []
    monkeypatch.setattr(timing, "graphs_gpu_us", lambda calls: timed.append(set(calls)) or
                        {label: 10.0 if label == "aten" else 2.0 + len(label) / 100 for label in calls})
    if wrong:
        monkeypatch.setattr(triton_attention, "_TEMPLATE", triton_attention._TEMPLATE.replace(
            "acc = acc / tl.where", "acc = 2 * acc / tl.where"))
    contiguous = lambda *shape: tuple(torch.empty(shape).stride())  # noqa: E731
    spec = ((1, 2), 9, 9, 16, 16, "float32", 0.25, "additive",
            (contiguous(1, 2, 9, 16), contiguous(1, 2, 9, 16), contiguous(1, 2, 9, 16), (9, 0, 0, 1),
             contiguous(1, 2, 9, 16)))
    triton_attention._compiled.cache_clear()  # (each variant of the template compiles anew)
    try:
        answer = triton_attention._timed.__wrapped__(spec, "cpu")
    finally:
        triton_attention._compiled.cache_clear()
    if wrong:
        assert answer is None and not timed  # nothing to time: ATen's call stays
        return
    seconds, config = answer
    assert timed and "aten" in timed[0] and len(timed[0]) == 1 + len(triton_attention.configs(9, 9, 16, 16))
    assert seconds["aten"] == 10e-6 and seconds["generated"] < seconds["aten"] and set(config) == {"xblock", "bn",
                                                                                                 "warps"}


def test_the_template_covers_short_sequences_only():
    assert triton_attention.fits((1, 12), 9, 9, 64, 64, "float32")
    assert triton_attention.fits((8, 12), 64, 64, 64, 64, "float16")
    assert not triton_attention.fits((1, 12), 9, triton_attention.MAX_KEYS + 1, 64, 64, "float32")
    assert not triton_attention.fits((1, 12), 9, 9, 256, 256, "float32")  # a head past the registers
    assert not triton_attention.fits((1, 12), 9, 9, 64, 64, "float64")


@on_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_timed_on_the_gpu_and_right_in_the_runtime(dtype, tmp_path, monkeypatch):
    monkeypatch.setattr(attention_kernels, "MODE", "auto")
    monkeypatch.setattr(gemm_forms, "MODE", "auto")
    torch.manual_seed(0)
    model = SelfAttention(heads=12, head_dim=64).eval().cuda().to(dtype)
    make = lambda: _bert_inputs(dtype, "cuda", width=768)  # noqa: E731
    traced = torch.jit.trace(model, make())
    converted = jit2triton.convert(traced, make(), device="cuda")
    choices = [c for c in converted.summary()["timed_choices"] if c["what"].startswith("attention form")]
    assert choices and all("generated" in c["times_us"] for c in choices), choices  # the template was timed
    path = tmp_path / "m.j2t"
    converted.save(path)
    loaded = jit2triton.load(path)
    for call in range(3):
        inputs = make()
        assert_same(loaded(*inputs), traced(*inputs), f"call {call}",
                    {torch.float16: (2e-2, 2e-2)} if dtype == torch.float16 else None)
