"""The CLI end to end: convert a .pt, run it against TorchScript, inspect it, and fail clearly on bad input."""
import re

import torch
from click.testing import CliRunner

from jit2triton.cli import main


def _save_model(tmp_path):
    class Embed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = torch.nn.Embedding(50, 8)
            self.linear = torch.nn.Linear(8, 4)

        def forward(self, ids, scale):
            return torch.tanh(self.linear(self.embedding(ids))) * scale

    torch.manual_seed(0)
    traced = torch.jit.trace(Embed().eval(), (torch.randint(0, 50, (2, 5)), torch.randn(2, 5, 4)))
    path = tmp_path / "embed.pt"
    torch.jit.save(traced, path)
    return path


def test_convert_run_inspect(tmp_path):
    model = _save_model(tmp_path)
    runner = CliRunner()
    package = tmp_path / "embed.j2t"
    result = runner.invoke(main, ["convert", str(model), "-o", str(package), "--input", "2x5:int64:0-50",
                                  "--input", "2x5x4:float32"])
    assert result.exit_code == 0, result.output
    assert "aten::embedding" in result.output and package.exists()

    result = runner.invoke(main, ["run", str(package), "--check", str(model), "--runs", "3", "--seed", "7"])
    assert result.exit_code == 0, result.output
    error = float(re.search(r"max abs error against .*: (\S+)", result.output).group(1))
    assert error < 1e-5
    assert "(ids: int64[2, 5], scale: float32[2, 5, 4]) -> float32[2, 5, 4]" in result.output

    result = runner.invoke(main, ["inspect", str(package), "--kernels", "--ir"])
    assert result.exit_code == 0, result.output
    assert "format v2" in result.output and "fallback" in result.output and "graph " in result.output


def test_convert_with_inputs_file(tmp_path):
    model = _save_model(tmp_path)
    inputs = tmp_path / "inputs.pt"
    torch.save((torch.randint(0, 50, (2, 5)), torch.randn(2, 5, 4)), inputs)
    result = CliRunner().invoke(main, ["convert", str(model), "--inputs-file", str(inputs)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "embed.j2t").exists()


def test_cli_errors_are_one_clear_line(tmp_path):
    result = CliRunner().invoke(main, ["convert", str(tmp_path / "missing.pt"), "--input", "2x2"])
    assert result.exit_code == 2
    assert "error: model file not found" in result.output
    assert "Traceback" not in result.output

    result = CliRunner().invoke(main, ["convert", str(_save_model(tmp_path)), "--input", "2x5:notadtype"])
    assert result.exit_code == 2 and "unknown dtype" in result.output


def test_version_and_help_answer_at_once_without_torch():
    import subprocess
    import sys
    import time
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", "import sys; sys.argv = ['jit2triton', '--help']\n"
                          "import jit2triton.cli as cli\ntry:\n    cli.main()\nexcept SystemExit:\n    pass\n"
                          "print('torch' in sys.modules)"], capture_output=True, text=True, check=True).stdout
    assert time.perf_counter() - started < 5.0  # generous: about 0.2 s here, 2.6 s when help imported torch
    assert out.strip().endswith("False"), "--help imported torch"
    commands = out.split("Commands:")[1]
    assert "..." not in commands, "a command's description is cut off in --help"
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0 and "jit2triton, version" in result.output


def test_kernel_sources_carry_no_full_paths_of_the_converting_machine(tmp_path, monkeypatch):
    import os

    import jit2triton
    monkeypatch.chdir(os.path.dirname(os.path.abspath(__file__)))  # the model's code lives under the working folder
    traced = torch.jit.trace(lambda x: torch.sigmoid(x) * 3 + 1, torch.randn(4, 4))
    code = jit2triton.convert(traced, example_inputs=(torch.randn(4, 4),)).code
    here = os.path.abspath(__file__)
    assert here not in code and os.path.basename(here) in code
    full = jit2triton.convert(traced, example_inputs=(torch.randn(4, 4),), full_source_paths=True).code
    assert here in full


def test_convert_dynamic_batch_serves_other_batch_sizes(tmp_path):
    model = _save_model(tmp_path)
    package = tmp_path / "embed.j2t"
    result = CliRunner().invoke(main, ["convert", str(model), "-o", str(package), "--input", "2x5:int64:0-50",
                                       "--input", "2x5x4:float32", "--dynamic-batch"])
    assert result.exit_code == 0, result.output
    assert "dynamic dim batch: 1..inf (converted at 2)" in result.output
    result = CliRunner().invoke(main, ["run", str(package), "--check", str(model), "--shape", "batch=7",
                                       "--runs", "2"])
    assert result.exit_code == 0, result.output
    assert "(ids: int64[batch, 5], scale: float32[batch, 5, 4])" in result.output
    assert float(re.search(r"max abs error against .*: (\S+)", result.output).group(1)) < 1e-5


def test_bench_times_against_torchscript_and_profiles_by_source_line(tmp_path):
    import json

    class Looped(torch.nn.Module):
        def forward(self, x, steps: int):
            for _ in range(steps):
                x = torch.tanh(x) * 2.0 + 1.0  # the loop body's kernel
            return x.softmax(-1)

    model = tmp_path / "looped.pt"
    torch.jit.save(torch.jit.script(Looped()), model)
    package = tmp_path / "looped.j2t"
    result = CliRunner().invoke(main, ["convert", str(model), "-o", str(package), "--input", "4x8:float32",
                                       "--input", "int=3"])
    assert result.exit_code == 0, result.output
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(main, ["bench", str(package), "--warmup-ms", "0", "--iterations", "7",
                                       "--against", str(model), "--profile", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "median speed-up over torch.jit" in result.output and "p99" in result.output
    data = json.loads(out.read_text())
    for label in ("jit2triton", "torch.jit"):
        stats = data["stats"][label]
        assert stats["calls"] == 7
        assert stats["min_ms"] <= stats["median_ms"] <= stats["p90_ms"] <= stats["p99_ms"] <= stats["max_ms"]
    rows = data["profile"]
    # exclusive times: a loop is charged only for what its body's steps do not account for, so the rows add up
    # to no more than a profiled call took (counting the body inside the loop too would nearly double them)
    assert sum(r["ms_per_call"] for r in rows) <= data["profiled_call_ms"]
    assert abs(sum(r["share"] for r in rows) - 1) < 1e-6
    body = next(r for r in rows if r["what"].startswith("kernel") and r["steps_per_call"] == 3)  # once a trip
    assert any("the loop body's kernel" in s for s in body["sources"])
    assert any(r["what"] == "prim::Loop" for r in rows)


def test_progress_is_a_bar_on_a_terminal_plain_lines_in_a_log_and_nothing_when_quiet(tmp_path, capsys, monkeypatch):
    from jit2triton.cli import _Progress

    def feed(progress):
        progress("fusing and generating triton kernels")
        for i in range(1, 41):
            progress(f"compiling Triton kernels {i}/40")
        progress("verifying against TorchScript on 2 input sets")
        return capsys.readouterr().err

    monkeypatch.setattr("sys.stderr.isatty", lambda: False, raising=False)
    log = feed(_Progress())
    counted = [line for line in log.splitlines() if "compiling Triton kernels" in line]
    assert counted[0].endswith(" 1/40") and counted[-1].endswith(" 40/40") and len(counted) == 11, counted
    assert "\r" not in log and log.splitlines()[-1].endswith("verifying against TorchScript on 2 input sets")
    terminal = _Progress()
    terminal.tty = True
    shown = feed(terminal)
    assert shown.count("\r") == 40 and "[" + "#" * 30 + "] 40/40\n" in shown
    assert feed(_Progress(quiet=True)) == ""

    model = _save_model(tmp_path)
    args = ["convert", str(model), "--input", "2x5:int64:0-50", "--input", "2x5x4:float32"]
    output = CliRunner().invoke(main, args).output
    # each line says the seconds since the first, and the passes are named as they start
    assert re.search(r"^\[jit2triton +\d+\.\ds\] pass place_on_device 1/\d+$", output, re.MULTILINE), output
    assert re.search(r"^conversion took \d+\.\ds, most in: ", output, re.MULTILINE), output  # and the report
    quiet = CliRunner().invoke(main, args + ["--quiet"])
    assert quiet.exit_code == 0 and len(quiet.output.splitlines()) == 1  # no progress, no report
    assert quiet.output.startswith("saved ")


def test_profile_rows_of_repeated_layers_add_up_to_one_row_per_source_line(tmp_path):
    import json

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(8, 8))

        def forward(self, x):
            return torch.tanh(torch.mm(x, self.weight)) * 0.5  # one line, three layers

    model = tmp_path / "layers.pt"
    torch.jit.save(torch.jit.trace(torch.nn.Sequential(Layer(), Layer(), Layer()), torch.randn(4, 8)), model)
    package = tmp_path / "layers.j2t"
    result = CliRunner().invoke(main, ["convert", str(model), "-o", str(package), "--input", "4x8:float32"])
    assert result.exit_code == 0, result.output
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(main, ["bench", str(package), "--warmup-ms", "0", "--iterations", "5",
                                       "--profile", "--json", str(out)])
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())["profile"]
    layer_rows = [r for r in rows if any("three layers" in s for s in r["sources"])]
    assert layer_rows and all(r["count"] == 3 and len(r["nodes"]) == 3 for r in layer_rows), layer_rows
    assert " x3 " in result.output


def test_the_readme_demo_runs_and_exits_cleanly():
    result = CliRunner().invoke(main, ["demo"])
    assert result.exit_code == 0, result.output
    assert "demo OK" in result.output and "error:" not in result.output


def test_inspect_says_how_many_cuda_graphs_a_cuda_package_may_hold():
    from jit2triton.cli import _cuda_graph_line
    from jit2triton.deploy.policy import MAX_GRAPHS
    dynamic = {"device": "cuda", "cuda_graph": True, "signature": {"dims": {"b": {}}}, "plan": {"steps": []}}
    assert f"one graph per input shape and scalar inputs and math mode (TF32, reduced-precision reductions, " \
        f"cuDNN's settings), captured on a key's second call, at most {MAX_GRAPHS}" in _cuda_graph_line(dynamic)
    regions = {"device": "cuda", "cuda_graph": False, "signature": {},
               "plan": {"steps": [{"kind": "graph"}, {"kind": "if", "blocks": [{"steps": [{"kind": "graph"}]}]}]}}
    assert _cuda_graph_line(regions).startswith("CUDA graphs: 2 regions, one graph per scalar inputs and math mode")
    assert _cuda_graph_line(dict(regions, plan={"steps": []})) == "CUDA graphs: none (the plan runs step by step)"
    timed_out = dict(regions, plan={"steps": []},
                     report={"cuda_graph": {"graph_us": 120.0, "steps_us": 100.0, "host_us": 40.0, "regions": False}})
    assert "took 120 us a call at conversion, step by step 100 us" in _cuda_graph_line(timed_out)
    assert _cuda_graph_line(dict(regions, device="cpu")) == ""


def test_inspect_answers_for_a_package_without_its_optional_parts(tmp_path):
    """The report, the IR and the producer's versions are optional (nothing runs by them): inspecting a package
    whose copies of them are null or partial says so rather than raising."""
    from fuzz_packages import small_package
    from package_tools import rewrite_package

    edited = tmp_path / "edited.j2t"

    def strip(manifest):
        manifest.update(ir=None, report=None)
        manifest["producer"].pop("python", None)
    rewrite_package(small_package(tmp_path), edited, edit_manifest=strip)
    result = CliRunner().invoke(main, ["inspect", str(edited), "--ir"])
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert "holds no IR" in result.output and "no conversion report" in result.output and "python ?" in result.output
