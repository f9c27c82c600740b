"""The backend records (emitters/backends.py) are the one list of kernel backends: the CLI offers their names,
each Python loader they name exists, and the C++ runtime's table of loaders (plan.cpp) names the same backends
with the same loaders."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import jit2triton
from jit2triton.emitters.backends import BACKENDS, NAMES, backend_for, backend_named, default_for
from jit2triton.errors import ConversionError

from package_tools import rewrite_package

PLAN_CPP = Path(__file__).resolve().parents[1] / "deploy" / "cpp" / "src" / "plan.cpp"


def cpp_kernel_backends() -> dict[str, str]:
    table = re.search(r"kKernelBackends\[\] = \{(.*?)\n\};", PLAN_CPP.read_text(), re.S)
    assert table, "plan.cpp has no kKernelBackends table"
    return dict(re.findall(r'\{"(\w+)", (\w+)\}', table.group(1)))


def test_the_cpp_runtime_loads_the_backends_the_records_name() -> None:
    assert cpp_kernel_backends() == {b.name: b.cpp_loader for b in BACKENDS.values() if b.cpp_loader}


def test_a_backend_that_generates_kernels_writes_its_own_section_and_loads_them() -> None:
    for backend in BACKENDS.values():
        generates = backend.generates_kernels
        assert (backend.section == backend.name) == generates
        assert (backend.cpp_loader is not None) == generates
        assert (backend.render is not None) == (backend.compile is not None) == generates


def test_the_cli_offers_the_backends() -> None:
    from jit2triton.cli import convert
    option = next(p for p in convert.params if p.name == "backend")
    assert tuple(option.type.choices) == NAMES


def test_an_unknown_backend_is_refused_by_name() -> None:
    with pytest.raises(ConversionError, match="unknown backend 'cuda'.*cpp, triton, aten"):
        backend_named("cuda")


def test_each_device_has_one_default_backend_and_a_backend_refuses_a_device_it_cannot_run_on() -> None:
    """The records answer which backend a device takes and which devices a backend supports: conversion asks them
    (no second list or if-chain in the face)."""
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert (default_for(cpu).name, default_for(cuda).name) == ("cpp", "triton")
    assert [b.name for b in BACKENDS.values() if b.supports(cuda)] == ["triton", "aten"]
    assert backend_for(None, cpu).name == "cpp" and backend_for("aten", cuda).name == "aten"
    with pytest.raises(ConversionError, match=r"C\+\+ backend generates CPU kernels; use device='cpu'"):
        backend_for("cpp", cuda)
    with pytest.raises(ConversionError, match="no backend generates kernels for device 'meta'"):
        backend_for(None, torch.device("meta"))


def test_the_runtime_refuses_a_backend_it_does_not_know(small_package, tmp_path, cpp_runtime) -> None:
    edited = tmp_path / "metal.j2t"
    rewrite_package(small_package[0], edited, edit_manifest=lambda m: m.update(backend="metal"))
    with pytest.raises(jit2triton.PackageVersionError, match="kernel backend 'metal'.*upgrade jit2triton"):
        jit2triton.load(edited)


def test_the_cpp_runtime_runs_cpu_triton_kernels_under_tritons_interpreter(cpp_runtime, tmp_path,
                                                                           monkeypatch) -> None:
    """From Python the C++ runtime hands a CPU Triton kernel's launches to Triton's interpreter; where that is off in
    the process, it refuses the package, saying how to turn it on."""
    pytest.importorskip("triton")
    from jit2triton.emitters import compile_triton
    model = torch.jit.trace(lambda x: torch.sigmoid(x) * 2, torch.randn(3, 5))
    path = tmp_path / "triton.j2t"
    jit2triton.convert(model, (torch.randn(3, 5),), backend="triton", verify=False).save(path)
    if compile_triton.interpreter_active():
        module = jit2triton.load(path, runtime="cpp")
        x = torch.randn(3, 5)
        assert module.runtime == "cpp"
        torch.testing.assert_close(module(x), model(x))
    monkeypatch.setattr(compile_triton, "interpreter_active", lambda: False)
    with pytest.raises(jit2triton.PackageDeviceError, match="Triton's interpreter, which is off in this process"):
        jit2triton.load(path, runtime="cpp")
