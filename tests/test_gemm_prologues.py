"""A few-row GEMM computing the kernel that makes its input first (transpiler/prologues.py, the prologue in
emitters/triton_gemm.py): BERT's residual add + LayerNorm before the FFN and the next layer's QKV projection.

On the CPU the generated GEMM form is forced (`gemm_forms.MODE = "skinny"`, Triton's interpreter); every package is
checked against TorchScript on fresh inputs, with and without the prologue taken (JIT2TRITON_GEMM_PROLOGUES=0). On
the GPU the same over two stacked BERT-base layers at 9 tokens, where every program computes the LayerNorm at once."""
import pytest
import torch
import torch.nn.functional as F

import jit2triton
from jit2triton.emitters import triton_gemm
from jit2triton.transpiler import gemm_forms, onednn_linear
from helpers import TOLERANCE, assert_same, on_gpu

HALF = {torch.float16: (2e-3, 2e-3)}
WHOLE = "computed whole by every program"  # the prologue's comment in the GEMM's source


class NormThenProject(torch.nn.Module):
    """A transformer's FFN half at few rows: add + LayerNorm, read by the up-projection (its prologue) and again as
    the residual after the down-projection; the second add + LayerNorm is the output (no GEMM reads it)."""

    def __init__(self, width: int = 128) -> None:
        super().__init__()
        self.norm, self.out_norm = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.up, self.down = torch.nn.Linear(width, 64), torch.nn.Linear(64, width)
        for p in self.parameters():  # LayerNorm's weights and biases not ones and zeros
            torch.nn.init.normal_(p, 0.0, 0.5)

    def forward(self, x, r):
        h = self.norm(x + r)
        return self.out_norm(self.down(F.gelu(self.up(h))) + h)


class ReadAgainInEpilogue(torch.nn.Module):
    """The GEMM's epilogue reads x again (`up(h) + h`): x cannot be made inside the kernel that reads it."""

    def __init__(self) -> None:
        super().__init__()
        self.norm, self.up = torch.nn.LayerNorm(128), torch.nn.Linear(128, 128)

    def forward(self, x):
        h = self.norm(x)
        return self.up(h) + h


@pytest.fixture(autouse=True)
def generated_form(monkeypatch):
    monkeypatch.setattr(onednn_linear, "MODE", "never")  # on the CPU it would take the GEMMs over
    monkeypatch.setattr(gemm_forms, "MODE", "skinny")


def _check(model, make, dtype, tmp_path, tolerances=None, draws=6):
    torch.manual_seed(0)
    traced = torch.jit.trace(model.eval().to(dtype), make(), check_trace=False)
    converted = jit2triton.convert(traced, make(), backend="triton")
    assert converted.summary()["verification"]["status"] == "passed", converted.report()
    path = tmp_path / "model.j2t"
    converted.save(path)
    loaded = jit2triton.load(path)
    for call in range(draws):
        inputs = make()
        assert_same(loaded(*inputs), traced(*inputs), f"call {call}", tolerances)
    return [k["name"] for k in converted.summary()["kernels"]], converted.code


@pytest.mark.parametrize("dtype, rows, width", [(torch.float32, 9, 128), (torch.float16, 9, 128),
                                                (torch.float32, 16, 512)])
def test_the_gemm_computes_the_layer_norm_before_it(dtype, rows, width, tmp_path, monkeypatch):
    """At 16 rows of 512 the prologue's tile holds 8 rows: every program runs its two programs in turn."""
    make = lambda: (torch.randn(1, rows, width, dtype=dtype), torch.randn(1, rows, width, dtype=dtype))  # noqa: E731
    tolerances = {**TOLERANCE, **HALF}
    names, code = _check(NormThenProject(width), make, dtype, tmp_path, tolerances)
    assert names[0] == "g0_add_layer_norm_linear_gelu" and len(names) == 3, names
    assert "# prologue: k0_add_layer_norm, computed whole by every program" in code
    assert f"for pid in range({2 if width == 512 else 1}):" in code
    assert "aten::layer_norm" in code.split("# ---- kernels/g0")[1].split("import triton")[0]  # its provenance

    monkeypatch.setenv("JIT2TRITON_GEMM_PROLOGUES", "0")
    names, code = _check(NormThenProject(width), make, dtype, tmp_path, tolerances, draws=2)
    assert len(names) == 4 and WHOLE not in code, names


def test_an_epilogue_reading_x_again_keeps_the_kernel_that_makes_it(tmp_path):
    make = lambda: (torch.randn(1, 9, 128),)  # noqa: E731
    names, code = _check(ReadAgainInEpilogue(), make, torch.float32, tmp_path)
    assert len(names) == 2 and WHOLE not in code, names


def test_the_rows_body_with_a_prologue_reads_x_where_the_prologue_stored_it(tmp_path, monkeypatch):
    """float16 through the rows body too (timing may choose either body on the GPU)."""
    monkeypatch.setattr(triton_gemm, "DOT_CONFIGS", ())
    make = lambda: (torch.randn(1, 9, 128, dtype=torch.float16), torch.randn(1, 9, 128, dtype=torch.float16))  # noqa
    names, code = _check(NormThenProject(), make, torch.float16, tmp_path, {**TOLERANCE, **HALF})
    assert names[0].endswith("_linear_gelu") and "x = out_buf" in code and "tl.dot" not in code


class BertLayer(torch.nn.Module):
    """BERT-base's layer written out (post-LayerNorm, attention through SDPA), as the 1x9 benchmark runs it."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.out = torch.nn.Linear(768, 3 * 768), torch.nn.Linear(768, 768)
        self.up, self.down = torch.nn.Linear(768, 3072), torch.nn.Linear(3072, 768)
        self.norm1, self.norm2 = torch.nn.LayerNorm(768), torch.nn.LayerNorm(768)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, 12, 64).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, 768)
        h = self.norm1(x + self.out(a))
        return self.norm2(h + self.down(F.gelu(self.up(h))))


@on_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_on_the_gpu_every_program_computes_the_layer_norm(dtype, tmp_path):
    torch.manual_seed(0)
    make = lambda: (torch.randn(1, 9, 768, device="cuda", dtype=dtype),)  # noqa: E731
    model = torch.nn.Sequential(BertLayer(), BertLayer()).eval().cuda().to(dtype)
    traced = torch.jit.trace(model, make(), check_trace=False)
    converted = jit2triton.convert(traced, make(), device="cuda")
    assert converted.summary()["verification"]["status"] == "passed", converted.report()
    assert WHOLE in converted.code, converted.report()
    path = tmp_path / "model.j2t"
    converted.save(path)
    loaded = jit2triton.load(path)
    for call in range(6):
        x = make()
        assert_same(loaded(*x), traced(*x), f"call {call}", {torch.float16: (2e-2, 2e-2), torch.float32: (1e-3, 1e-4)})
