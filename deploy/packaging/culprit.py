"""Which generated kernel makes a package disagree with TorchScript: found by running the plan before fusion (every
op through ATen, in the reference interpreter) and the package (in the C++ runtime that ships it, every step
observed) side by side on the inputs that failed, and comparing every value a kernel writes with the value ATen
computed for the same IR value. Conversion only: the runtimes never import this module.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from jit2triton.transpiler import pipeline
from jit2triton.transpiler.ir import KERNEL_OP, Attr, literals
from jit2triton.transpiler.op_table import lookup

from .interpreter import Executor, placed_weights

ErrorOf = Callable[[torch.Tensor, torch.Tensor], float]  # (actual, expected) -> 0 where they agree to rounding
# The package run on a plan's inputs, every step observed: [(node, its outputs)] in the order made, at most
# MAX_OCCURRENCES per node (the C++ runtime's Module::observe, through verify.PackageRunner)
Observe = Callable[[list, int], list]
Trace = dict[tuple[int, int], torch.Tensor]  # (IR value id, which time the plan made it) -> the tensor, in order
# A loop's iterations compared apart, up to this many per value (each a copy kept while the search runs): where only
# the last is kept, a decision rounding flipped in an earlier iteration (a detector's top-k per feature level) goes
# unseen, and a kernel after the loop takes the blame
MAX_OCCURRENCES = 16


@dataclass
class Culprit:
    """"kernel": `node` is a generated kernel that differs from ATen (take it out). "rounding": `node` is a
    discontinuous op (a comparison, a sort, NMS) that decided differently on inputs that agreed to rounding, the first
    value to differ on every failed case (keep the kernels)."""
    kind: str
    node: Any
    error: float
    key: tuple[int, int] = (0, 0)  # the value that differs (IR value id, which time the plan made it)


def find_culprit(graph, sched: pipeline.Plan, observe: Observe, failed_inputs: list[list], device: torch.device,
                 error_of: ErrorOf) -> Optional[Culprit]:
    """Why the package (built from `sched`, the plan of `graph` after fusion; `observe` runs it) disagrees with
    TorchScript on `failed_inputs`; None when neither a kernel nor rounding explains it."""
    before = pipeline.plan(graph)
    weights = placed_weights(before.weights, before.plan, device)
    constants = literals(graph)
    rounding = None
    for inputs in failed_inputs:
        reference = observed_values(before.plan, weights, before.node_table, before.nodes, inputs)
        actual = fused_values(observe, sched.nodes, inputs)
        first = first_divergence(reference, actual, sched.nodes, error_of)
        if first is not None and first.node.op == KERNEL_OP:
            return first
        given = {v.id: x for v, x in zip(graph.inputs, inputs)}
        given.update(constants)
        finished = _finished_kernel(first, actual, given)
        if finished is not None:
            return finished
        kernel = divergent_kernel(reference, actual, sched.nodes, error_of)  # after an ATen op that parted
        if first is not None and lookup(first.node.op).discontinuous:
            if _same_inputs(first, reference, actual, given):
                return None  # the same inputs decided otherwise: not rounding (a runtime's own op, say, is wrong)
            rounding = rounding or Culprit("rounding", first.node, first.error)
        elif kernel is not None:
            return kernel
        else:
            return None  # a failed case nothing explains
    return rounding


def _finished_kernel(first: Optional[Culprit], actual: Trace, given: dict) -> Optional[Culprit]:
    """Where the first value to differ is made by an ATen node that finishes kernels' work (Attr.FINISHES): the
    kernel, where the op it stands for, run through ATen on the package's own inputs to it, gives another answer
    than the package (upstream rounding cannot explain that); else None."""
    if first is None or Attr.FINISHES not in first.node.attrs:
        return None
    kernel, stood_for = first.node.attrs[Attr.FINISHES]
    args = _inputs_read(stood_for, first.key[1], actual, given)
    if args is None:
        return None
    namespace, _, name = stood_for.op.partition("::")
    try:
        expected = getattr(getattr(torch.ops, namespace), name.partition(".")[0])(*args)
    except Exception:  # noqa: BLE001 - no answer to compare with: leave it to the other explanations
        return None
    got = actual[first.key]
    if got.shape == expected.shape and torch.equal(got, expected.to(got.device)):
        return None
    return Culprit("kernel", kernel, first.error)


def _same_inputs(first: Culprit, reference: Trace, actual: Trace, given: dict) -> bool:
    """Whether the discontinuous node that made the first value to differ read the same inputs, tensors bit for
    bit, in the package as in ATen's plan; False where that is not known."""
    ours = _inputs_read(first.node, first.key[1], actual, given)
    theirs = _inputs_read(first.node, first.key[1], reference, given)
    return ours is not None and theirs is not None and all(_same(a, b) for a, b in zip(ours, theirs))


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b.to(a.device))
    return not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor) and a == b


def _inputs_read(node, occurrence: int, trace: Trace, given: dict) -> Optional[list]:
    """`node`'s inputs as a run read them: each tensor as `trace` made it (in the same loop iteration as the value
    that differs, or once before the loop), else as `given` (the model's inputs, the constants); None where an
    input is none of these (a host number made from data, a list built at run time)."""
    args = []
    for v in node.inputs:
        made = [key for key in trace if key[0] == v.id]
        if made:
            args.append(trace[max((k for k in made if k[1] <= occurrence), default=made[0])])
        elif v.id in given:
            args.append(given[v.id])
        else:
            return None
    return args


def observed_values(plan: dict, weights: dict, node_table: list, nodes: list, inputs: list) -> Trace:
    """Run a plan (every op through ATen) on `inputs` in the reference interpreter and keep every tensor it makes,
    by IR value id and occurrence (a loop's iterations apart, up to MAX_OCCURRENCES), in the order made. A run
    that fails keeps what it made before the failure."""
    seen: Trace = {}
    made: Counter = Counter()

    def observe(index: int, outputs: tuple) -> None:
        _keep(seen, made, nodes[index], outputs)

    executor = Executor(plan, weights, node_table, observe=observe)
    try:
        executor([x.clone() if isinstance(x, torch.Tensor) else x for x in inputs])
    except Exception:  # noqa: BLE001 - what it made before the failure is what there is to compare
        pass
    return seen


def fused_values(observe: Observe, nodes: list, inputs: list) -> Trace:
    """Every tensor the package makes on `inputs` in the C++ runtime, its kernels' and its ATen steps', as
    observed_values keeps them."""
    seen: Trace = {}
    made: Counter = Counter()
    for index, outputs in observe([x.clone() if isinstance(x, torch.Tensor) else x for x in inputs], MAX_OCCURRENCES):
        _keep(seen, made, nodes[index], outputs)
    return seen


def _keep(seen: Trace, made: Counter, node, outputs: tuple) -> None:
    for value, obj in zip(node.outputs, outputs):
        if isinstance(obj, torch.Tensor) and made[value.id] < MAX_OCCURRENCES:
            seen[(value.id, made[value.id])] = obj.detach().clone()
        made[value.id] += 1


def divergent_kernel(reference: Trace, fused: Trace, nodes: list, error_of: ErrorOf) -> Optional[Culprit]:
    """The first kernel node (in execution order) whose output differs from ATen's value for it, with its error."""
    return first_divergence(reference, fused, [node for node in nodes if node.op == KERNEL_OP], error_of)


def first_divergence(reference: Trace, actual: Trace, nodes: list, error_of: ErrorOf) -> Optional[Culprit]:
    """The node that made the first value (in the order the package made them) differing from ATen's, with its
    error: there the package and the model first part. Everything before it agreed, so where that node is a
    discontinuous op (a comparison, an argsort, NMS: the op table's `discontinuous`), nearly equal inputs decided
    differently, which rounding alone does; where it is a kernel, the kernel is wrong."""
    producer = {v.id: node for node in nodes for v in node.outputs}
    for key, value in actual.items():
        expected = reference.get(key)
        if expected is None or key[0] not in producer:
            continue
        error = error_of(value, expected)
        if error:
            return Culprit("kernel", producer[key[0]], error, key)
    return None
