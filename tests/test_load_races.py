"""A package is checked and used as the same bytes: another process writing the file while it loads (in place, or
by saving over its name) never gets its bytes run and never makes a good package fail (issue 34, items 1 and 6).

Each test races a writer process against a loop of loads for a bounded time (a few seconds) and asserts the
outcome of every load: before the fix, the swapped library ran within a few attempts and a load during a save
failed a few times in a hundred."""
from __future__ import annotations

import subprocess
import sys
import time

import torch

import jit2triton
from jit2triton.deploy.signing import generate_keys

from planted import planted_library

SECONDS = 2.5  # per race: enough for hundreds of loads of the small package

# Rewrites `length` bytes at `offset` of PATH alternately from two files, as fast as it can, until killed.
SWAPPER = r"""
import os, sys
path, offset = sys.argv[1], int(sys.argv[2])
first, second = open(sys.argv[3], "rb").read(), open(sys.argv[4], "rb").read()
fd = os.open(path, os.O_WRONLY)
print("ready", flush=True)
while True:
    os.pwrite(fd, first, offset)
    os.pwrite(fd, second, offset)
"""

# Saves two packages over PATH in turn, as save_package does (a temporary beside it, then a rename), until killed.
SAVER = r"""
import os, sys
path, packages = sys.argv[1], [open(p, "rb").read() for p in sys.argv[2:]]
print("ready", flush=True)
i = 0
while True:
    tmp = f"{path}.{os.getpid()}.partial"
    with open(tmp, "wb") as f:
        f.write(packages[i % len(packages)])
    os.replace(tmp, path)
    i += 1
"""

def _start(script: str, *args) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", script, *map(str, args)], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "ready"
    return process


def _stop(process: subprocess.Popen) -> None:
    process.kill()
    process.wait()


def test_a_library_swapped_in_while_a_signed_package_loads_never_runs(small_package, tmp_path, monkeypatch,
                                                                       cpp_runtime) -> None:
    private, public = generate_keys(tmp_path / "keys")
    path = tmp_path / "signed.j2t"
    jit2triton.load(small_package[0]).save(path, signing_key=private)
    reader = torch._C.PyTorchFileReader(str(path))
    offset = reader.get_record_offset("binaries/kernels.so")
    genuine = bytes(reader.get_record("binaries/kernels.so"))
    planted = planted_library(tmp_path)
    assert len(planted) <= len(genuine)  # written over the genuine bytes; the rest of them stays
    (tmp_path / "genuine.so").write_bytes(genuine)
    (tmp_path / "planted.so").write_bytes(planted)
    mark = tmp_path / "planted-ran"
    monkeypatch.setenv("J2T_PLANTED_MARK", str(mark))
    x, y = torch.randn(2, 4), torch.randn(2, 3)
    expected = small_package[1](x, y)
    swapper = _start(SWAPPER, path, offset, tmp_path / "planted.so", tmp_path / "genuine.so")
    loads = refused = 0
    try:
        end = time.monotonic() + SECONDS
        while time.monotonic() < end and not mark.exists():
            # an empty cache each time: nothing of an earlier load is reused (that is where the swap got in)
            monkeypatch.setenv("JIT2TRITON_CACHE", str(tmp_path / f"cache-{loads + refused}"))
            try:
                module = jit2triton.load(path, trusted_keys=[public])
            except (jit2triton.SignatureError, jit2triton.CorruptPackageError):
                refused += 1  # a package changing under the reader may be refused, never run
                continue
            torch.testing.assert_close(module(x, y), expected)
            loads += 1
    finally:
        _stop(swapper)
    assert not mark.exists(), f"the swapped-in library ran (after {loads} loads, {refused} refusals)"
    assert loads + refused > 20
    for cached in (tmp_path).glob("cache-*/cpp/lib-*.so"):  # whatever is cached holds what its name says
        import hashlib
        assert cached.name == f"lib-{hashlib.sha256(cached.read_bytes()).hexdigest()}.so"


def _linear_package(folder, name: str, features: int, seed: int):
    torch.manual_seed(seed)
    model = torch.jit.trace(torch.nn.Linear(features, 3).eval(), torch.randn(2, features))
    path = folder / f"{name}.j2t"
    jit2triton.convert(model, (torch.randn(2, features),)).save(path)
    return path, model


def test_loading_while_another_process_saves_the_same_path_never_fails(tmp_path, cpp_runtime) -> None:
    """Two packages of different input shapes saved over one name in turn: each load gets one of them whole (its
    signature and its plan from the same file), never a checksum failure or an input error."""
    first, second = _linear_package(tmp_path, "first", 4, 0), _linear_package(tmp_path, "second", 6, 1)
    models = {4: first[1], 6: second[1]}
    path = tmp_path / "served.j2t"
    path.write_bytes(first[0].read_bytes())
    saver = _start(SAVER, path, first[0], second[0])
    seen, failures = {4: 0, 6: 0}, []
    try:
        end = time.monotonic() + SECONDS
        while time.monotonic() < end:
            try:
                module = jit2triton.load(path)
                features = module.manifest["signature"]["inputs"][0]["shape"][1]
                x = torch.randn(2, features)
                torch.testing.assert_close(module(x), models[features](x))
                seen[features] += 1
            except jit2triton.Jit2TritonError as err:
                failures.append(f"{type(err).__name__}: {err}")
    finally:
        _stop(saver)
    assert not failures, (len(failures), sum(seen.values()), failures[:3])
    assert seen[4] + seen[6] > 20
