"""Signed packages (deploy/signing.py, deploy/cpp/src/signing.cpp): with trusted keys set, load takes only a
package one of the keys signed, and refuse an unsigned, re-signed or tampered one before anything in it is read or
run; without keys, packages load as before."""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess

import pytest
import torch
from click.testing import CliRunner

import jit2triton
from jit2triton.cli import main
from jit2triton.deploy.signing import SIGNATURE_MEMBER, generate_keys

from package_tools import read_members, rewrite_package


@pytest.fixture
def keys(tmp_path):
    """Two key pairs: (private, public) of the signer, and of a stranger."""
    return generate_keys(tmp_path / "signer"), generate_keys(tmp_path / "stranger")


@pytest.fixture
def signed(small_package, keys, tmp_path):
    """The small package, signed by the signer: (path, torchscript model)."""
    path = tmp_path / "signed.j2t"
    jit2triton.load(small_package[0]).save(path, signing_key=keys[0][0])
    return path, small_package[1]


def _check_runs(module, model) -> None:
    x, y = torch.randn(2, 4), torch.randn(2, 3)
    torch.testing.assert_close(module(x, y), model(x, y))


def _refusal(path, keys) -> str:
    with pytest.raises(jit2triton.SignatureError) as err:
        jit2triton.load(path, trusted_keys=keys)
    return str(err.value)


def test_keygen_writes_a_private_key_only_its_owner_reads_and_never_overwrites(tmp_path) -> None:
    private, public = generate_keys(tmp_path / "k")
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o600
    assert open(private).read().startswith("-----BEGIN PRIVATE KEY-----")
    assert open(public).read().startswith("-----BEGIN PUBLIC KEY-----")
    before = open(private).read()
    with pytest.raises(jit2triton.SignatureError, match="exists"):
        generate_keys(tmp_path / "k")
    assert open(private).read() == before
    generate_keys(tmp_path / "k", overwrite=True)
    assert open(private).read() != before


def test_a_package_signed_by_a_trusted_key_loads_and_runs(signed, keys, cpp_runtime) -> None:
    module = jit2triton.load(signed[0], trusted_keys=[keys[1][1], keys[0][1]])
    assert module.runtime == "cpp"
    _check_runs(module, signed[1])


def test_without_trusted_keys_signed_and_unsigned_packages_load_as_before(signed, small_package, cpp_runtime) -> None:
    for path in (signed[0], small_package[0]):
        _check_runs(jit2triton.load(path), signed[1])


def test_an_unsigned_package_is_refused_when_keys_are_trusted(small_package, keys, cpp_runtime) -> None:
    assert "is not signed" in _refusal(small_package[0], [keys[0][1]])


def test_a_package_signed_by_another_key_is_refused(signed, keys, cpp_runtime) -> None:
    assert "by none of the trusted keys" in _refusal(signed[0], [keys[1][1]])


def _tampered_weights(members):
    blob = bytearray(members["weights.bin"])
    blob[0] ^= 0x40
    return "weights.bin", bytes(blob)


def _tampered_manifest(members):
    manifest = json.loads(members["manifest.json"])
    manifest["model"]["name"] = "evil"
    return "manifest.json", json.dumps(manifest).encode()


@pytest.mark.parametrize("edit", [_tampered_weights, _tampered_manifest])
def test_a_signed_package_changed_and_re_checksummed_is_refused(edit, signed, keys, tmp_path, cpp_runtime) -> None:
    """rewrite_package recomputes checksums.json, as anyone who edits a package can; the old signature stays."""
    tampered = tmp_path / "tampered.j2t"
    rewrite_package(signed[0], tampered, edit_member=edit)
    assert SIGNATURE_MEMBER in read_members(tampered)
    jit2triton.load(tampered)  # without keys the checksums pass: only the signature catches it
    assert "changed after signing" in _refusal(tampered, [keys[0][1]])


def test_a_forged_signature_of_any_length_is_refused_not_a_crash(signed, keys, tmp_path, cpp_runtime) -> None:
    for forged in (b"", b"\0" * 64, b"\xff" * 63, read_members(signed[0])[SIGNATURE_MEMBER] * 2):
        path = tmp_path / "forged.j2t"
        rewrite_package(signed[0], path, edit_member=lambda m: (SIGNATURE_MEMBER, forged))
        assert "by none of the trusted keys" in _refusal(path, [keys[0][1]])


def test_no_code_from_a_tampered_package_runs(signed, keys, tmp_path, monkeypatch, cpp_runtime) -> None:
    """A kernel library replaced by one whose constructor writes a file, checksums recomputed: with the signer's
    key trusted, the load is refused and the constructor never runs (nor does a build from the package's source)."""
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        pytest.skip("no C++ compiler to build the planted library")
    marker = tmp_path / "constructor-ran"
    source = tmp_path / "evil.c"
    source.write_text('#include <stdio.h>\n__attribute__((constructor)) static void run(void) {\n'
                      f'  FILE* f = fopen("{marker}", "w"); if (f) fclose(f);\n}}\n')
    library = tmp_path / "evil.so"
    subprocess.run([compiler, "-x", "c", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    monkeypatch.setenv("JIT2TRITON_CACHE", str(tmp_path / "cache"))
    tampered = tmp_path / "tampered.j2t"
    rewrite_package(signed[0], tampered, edit_member=lambda m: ("binaries/kernels.so", library.read_bytes()))
    _refusal(tampered, [keys[0][1]])
    assert not marker.exists()
    result = CliRunner().invoke(main, ["inspect", str(tampered), "--trusted-key", str(keys[0][1])])
    assert result.exit_code == 2 and "changed after signing" in result.output
    assert not marker.exists()


def test_the_environment_variable_requires_signatures_and_a_program_cannot_opt_out(signed, small_package, keys,
                                                                                 monkeypatch, cpp_runtime) -> None:
    monkeypatch.setenv("JIT2TRITON_TRUSTED_KEYS", os.pathsep.join(["", str(keys[0][1])]))
    _check_runs(jit2triton.load(signed[0]), signed[1])
    for passed in (None, [], [keys[1][1]]):
        assert "is not signed" in _refusal(small_package[0], passed)


def test_converting_where_signatures_are_required_checks_and_returns_the_package_it_built(small_package, keys,
                                                                                       monkeypatch, request) -> None:
    """JIT2TRITON_TRUSTED_KEYS is for package files handed to load: conversion's own checks of the package it just
    built (the C++ runtime's verification) and the module convert returns are not refused for lacking a signature
    (the C++ runtime read the variable itself, so converting failed), while loading that package unsigned still is."""
    request.getfixturevalue("cpp_runtime")
    monkeypatch.setenv("JIT2TRITON_TRUSTED_KEYS", str(keys[0][1]))
    model = small_package[1]
    converted = jit2triton.convert(model, example_inputs=(torch.randn(2, 4), torch.randn(2, 3)))
    assert converted.runtime == "cpp"
    assert converted.summary()["verification"]["runtime"] == "cpp"
    _check_runs(converted, model)
    assert "is not signed" in _refusal(small_package[0], None)


def test_an_unusable_key_file_is_named(signed, tmp_path, cpp_runtime) -> None:
    not_a_key = tmp_path / "key.pub"
    not_a_key.write_text("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n")
    assert "key.pub" in _refusal(signed[0], [not_a_key])
    assert "cannot read the trusted key" in _refusal(signed[0], [tmp_path / "missing.pub"])


def test_signing_with_a_public_key_or_a_missing_file_says_so(small_package, keys, tmp_path) -> None:
    module = jit2triton.load(small_package[0])
    for key in (keys[0][1], tmp_path / "missing.key"):
        with pytest.raises(jit2triton.SignatureError):
            module.save(tmp_path / "out.j2t", signing_key=key)
    assert not (tmp_path / "out.j2t").exists()


def test_a_re_saved_package_is_signed_only_if_asked(signed, keys, tmp_path) -> None:
    module = jit2triton.load(signed[0], trusted_keys=[keys[0][1]])
    module.save(tmp_path / "again.j2t")
    assert SIGNATURE_MEMBER not in read_members(tmp_path / "again.j2t")
    module.save(tmp_path / "resigned.j2t", signing_key=keys[1][0])
    jit2triton.load(tmp_path / "resigned.j2t", trusted_keys=[keys[1][1]])


def test_the_cli_makes_keys_signs_checks_and_shows_it(tmp_path, keys) -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["keygen", "--out", str(tmp_path / "cli-keys")], catch_exceptions=False)
    assert "jit2triton.pub" in result.output
    private, public = tmp_path / "cli-keys" / "jit2triton.key", tmp_path / "cli-keys" / "jit2triton.pub"
    model = torch.jit.trace(torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh()), torch.randn(2, 4))
    torch.jit.save(model, str(tmp_path / "m.pt"))
    result = runner.invoke(main, ["convert", str(tmp_path / "m.pt"), "--input", "2x4", "--sign", str(private),
                                  "--quiet"], catch_exceptions=False)
    assert "signed" in result.output.splitlines()[-1]
    package = str(tmp_path / "m.j2t")
    result = runner.invoke(main, ["run", package, "--trusted-key", str(public),
                                  "--check", str(tmp_path / "m.pt")], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    result = runner.invoke(main, ["inspect", package, "--trusted-key", str(public)], catch_exceptions=False)
    assert "signed: yes, by a trusted key" in result.output
    result = runner.invoke(main, ["run", package, "--trusted-key", str(keys[1][1])])
    assert result.exit_code != 0 and "none of the trusted keys" in result.output
