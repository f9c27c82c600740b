"""Mutation fuzz of package loading: damaged and hand-edited packages must be refused with an error of the
jit2triton family (or, where the edit is harmless, load and run), never crash the process or raise anything else.

Four kinds of mutation, from one seed each:
  - a byte of the archive's metadata (zip headers, central directory, the torch records) changed;
  - random bytes written anywhere in the file;
  - the manifest edited at a random place (a number, a string, a list or an object replaced) with the checksums
    recomputed, as anyone who edits a package can;
  - the manifest edited where its structure matters (tests/mutate_structure.py: zero-size dims, strides and dtypes
    swapped, control flow's arity, a container aliased into itself, the arena's size, a dim's range, the kernel
    table), checksums recomputed.

    python tests/mutate_packages.py --package small.j2t --runtime cpp --first 0 --count 5000
    python tests/mutate_packages.py --package signed.j2t --trusted-key keys/jit2triton.pub ...

With --trusted-key (the package signed by that key), a mutated package that loads must hold exactly the signed
members: anything else is a signature that let a change through.

Prints one line per failure and a summary; exits 1 on any failure. A crash kills the process: the last
"seed N" line on stdout (flushed before each load) names the mutation that did it.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import random
import sys
import tempfile
import zipfile

import torch

sys.path.insert(0, os.path.dirname(__file__))
import jit2triton  # noqa: E402
from jit2triton.errors import Jit2TritonError  # noqa: E402
from jit2triton.inputs import random_inputs  # noqa: E402
from jit2triton.deploy.package import _read_file, _records  # noqa: E402
from mutate_structure import structural_edit  # noqa: E402
from package_tools import read_members, write_members  # noqa: E402

ODD_VALUES = [0, -1, 1, 2 ** 31, -2 ** 31, 2 ** 62, 10 ** 30, 0.5, float("nan"), "", "x" * 300, None, True, [], {},
              [[[[[[[[]]]]]]]], "s", "w", ["s", -1], ["s", 10 ** 9]]


def metadata_ranges(data: bytes) -> list[tuple[int, int]]:
    """Byte ranges of the zip structure: each member's local header (with its name and extra field) and the
    central directory with the end records."""
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        ranges = [(i.header_offset, i.header_offset + 30 + len(i.filename) + 64) for i in zf.infolist()]
    central = data.find(b"PK\x01\x02")
    if central >= 0:
        ranges.append((central, len(data)))
    return ranges


def edit_json(value, rng: random.Random):
    """`value` with one random place in it replaced."""
    if isinstance(value, dict) and value and rng.random() < 0.85:
        key = rng.choice(sorted(value))
        copy = dict(value)
        if rng.random() < 0.1:
            del copy[key]
        else:
            copy[key] = edit_json(value[key], rng)
        return copy
    if isinstance(value, list) and value and rng.random() < 0.85:
        i = rng.randrange(len(value))
        copy = list(value)
        roll = rng.random()
        if roll < 0.1:
            del copy[i]
        elif roll < 0.2:
            copy.insert(i, copy[i])
        else:
            copy[i] = edit_json(value[i], rng)
        return copy
    return rng.choice(ODD_VALUES)


def mutate(data: bytes, members: dict[str, bytes], seed: int) -> tuple[str, bytes]:
    rng = random.Random(seed)
    kind = seed % 4
    if kind == 0:
        start, stop = rng.choice(metadata_ranges(data))
        offset = rng.randrange(start, min(stop, len(data)))
        damaged = bytearray(data)
        damaged[offset] = rng.choice([0, 0xFF, damaged[offset] ^ (1 << rng.randrange(8)), rng.randrange(256)])
        return f"metadata byte {offset}", bytes(damaged)
    if kind == 1:
        damaged = bytearray(data)
        offset = rng.randrange(len(data))
        for i in range(rng.randint(1, 16)):
            if offset + i < len(damaged):
                damaged[offset + i] = rng.randrange(256)
        return f"random bytes at {offset}", bytes(damaged)
    manifest = json.loads(members["manifest.json"])
    if kind == 2:
        what, manifest = "manifest edit", edit_json(manifest, rng)
    else:
        what = f"structural edit: {structural_edit(manifest, rng)}"
    edited = dict(members, **{"manifest.json": json.dumps(manifest).encode()})
    checksums = {name: hashlib.sha256(blob).hexdigest() for name, blob in edited.items() if name != "checksums.json"}
    edited["checksums.json"] = json.dumps(checksums).encode()
    with tempfile.NamedTemporaryFile(suffix=".j2t") as f:
        write_members(f.name, edited)
        return what, open(f.name, "rb").read()


def _members_as_read(path: str) -> dict[str, bytes]:
    """The members as the runtimes read them (by offset, as torch's reader finds them; no CRC check)."""
    return {name: bytes(data) for name, data in _records(path, _read_file(path, False)).items()}


def try_package(path: str, runtime: str, trusted_key: str | None = None, signed: dict | None = None) -> str:
    """'' when the package was refused with a jit2triton error or loaded and ran; else what went wrong."""
    try:
        module = jit2triton.load(path, runtime=runtime, trusted_keys=[trusted_key] if trusted_key else None)
    except Jit2TritonError:
        return ""
    except Exception as err:  # anything else reaching a user is a defect
        return f"{type(err).__name__}: {str(err)[:200]}"
    if trusted_key and _members_as_read(path) != signed:
        return "a changed package loaded although trusted keys were set"
    try:  # (a signature field only random inputs read, such as an input's range, may be damaged: not the runtime's)
        signature = module.manifest["signature"]
        # each dynamic dim at its example's size, as the C++ driver's random_inputs (a damaged one: 2)
        sizes = {name: n if type(n) is int and 1 <= n <= 64 else 2
                 for name, n in ((name, (d or {}).get("example")) for name, d in (signature.get("dims") or {}).items())}
        inputs = random_inputs(signature["inputs"], module.device, sizes=sizes)
        # a damaged example value (2**62) would make a loop's trip count endless: the harness's input, not the runtime
        inputs = [3 if type(x) is int and abs(x) > 64 else x for x in inputs]
    except Exception:
        return ""
    try:
        module(*inputs)
    except Jit2TritonError:
        return ""
    except Exception as err:  # anything else reaching a user is a defect
        return f"{type(err).__name__}: {str(err)[:200]}"
    return ""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--package", required=True)
    parser.add_argument("--runtime", choices=["cpp"], default="cpp")
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--count", type=int, default=500)
    parser.add_argument("--trusted-key", help="the public key that signed the package: loads require it")
    parser.add_argument("--write-dir", help="write the mutated packages here (mutation-<seed>.j2t) and load none, "
                                            "for the sanitized C++ driver (deploy/cpp/tools/j2t_fuzz.cpp)")
    args = parser.parse_args()
    data = open(args.package, "rb").read()
    members = read_members(args.package)
    if args.write_dir:
        os.makedirs(args.write_dir, exist_ok=True)
        for seed in range(args.first, args.first + args.count):
            with open(os.path.join(args.write_dir, f"mutation-{seed:07d}.j2t"), "wb") as f:
                f.write(mutate(data, members, seed)[1])
        print(f"wrote {args.count} mutations ({args.first}..{args.first + args.count - 1}) to {args.write_dir}")
        return 0
    torch.manual_seed(0)
    failures = 0
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "mutated.j2t")
        for seed in range(args.first, args.first + args.count):
            what, damaged = mutate(data, members, seed)
            with open(path, "wb") as f:
                f.write(damaged)
            print(f"seed {seed}: {what}", flush=True)
            problem = try_package(path, args.runtime, args.trusted_key, members)
            if problem:
                failures += 1
                print(f"FAIL seed {seed} ({what}): {problem}", flush=True)
    print(f"{args.count} mutations ({args.first}..{args.first + args.count - 1}), {args.runtime} runtime: "
          f"{failures} failing", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
