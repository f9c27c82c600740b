"""The conversion report says what each kernel holds without contradicting itself: the ops jit2triton added (an
index check before a gather) are named as such and not counted as TorchScript nodes."""
import re

import torch

import jit2triton


class Lookup(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.Embedding(50, 8)

    def forward(self, ids):
        return torch.tanh(self.embedding(ids))


def test_a_kernel_of_added_ops_only_counts_no_torchscript_node():
    ids = torch.randint(0, 50, (2, 5))
    converted = jit2triton.convert(torch.jit.trace(Lookup().eval(), ids), example_inputs=(ids,))
    report = converted.report()
    kernel_lines = [line.strip() for line in report.splitlines() if line.strip().startswith("kernel ")]
    check = next(line for line in kernel_lines if "aten::ge.Scalar" in line)
    assert re.fullmatch(r"kernel k\d+_\w+: no TorchScript node; 4 ops jit2triton added \(aten::ge.Scalar, "
                        r"aten::lt.Scalar, aten::logical_and, aten::all\)", check), check
    assert not any(re.search(r": 0 |\b1 nodes\b", line) for line in kernel_lines), report
    kernels = converted.summary()["kernels"]
    added = next(k for k in kernels if k["added_ops"])
    assert added["nodes"] == 0 and added["ops"] == []
    assert sum(k["nodes"] for k in kernels) == converted.summary()["native_nodes"]


class Decoder(torch.nn.Module):
    """Convolutions every model could have, in the forms the op table first missed: a transposed conv1d
    (ConvTasNet's decoder) and a conv with padding="same"."""

    def __init__(self):
        super().__init__()
        self.same = torch.nn.Conv1d(4, 4, 3, padding="same")
        self.up = torch.nn.ConvTranspose1d(4, 2, 4, stride=2)

    def forward(self, x):
        return torch.sigmoid(self.up(torch.relu(self.same(x))))


def test_convolutions_run_as_externs_not_fallbacks():
    model = torch.jit.script(Decoder().eval())
    x = torch.randn(2, 4, 9)
    converted = jit2triton.convert(model, example_inputs=(x,), backend="cpp")
    summary = converted.summary()
    assert summary["fallback_nodes"] == 0 and summary["extern_nodes"] == 2, converted.report()
    assert "aten::conv1d.padding x1" in converted.report() and "aten::conv_transpose1d x1" in converted.report()
    torch.testing.assert_close(converted(x), model(x))


class Guarded(torch.nn.Module):
    """A branch no input of the model's kind takes (a NaN in the scores: code for another input, as torchvision's
    detectors hold for other image types and sizes), and one ATen op the taken path runs."""

    def forward(self, scores):
        if bool(scores.isnan().any()):
            scores = torch.nan_to_num(scores).kron(scores).cummax(0)[0].flatten()
        return scores.cumprod(0) + 1.0


def test_the_fallbacks_in_branches_conversion_never_saw_run_are_counted_apart():
    model = torch.jit.script(Guarded().eval())
    converted = jit2triton.convert(model, example_inputs=(torch.rand(6) + 0.5,), backend="cpp")
    summary = converted.summary()
    reached = summary["fallback_nodes"] - summary["unreached_fallback_nodes"]
    assert summary["unreached_fallback_nodes"] >= 3 and reached >= 1, converted.report()  # (cumprod ran)
    assert f"{summary['fallback_nodes']} fallback through ATen ({summary['unreached_fallback_nodes']} of them in " \
           "branches conversion never saw run)" in converted.report()
    x = torch.rand(6) + 0.5
    torch.testing.assert_close(converted(x), model(x))


class _Layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(32, 32)
        self.norm = torch.nn.LayerNorm(32)

    def forward(self, x):
        return self.norm(x + torch.relu(self.fc(x)))


class _Layers(torch.nn.Module):
    """Three alike layers of a GEMM (an extern) and a kernel (residual, ReLU, LayerNorm), then a head."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(_Layer() for _ in range(3))
        self.head = torch.nn.Linear(32, 4)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x).softmax(-1)


def test_the_report_counts_launches_per_call_and_per_repeated_layer():
    example = (torch.randn(2, 5, 32),)
    converted = jit2triton.convert(torch.jit.trace(_Layers().eval(), example), example)
    launches = converted.summary()["launches"]
    assert launches == {"per_call": 8, "layers": 3, "per_layer": 2}, converted.report()
    assert "launches per call: 8 (kernels and ATen calls, a loop's body once); 3 repeated layers, 2 launches each" \
        in converted.report()
