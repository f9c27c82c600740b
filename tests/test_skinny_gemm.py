"""The generated GEMM form for few rows (emitters/triton_gemm.py, transpiler/gemm_kernels.py): forced on the CPU
(`gemm_forms.MODE = "skinny"`, Triton's interpreter) every package is checked against TorchScript on fresh inputs;
on the GPU the form is timed against cuBLAS's and the runtime's answers checked the same way.

float16 on the CPU: the interpreter computes bfloat16 dots wrongly (verification takes such a kernel out, which
`test_a_template_kernel_that_disagrees_with_aten_is_taken_out` shows on purpose)."""
import pytest
import torch
import torch.nn.functional as F

import jit2triton
from jit2triton.emitters import triton_gemm
from jit2triton.transpiler import gemm_forms, onednn_linear
from helpers import TOLERANCE, BertFeedForward, assert_same, on_gpu

HALF = {torch.float16: (2e-3, 2e-3)}


class FewRows(torch.nn.Module):
    """A GEMM with a bias (taken into the template's epilogue), one without, and GPT-2's Conv1D (addmm, the weight
    stored [K, N]), over 3-d and 2-d rows."""

    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(128, 64)
        self.plain = torch.nn.Linear(64, 64, bias=False)
        self.conv1d_weight = torch.nn.Parameter(torch.randn(64, 32) * 0.1)
        self.conv1d_bias = torch.nn.Parameter(torch.randn(32))

    def forward(self, x):
        h = F.gelu(self.up(x))
        h = self.plain(h) + h
        return torch.addmm(self.conv1d_bias, h.reshape(-1, 64), self.conv1d_weight)


@pytest.fixture(autouse=True)
def generated_form(monkeypatch):
    monkeypatch.setattr(onednn_linear, "MODE", "never")  # on the CPU it would take the GEMMs over
    monkeypatch.setattr(gemm_forms, "MODE", "skinny")


def _convert(model, make, dtype=torch.float16, **options):
    torch.manual_seed(0)
    traced = torch.jit.trace(model.eval().to(dtype), make(), check_trace=False)
    return traced, jit2triton.convert(traced, (make(),), backend="triton", **options)


def _template_kernels(converted) -> list[str]:
    return [k["name"] for k in converted.summary()["kernels"] if k["name"].startswith("g")]


def test_the_generated_form_computes_what_torchscript_does(tmp_path):
    make = lambda: torch.randn(1, 9, 128, dtype=torch.float16)  # noqa: E731
    traced, converted = _convert(FewRows(), make)
    assert len(_template_kernels(converted)) == 3, converted.report()
    assert "x[9, 128] @ w[64, 128]^T + b" in converted.code  # the readable template, with its provenance
    path = tmp_path / "model.j2t"
    converted.save(path)
    loaded = jit2triton.load(path)
    for call in range(2):
        x = make()
        assert_same(loaded(x), traced(x), f"call {call}", HALF)


@pytest.mark.parametrize("rows, dtype", [(9, torch.float32), (1, torch.float32), (9, torch.float16),
                                         (16, torch.bfloat16)])
def test_the_rows_body_computes_what_torchscript_does(rows, dtype, tmp_path, monkeypatch):
    """float32's only body; the half types' other (the dot body kept out here, as timing may choose)."""
    monkeypatch.setattr(triton_gemm, "DOT_CONFIGS", ())
    make = lambda: torch.randn(1, rows, 128, dtype=dtype)  # noqa: E731
    traced, converted = _convert(FewRows(), make, dtype)
    assert len(_template_kernels(converted)) == 3, converted.report()
    assert f"sum{rows - 1} += wt * tl.load(x_at" in converted.code and "tl.dot" not in converted.code
    path = tmp_path / "model.j2t"
    converted.save(path)
    loaded = jit2triton.load(path)
    for call in range(2):
        x = make()
        assert_same(loaded(x), traced(x), f"call {call}", {**TOLERANCE, torch.float16: (2e-3, 2e-3)})


def test_the_pointwise_kernel_alone_after_a_gemm_becomes_its_epilogue():
    make = lambda: torch.randn(1, 9, 128, dtype=torch.float16)  # noqa: E731
    traced, converted = _convert(FewRows(), make)
    names = [k["name"] for k in converted.summary()["kernels"]]
    assert "g0_linear_gelu" in names and not any(n.endswith("_gelu") and n.startswith("k") for n in names), names
    assert "product = acc.to(tl.float16).to(tl.float32)" in converted.code  # rounded as ATen's GEMM output is
    x = make()
    assert_same(converted(x), traced(x), "with the epilogue", HALF)


def test_a_product_read_twice_keeps_its_own_store():
    class Both(torch.nn.Module):  # the product is an output too: the GELU's kernel cannot take it over
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(128, 64)

        def forward(self, x):
            y = self.fc(x)
            return F.gelu(y), y

    make = lambda: torch.randn(1, 9, 128, dtype=torch.float16)  # noqa: E731
    traced, converted = _convert(Both(), make)
    assert _template_kernels(converted) == ["g0_linear"], converted.report()
    x = make()
    assert_same(converted(x), traced(x), "product read twice", HALF)


def test_rows_the_template_does_not_cover_stay_with_aten():
    class Wide(torch.nn.Module):  # 32 rows: past one tile of rows
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(128, 64)

        def forward(self, x):
            return self.fc(x)

    make = lambda: torch.randn(32, 128, dtype=torch.float16)  # noqa: E731
    traced, converted = _convert(Wide(), make)
    assert not _template_kernels(converted)
    x = make()
    assert_same(converted(x), traced(x), "32 rows", HALF)


def test_rows_that_are_not_dense_stay_a_linear():
    class Transposed(torch.nn.Module):  # x arrives [1, 128, 9] and is read as rows through a transposed view
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(128, 64)

        def forward(self, x):
            return self.fc(x.transpose(1, 2))

    make = lambda: torch.randn(1, 128, 9, dtype=torch.float16)  # noqa: E731
    traced, converted = _convert(Transposed(), make)
    x = make()
    assert_same(converted(x), traced(x), "transposed rows", HALF)


def test_rows_apart_in_a_larger_tensor_are_read_in_place():
    class Pooler(torch.nn.Module):  # BERT's pooler: the first token of each sequence, rows 9 x 128 apart
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(128, 64)

        def forward(self, x):
            return torch.tanh(self.fc(x[:, 0]))

    make = lambda: torch.randn(2, 9, 128)  # noqa: E731
    traced, converted = _convert(Pooler(), make, torch.float32)
    assert _template_kernels(converted) == ["g0_linear_tanh"], converted.report()
    assert "sum1 += wt * tl.load(x_at + 1152)" in converted.code
    for call in range(2):
        x = make()
        assert_same(converted(x), traced(x), f"call {call}")


ROWS_WRONG = ("wt = tl.load(w_at)", "wt = -tl.load(w_at)")


@pytest.mark.parametrize("dtype, body, wrong", [(torch.float16, "_DOT", ("acc += tl.dot(", "acc -= tl.dot(")),
                                                (torch.float32, "_ROWS", ROWS_WRONG)])
def test_a_template_kernel_that_disagrees_with_aten_is_taken_out(dtype, body, wrong, monkeypatch):
    monkeypatch.setattr(triton_gemm, body, getattr(triton_gemm, body).replace(*wrong))
    make = lambda: torch.randn(1, 9, 128, dtype=dtype)  # noqa: E731
    traced, converted = _convert(FewRows(), make, dtype)
    assert not _template_kernels(converted)
    assert "taken out: kernel g0_linear" in converted.report()
    x = make()
    assert_same(converted(x), traced(x), "after the culprit search", HALF if dtype == torch.float16 else None)


@pytest.mark.parametrize("wrong", [False, True])
def test_timing_keeps_only_configurations_that_compute_the_gemm(wrong, monkeypatch):
    """The GPU's timing path, run on the CPU (the float32 template under the interpreter, the graph timing faked)."""
    from jit2triton.transpiler import timing
    monkeypatch.setattr(timing, "graphs_gpu_us", lambda calls: {label: 1.0 + len(label) for label in calls})
    if wrong:
        monkeypatch.setattr(triton_gemm, "_ROWS", triton_gemm._ROWS.replace(*ROWS_WRONG))
        triton_gemm._compiled.cache_clear()
    try:
        answer = triton_gemm._timed.__wrapped__(3, 64, 32, "float32", True, "cpu")
    finally:
        triton_gemm._compiled.cache_clear()
    if wrong:
        assert answer is None
        return
    seconds, config = answer
    shortest = min(triton_gemm.configs(3, 64, 32, "float32"), key=lambda c: len(triton_gemm.label(c)))
    assert seconds == (1.0 + len(triton_gemm.label(shortest))) / 1e6 and config == shortest


@on_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_timed_on_the_gpu_and_right_in_the_runtime(dtype, tmp_path, monkeypatch):
    monkeypatch.setattr(gemm_forms, "MODE", "auto")

    torch.manual_seed(0)
    make = lambda: torch.randn(1, 9, 768, device="cuda", dtype=dtype)  # noqa: E731
    traced = torch.jit.trace(BertFeedForward().eval().cuda().to(dtype), make())  # 9 tokens
    converted = jit2triton.convert(traced, (make(),), device="cuda")
    choices = [c for c in converted.summary()["timed_choices"] if c["what"].startswith("GEMM form")]
    assert choices and all("skinny" in c["times_us"] for c in choices), choices  # the template was timed
    path = tmp_path / "m.j2t"
    converted.save(path)
    loaded = jit2triton.load(path)
    for call in range(3):
        x = make()
        assert_same(loaded(x), traced(x), f"call {call}", {dtype: (2e-2, 2e-2)} if dtype != torch.float32 else None)


def test_the_template_fits_few_rows_of_half_types_with_int32_offsets():
    assert triton_gemm.fits(9, 768, 3072, "float16") and triton_gemm.fits(1, 3072, 768, "bfloat16")
    assert not triton_gemm.fits(17, 768, 3072, "float16")  # past one tile of rows
    assert triton_gemm.fits(9, 768, 3072, "float32") and triton_gemm.fits(1, 768, 2, "float32")  # the rows body
    assert not triton_gemm.fits(9, 768, 3072, "float64")
    assert not triton_gemm.fits(9, 100, 3072, "float16")  # no configuration divides K
    assert not triton_gemm.fits(9, 2 ** 16, 2 ** 16, "float16")  # the weight's offsets would pass int32
