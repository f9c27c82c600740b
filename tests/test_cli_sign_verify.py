"""`jit2triton sign` and `jit2triton verify`: signing a saved package, and checking it as `load` would, from the
command line; keygen's refusal in the command's words."""
import pytest
import torch
from click.testing import CliRunner

import jit2triton
from jit2triton.cli import main

from package_tools import read_members, write_members


@pytest.fixture(scope="module")
def signing(tmp_path_factory):
    folder = tmp_path_factory.mktemp("signing")
    x = torch.randn(2, 3)
    traced = torch.jit.trace(torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU()).eval(), (x,))
    jit2triton.convert(traced, example_inputs=(x,), backend="aten", verify=False).save(folder / "model.j2t")
    assert CliRunner().invoke(main, ["keygen", "--out", str(folder / "keys")]).exit_code == 0
    assert CliRunner().invoke(main, ["keygen", "--out", str(folder / "other")]).exit_code == 0
    return folder


def _invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_sign_then_verify_with_the_key_and_load(signing, monkeypatch):
    monkeypatch.delenv("JIT2TRITON_TRUSTED_KEYS", raising=False)
    key, pub = signing / "keys" / "jit2triton.key", signing / "keys" / "jit2triton.pub"
    signed = signing / "signed.j2t"
    result = _invoke("sign", signing / "model.j2t", "--key", key, "-o", signed)
    assert result.exit_code == 0, result.output
    result = _invoke("verify", signed, "--trusted-key", pub)
    assert result.exit_code == 0 and "signed by a trusted key" in result.stdout, result.output
    jit2triton.load(signed, trusted_keys=[pub])  # what verify said, load agrees with
    result = _invoke("verify", signed)  # no keys: checksums only, and it says the signature was not checked
    assert result.exit_code == 0 and "signed (signature not checked" in result.stdout, result.output


def test_verify_refuses_unsigned_and_other_keys_with_exit_2(signing, monkeypatch):
    monkeypatch.delenv("JIT2TRITON_TRUSTED_KEYS", raising=False)
    other = signing / "other" / "jit2triton.pub"
    result = _invoke("verify", signing / "model.j2t", "--trusted-key", other)
    assert result.exit_code == 2 and "is not signed" in result.stderr, result.output
    signed = signing / "by-other.j2t"
    assert _invoke("sign", signing / "model.j2t", "--key", signing / "keys" / "jit2triton.key", "-o", signed).exit_code == 0
    result = _invoke("verify", signed, "--trusted-key", other)
    assert result.exit_code == 2 and "none of the trusted keys" in result.stderr, result.output
    monkeypatch.setenv("JIT2TRITON_TRUSTED_KEYS", str(other))  # the operator's keys apply to verify too
    assert _invoke("verify", signed).exit_code == 2


def test_verify_finds_a_damaged_package(signing, monkeypatch):
    monkeypatch.delenv("JIT2TRITON_TRUSTED_KEYS", raising=False)
    members = read_members(signing / "model.j2t")
    weights = bytearray(members["weights.bin"])
    weights[0] ^= 0xFF  # a weight changed, its checksum not
    write_members(signing / "damaged.j2t", {**members, "weights.bin": bytes(weights)})
    result = _invoke("verify", signing / "damaged.j2t")
    assert result.exit_code == 2 and result.stderr.startswith("error: "), result.output


def test_sign_refuses_a_public_key_and_a_target_that_is_not_a_file(signing):
    result = _invoke("sign", signing / "model.j2t", "--key", signing / "keys" / "jit2triton.pub")
    assert result.exit_code == 2 and "private key" in result.stderr, result.output
    result = _invoke("sign", signing / "model.j2t", "--key", signing / "keys" / "jit2triton.key", "-o", "/dev/null")
    assert result.exit_code == 2 and "/dev/null" in result.stderr, result.output


def test_keygen_refusal_names_the_option_not_the_argument(signing):
    result = _invoke("keygen", "--out", signing / "keys")
    assert result.exit_code == 2 and "--force" in result.stderr and "overwrite" not in result.stderr, result.output
