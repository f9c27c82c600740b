"""Which parts of a plan may run as CUDA graphs, decided once at convert time (the C++ runtime captures them).

A plan that is straight-line GPU work runs whole as one graph (`capturable` and `worth_capturing`). A plan with
control flow, or with an op that reads a tensor's value on the host, cannot; `group_regions` then wraps each long
enough run of graph-safe steps (inside branches and loop bodies too) in a `graph` step:

    {"kind": "graph", "steps": [...], "args": [["s", slot] read], "outs": [slots read after it],
     "free": [slots its steps release], "launches": n, "node": first step's node}

A runtime may run a `graph` step as its steps, one by one (on the CPU, with `cuda_graphs=False`, and always in the
Python reference runtime), or capture them and replay (the C++ runtime, deploy/cpp/src/cuda_graph.cpp): the step's inputs are all it reads and its outputs all that is read after it, so a replay that copies
the inputs in and the outputs out does what the steps do.
"""
from __future__ import annotations

from typing import Iterator

import torch

from jit2triton.transpiler.report import NO_LAUNCH

from ..op_facts import CONTAINERS, SYNCS_HOST
from ..policy import COPY_BYTES_PER_US, LAUNCH_US

MIN_STEPS = 3
MIN_REGION_LAUNCHES = 4  # a region's replay costs three launches (copy in, graph, copy out): fewer gain nothing


def capturable(plan: dict, on_host: frozenset = frozenset(), counts: frozenset = frozenset()) -> bool:
    """Whether every step of the plan can live inside one CUDA graph (`on_host`, `counts`: see group_regions)."""
    return all(step["kind"] in ("call", "kernel") and step.get("op") not in SYNCS_HOST and step["node"] not in on_host
               and not counts & set(step.get("sizes", ())) and not step.get("by_value") for step in plan["steps"])


def worth_capturing(plan: dict, signature: dict) -> bool:
    """A graph saves each step's launch but costs a copy of every input and output: for a few steps, or for large
    tensors (sin(x)**2 + cos(x)**2 over 16M floats), the copies cost more than the launches they save."""
    sizes = {name: d["example"] for name, d in signature.get("dims", {}).items()}  # judged at the example's sizes
    copied = sum(_bytes(d, sizes) for d in signature["inputs"]) + _bytes(signature["outputs"], sizes)
    steps = len(plan["steps"])
    # a replay is itself a launch, and the copies in and out are two more: a plan of a few steps gains nothing
    return steps > MIN_STEPS and copied / COPY_BYTES_PER_US < LAUNCH_US * steps


def _bytes(desc: dict, sizes: dict[str, int]) -> int:
    if desc.get("type") == "Tensor":
        n = 1
        for d in desc["shape"]:
            n *= sizes[d] if isinstance(d, str) else d
        return n * getattr(torch, desc["dtype"]).itemsize
    items = desc.get("items", [])
    return sum(_bytes(d, sizes) for d in (items.values() if isinstance(items, dict) else items))


# ---- regions of plans with control flow ---------------------------------------------------------------------------

def group_regions(plan: dict, nodes: list[dict], on_host: frozenset = frozenset(),
                  counts: frozenset = frozenset()) -> dict:
    """The plan with its runs of graph-safe steps wrapped in `graph` steps. `on_host` holds the nodes that make CPU
    tensors: a graph would run their work once, when captured, and never again. `counts` holds the bound dims that
    are counts read from data (transpiler/data_sizes.py): a region is a graph per size it runs at, and a count
    takes a new size call after call, so a kernel over one stays out (a graph per count, each a capture). A node
    near an in-place write (its table entry's `near_write`, transpiler/alias_analysis.py's near_writes) stays out
    too: a region copies its inputs in and its outputs out, so a write inside one would land on the copy, and a view
    that left one would no longer alias its base."""
    return dict(plan, steps=_group_block(plan["steps"], plan["outputs"], nodes, on_host | _over_counts(plan, counts)))


def regions(plan: dict) -> list[dict]:
    """The plan's `graph` steps, inside control flow too."""
    return [step for step in _walk(plan["steps"]) if step["kind"] == "graph"]


def has_regions(plan: dict) -> bool:
    return bool(regions(plan))


def without_regions(plan: dict) -> dict:
    """The plan with each region put back as its steps."""
    return dict(plan, steps=_ungrouped(plan["steps"]))


def _ungrouped(steps: list[dict]) -> list[dict]:
    flat: list[dict] = []
    for step in steps:
        if step["kind"] == "graph":
            flat += step["steps"]
        elif step.get("blocks"):
            flat.append(dict(step, blocks=[dict(block, steps=_ungrouped(block["steps"])) for block in step["blocks"]]))
        else:
            flat.append(step)
    return flat


def _over_counts(plan: dict, counts: frozenset) -> frozenset:
    """The nodes of the kernel steps that take a count read from data."""
    return frozenset(step["node"] for step in _walk(plan["steps"]) if counts & set(step.get("sizes", ())))


def _walk(steps: list[dict]) -> Iterator[dict]:
    for step in steps:
        yield step
        for block in step.get("blocks", ()):
            yield from _walk(block["steps"])
        yield from _walk(step.get("steps", ()))


def _graph_safe(step: dict, on_host: frozenset, nodes: list[dict]) -> bool:
    """(A step that binds sizes stays out: a replay would skip the binding the steps after the region read. So does
    a kernel taking host numbers by value: a graph would replay the numbers it was captured with.)"""
    return (step["kind"] in ("call", "kernel") and step.get("op") not in SYNCS_HOST and not step.get("mutates")
            and step["node"] not in on_host and not nodes[step["node"]].get("near_write")
            and not step.get("binds") and not step.get("by_value"))


def _launches(step: dict, nodes: list[dict]) -> int:
    return 1 if step["kind"] == "kernel" or nodes[step["node"]]["category"] not in NO_LAUNCH else 0


# ---- scalars that change from one iteration of a loop to the next -------------------------------------------------
# A graph bakes in the scalars it reads, so a region reading one of these would be a graph per value: NMS's
# `arange(n) > i` was a graph per box, each captured once (syncing the device), replayed at most once a call, the
# rest run step by step after building a key, and a held graph evicted and captured again whenever the counts aged.
# Such a step stays out of regions. The varying slots are the loop's counter, the numbers and flags it carries, and
# what host steps compute from them; tracked step by step, as a slot is written again by later steps. (A tensor a
# host step makes of such a number, aten::scalar_tensor's, counts too, though a region could take it as an input:
# the plan does not say which host ops make tensors.)

def _group_block(steps: list[dict], results: list, nodes: list[dict], on_host: frozenset,
                 varying: frozenset = frozenset()) -> list[dict]:
    return _group(steps, results, nodes, on_host, set(varying))


def _group(steps: list[dict], results: list, nodes: list[dict], on_host: frozenset, varying: set) -> list[dict]:
    """`varying`: the slots that hold such scalars as the block starts; left as they are when it ends."""
    safe: list[bool] = []
    inner_steps: list[dict] = []
    for step in steps:
        reads_varying = any(ref[0] == "s" and ref[1] in varying for ref in step["args"])
        if step.get("blocks"):
            step, outs_vary = _group_inner(step, nodes, on_host, varying)
        else:
            outs_vary = reads_varying and step["kind"] == "call" and nodes[step["node"]]["category"] == "host"
        inner_steps.append(step)
        safe.append(_graph_safe(step, on_host, nodes) and not reads_varying)
        (varying.update if outs_vary else varying.difference_update)(step["outs"])
    grouped: list[dict] = []
    start = 0
    for end in range(len(inner_steps) + 1):
        if end < len(inner_steps) and safe[end]:
            continue
        grouped.extend(_region(inner_steps, start, end, results, nodes))
        if end < len(inner_steps):
            grouped.append(inner_steps[end])
        start = end + 1
    return grouped


def _group_inner(step: dict, nodes: list[dict], on_host: frozenset, varying: set) -> tuple[dict, bool]:
    """The control-flow step with its blocks grouped, and whether its outputs hold varying scalars."""
    if step["kind"] == "loop":
        body = step["blocks"][0]
        carried = list(zip(body["inputs"][1:], step["args"][2:], body["outputs"][1:]))
        start = set(varying) | {body["inputs"][0]} | {
            slot for slot, first, _ in carried if first[0] == "c" and isinstance(first[1], (int, float))}
        for _ in range(2):  # a value carried round the loop varies if the body hands back a varying one
            end = set(start)
            _group(body["steps"], body["outputs"], nodes, on_host, end)
            start |= {slot for slot, _, result in carried if result[0] == "s" and result[1] in end}
        grouped = dict(body, steps=_group(body["steps"], body["outputs"], nodes, on_host, start))
        return dict(step, blocks=[grouped]), any(ref[0] == "s" and ref[1] in varying for ref in step["args"])
    blocks, outs_vary = [], False
    for block in step["blocks"]:
        end = set(varying)
        blocks.append(dict(block, steps=_group(block["steps"], block["outputs"], nodes, on_host, end)))
        outs_vary |= any(ref[0] == "s" and ref[1] in end for ref in block["outputs"])
    return dict(step, blocks=blocks), outs_vary


def _region(steps: list[dict], start: int, end: int, results: list, nodes: list[dict]) -> list[dict]:
    """steps[start:end] (all graph-safe), in order, with the middle as a `graph` step when it launches enough work.
    Steps at either end that launch nothing (views, host bookkeeping) stay outside: a view of a loop's input indexed
    by the loop counter then enters the graph as a tensor of one shape, not as a counter that changes every
    iteration (a graph bakes in the scalars it reads, so each value would need a graph of its own). A container
    made at the start stays inside: a graph cannot take a list of tensors as an input."""
    first, last = start, end
    while first < last and not _launches(steps[first], nodes) and steps[first].get("op") not in CONTAINERS:
        first += 1
    while last > first and not _launches(steps[last - 1], nodes):
        last -= 1
    run = steps[first:last]
    launches = sum(_launches(s, nodes) for s in run)
    if launches < MIN_REGION_LAUNCHES:
        return steps[start:end]
    reads, writes = [], set()
    for step in run:
        for ref in step["args"]:
            if ref[0] == "s" and ref[1] not in writes and ref[1] not in reads:
                reads.append(ref[1])
        writes.update(step["outs"])
    live = _read_before_written(steps[last:], results)
    outputs = sorted(slot for slot in writes if slot in live)
    freed = {slot for step in run for slot in step.get("free", ())} - set(outputs)
    region = {"kind": "graph", "node": run[0]["node"], "steps": run, "args": [["s", r] for r in reads],
              "outs": outputs, "free": sorted(freed), "launches": launches}
    return [*steps[start:first], region, *steps[last:end]]


def _read_before_written(steps: list[dict], results: list) -> set[int]:
    """The slots whose current values the steps (and then the block's results) read: a region must hand them out."""
    live, written = set(), set()
    for step in steps:
        live.update(slot for slot in _reads(step) if slot not in written)
        written.update(step["outs"])
    live.update(ref[1] for ref in results if ref[0] == "s" and ref[1] not in written)
    return live


def _reads(step: dict) -> Iterator[int]:
    """Every slot a step reads, in its nested blocks too (more than it needs at worst: a copy out too many)."""
    yield from (ref[1] for ref in step.get("args", ()) if ref[0] == "s")
    for block in step.get("blocks", ()):
        for inner in block["steps"]:
            yield from _reads(inner)
        yield from (ref[1] for ref in block["outputs"] if ref[0] == "s")
