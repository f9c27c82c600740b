"""Checks that can fail and mistakes that are the user's: `run --check` exits 3 when the outputs differ beyond the
tolerance; a path that is not a regular file is never written over; the paths a command writes are checked before
its work (convert -o, bench --json, demo --keep), and a write that fails is one line naming the path (exit 2, not a
bug's 1); a model that fails on the package's inputs is reported by the op's own error."""
import errno
import os

import pytest
import torch
from click.testing import CliRunner

import jit2triton
from jit2triton.cli import main
from jit2triton.errors import WriteError

from check_models import two_models_one_signature


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return two_models_one_signature(tmp_path_factory.mktemp("check"))


def _one_line(result, code: int = 2) -> str:
    lines = [line for line in result.stderr.splitlines() if not line.startswith("[jit2triton ")]
    assert result.exit_code == code, f"exit code {result.exit_code}\n{result.output}"
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def _not_called(*args, **kwargs):
    raise AssertionError("the work started before the path it writes was checked")


def test_run_check_fails_with_exit_code_3_on_another_model_of_the_same_signature(models):
    package, right, other = (str(p) for p in models)
    result = CliRunner().invoke(main, ["run", package, "--check", other, "--runs", "1"])
    line = _one_line(result, 3)
    assert "differs from" in line and "output" in line and "beyond the tolerance" in line
    assert "output tensor float32[2, 4]: max abs error" in result.stdout and "DIFFERS" in result.stdout
    assert "Exit codes:" in CliRunner().invoke(main, ["--help"]).output  # the codes are documented
    assert "exits with code 3" in " ".join(CliRunner().invoke(main, ["run", "--help"]).output.split())


def test_run_check_passes_on_the_right_model_and_takes_a_tolerance(models):
    package, right, other = (str(p) for p in models)
    result = CliRunner().invoke(main, ["run", package, "--check", right, "--runs", "1"])
    assert result.exit_code == 0, result.output
    assert "(rtol 0.001 of the largest magnitude" in result.stdout and ": ok" in result.stdout
    assert "outputs match" in result.stdout
    # a tolerance wide enough lets the other model pass: the verdict is the tolerance's, not a fixed number's
    for tolerance in (["--rtol", "100"], ["--rtol", "0", "--atol", "100"]):
        result = CliRunner().invoke(main, ["run", package, "--check", other, "--runs", "1"] + tolerance)
        assert result.exit_code == 0, result.output
    line = _one_line(CliRunner().invoke(main, ["run", package, "--rtol", "0.1"]))
    assert "--check" in line


def test_writes_refuse_what_is_not_a_regular_file(models, tmp_path):
    package, right, _ = models
    fifo = tmp_path / "fifo.j2t"
    os.mkfifo(fifo)
    null_link = tmp_path / "null.j2t"
    null_link.symlink_to(os.devnull)
    for target, kind in [(fifo, "a FIFO"), (null_link, "a character device")]:
        line = _one_line(CliRunner().invoke(main, ["convert", str(right), "--input", "2x8", "-o", str(target)]))
        assert f"cannot write {target}" in line and kind in line and "not a regular file" in line
    for target, kind in [(fifo, "a FIFO"), (null_link, "a character device"), (tmp_path, "a folder")]:
        with pytest.raises(WriteError, match=f"it is {kind}, not a regular file"):
            jit2triton.load(package).save(target)
    assert null_link.is_symlink() and os.readlink(null_link) == os.devnull and fifo.is_fifo()
    # a link to a file is written through: the link stays, the file it names is the package
    real, link = tmp_path / "real.j2t", tmp_path / "latest.j2t"
    real.write_bytes(b"old")
    link.symlink_to(real)
    jit2triton.load(package).save(link)
    assert link.is_symlink() and real.stat().st_size > 3 and jit2triton.load(link) is not None


def test_paths_written_are_checked_before_the_work(models, tmp_path, monkeypatch):
    package, right, _ = (str(p) for p in models)
    monkeypatch.setattr("jit2triton.api.convert", _not_called)
    monkeypatch.setattr("jit2triton.bench.run_bench", _not_called)
    monkeypatch.setattr("jit2triton.demo.run_demo", _not_called)
    missing = str(tmp_path / "missing" / "x.j2t")
    for args, expected in [
            (["convert", right, "--input", "2x8", "-o", missing], "folder"),
            (["bench", package, "--json", str(tmp_path / "missing" / "x.json")], "--json"),
            (["bench", package, "--json", package], "itself"),
            (["demo", "--keep", missing], "--keep")]:
        line = _one_line(CliRunner().invoke(main, args))
        assert expected in line and "internal error" not in line, args
    if os.path.isdir("/proc/self"):  # a folder where no file can be made, even by root (os.access says yes to root)
        line = _one_line(CliRunner().invoke(main, ["convert", right, "--input", "2x8", "-o", "/proc/x.j2t"]))
        assert "cannot write /proc/x.j2t: its folder /proc takes no new file" in line


def test_a_write_that_fails_names_the_path_and_the_reason(models, tmp_path, monkeypatch):
    package, right, _ = models

    def disk_full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr("jit2triton.deploy.package.os.fsync", disk_full)
    target = tmp_path / "full.j2t"
    with pytest.raises(WriteError, match=f"cannot write {target}: No space left on device"):
        jit2triton.load(package).save(target)
    assert os.listdir(tmp_path) == []  # the temporary is gone too


def test_a_model_that_fails_on_the_inputs_is_reported_by_the_ops_own_error(models, tmp_path):
    package = str(models[0])

    class Images(torch.nn.Module):  # takes one tensor, as the package does, and fails on it inside an op
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(5, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.linear(x)

    images = tmp_path / "images.pt"
    torch.jit.save(torch.jit.script(Images()), images)
    for command in (["bench", package, "--against", str(images), "--iterations", "1"],
                    ["run", package, "--check", str(images), "--runs", "1"]):
        line = _one_line(CliRunner().invoke(main, command))
        assert "mat1 and mat2 shapes cannot be multiplied" in line and "Tensor) -> Tensor" not in line, line
