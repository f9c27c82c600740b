"""What forward() does besides its outputs (#34's side-effect ops): warnings.warn warns and print prints in the
runtime, `with torch.no_grad():` is its body, and what a package cannot repeat per call (seeding, reading a file)
is refused at conversion with the op and its source line."""
import warnings
from typing import Any

import pytest
import torch

import jit2triton
from jit2triton import ConversionError

from helpers import assert_same


class Talks(torch.nn.Module):
    def forward(self, x):
        warnings.warn("inputs are not normalised")
        print("rows:", x.shape[0], "scale", 0.5)
        with torch.no_grad():
            y = x * 2
        return y + 1


def _scripted_and_loaded(model, tmp_path):
    """The scripted model and its package as load() gives it, converted on a [3, 2] example."""
    scripted = torch.jit.script(model.eval())
    jit2triton.convert(scripted, (torch.randn(3, 2),)).save(tmp_path / "m.j2t")
    return scripted, jit2triton.load(tmp_path / "m.j2t")


def test_warn_print_and_no_grad_run_as_torchscript_runs_them(tmp_path, capfd):
    scripted, loaded = _scripted_and_loaded(Talks(), tmp_path)
    capfd.readouterr()
    x = torch.randn(3, 2)
    with pytest.warns(UserWarning, match="inputs are not normalised") as ours:
        out = loaded(x)
    assert_same(out, x * 2 + 1)
    assert "rows: 3 scale 0.5" in capfd.readouterr().out
    with pytest.warns(UserWarning) as theirs:
        scripted(x)
    # as TorchScript warns: the message alone, at the model's line (not a line of the runtime's)
    assert [(str(w.message), w.filename, w.lineno) for w in ours] == \
        [(str(w.message), w.filename, w.lineno) for w in theirs] == [("inputs are not normalised", __file__, 18)]


class PrintsNumbers(torch.nn.Module):
    """print's text of floats (whole, tiny, huge, signed zero), containers of them and strings."""

    def forward(self, x):
        total, first = float(x.max()), float(x[0, 0])  # (exact: no sum whose order rounds)
        print("sum", total, first * 1e20, first * 1e-7, float(x.shape[0]), -0.0, 2.5, [total, 2.0], (total,),
              {"mean": total / 6, "rows": 2.0}, ["a'b", "c"], x.shape, None, True)
        return x + 1


def test_print_writes_what_torchscript_writes(tmp_path, capfd):
    scripted, loaded = _scripted_and_loaded(PrintsNumbers(), tmp_path)
    capfd.readouterr()
    for _ in range(6):
        x = torch.randn(3, 2)
        scripted(x)
        expected = capfd.readouterr().out
        assert_same(loaded(x), x + 1)
        assert capfd.readouterr().out == expected and expected.startswith("sum ")


class Seeds(torch.nn.Module):
    def forward(self, x):
        torch.manual_seed(0)
        return x + torch.rand(x.shape)


class Timer:  # a context manager of the model's own: jit2triton cannot run its __enter__/__exit__
    def __init__(self) -> None:
        self.depth = 0

    def __enter__(self) -> None:
        self.depth += 1

    def __exit__(self, kind: Any, value: Any, trace: Any) -> None:
        self.depth -= 1


class OtherContext(torch.nn.Module):
    def forward(self, x):
        with Timer():
            y = x * 2
        return y


def test_seeding_in_forward_is_refused_with_its_line():
    with pytest.raises(ConversionError, match=r"aten::manual_seed .*test_side_effects.py.*seed it before calling"):
        jit2triton.convert(torch.jit.script(Seeds().eval()), (torch.randn(3),))


def test_a_context_manager_of_the_models_own_is_refused_with_its_line():
    with pytest.raises(ConversionError, match=r"`with` block of .*Timer .*test_side_effects.py"):
        jit2triton.convert(torch.jit.script(OtherContext().eval()), (torch.randn(3),))


def doubled_without_grad(x: torch.Tensor) -> torch.Tensor:  # (a function: freezing may leave the call to it)
    with torch.no_grad():
        y = x * 2
    return y


def seeded_noise(x: torch.Tensor) -> torch.Tensor:
    torch.manual_seed(0)
    return x + torch.rand(x.shape)


class CallsNoGrad(torch.nn.Module):
    def forward(self, x):
        return doubled_without_grad(x) + 1


class CallsSeed(torch.nn.Module):
    def forward(self, x):
        return seeded_noise(x)


def _ran_plain(module: torch.nn.Module, x: torch.Tensor) -> torch.jit.ScriptModule:
    """Scripted and run once in TorchScript's plain interpreter, as a user may before converting: freezing then
    leaves the calls of its functions for conversion to inline, and what they hide is seen only after that."""
    scripted = torch.jit.script(module.eval())
    with torch.jit.optimized_execution(False):
        scripted(x)
    return scripted


def test_no_grad_inside_a_called_function(tmp_path):
    model = _ran_plain(CallsNoGrad(), torch.randn(3, 2))
    jit2triton.convert(model, (torch.randn(3, 2),)).save(tmp_path / "m.j2t")
    loaded = jit2triton.load(tmp_path / "m.j2t")
    for _ in range(6):
        x = torch.randn(3, 2)
        assert_same(loaded(x), model(x))


def test_seeding_inside_a_called_function_is_refused_with_its_line():
    with pytest.raises(ConversionError, match=r"aten::manual_seed .*test_side_effects.py.*seed it before calling"):
        jit2triton.convert(_ran_plain(CallsSeed(), torch.randn(3)), (torch.randn(3),))


def test_the_reference_interpreter_writes_values_as_torchscript_does():
    """Conversion's Python interpreter of plans (deploy/host_ops.py) formats strings as TorchScript's str, format
    and print do, so what it computes while typing the graph is what TorchScript and the runtime compute."""
    from typing import List, Tuple

    from jit2triton.deploy.host_ops import HOST_OPS, print_text

    @torch.jit.script
    def texts(xs: List[float], pair: Tuple[float, str]) -> List[str]:
        return [str(x) for x in xs] + [str(xs), "{} {}".format(pair, {"k": xs[0]})]

    xs = [2.0, 0.1, -0.0, 1e20, 1e16, 1 / 3, 5e-324, float("inf"), float("nan"), -1.5e-7, 123456789.0]
    pair = (1.0, "a")
    ours = [print_text(x) for x in xs] + [print_text(xs), HOST_OPS["aten::format"]("{} {}", pair, {"k": xs[0]})]
    assert ours == texts(xs, pair)
