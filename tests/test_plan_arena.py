"""The arena (transpiler/plan_arena.py): CPU kernels write intermediate outputs into one buffer planned at convert
time. What can go wrong is sharing: two values alive at once on the same bytes, a value the caller holds (or a view
of it) overwritten by the next call, two threads' calls on one arena. Each test below fails when that happens. The
C++ runtime places outputs in the arena, and refuses a damaged one."""
from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

import jit2triton
from jit2triton.errors import CorruptPackageError
from package_tools import rewrite_package


class Block(nn.Module):
    """Kernels between GEMMs, some values read long after they are made (the residuals), some right away."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(32, 64), nn.Linear(64, 32), nn.Linear(32, 32)
        self.norm = nn.LayerNorm(32)

    def forward(self, x):
        h = torch.tanh(x) * 2  # read again at the end
        y = self.b(nn.functional.gelu(self.a(h)))
        z = self.norm(y + h)
        w = self.c(torch.sigmoid(z) * z)
        return w + h - z


class Escapes(nn.Module):
    """Kernel outputs the caller receives: directly, inside a tuple, and through a view of one."""

    def forward(self, x):
        a = torch.relu(x) + 1
        b = (x * 3).t()
        c = torch.sin(x) * 2
        return a, b, {"c": c, "d": torch.mm(c, x.t())}


def _convert(model, example, path):
    traced = torch.jit.trace(model.eval(), example, strict=False)
    # fixed choices: whether a timed oneDNN linear (whose reads escape the arena) wins must not decide the plan here
    converted = jit2triton.convert(traced, example_inputs=example, choices="fixed")
    converted.save(path)
    return traced, converted


def _arena_steps(plan: dict) -> list[dict]:
    return [step for step in plan["steps"] if step.get("arena")]


def test_kernels_write_into_the_arena_and_agree_with_torchscript(tmp_path) -> None:
    """Verification at convert time takes out a kernel that disagrees with ATen, so a packing that overlapped live
    values would show as removed kernels; then fresh inputs against TorchScript, twice over."""
    torch.manual_seed(0)
    traced, converted = _convert(Block(), (torch.randn(4, 32),), tmp_path / "block.j2t")
    plan = converted.manifest["plan"]
    assert plan["arena"]["bytes"] > 0 and len(_arena_steps(plan)) >= 3, plan.get("arena")
    assert converted.manifest["report"]["verification"]["kernels_removed"] == []
    loaded = jit2triton.load(tmp_path / "block.j2t")
    for _ in range(3):
        x = torch.randn(4, 32)
        torch.testing.assert_close(loaded(x), traced(x), rtol=1e-5, atol=1e-5)


def test_values_alive_at_once_never_share_bytes(tmp_path) -> None:
    """On the plan: a value in the arena is alive from its step to its last reader's; any two whose lives overlap
    hold disjoint bytes, and the arena is smaller than giving each its own."""
    torch.manual_seed(0)
    _, converted = _convert(Block(), (torch.randn(4, 32),), tmp_path / "block.j2t")
    plan = converted.manifest["plan"]
    placed = []
    for position, step in enumerate(plan["steps"]):
        for j, offset in enumerate(step.get("arena") or ()):
            if offset is None:
                continue
            slot = step["outs"][j]
            last = position
            for later in range(position + 1, len(plan["steps"])):
                other = plan["steps"][later]
                if any(r == ["s", slot] for r in other["args"]):
                    last = later
                if slot in other.get("outs", ()):
                    break
            shape, dtype, strides = step["out_types"][j]
            nbytes = (1 + sum((n - 1) * s for n, s in zip(shape, strides))) * getattr(torch, dtype).itemsize
            placed.append((position, last, offset, offset + nbytes))
    assert len(placed) >= 3
    for i, (born, dies, start, end) in enumerate(placed):
        for born2, dies2, start2, end2 in placed[i + 1:]:
            if born <= dies2 and born2 <= dies:
                assert end <= start2 or end2 <= start, (placed[i], (born2, dies2, start2, end2))
    assert plan["arena"]["bytes"] < sum(-(-(e - s) // 64) * 64 for _, _, s, e in placed)


def test_what_the_caller_receives_is_never_in_the_arena(tmp_path) -> None:
    """Outputs, outputs in containers and views of kernel outputs stay the caller's: a second call must not change
    the first call's results."""
    torch.manual_seed(0)
    traced, converted = _convert(Escapes(), (torch.randn(6, 6),), tmp_path / "escapes.j2t")
    # (verification would take every kernel out of a package whose outputs a second call overwrites)
    assert converted.manifest["report"]["verification"]["kernels_removed"] == []
    assert any(step["kind"] == "kernel" for step in converted.manifest["plan"]["steps"])
    loaded = jit2triton.load(tmp_path / "escapes.j2t")
    x1, x2 = torch.randn(6, 6), torch.randn(6, 6)
    first = loaded(x1)
    kept = [t.clone() for t in (first[0], first[1], first[2]["c"], first[2]["d"])]
    loaded(x2)
    for held, copy in zip((first[0], first[1], first[2]["c"], first[2]["d"]), kept):
        torch.testing.assert_close(held, copy, rtol=0, atol=0)
    torch.testing.assert_close(first, traced(x1))


def test_concurrent_calls_each_get_their_own_arena(tmp_path) -> None:
    torch.manual_seed(0)
    traced, _ = _convert(Block(), (torch.randn(64, 32),), tmp_path / "block.j2t")
    loaded = jit2triton.load(tmp_path / "block.j2t")
    failures = []

    def calls(seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        for _ in range(40):
            x = torch.randn(64, 32, generator=generator)
            try:
                torch.testing.assert_close(loaded(x), traced(x), rtol=1e-5, atol=1e-5)
            except AssertionError as err:
                failures.append(err)

    threads = [threading.Thread(target=calls, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures[0]


@pytest.mark.parametrize("damage", ["offset past the end", "negative size", "unaligned offset", "not a list"])
def test_a_damaged_arena_is_refused(tmp_path, damage) -> None:
    torch.manual_seed(0)
    _convert(Block(), (torch.randn(4, 32),), tmp_path / "block.j2t")

    def edit(plan):
        step = _arena_steps(plan)[0]
        if damage == "offset past the end":
            step["arena"][0] = plan["arena"]["bytes"]
        elif damage == "negative size":
            plan["arena"]["bytes"] = -64
        elif damage == "unaligned offset":
            step["arena"][0] = 8
        else:
            step["arena"] = 0
    rewrite_package(tmp_path / "block.j2t", tmp_path / "damaged.j2t", edit_manifest=lambda m: edit(m["plan"]))
    with pytest.raises(CorruptPackageError, match="arena"):
        jit2triton.load(tmp_path / "damaged.j2t")(torch.randn(4, 32))
