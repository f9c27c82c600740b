"""The memory planner reuses slots by liveness and frees values right after their last use."""
import torch

import jit2triton
from jit2triton.loaders import load_script
from jit2triton.transpiler.from_torchscript import from_torchscript
from jit2triton.transpiler.build_plan import build_plan


def _plan(fn, *example):
    script = load_script(torch.jit.script(fn))
    graph = from_torchscript(script.graph, script.input_names, script.name)
    return build_plan(graph).plan


def chain(x):
    y = x.sin()
    y = y.cos()
    y = y.exp()
    y = y.tanh()
    y = y.sigmoid()
    y = y.relu()
    return y * 2


def test_a_chain_reuses_two_slots():
    plan = _plan(chain, torch.randn(4))
    values = sum(len(s["outs"]) for s in plan["steps"]) + 1
    assert values >= 7
    assert plan["num_slots"] == 2  # each value dies as the next is made
    assert all(s.get("free") for s in plan["steps"][:-1])


def loop_reads_outer(x, n: int):
    w = x * 2
    acc = torch.zeros_like(x)
    for i in range(n):
        acc = acc + w  # w is read on every iteration: it must live until the loop ends
    return acc


def test_values_read_inside_a_loop_live_until_it_ends():
    plan = _plan(loop_reads_outer)
    loop = next(s for s in plan["steps"] if s["kind"] == "loop")
    w_slot = plan["steps"][0]["outs"][0]
    inner_frees = [slot for s in loop["blocks"][0]["steps"] for slot in s.get("free", [])]
    assert w_slot not in inner_frees
    assert w_slot in loop.get("free", [])
    scripted = torch.jit.script(loop_reads_outer)
    module = jit2triton.convert(scripted, example_inputs=(torch.randn(3), 2))
    x = torch.randn(3)
    torch.testing.assert_close(module(x, 5), scripted(x, 5))
