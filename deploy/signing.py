"""Signed packages: an Ed25519 signature over a package's checksums, checked before anything in it is parsed.

`checksums.json` holds the sha256 of every other member, and the reader refuses a member it does not list, so a
signature over its exact bytes covers the whole package: manifest, weights, kernel sources and binaries. The
signature is the member `signature.ed25519` (64 raw bytes, no parsing) over `SIGNED_PREFIX + checksums.json`; the
prefix keeps a signature made for something else from passing as a package's.

Without trusted keys a package loads as before (and a signed one too). With trusted keys, from `load(...,
trusted_keys=[...])` or the JIT2TRITON_TRUSTED_KEYS environment variable (paths separated by os.pathsep, read by
the runtime and this reader, so an operator can require signatures fleet-wide), an unsigned package, or one no trusted key
signed, is refused before its manifest is read and before any of its code, or any cached build of it, is loaded.
The C++ runtime does the same check (deploy/cpp/src/signing.cpp) with OpenSSL's libcrypto.

Keys are PEM files: the private key PKCS#8, the public key SubjectPublicKeyInfo, as `openssl genpkey -algorithm
ed25519` writes them. Python uses the `cryptography` library.
"""
from __future__ import annotations

import os
from typing import Iterable, Optional, Sequence, Union

from jit2triton.errors import SignatureError

from . import policy
from .policy import SIGNATURE_MEMBER

SIGNED_PREFIX = policy.SIGNED_PREFIX.encode()
TRUSTED_KEYS_ENV = "JIT2TRITON_TRUSTED_KEYS"
PRIVATE_KEY_FILE, PUBLIC_KEY_FILE = "jit2triton.key", "jit2triton.pub"

KeyPaths = Optional[Sequence[Union[str, os.PathLike]]]


def _crypto():
    try:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise SignatureError("signing and checking packages needs the `cryptography` package: "
                             "pip install cryptography") from None
    return serialization, ed25519, InvalidSignature


def generate_keys(folder: Union[str, os.PathLike], overwrite: bool = False) -> tuple[str, str]:
    """Write a new Ed25519 key pair into `folder` (created 0700): the private key (mode 0600) to sign packages
    with, the public key to give to whoever loads them. Returns (private key path, public key path)."""
    serialization, ed25519, _ = _crypto()
    folder = os.fspath(folder)
    private_path, public_path = os.path.join(folder, PRIVATE_KEY_FILE), os.path.join(folder, PUBLIC_KEY_FILE)
    if not overwrite:
        for existing in (private_path, public_path):
            if os.path.exists(existing):
                raise SignatureError(f"{existing!r} exists; keep it, or pass overwrite (CLI: --force) to replace "
                                     "the key pair (packages signed with the old key then need the old public key)")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    key = ed25519.Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo)
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(private)
    os.chmod(private_path, 0o600)  # an existing file keeps its mode through O_TRUNC
    with open(public_path, "wb") as f:
        f.write(public)
    return private_path, public_path


def sign(checksums: bytes, key_path: Union[str, os.PathLike]) -> bytes:
    """The signature member's bytes for a package whose checksums.json is `checksums`."""
    serialization, ed25519, _ = _crypto()
    key = _read_key(os.fspath(key_path), "the signing key", ed25519.Ed25519PrivateKey,
                    lambda data: serialization.load_pem_private_key(data, password=None))
    return key.sign(SIGNED_PREFIX + checksums)


def trusted_key_paths(given: KeyPaths = None) -> list[str]:
    """The keys `given` to load, and those named by JIT2TRITON_TRUSTED_KEYS: a program cannot opt out of what the
    operator requires, only add keys of its own."""
    if isinstance(given, (str, os.PathLike)):
        given = [given]  # one path, not its characters
    paths = [os.fspath(p) for p in given or ()]
    paths += [p for p in os.environ.get(TRUSTED_KEYS_ENV, "").split(os.pathsep) if p]
    return list(dict.fromkeys(paths))


def _public_keys(paths: Iterable[str]) -> list:
    serialization, ed25519, _ = _crypto()
    return [_read_key(path, "the trusted key", ed25519.Ed25519PublicKey, serialization.load_pem_public_key)
            for path in paths]


def _read_key(path: str, role: str, kind: type, parse):
    """The Ed25519 key in the PEM file at `path`, or a SignatureError naming the file and what to use instead."""
    try:
        with open(path, "rb") as f:
            key = parse(f.read())
    except OSError as err:
        raise SignatureError(f"cannot read {role} {path!r}: {err.strerror}") from None
    except (ValueError, TypeError) as err:
        raise SignatureError(f"{role} {path!r} is not an unencrypted PEM {kind.__name__} ({err}); use the files "
                             "`jit2triton keygen --out DIR` writes") from None
    if not isinstance(key, kind):
        raise SignatureError(f"{role} {path!r} is a {type(key).__name__}; packages are signed with Ed25519 keys, "
                             "as `jit2triton keygen --out DIR` makes them")
    return key


def check_signature(path: str, members: dict, key_paths: list[str]) -> None:
    """Refuse the package unless one of the keys signed its checksums (nothing to check without keys)."""
    if not key_paths:
        return
    keys = _public_keys(key_paths)
    _, _, invalid = _crypto()
    signature, checksums = members.get(SIGNATURE_MEMBER), members.get("checksums.json")
    if signature is None or checksums is None:
        raise SignatureError(f"{path!r} is not signed, and trusted keys are set ({_named(key_paths)}): load only "
                             "packages signed with `jit2triton convert --sign KEY` (or save(path, signing_key=KEY))")
    message = SIGNED_PREFIX + bytes(checksums)
    for key in keys:
        try:
            key.verify(bytes(signature), message)
            return
        except invalid:
            continue
    raise SignatureError(f"{path!r} is signed, but by none of the trusted keys ({_named(key_paths)}), or it was "
                         "changed after signing; do not load it. Re-sign it, or trust the key it was signed with")


def _named(paths: list[str]) -> str:
    return ", ".join(repr(p) for p in paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
