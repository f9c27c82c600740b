"""The C++ runtime (deploy/cpp), the one runtime, from Python and from C++.

Two ways in: the Python extension (`jit2triton.load(path, runtime="cpp")`: the whole plan runs in C++), and programs
built with CMake against libtorch, with no Python in the process (`j2t-run`, and the README's example program).
Each is compared with TorchScript on fresh random inputs; bad packages are refused with the Python loader's messages.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

import jit2triton
from jit2triton.deploy.cpp_runtime import ROOT
from jit2triton.inputs import random_inputs

from package_tools import (format_1_package, manifest_of, read_members, rewrite_package, torchscript_file,
                           write_members)
from helpers import (INTERPRETED, LONG_TESTS, assert_matches_on_cuda, assert_same_outputs, build, copied, cuda_zoo, fresh_calls,
                     on_gpu, to_device)
from models import MODELS, ModelSpec
from check_models import two_models_one_signature


def convert_and_save(spec: ModelSpec, tmp_path, backend=None):
    source, reference, example = build(spec, tmp_path)
    path = tmp_path / f"{spec.name}.j2t"
    jit2triton.convert(source, example_inputs=example, device="cpu", backend=backend).save(path)
    return path, reference, example


@pytest.mark.parametrize("spec", MODELS, ids=[s.name for s in MODELS])
def test_cpp_runtime_matches_torchscript(spec: ModelSpec, tmp_path, cpp_runtime) -> None:
    path, reference, example = convert_and_save(spec, tmp_path)
    module = jit2triton.load(path, runtime="cpp")
    for call in fresh_calls(spec, example):
        expected = reference(*copied(call))
        inputs = copied(call)
        actual = module(*inputs)
        assert_same_outputs(actual, expected, spec)
        for before, after in zip(call, inputs):
            if isinstance(before, torch.Tensor):
                assert torch.equal(before, after), "the C++ runtime changed an input"


@pytest.mark.parametrize("name", ["bert_encoder_layer", "scripted_loop_branch", "dict_outputs"])
def test_cpp_runtime_runs_aten_only_packages(name: str, tmp_path, cpp_runtime) -> None:
    spec = next(s for s in MODELS if s.name == name)
    path, reference, example = convert_and_save(spec, tmp_path, backend="aten")
    module = jit2triton.load(path, runtime="cpp")
    for call in fresh_calls(spec, example):
        assert_same_outputs(module(*copied(call)), reference(*copied(call)), spec)


def test_a_later_process_imports_the_built_runtime_without_build_tools(small_package, cpp_runtime) -> None:
    """Loading with the C++ runtime, once it is built, must not import torch's cpp_extension (setuptools: 120 ms, most
    of a cold start)."""
    path, traced = small_package
    code = ("import sys, torch, jit2triton; m = jit2triton.load(sys.argv[1]); "
            "assert m._runtime.name == 'cpp', m._runtime; m(torch.randn(2, 4), torch.randn(2, 3)); "
            "print('torch.utils.cpp_extension' in sys.modules)")
    env = dict(os.environ, JIT2TRITON_RUNTIME="auto")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split()[0] == "False", out.stdout + out.stderr


def test_cpp_runtime_reports_like_the_python_runtime(small_package, cpp_runtime) -> None:
    path, _ = small_package
    cpp, python = jit2triton.load(path, runtime="cpp"), jit2triton.load(path)
    assert cpp.signature() == python.signature() == cpp._runtime.module.signature()
    assert cpp.summary() == python.summary()
    assert cpp.device == torch.device("cpu")


# ---- bad packages and inputs: refusals, with messages that say what to do ----------------------------------------

def _truncated(path, tmp_path):
    data = path.read_bytes()
    out = tmp_path / "truncated.j2t"
    out.write_bytes(data[: len(data) // 2])
    return out


def _bad_weights(path, tmp_path):
    members = read_members(path)
    weights = bytearray(members["weights.bin"])
    weights[0] ^= 0xFF
    members["weights.bin"] = bytes(weights)
    out = tmp_path / "bad_weights.j2t"
    write_members(out, members)
    return out


def _edited(edit):
    def make(path, tmp_path):
        out = tmp_path / "edited.j2t"
        rewrite_package(path, out, edit_manifest=edit)
        return out
    return make


BAD_PACKAGES = {
    "missing": (lambda path, tmp_path: tmp_path / "nope.j2t", jit2triton.PackageError, "not found"),
    "truncated": (_truncated, jit2triton.CorruptPackageError, "truncated or corrupted"),
    "checksum": (_bad_weights, jit2triton.CorruptPackageError, "'weights.bin' fails its checksum"),
    "newer_format": (_edited(lambda m: m.update(format_version=99)), jit2triton.PackageVersionError,
                     "upgrade jit2triton"),
    "other_torch": (_edited(lambda m: m["producer"].update(torch="1.13.1")), jit2triton.PackageVersionError,
                    "torch 1.13.1"),
    "other_torch_minor": (_edited(lambda m: m["producer"].update(torch="2.99.0")), jit2triton.PackageVersionError,
                          "torch 2.99.0"),
    "format_zero": (_edited(lambda m: m.update(format_version=0)), jit2triton.CorruptPackageError,
                    "names a package format no jit2triton wrote"),
    "format_text": (_edited(lambda m: m.update(format_version="2")), jit2triton.CorruptPackageError,
                    "names a package format no jit2triton wrote"),
    "format_float": (_edited(lambda m: m.update(format_version=2.0)), jit2triton.CorruptPackageError,
                     "names a package format no jit2triton wrote"),
    "other_device": (_edited(lambda m: m.update(device="cuda")), jit2triton.PackageDeviceError, "no CUDA device"),
    "cpu_kernels_to_cuda": (_edited(lambda m: m.update(device="cpu")), jit2triton.PackageDeviceError,
                            "compiled for the CPU and run only there"),
    "torchscript_file": (lambda path, tmp_path: torchscript_file(tmp_path), jit2triton.PackageError,
                         "is a TorchScript archive (or a torch.save file), not a jit2triton package"),
    "format_1": (lambda path, tmp_path: format_1_package(path, tmp_path), jit2triton.PackageVersionError,
                 "is a package of format 1"),
}


@pytest.mark.parametrize("case", sorted(BAD_PACKAGES))
def test_bad_packages_are_refused_with_the_python_message(case, small_package, tmp_path, cpp_runtime) -> None:
    make, error, message = BAD_PACKAGES[case]
    if case == "other_device" and torch.cuda.is_available():
        pytest.skip("this machine has the CUDA device the package asks for")
    bad = make(small_package[0], tmp_path)
    where = "cuda" if case == "cpu_kernels_to_cuda" else None
    with pytest.raises(error, match=re.escape(message)) as from_cpp:
        jit2triton.load(bad, runtime="cpp", map_location=where)
    with pytest.raises(error) as from_python:
        jit2triton.load(bad, map_location=where)
    assert str(from_cpp.value) == str(from_python.value)  # both read through torch's archive reader


BAD_INPUTS = {
    "count": ((torch.randn(2, 4),), r"expected 2 inputs \(x, y\), got 1"),
    "shape": ((torch.randn(2, 4), torch.randn(5, 3)), r"input 1 \('y'\): expected float32\[2, 3\] on cpu, got float32\[5, 3\]"),
    "dtype": ((torch.randn(2, 4).half(), torch.randn(2, 3)), r"input 0 \('x'\): expected float32\[2, 4\] on cpu, got float16"),
    "device": ((torch.randn(2, 4, device="meta"), torch.randn(2, 3)), r"input 0 \('x'\).* on meta"),
    "not_a_tensor": (("x", torch.randn(2, 3)), "expected a tensor"),
    "sparse": ((torch.randn(2, 4).to_sparse(), torch.randn(2, 3)),
               r"input 0 \('x'\): expected a dense tensor float32\[2, 4\] on cpu, got a torch.sparse_coo tensor"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_inputs_get_the_python_message(case, small_package, cpp_runtime) -> None:
    inputs, message = BAD_INPUTS[case]
    with pytest.raises(jit2triton.InputError, match=message) as from_cpp:
        jit2triton.load(small_package[0], runtime="cpp")(*inputs)
    with pytest.raises(jit2triton.InputError) as from_python:
        jit2triton.load(small_package[0])(*inputs)
    assert str(from_cpp.value) == str(from_python.value)


def test_a_failing_op_names_the_op_and_source(tmp_path, cpp_runtime) -> None:
    @torch.jit.script
    def pick(x, i: int):
        return x[i]

    path = tmp_path / "pick.j2t"
    jit2triton.convert(pick, example_inputs=(torch.randn(3), 1)).save(path)
    module = jit2triton.load(path, runtime="cpp")
    assert torch.equal(module(torch.arange(3.0), 2), torch.tensor(2.0))
    with pytest.raises(jit2triton.Jit2TritonError, match=r"aten::select.int failed \(model source"):
        module(torch.randn(3), 7)


def test_a_scalar_input_that_sets_a_kernel_input_shape_is_served(tmp_path, cpp_runtime) -> None:
    """Conversion runs the model at other values of `n`, so no kernel is fitted to the example's (a size the package
    did fix is a SizeChangedError in the runtime: tests/test_fixed_sizes.py)."""
    @torch.jit.script
    def tile(x, n: int):
        return x.repeat(n + 1, 1) * 2.0 + 1.0

    path = tmp_path / "tile.j2t"
    jit2triton.convert(tile, example_inputs=(torch.randn(3, 4), 2)).save(path)
    module = jit2triton.load(path, runtime="cpp")
    for n in (2, 0, 5):
        x = torch.randn(3, 4)
        torch.testing.assert_close(module(x, n), tile(x, n))


# ---- no Python in the process: the CMake build, j2t-run and the README's example program -------------------------

@pytest.fixture(scope="session")
def cmake_build(tmp_path_factory):
    """The README's example project, built with CMake: it builds the runtime library and j2t-run as a subproject."""
    if not LONG_TESTS and not torch.cuda.is_available():  # (80 s of CI's 20 minutes; the GPU checks always build it)
        pytest.skip("a long test (the CMake build): set JIT2TRITON_LONG_TESTS=1 to run it")
    if shutil.which("cmake") is None:
        pytest.skip("CMake is not installed: the C++ loader's CMake build cannot be tested here")
    build_dir = tmp_path_factory.mktemp("cpp_build")
    configure = ["cmake", "-S", os.path.join(ROOT, "example"), "-B", str(build_dir),
                 f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}", f"-DJIT2TRITON_DIR={ROOT}"]
    for command in (configure, ["cmake", "--build", str(build_dir), "-j", str(os.cpu_count() or 2)]):
        done = subprocess.run(command, capture_output=True, text=True)
        assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return build_dir


def _no_python_env() -> dict:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    return env


@pytest.mark.parametrize("name", ["numpy_fn", "small_cnn_bn_se", "bert_encoder_layer", "scripted_loop_branch",
                                  "int_bool_inputs_embedding_gather_topk", "tuple_outputs", "lstm_two_layers"])
def test_j2t_run_matches_torchscript(name: str, tmp_path, cmake_build) -> None:
    spec = next(s for s in MODELS if s.name == name)
    path, reference, _ = convert_and_save(spec, tmp_path)
    seed = 7
    done = subprocess.run([str(cmake_build / "jit2triton" / "j2t-run"), str(path), "--seed", str(seed),
                           "--dump", str(tmp_path), "--bench", "3", "--profile", "--threads", "1"],
                          capture_output=True, text=True, env=_no_python_env())
    assert done.returncode == 0, done.stderr
    assert " on cpu, 1 threads\n" in done.stdout, done.stdout  # torch's threads too, as bench --threads sets them
    assert re.search(r"j2t-run +min \S+ +mean \S+ +median \S+ +p90 \S+ +p99 \S+ +max \S+ ms +\(3 calls",
                     done.stdout), done.stdout  # as `jit2triton bench` prints it
    profile = done.stdout[done.stdout.index("profile: the C++ runtime, 3 calls"):].splitlines()
    shares = [float(line.split("%")[0]) for line in profile[2:]]  # each step's share, as bench prints them
    assert shares and 99 <= sum(shares) <= 101, profile
    signature = manifest_of(path)["signature"]
    inputs = random_inputs(signature["inputs"], "cpu", seed)  # the same draws j2t-run made
    expected = reference(*inputs)
    flat = []

    def flatten(v):
        if isinstance(v, torch.Tensor):
            flat.append(v)
        elif isinstance(v, (tuple, list)):
            for x in v:
                flatten(x)
        elif isinstance(v, dict):
            for x in v.values():
                flatten(x)

    flatten(expected)
    for i, want in enumerate(flat):
        want = want.detach().contiguous()
        raw = np.fromfile(tmp_path / f"output_{i}.bin", dtype=np.uint8)
        got = torch.from_numpy(raw).view(want.dtype).reshape(want.shape)
        assert f"output {i}:" in done.stdout
        torch.testing.assert_close(got, want, rtol=spec.rtol, atol=spec.atol)


def test_j2t_run_serves_dynamic_dims_at_the_sizes_asked(tmp_path, cmake_build) -> None:
    class Model(torch.nn.Module):
        def forward(self, x):
            return torch.tanh(x).sum(-1) * x.shape[1]

    example = (torch.randn(2, 5, 3),)
    dims = {"x": {0: jit2triton.Dim("B", max=16), 1: jit2triton.Dim("S", max=64)}}
    model = torch.jit.trace(Model(), example)
    path = tmp_path / "dynamic.j2t"
    jit2triton.convert(model, example, dynamic_shapes=dims).save(path)
    run = str(cmake_build / "jit2triton" / "j2t-run")
    done = subprocess.run([run, str(path), "--shape", "B=3,S=17", "--seed", "4", "--dump", str(tmp_path)],
                          capture_output=True, text=True, env=_no_python_env())
    assert done.returncode == 0, done.stderr
    assert "signature (x: float32[B, S, 3]) -> float32[B, S]" in done.stdout
    (x,) = random_inputs(manifest_of(path)["signature"]["inputs"], "cpu", 4, {"B": 3, "S": 17})
    got = torch.from_numpy(np.fromfile(tmp_path / "output_0.bin", dtype=np.float32)).reshape(3, 17)
    torch.testing.assert_close(got, model(x))
    done = subprocess.run([run, str(path), "--shape", "B=30"], capture_output=True, text=True, env=_no_python_env())
    assert done.returncode != 0 and "dim 'B' takes sizes 1..16, not 30" in done.stderr
    done = subprocess.run([run, str(path), "--shape", "Q=3"], capture_output=True, text=True, env=_no_python_env())
    assert done.returncode != 0 and "no dynamic dim 'Q'" in done.stderr


def test_j2t_run_refuses_a_corrupt_package(small_package, tmp_path, cmake_build) -> None:
    bad = _bad_weights(small_package[0], tmp_path)
    done = subprocess.run([str(cmake_build / "jit2triton" / "j2t-run"), str(bad)], capture_output=True, text=True)
    assert done.returncode == 2
    assert "'weights.bin' fails its checksum" in done.stderr


def test_j2t_run_answers_help_and_version(cmake_build) -> None:
    tool = str(cmake_build / "jit2triton" / "j2t-run")
    helped = subprocess.run([tool, "--help"], capture_output=True, text=True)
    assert helped.returncode == 0 and helped.stdout.startswith("usage: j2t-run model.j2t")
    version = subprocess.run([tool, "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and "package format 2" in version.stdout and torch.__version__.split("+")[0] in \
        version.stdout


def test_j2t_run_names_what_is_wrong_in_one_line(small_package, tmp_path, cmake_build) -> None:
    tool, (path, traced) = str(cmake_build / "jit2triton" / "j2t-run"), small_package
    reference = tmp_path / "small.pt"
    torch.jit.save(traced, reference)
    (tmp_path / "junk.pt").write_text("not an archive")
    for args, expected in [([path, "--bogus", "1"], "unknown option --bogus"), (["--bogus"], "unknown option --bogus"),
                           ([path, "--device"], "--device needs a value"),
                           ([path, "--torchscript", path], "is a jit2triton package; give the TorchScript .pt"),
                           ([path, "--torchscript", tmp_path / "junk.pt"], "is not a TorchScript archive")]:
        done = subprocess.run([tool] + [str(a) for a in args], capture_output=True, text=True, env=_no_python_env())
        assert done.returncode == 2 and expected in done.stderr, (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    done = subprocess.run([tool, str(path), "--torchscript", str(reference), "--bench", "3", "--warmup-ms", "0"],
                          capture_output=True, text=True, env=_no_python_env())
    assert done.returncode == 0, done.stderr
    assert re.search(r"torch.jit +min .* ms +\(3 calls", done.stdout) and "median speed-up over torch.jit: " in \
        done.stdout, done.stdout


def test_j2t_run_torchscript_fails_with_exit_code_3_on_another_model_of_the_same_signature(tmp_path,
                                                                                         cmake_build) -> None:
    tool = str(cmake_build / "jit2triton" / "j2t-run")
    package, right, other = two_models_one_signature(tmp_path)
    done = subprocess.run([tool, str(package), "--torchscript", str(other)], capture_output=True, text=True,
                          env=_no_python_env())
    assert done.returncode == 3, done.stdout + done.stderr  # policy.OUTPUTS_DIFFER, as `jit2triton run --check`
    assert "output 0 float32[2, 4]: max abs error" in done.stdout and "DIFFERS" in done.stdout
    assert len(done.stderr.strip().splitlines()) == 1 and "beyond the tolerance at output 0" in done.stderr
    for tolerance, reference in [([], right), (["--rtol", "100"], other), (["--rtol", "0", "--atol", "100"], other)]:
        done = subprocess.run([tool, str(package), "--torchscript", str(reference)] + tolerance, capture_output=True,
                              text=True, env=_no_python_env())
        assert done.returncode == 0 and "outputs match" in done.stdout, (tolerance, done.stdout + done.stderr)
    helped = subprocess.run([tool, "--help"], capture_output=True, text=True).stdout
    assert "--rtol" in helped and "3 --torchscript: the outputs" in " ".join(helped.split())


def test_j2t_run_refuses_bad_numbers_and_a_missing_dump_folder(small_package, tmp_path, cmake_build) -> None:
    tool, path = str(cmake_build / "jit2triton" / "j2t-run"), str(small_package[0])
    (tmp_path / "a_file").write_text("")
    for args, expected in [(["--bench", "abc"], "--bench takes a whole number, 1 or more, not 'abc'"),
                           (["--bench", "0"], "--bench takes a whole number, 1 or more, not '0'"),
                           (["--bench", "3x"], "not '3x'"), (["--threads", "0"], "--threads takes a whole number"),
                           (["--seed", "-1"], "--seed takes a whole number 0 or more"),
                           (["--warmup-ms", "soon"], "--warmup-ms takes a number"),
                           (["--rtol", "0.1"], "give --torchscript M.pt too"),
                           (["--dump", str(tmp_path / "missing")], "is not an existing folder"),
                           (["--dump", str(tmp_path / "a_file")], "is not an existing folder")]:
        done = subprocess.run([tool, path] + args, capture_output=True, text=True, env=_no_python_env())
        assert done.returncode == 2 and expected in done.stderr, (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1 and not done.stdout, (args, done.stdout)


def test_readme_example_program_matches_torchscript(tmp_path, cmake_build) -> None:
    torch.manual_seed(0)
    model = torch.jit.trace(torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.GELU()).eval(), torch.randn(2, 4))
    path = tmp_path / "model.j2t"
    jit2triton.convert(model, example_inputs=(torch.randn(2, 4),)).save(path)
    done = subprocess.run([str(cmake_build / "run_model"), str(path)], capture_output=True, text=True,
                          env=_no_python_env())
    assert done.returncode == 0, done.stderr
    torch.manual_seed(0)  # the program draws its input from torch's CPU generator seeded with 0
    expected = model(torch.randn(2, 4))
    printed = [float(v) for v in re.findall(r"-?\d+\.\d+(?:e[-+]\d+)?", done.stdout.split("\n", 1)[1].split("[")[0])]
    assert len(printed) == expected.numel()
    torch.testing.assert_close(torch.tensor(printed).reshape(expected.shape), expected.detach(), rtol=1e-3, atol=1e-3)


# ---- CUDA: GPU packages through the C++ runtime (run on the GPU machine) ------------------------------------------

@on_gpu
@pytest.mark.parametrize("spec, cuda_graphs", cuda_zoo())
def test_gpu_package_through_the_cpp_runtime_matches_torchscript(spec, cuda_graphs, tmp_path, monkeypatch,
                                                                 cpp_runtime):
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # as in test_triton_backend: full float32
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    source, reference, example = build(spec, tmp_path)
    path = tmp_path / f"{spec.name}.j2t"
    jit2triton.convert(source, example_inputs=to_device(example, "cuda"), device="cuda").save(path)
    loaded = jit2triton.load(path, runtime="cpp", cuda_graphs=cuda_graphs)
    assert loaded._runtime.uses_cuda_graph == (cuda_graphs and loaded.manifest["cuda_graph"])
    assert_matches_on_cuda(loaded, spec, example, reference)


@on_gpu
def test_j2t_run_runs_a_gpu_package(tmp_path, cmake_build):
    spec = next(s for s in MODELS if s.name == "bert_encoder_layer")
    source, reference, example = build(spec, tmp_path)
    path = tmp_path / "bert.j2t"
    jit2triton.convert(source, example_inputs=to_device(example, "cuda"), device="cuda").save(path)
    done = subprocess.run([str(cmake_build / "jit2triton" / "j2t-run"), str(path), "--dump", str(tmp_path),
                           "--bench", "20"], capture_output=True, text=True, env=_no_python_env())
    assert done.returncode == 0, done.stderr
    assert "on cuda:0" in done.stdout
    signature = manifest_of(path)["signature"]
    inputs = random_inputs(signature["inputs"], "cpu", 0)
    expected = reference(*inputs)
    raw = np.fromfile(tmp_path / "output_0.bin", dtype=np.float32)
    torch.testing.assert_close(torch.from_numpy(raw).reshape(expected.shape), expected, rtol=1e-4, atol=1e-4)


def test_the_default_load_runs_the_cpp_runtime_and_the_python_runtime_is_retired(small_package, cpp_runtime,
                                                                                monkeypatch) -> None:
    path, traced = small_package
    x, y = torch.randn(2, 4), torch.randn(2, 3)
    module = jit2triton.load(path)
    assert module.runtime == "cpp"
    torch.testing.assert_close(module(x, y), traced(x, y))
    monkeypatch.setenv("JIT2TRITON_RUNTIME", "python")
    with pytest.raises(ValueError, match="the Python runtime is retired"):
        jit2triton.load(path)
    assert jit2triton.load(path, runtime="cpp").runtime == "cpp"  # an explicit choice wins over the environment
    with pytest.raises(ValueError, match="runtime must be one of auto, cpp"):
        jit2triton.load(path, runtime="rust")


def test_without_a_cpp_runtime_load_says_what_to_install(small_package, monkeypatch) -> None:
    """No compiler here and no fitting build in the package: a clear error, for load and serving alike (one choice,
    deploy/runtime_choice.py)."""
    from jit2triton.deploy import cpp_runtime
    from jit2triton.deploy.serving.server import load_for_serving
    monkeypatch.setattr(cpp_runtime, "unavailable", lambda *package: "no C++ compiler on this machine")
    path = small_package[0]
    for load in (jit2triton.load, load_for_serving):
        with pytest.raises(jit2triton.RuntimeUnavailableError,
                           match="no C\\+\\+ compiler on this machine. Install a C\\+\\+17 compiler"):
            load(path)
    with pytest.raises(ValueError, match="runtime must be one of auto, cpp"):
        load_for_serving(path, runtime="rust")


def test_serving_in_the_cpp_runtime_reads_the_manifest_it_loaded(small_package, cpp_runtime) -> None:
    from jit2triton.deploy.serving.server import load_for_serving
    model, manifest = load_for_serving(small_package[0], runtime="cpp")
    assert model.name == "cpp" and manifest == manifest_of(small_package[0])


@pytest.mark.skipif(not INTERPRETED, reason="a Triton package on the CPU runs under Triton's interpreter")
def test_a_triton_package_on_the_cpu_loads_in_the_cpp_runtime_by_default(tmp_path, cpp_runtime) -> None:
    """Its kernels run under Triton's interpreter, called back from the C++ plan: no fallback, and conversion
    verified that runtime too."""
    example = (torch.randn(3, 5),)
    model = torch.jit.trace(lambda x: torch.sin(x) * 2, example)
    path = tmp_path / "interpreted.j2t"
    converted = jit2triton.convert(model, example_inputs=example, backend="triton")
    assert converted.runtime == "cpp" and converted.summary()["verification"]["runtime"] == "cpp"
    converted.save(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no fallback notice)
        module = jit2triton.load(path)
    assert module.runtime == "cpp"
    x = torch.randn(3, 5)
    torch.testing.assert_close(module(x), model(x))


def test_a_module_the_cpp_runtime_loaded_reports_and_saves_after_its_file_is_gone(small_package, tmp_path,
                                                                                  cpp_runtime) -> None:
    """(the demo loads from a temporary folder, removed before it prints the report)"""
    path, traced = small_package
    moved = tmp_path / "gone.j2t"
    shutil.copy(path, moved)
    module = jit2triton.load(moved)
    assert module.runtime == "cpp"
    os.remove(moved)
    assert module.summary()["verification"]["status"] == "passed" and "cpu" in module.report()
    module.save(tmp_path / "again.j2t")
    x, y = torch.randn(2, 4), torch.randn(2, 3)
    torch.testing.assert_close(jit2triton.load(tmp_path / "again.j2t")(x, y), traced(x, y))
    torch.testing.assert_close(module(x, y), traced(x, y))


@torch.jit.script
def _looped(x, w):
    for _ in range(5):
        x = torch.sin(x) * 2.0
    return x @ w


def test_observe_hands_over_every_step_s_outputs_in_the_order_made(tmp_path, cpp_runtime) -> None:
    """Module::observe, the culprit search's view of the package (deploy/packaging/culprit.py): each step's node and
    outputs, in the order the steps ran, a loop's iterations apart up to the cap per node, tensors copied (a later
    step reusing the memory changes nothing handed over)."""
    from jit2triton.deploy.cpp_runtime import CppRuntime
    example = (torch.randn(3, 4), torch.randn(4, 2))
    jit2triton.convert(_looped, example).save(tmp_path / "m.j2t")
    module = CppRuntime(str(tmp_path / "m.j2t"), cuda_graphs=False).module
    manifest = json.loads(module.member("manifest.json"))
    x, w = torch.randn(3, 4), torch.randn(4, 2)
    seen = module.observe([x, w], 3)
    nodes = [manifest["nodes"][node] for node, _ in seen]
    kernels = [outputs[0] for (node, outputs), info in zip(seen, nodes) if info.get("kernel")]
    assert len(kernels) == 3  # five iterations, three handed over
    expected = x
    for made in kernels:
        expected = torch.sin(expected) * 2.0
        torch.testing.assert_close(made, expected)
    loop = next(outputs for (node, outputs), info in zip(seen, nodes) if info["op"] == "prim::Loop")
    matmul = next(outputs for (node, outputs), info in zip(seen, nodes) if info["op"] == "aten::matmul")
    torch.testing.assert_close(matmul[0], _looped(x, w))
    torch.testing.assert_close(loop[-1] @ w, matmul[0])
    assert [info["op"] for info in nodes][-1] == "aten::matmul"  # (the order they ran)


def test_without_a_cpp_runtime_conversion_says_what_to_install(monkeypatch) -> None:
    """Conversion verifies a package in the runtime that ships it: where that runtime cannot be had, it says so
    rather than verifying elsewhere."""
    from jit2triton.deploy import cpp_runtime
    monkeypatch.setattr(cpp_runtime, "unavailable", lambda *package: "no C++ compiler on this machine")
    with pytest.raises(jit2triton.ConversionError, match="in the C\\+\\+ runtime that runs it, which cannot be built "
                                                         "here: no C\\+\\+ compiler on this machine"):
        jit2triton.convert(torch.jit.trace(lambda x: torch.sin(x) * 2.0, (torch.randn(3),)), (torch.randn(3),))
