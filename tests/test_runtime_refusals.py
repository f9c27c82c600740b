"""The runtime tells a clear story (issue 34, item 9): a damaged member is named, a model that raises raises what
TorchScript raises (a torch.jit.Error), so code written around torch.jit.load keeps working, and every mutated
package is run or refused with jit2triton's own error (issue 45)."""
from __future__ import annotations

from typing import List

import pytest
import torch

import jit2triton

from package_tools import read_members, write_members


def _refusal(path) -> str:
    with pytest.raises(jit2triton.CorruptPackageError) as err:
        jit2triton.load(path)
    return str(err.value)


@pytest.mark.parametrize("damage", ["renamed", "changed", "two changed"])
def test_the_runtime_names_the_damaged_member(damage, small_package, tmp_path, cpp_runtime) -> None:
    """A member renamed in the archive (as a case-folding copy would), changed, or two changed: the message names
    the first in sorted order (the Python and C++ readers once named the first each met, in their own orders)."""
    members = read_members(small_package[0])
    if damage == "renamed":
        members["binaries/Kernels.so"] = members.pop("binaries/kernels.so")
    else:
        library = members["binaries/kernels.so"]
        members["binaries/kernels.so"] = library[:-1] + bytes([library[-1] ^ 0xFF])
    if damage == "two changed":
        members["manifest.json"] = members["manifest.json"].replace(b'"format"', b'"Format"', 1)
    damaged = tmp_path / "damaged.j2t"
    write_members(damaged, members)
    said = _refusal(damaged)
    assert ("'binaries/Kernels.so'" if damage == "renamed" else "'binaries/kernels.so'") in said  # sorted first


def test_a_member_name_that_is_not_utf8_is_refused_as_damage(small_package, tmp_path, cpp_runtime) -> None:
    """Its bytes in the archive's headers, not in checksums.json: the C++ runtime's message quotes the name, which
    reached Python as a UnicodeDecodeError instead of the refusal (found by the mutation fuzz)."""
    data = bytearray(small_package[0].read_bytes())
    name = b"binaries/kernels.so"
    spots = [i for i in range(len(data)) if data.startswith(name, i)]
    for at in (spots[0], spots[-1]):  # the local header and the central directory (checksums.json lies between)
        data[at + len("binaries/k")] = 0xD5
    damaged = tmp_path / "damaged.j2t"
    damaged.write_bytes(bytes(data))
    _refusal(damaged)


class Raises(torch.nn.Module):
    def forward(self, x):
        if bool(x.sum() > 100):
            raise ValueError("the sum is too large")
        return x.relu() + 1


def test_a_model_that_raises_raises_what_torchscript_raises(tmp_path, cpp_runtime) -> None:
    model = torch.jit.script(Raises())
    path = tmp_path / "raises.j2t"
    jit2triton.convert(model, (torch.randn(4, 8),)).save(path)
    module = jit2triton.load(path)
    large = torch.full((4, 8), 10.0)
    with pytest.raises(torch.jit.Error) as theirs:
        model(large)
    with pytest.raises(torch.jit.Error, match="the sum is too large") as ours:
        module(large)
    assert isinstance(ours.value, jit2triton.ModelRaisedError)
    assert isinstance(ours.value, type(theirs.value))


def test_the_cpp_runtimes_module_gives_its_own_package_to_python(small_package, tmp_path, cpp_runtime) -> None:
    """Its manifest, files and weights come from the bytes the C++ runtime read (the weights without a copy), and
    saving it again gives a package that runs the same."""
    module = jit2triton.load(small_package[0], runtime="cpp")
    contents = module._contents
    held = module._runtime.module.weights()
    assert {n: w.data_ptr() for n, w in contents.weights.items()} == {n: w.data_ptr() for n, w in held.items()}
    assert contents.manifest["signature"]["inputs"][0]["shape"] == [2, 4]
    module.save(tmp_path / "again.j2t")
    again = jit2triton.load(tmp_path / "again.j2t", runtime="cpp")
    x, y = torch.randn(2, 4), torch.randn(2, 3)
    torch.testing.assert_close(again(x, y), small_package[1](x, y))


class SplitByLengths(torch.nn.Module):
    """Per-feature split sizes read from the lengths (KeyedJaggedTensor style): `tolist` is TorchScript's
    prim::tolist, which takes the tensor, then its dim and element type as int constants."""
    def forward(self, values, lengths):
        sizes: List[int] = lengths.sum(1).tolist()
        parts = torch.split(values, sizes)
        return [p.sum(0) * 2 for p in parts]


class ToLists(torch.nn.Module):
    """tolist at each dim from 0 to 2, of each element type it gives (float, int, bool)."""
    def forward(self, x):
        rows: List[List[float]] = x.tolist()
        signs: List[bool] = (x[0] > 0).tolist()
        rounded: List[int] = x[1].round().long().tolist()
        first: float = x[0, 0].tolist()
        return rows, signs, rounded, first


def test_tolist_matches_torchscript(tmp_path, cpp_runtime) -> None:
    """Issue 43: the C++ runtime, load()'s default, passed prim::tolist an argument count after its arguments, as
    TorchScript's interpreter does only for the variadic ops whose operation it makes once (not per node), and
    every call failed ("Expected Tensor but got Int"); verification had run the Python runtime."""
    split, lists = torch.jit.script(SplitByLengths()), torch.jit.script(ToLists())
    jit2triton.convert(split, (torch.randn(10, 4), torch.tensor([[1, 2], [3, 4]]))).save(tmp_path / "split.j2t")
    jit2triton.convert(lists, (torch.randn(3, 4),)).save(tmp_path / "lists.j2t")
    loaded_split = jit2triton.load(tmp_path / "split.j2t")
    loaded_lists = jit2triton.load(tmp_path / "lists.j2t")
    for lengths in ([[2, 2], [1, 5]], [[0, 3], [4, 3]], [[5, 5], [0, 0]]):
        values, lengths = torch.randn(10, 4), torch.tensor(lengths)
        torch.testing.assert_close(loaded_split(values, lengths), split(values, lengths))
    for _ in range(3):
        x = torch.randn(3, 4) * 3
        assert loaded_lists(x) == lists(x)


@torch.jit.script
def stepped(x, n: int):
    """Kernels, a loop, a branch, list and int steps, a mask's count: most kinds of plan step."""
    seen = torch.zeros(x.shape[0], dtype=torch.bool)
    values: List[int] = []
    for i in range(n):
        if not bool(seen[i % x.shape[0]]):
            seen = seen | (x > 0.1 * i)
        values.append(i * 3)
    return x[seen].sin() * 2.0 + float(len(values)), seen


def _outcome(path: str) -> str:
    """'ran', or 'refused' (a jit2triton error at load or at the call), or what else escaped."""
    from jit2triton.inputs import random_inputs
    try:
        module = jit2triton.load(path)
        signature = module.manifest["signature"]
    except jit2triton.Jit2TritonError:
        return "refused"
    except Exception as err:  # noqa: BLE001 - a defect, reported as the outcome
        return f"{type(err).__name__} at load"
    try:
        torch.manual_seed(0)
        inputs = random_inputs(signature["inputs"], module.device, sizes={name: 2 for name in signature.get("dims") or {}})
        inputs = [3 if type(x) is int and abs(x) > 64 else x for x in inputs]  # (a damaged example: an endless loop)
    except Exception:  # noqa: BLE001 - a signature too damaged to draw inputs from: no call to compare
        return "ran"
    try:
        module(*inputs)
    except jit2triton.Jit2TritonError:
        return "refused"
    except Exception as err:  # noqa: BLE001
        return f"{type(err).__name__} at call"
    return "ran"


@pytest.mark.parametrize("program", ["small", "stepped"])
def test_the_runtime_runs_or_refuses_each_mutant(program, small_package, tmp_path, request) -> None:
    """Issue 45: mutated packages (tests/mutate_packages.py: damaged bytes, manifest edits with the checksums
    recomputed, structural edits), each loaded and called: run, or refused with a jit2triton error, never another
    exception. (While a Python runtime read packages too, this found the two disagreeing on a step's `kwnames` not a
    list, a reference of an unknown kind, a kernel's `sizes` not a list, a kernel listed twice, a null weights index,
    a non-string `isa`, `aten::__not__` of a tensor.)"""
    request.getfixturevalue("cpp_runtime")
    from mutate_packages import mutate
    if program == "small":
        path = str(small_package[0])
    else:
        path = str(tmp_path / "stepped.j2t")
        jit2triton.convert(stepped, (torch.randn(12), 9)).save(path)
    data, members = open(path, "rb").read(), read_members(path)
    mutant = str(tmp_path / "mutant.j2t")
    escaped, outcomes = [], set()
    for seed in range(300):
        what, damaged = mutate(data, members, seed)
        with open(mutant, "wb") as f:
            f.write(damaged)
        outcome = _outcome(mutant)
        outcomes.add(outcome)
        if outcome not in ("ran", "refused"):
            escaped.append(f"seed {seed} ({what}): {outcome}")
    assert not escaped, escaped
    assert outcomes == {"ran", "refused"}, outcomes  # (the mutations reach both)
