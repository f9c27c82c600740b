"""The CLI says each thing once, in its own words: help that matches the code, one line per error with no warning
before it, the emulated-precision warning once, options named as the command names them, JSON that parses, plurals,
the shell's exit code for Ctrl-C; `run --threads/--inputs-file`; a hint for a model traced in training mode."""
import json

import pytest
import torch
from click.testing import CliRunner

import jit2triton
from jit2triton.bench import format_profile
from jit2triton.cli import main


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("noise")
    x = torch.randn(2, 4)
    traced = torch.jit.trace(torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.GELU()).eval(), (x,))
    traced.save(str(folder / "model.pt"))
    jit2triton.convert(traced, (x,)).save(folder / "model.j2t")
    return folder


def _invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _error_lines(result):
    return [line for line in result.stderr.splitlines() if not line.startswith("[jit2triton ")]


def test_bench_help_says_profile_times_the_runtime_benchmarked():
    text = " ".join(_invoke("bench", "--help").output.split())
    assert "in the runtime benchmarked" in text and "(Python runtime" not in text


def test_a_package_for_another_device_is_one_line_with_no_warning_first(files):
    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA: the refusal is that the device is missing")
    result = _invoke("run", files / "model.j2t", "--device", "cuda")
    assert result.exit_code == 2 and len(_error_lines(result)) == 1, result.stderr
    assert _error_lines(result)[0].startswith("error: ")


def test_options_are_named_as_the_command_names_them(files):
    for args, named, not_named in [(["--rtol", "0.1"], "--rtol", "accuracy="),
                                   (["--io-precision", "fp16"], "--io-precision", "io_precision="),
                                   (["--precision", "bf16", "--io-precision", "fp16"], "--io-precision", "io_precision=")]:
        result = _invoke("convert", files / "model.pt", "--input", "2x4", "-o", files / "x.j2t", *args)
        lines = _error_lines(result)
        assert result.exit_code == 2 and len(lines) == 1 and named in lines[0] and not_named not in lines[0], lines
    assert not (files / "x.j2t").exists()


def test_the_emulated_precision_warning_is_printed_once(files, monkeypatch):
    from jit2triton import precision
    monkeypatch.setattr(precision, "cpu_supports", lambda dtype: False)  # as on a CPU without native bfloat16
    for quiet in ([], ["--quiet"]):
        result = _invoke("convert", files / "model.pt", "--input", "2x4", "-o", files / "bf16.j2t", "--precision",
                         "bf16", "--no-verify", *quiet)
        assert result.exit_code == 0, result.output
        assert result.stderr.count("emulate bfloat16") == 1, result.stderr


def test_inspect_plan_is_json_alone(files):
    result = _invoke("inspect", files / "model.j2t", "--plan")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["steps"] and {"kind", "op"} <= set(plan["steps"][0])
    assert _invoke("inspect", files / "model.j2t", "--plan", "--kernels").exit_code == 2


def test_the_profile_keeps_the_source_line_whole():
    source = "transformers/models/bert/modeling_bert.py:348 hidden_states = self.dense(hidden_states)"
    row = {"what": "aten::linear", "count": 12, "share": 0.5, "ms_per_call": 1.0, "sources": [source]}
    line = format_profile([row])[1]
    assert line.endswith(source), line
    long = source + " + self.another_long_name_for_a_residual_branch(hidden_states)"
    assert "hidden_states = self.dense(hidden_states) + self.an" in format_profile([dict(row, sources=[long])])[1]


def test_plurals_and_run_threads_and_inputs_file(files):
    x = torch.randn(2, 4)
    torch.save((x,), files / "inputs.pt")
    result = _invoke("run", files / "model.j2t", "--runs", "1", "--threads", "1", "--inputs-file", files / "inputs.pt",
                     "--check", files / "model.pt")
    assert result.exit_code == 0, result.output
    assert "over 1 run, 1 thread" in result.stdout and "outputs match" in result.stdout
    torch.save((torch.randn(3, 4),), files / "wrong.pt")  # another shape: the package's own refusal, one line
    result = _invoke("run", files / "model.j2t", "--inputs-file", files / "wrong.pt")
    assert result.exit_code == 2 and len(_error_lines(result)) == 1, result.stderr
    result = _invoke("run", files / "model.j2t", "--inputs-file", files / "inputs.pt", "--shape", "B=2")
    assert result.exit_code == 2 and "--inputs-file" in result.stderr
    result = _invoke("bench", files / "model.j2t", "--iterations", "2", "--warmup-ms", "0", "--threads", "1")
    assert result.exit_code == 0 and ", 1 thread, " in result.stdout, result.output


def test_ctrl_c_during_convert_exits_130(files, monkeypatch):
    import jit2triton.api

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(jit2triton.api, "convert", interrupted)
    result = _invoke("convert", files / "model.pt", "--input", "2x4", "-o", files / "never.j2t")
    lines = [line for line in _error_lines(result) if line]  # (click ends the terminal's ^C line first)
    assert result.exit_code == 130 and lines == ["error: interrupted"], result.stderr


class Dropping(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin, self.drop = torch.nn.Linear(4, 4), torch.nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.lin(x))


def test_a_model_traced_in_training_mode_gets_a_hint():
    x = torch.randn(2, 4)
    traced = torch.jit.trace(Dropping(), (x,), check_trace=False)  # training mode: dropout recorded as training
    with pytest.warns(jit2triton.api.TrainingModeWarning, match=r"aten::dropout at .*model.eval\(\)"):
        jit2triton.convert(traced, (x,), verify=False)
    evaluated = torch.jit.trace(Dropping().eval(), (x,))
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error", jit2triton.api.TrainingModeWarning)
        jit2triton.convert(evaluated, (x,), verify=False)
