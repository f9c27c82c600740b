"""Every command, given bad arguments, answers with one line on stderr and exit code 2, and checks what it can before
doing any work; `jit2triton --debug` shows the traceback instead; a bug of ours is one line and exit code 1."""
import socket

import pytest
import torch
from click.testing import CliRunner

from jit2triton.cli import main


class TwoInputs(torch.nn.Module):
    def forward(self, input_ids, attention_mask):
        return (input_ids * attention_mask).float().sum(-1)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A small conv model and its package, another model that takes other inputs, and bad input files."""
    folder = tmp_path_factory.mktemp("cli_errors")
    torch.manual_seed(0)
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).eval()
    model = folder / "conv.pt"
    torch.jit.save(torch.jit.trace(conv, torch.randn(1, 3, 8, 8)), model)
    other = folder / "two.pt"
    torch.jit.save(torch.jit.script(TwoInputs()), other)
    package = folder / "conv.j2t"
    done = CliRunner().invoke(main, ["convert", str(model), "-o", str(package), "--input", "1x3x8x8", "--quiet"])
    assert done.exit_code == 0, done.output
    torch.save({"x": torch.randn(1, 3, 8, 8)}, folder / "dict.pt")
    torch.save((torch.randn(1, 3, 9, 9),), folder / "wrong_shape.pt")
    (folder / "not_torch.pt").write_text("hello")
    (folder / "corrupt.j2t").write_bytes(b"PK\x03\x04 not really a zip")
    CliRunner().invoke(main, ["keygen", "--out", str(folder / "keys")])
    return folder


def _bad_arguments(f) -> dict[str, list[str]]:
    model, package, other = str(f / "conv.pt"), str(f / "conv.j2t"), str(f / "two.pt")
    return {
        "convert: no such model": ["convert", str(f / "missing.pt"), "--input", "2x2"],
        "convert: unknown dtype": ["convert", model, "--input", "1x3x8x8:notadtype"],
        "convert: an undeclared dim": ["convert", model, "--input", "Bx3x8x8"],
        "convert: a dict in --inputs-file": ["convert", model, "--inputs-file", str(f / "dict.pt")],
        "convert: --inputs-file not torch's": ["convert", model, "--inputs-file", str(f / "not_torch.pt")],
        "convert: a public key to sign with": ["convert", model, "--input", "1x3x8x8", "-o", str(f / "signed.j2t"),
                                               "--sign", str(f / "keys" / "jit2triton.pub")],
        "convert: onto the model itself": ["convert", model, "--input", "1x3x8x8", "-o", model],
        "convert: into a missing folder": ["convert", model, "--input", "1x3x8x8", "-o", str(f / "no" / "x.j2t")],
        "convert: an unknown backend": ["convert", model, "--backend", "tpu"],
        "convert: unknown choices": ["convert", model, "--input", "1x3x8x8", "--choices", "sometimes"],
        "run: no such package": ["run", str(f / "missing.j2t")],
        "run: a corrupt package": ["run", str(f / "corrupt.j2t")],
        "run: --check of a missing model": ["run", package, "--check", str(f / "missing.pt")],
        "run: --check of another model": ["run", package, "--check", other, "--runs", "1"],
        "run: --check of a file not TorchScript": ["run", package, "--check", str(f / "not_torch.pt")],
        "run: --runs 0": ["run", package, "--runs", "0"],
        "run: --shape of a static package": ["run", package, "--shape", "B=4"],
        "bench: --against another model": ["bench", package, "--against", other, "--iterations", "1"],
        "bench: --iterations 0": ["bench", package, "--iterations", "0"],
        "bench: --threads 0": ["bench", package, "--threads", "0"],
        "bench: --duration-s 0": ["bench", package, "--duration-s", "0"],
        "bench: a dict in --inputs-file": ["bench", package, "--inputs-file", str(f / "dict.pt")],
        "bench: inputs of the wrong shape": ["bench", package, "--inputs-file", str(f / "wrong_shape.pt"),
                                             "--iterations", "1"],
        "inspect: a corrupt package": ["inspect", str(f / "corrupt.j2t")],
        "inspect: untrusted": ["inspect", package, "--trusted-key", str(f / "keys" / "jit2triton.pub")],
        "keygen: keys already there": ["keygen", "--out", str(f / "keys")],
        "serve: no such package": ["serve", str(f / "missing.j2t")],
        "serve: a port out of range": ["serve", package, "--port", "70000"],
        "demo: an unknown device": ["demo", "--device", "tpu"],
        "an unknown command": ["conver", model],
        "an unknown option": ["run", package, "--bogus"],
    }


def _assert_one_line(result, what: str) -> str:
    lines = [line for line in result.stderr.splitlines() if not line.startswith("[jit2triton] ")]  # progress
    assert result.exit_code == 2, f"{what}: exit code {result.exit_code}\n{result.output}"
    assert len(lines) == 1 and lines[0].startswith("error: "), f"{what}: stderr is not one line:\n{result.stderr}"
    return lines[0]


def test_every_command_answers_bad_arguments_with_one_line_and_exit_code_2(files):
    for what, args in _bad_arguments(files).items():
        _assert_one_line(CliRunner().invoke(main, args), what)
    assert not (files / "signed.j2t").exists()


def test_what_convert_can_check_it_checks_before_converting(files, monkeypatch):
    import time

    from jit2triton.emitters import compile_triton

    started = time.perf_counter()
    line = _assert_one_line(CliRunner().invoke(main, ["convert", str(files / "conv.pt"), "--input", "1x3x8x8", "-o",
                                                      str(files / "x.j2t"), "--sign",
                                                      str(files / "keys" / "jit2triton.pub")]), "--sign a public key")
    assert "signing key" in line and "private" in line.lower()
    # a missing model is only found by loading it: the backend is refused before
    monkeypatch.setattr(compile_triton, "interpreter_active", lambda: False)
    line = _assert_one_line(CliRunner().invoke(main, ["convert", str(files / "missing.pt"), "--input", "2x2",
                                                      "--backend", "triton"]), "triton on the CPU")
    assert "Triton's interpreter" in line
    assert time.perf_counter() - started < 5  # nothing was converted (the conv model converts in about 2 s)


def test_messages_name_the_problem_and_quote_no_tensor(files):
    bad = _bad_arguments(files)
    line = _assert_one_line(CliRunner().invoke(main, bad["run: --check of another model"]), "")
    assert "two.pt does not take the inputs" in line and "attention_mask" in line
    line = _assert_one_line(CliRunner().invoke(main, bad["convert: a dict in --inputs-file"]), "")
    assert "holds a dict (keys 'x')" in line and "tensor(" not in line
    line = _assert_one_line(CliRunner().invoke(main, bad["an unknown option"]), "")
    assert "--bogus" in line


def test_serve_refuses_a_busy_port_before_starting_ray(files):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        result = CliRunner().invoke(main, ["serve", str(files / "conv.j2t"), "--port", str(port)])
    line = _assert_one_line(result, "serve on a busy port")
    assert f"127.0.0.1:{port}" in line and "--port" in line


def test_debug_shows_the_traceback_and_a_bug_is_one_line_with_exit_code_1(files, monkeypatch):
    from jit2triton.errors import InputError

    result = CliRunner().invoke(main, ["--debug", "run", str(files / "conv.j2t"), "--check",
                                       str(files / "two.pt")])
    assert isinstance(result.exception, InputError)  # raised through click: Python prints its traceback

    def broken(*args, **kwargs):
        raise KeyError("plan")
    monkeypatch.setattr("jit2triton.api.load", broken)
    result = CliRunner().invoke(main, ["run", str(files / "conv.j2t")])
    lines = result.stderr.splitlines()
    assert result.exit_code == 1 and len(lines) == 1 and "internal error" in lines[0] and "KeyError" in lines[0]
