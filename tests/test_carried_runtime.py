"""A package carries the C++ runtime build that verified it (issue 45: one runtime of record), so a machine that
cannot build the runtime (no compiler, no ninja: a slim deployment image) runs the package in the C++ runtime all the
same, where the build fits (these sources, this torch, this Python); where none fits, load says what to install.
The machine without a compiler is a child process whose PATH holds nothing and whose jit2triton cache is empty."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import jit2triton
from jit2triton.deploy import cpp_runtime

from package_tools import read_members, write_members

CHILD = textwrap.dedent("""
    import sys, warnings
    import torch
    import jit2triton
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            module = jit2triton.load(sys.argv[1])
        except jit2triton.RuntimeUnavailableError as err:
            print("RuntimeUnavailableError", str(err).replace(chr(10), " "))
            sys.exit(0)
    reference = torch.jit.load(sys.argv[2], map_location=sys.argv[3])
    worst = 0.0
    for seed in range(3):
        x = torch.randn(3, 8, generator=torch.Generator().manual_seed(seed)).to(sys.argv[3])
        worst = max(worst, (module(x) - reference(x)).abs().max().item())
    print("runtime", module.runtime, "worst", worst)
    for w in caught:
        print("warning", str(w.message).replace(chr(10), " "))
""")


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 16)

    def forward(self, x):
        return torch.nn.functional.gelu(self.linear(x)).sum(-1, keepdim=True) * torch.sigmoid(x)


DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA")])]


@pytest.fixture(scope="module", params=DEVICES)
def converted(request, tmp_path_factory):
    device = request.param
    folder = tmp_path_factory.mktemp(f"carried_{device}")
    model = torch.jit.script(Model().eval()).to(device)
    torch.jit.save(model, str(folder / "model.pt"))
    module = jit2triton.convert(model, (torch.randn(3, 8, device=device),), device=device)
    module.save(str(folder / "model.j2t"))
    return folder, module, device


def _without_a_compiler(tmp_path, package, reference, device: str) -> str:
    """The child's output, run where no compiler, ninja or earlier build of the runtime can be found."""
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    (tmp_path / "bin").mkdir()
    (tmp_path / "cache").mkdir()
    env = {"PATH": str(tmp_path / "bin"), "HOME": str(tmp_path), "JIT2TRITON_CACHE": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run([sys.executable, str(script), str(package), str(reference), device], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _rewritten(src, dst, change) -> None:
    """The package with its members changed by `change`, its checksums made to fit (as anyone editing it can)."""
    members = read_members(src)
    members.pop("checksums.json")
    change(members)
    members["checksums.json"] = json.dumps({n: hashlib.sha256(d).hexdigest() for n, d in members.items()}).encode()
    write_members(dst, members)


def test_a_package_carries_the_runtime_build_that_verified_it(converted):
    folder, module, _ = converted
    assert module.summary()["verification"]["runtime"] == "cpp"
    carried = {n: d for n, d in read_members(folder / "model.j2t").items() if n.startswith(cpp_runtime.CARRIED)}
    assert list(carried) == [f"{cpp_runtime.CARRIED}{cpp_runtime.build_name(cpp_runtime.with_cuda())}.so"]
    assert cpp_runtime.carried_member() == next(iter(carried.items()))


def test_a_machine_without_a_compiler_runs_the_carried_runtime(converted, tmp_path):
    folder, _, device = converted
    out = _without_a_compiler(tmp_path, folder / "model.j2t", folder / "model.pt", device)
    runtime, worst = out.split()[1], float(out.split()[3])
    assert runtime == "cpp" and worst < 1e-4, out
    assert "warning" not in out, out


@pytest.mark.parametrize("change", ["absent", "another build"])
def test_without_a_fitting_build_load_says_what_to_install(converted, tmp_path, change):
    folder, _, device = converted
    package = tmp_path / "edited.j2t"

    def edit(members):
        name = next(n for n in members if n.startswith(cpp_runtime.CARRIED))
        data = members.pop(name)
        if change == "another build":  # (built from other sources, or for another torch or Python)
            members[f"{cpp_runtime.CARRIED}jit2triton_runtime_0123456789abcdef.so"] = data
    _rewritten(folder / "model.j2t", package, edit)
    out = _without_a_compiler(tmp_path, package, folder / "model.pt", device)
    assert "RuntimeUnavailableError" in out and "Install a C++17 compiler" in out, out
    assert "carries no C++ runtime built from this jit2triton" in out, out
