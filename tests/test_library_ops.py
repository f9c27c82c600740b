"""A package that calls an op of a library, not of torch (torchvision::nms in a detector): loaded where the library's
ops are not registered, the runtime names the library and how to load it; `--import` loads it for the CLI."""
import os
import subprocess
import sys

import pytest
import torch

import jit2triton

HERE = os.path.dirname(os.path.abspath(__file__))
NOT_TORCHS = "belongs to the library j2t_test_ops, not to torch"


class CallsALibraryOp(torch.nn.Module):
    def forward(self, x, y):
        return torch.ops.j2t_test_ops.scaled_add(x.relu(), y, 0.5) * 2


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> str:
    import j2t_test_ops  # noqa: F401 - registers the op, as `import torchvision` does

    model = torch.jit.script(CallsALibraryOp())
    converted = jit2triton.convert(model, (torch.randn(4, 8), torch.randn(4, 8)), device="cpu")
    assert converted.summary()["verification"]["status"] == "passed"
    path = str(tmp_path_factory.mktemp("library_op") / "model.j2t")
    converted.save(path)
    return path


def _python(code: str, path: str) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter, where nothing has imported the library (this test process has)."""
    return subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": HERE})


def test_a_library_op_not_loaded_is_named_with_how_to_load_it(package) -> None:
    from jit2triton.deploy.cpp_runtime import unavailable
    if unavailable():
        pytest.skip(unavailable())
    out = _python("import sys, jit2triton\n"
                  "try:\n"
                  "    jit2triton.load(sys.argv[1])\n"
                  "except jit2triton.PackageError as err:\n"
                  "    print(err)\n", package)
    assert NOT_TORCHS in out.stdout and "`import j2t_test_ops`" in out.stdout, out.stdout + out.stderr
    assert "does not exist in this torch" not in out.stdout  # (a torch without it was the old message's guess)
    # with the library imported first, the package loads and gives TorchScript's answer on fresh inputs
    out = _python("import sys, torch, jit2triton, j2t_test_ops\n"
                  "package = jit2triton.load(sys.argv[1])\n"
                  "x, y = torch.randn(4, 8), torch.randn(4, 8)\n"
                  "torch.testing.assert_close(package(x, y), (x.relu() + 0.5 * y) * 2)\n"
                  "print('ok', package.runtime)\n", package)
    assert out.stdout.split() == ["ok", "cpp"], out.stdout + out.stderr


def test_the_cli_imports_the_library_it_is_told_to(package) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "jit2triton.cli", *args], capture_output=True, text=True,
                              timeout=600, env={**os.environ, "PYTHONPATH": HERE})

    refused = cli("run", package, "--runs", "1")
    assert refused.returncode != 0 and NOT_TORCHS in refused.stderr and "--import j2t_test_ops" in refused.stderr
    ran = cli("run", package, "--runs", "1", "--import", "j2t_test_ops")
    assert ran.returncode == 0 and "median time per call" in ran.stdout, ran.stderr
    timed = cli("bench", package, "--iterations", "3", "--warmup-ms", "0", "--profile", "--import", "j2t_test_ops")
    assert timed.returncode == 0, timed.stderr
    missing = cli("run", package, "--import", "no_such_module_here")
    assert missing.returncode == 2 and "cannot import 'no_such_module_here'" in missing.stderr


def test_converting_a_model_that_calls_a_library_op_names_the_library(tmp_path) -> None:
    """`jit2triton convert detector.pt` where nothing imported torchvision: torch.jit.load cannot read the model.
    The error names the library and `--import`, which converts it."""
    model = tmp_path / "model.pt"
    made = subprocess.run([sys.executable, "-c", "import sys, torch, j2t_test_ops, test_library_ops\n"
                           "torch.jit.save(torch.jit.script(test_library_ops.CallsALibraryOp()), sys.argv[1])",
                           str(model)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": HERE})
    assert made.returncode == 0, made.stderr

    def convert(*more: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "jit2triton.cli", "convert", str(model), "--input", "4x8",
                               "--input", "4x8", "--quiet", "-o", str(tmp_path / "model.j2t"), *more],
                              capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": HERE})

    refused = convert()
    assert refused.returncode != 0 and NOT_TORCHS in refused.stderr, refused.stderr
    assert "jit2triton convert --import j2t_test_ops" in refused.stderr and "torch.save" not in refused.stderr
    converted = convert("--import", "j2t_test_ops")
    assert converted.returncode == 0 and (tmp_path / "model.j2t").exists(), converted.stderr


def test_serve_refuses_a_package_whose_library_is_not_imported_before_starting_ray(package) -> None:
    """One line before any replica starts (each would fail alone, in Ray's logs); --import passes the check and is
    handed to each replica (deploy/serving/server.py)."""
    pytest.importorskip("ray")
    refused = subprocess.run([sys.executable, "-m", "jit2triton.cli", "serve", package, "--port", "1"],
                             capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": HERE})
    assert refused.returncode != 0 and NOT_TORCHS in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr


def test_a_plan_whose_ops_all_resolve_passes_the_check_and_a_library_op_is_named(package) -> None:
    from jit2triton.deploy.package import read_package
    from jit2triton.deploy.resolve import check_plan_ops

    plan = read_package(package).manifest["plan"]
    check_plan_ops(plan)  # (this process imported the library: the package fixture did)
    nested = {"steps": [{"kind": "if", "blocks": [{"steps": [{"kind": "call", "op": "no_such_library::op"}]}]}]}
    with pytest.raises(jit2triton.PackageError, match="belongs to the library no_such_library"):
        check_plan_ops(nested)
    check_plan_ops({"steps": [None, {"kind": "call"}]})  # (a damaged plan is the runtime's to refuse at load)
