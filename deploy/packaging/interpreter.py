"""The reference interpreter of an execution plan: each step is compiled once into a small closure over a list of
slots, and a call runs the closures in order.

The runtime is the C++ one (deploy/cpp: what `jit2triton.load` runs, and what verification checks as it ships).
This one is conversion's: it runs plans before fusion, every op through ATen, to type graphs and to give the
culprit search ATen's value of every IR value (`observe`; the C++ runtime gives the package's: Module::observe).
So it holds none of the production machinery: it reads no package (it takes the plan conversion built), runs no
kernels, checks no inputs, keeps no module state, runs no CUDA graphs, no memory arena, no fast paths.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from jit2triton.errors import Jit2TritonError, StepError

from ..op_facts import UNPACKS
from .packed import build_packed, packed_constant
from ..resolve import resolve_op

Step = Callable[[list], None]
Observer = Callable[[int, tuple], None]  # (node index, output values)


def placed_weights(weights: dict[str, torch.Tensor], plan: dict, device: torch.device) -> dict[str, torch.Tensor]:
    """The weights where the plan runs: on `device`, but those the plan keeps on the CPU (its "host_weights")."""
    host = set(plan.get("host_weights", ()))
    return {name: w.to("cpu" if name in host else device) for name, w in weights.items()}


class Executor:
    def __init__(self, plan: dict, weights: dict[str, torch.Tensor], nodes: list[dict],
                 observe: Optional[Observer] = None) -> None:
        self.weights = weights
        self.nodes = nodes
        self.observe = observe
        self.num_slots = plan["num_slots"]
        self.input_slots = plan["inputs"]
        # Dynamic dims: read from the inputs once per call, into the slot after the plan's own
        self.dim_sources = [(name, position, axis) for name, position, axis in plan.get("dims", ())]
        self.sizes_slot = self.num_slots
        # a size table per call also where no dim comes from the inputs but steps bind some (a count read from data)
        self.has_sizes = bool(self.dim_sources or plan.get("bound_dims"))
        self.packed = build_packed(plan.get("packed", ()), self.literal)  # a quantized op's packed weights
        self.steps = self.compile_block(plan["steps"])
        self.output_getters = [self.getter(r) for r in plan["outputs"]]

    def __call__(self, inputs: list) -> list:
        env: list = [None] * (self.num_slots + 1)
        for slot, value in zip(self.input_slots, inputs):
            env[slot] = value
        if self.has_sizes:
            env[self.sizes_slot] = self.sizes_of(inputs)
        self.run_steps(self.steps, env)
        return [get(env) for get in self.output_getters]

    def run_steps(self, steps: list[tuple[Step, int]], env: list) -> None:
        for step, node in steps:
            try:
                step(env)
            except Jit2TritonError:
                raise
            except Exception as err:
                raise self.failure(node)(err) from err

    # --- compiling steps -------------------------------------------------------------------------------------

    def literal(self, ref: list) -> Any:
        if ref[0] == "w":
            return self.weights[ref[1]]
        if ref[0] == "wl":
            return [self.weights[name] for name in ref[1]]
        if ref[0] == "p":
            return packed_constant(self.packed, ref[1])
        return ref[1]

    def getter(self, ref: list) -> Callable[[list], Any]:
        if ref[0] == "s":
            slot = ref[1]
            return lambda env: env[slot]
        value = self.literal(ref)
        return lambda env: value

    def compile_block(self, steps: list[dict]) -> list[tuple[Step, int]]:
        return [(self.compile_step(s), s["node"]) for s in steps]

    def compile_step(self, step: dict) -> Step:
        kind = step["kind"]
        if kind == "call":
            return self.compile_call(step)
        if kind == "if":
            return self.compile_if(step)
        if kind == "loop":
            return self.compile_loop(step)
        raise Jit2TritonError(f"a {kind!r} step: the reference interpreter runs plans before fusion (every op through "
                              "ATen), with no kernel or region steps")

    def compile_call(self, step: dict) -> Step:
        fn = resolve_op(step["op"])
        args = step["args"]
        template = [None if r[0] == "s" else self.literal(r) for r in args]
        from_slots = [(i, r[1]) for i, r in enumerate(args) if r[0] == "s"]
        kwnames = tuple(step.get("kwnames", ()))
        npos = len(args) - len(kwnames)
        outs = step["outs"]
        free = step.get("free", ())
        node, observe = step["node"], self.observe
        unpacks = step["op"] in UNPACKS  # one output per item, however many: `[x] = chunk(...)` is one
        if step.get("binds"):
            return self.binding(step, self.compile_call(dict(step, binds=(), free=())), free)

        def call(env: list) -> None:
            a = template.copy()
            for i, slot in from_slots:
                a[i] = env[slot]
            if kwnames:
                result = fn(*a[:npos], **dict(zip(kwnames, a[npos:])))
            else:
                result = fn(*a)
            if unpacks and len(result) != len(outs):
                raise ValueError(f"cannot unpack {len(result)} values into {len(outs)}")
            if not outs:  # (a call made for its effect: nothing to store or observe)
                _store(env, outs, (), free, None, node)
            else:
                _store(env, outs, (result,) if len(outs) == 1 and not unpacks else tuple(result), free, observe, node)

        return call

    def binding(self, step: dict, call: Step, free: list) -> Step:
        """A call (or an `if`) that also binds sizes of its outputs into the call's size table
        (transpiler/bind_sizes.py), read before its slots are released."""
        binds = [(name, step["outs"][index], axis) for name, index, axis in step["binds"]]
        sizes_slot = self.sizes_slot

        def bind(env: list) -> None:
            call(env)
            sizes = env[sizes_slot]
            for name, slot, axis in binds:
                sizes[name] = env[slot].shape[axis]
            for slot in free:
                env[slot] = None

        return bind

    def failure(self, node: int) -> Callable[[Exception], StepError]:
        info = self.nodes[node]
        where = f" (model source {info['source']})" if info.get("source") else ""
        return lambda err: StepError(f"{info['op']} failed{where}: {type(err).__name__}: {err}")

    def sizes_of(self, inputs: list) -> dict:
        return {name: inputs[position].shape[axis] for name, position, axis in self.dim_sources}

    def compile_if(self, step: dict) -> Step:
        if step.get("binds"):  # (sizes of its outputs, whichever branch ran: bind_sizes.py)
            return self.binding(step, self.compile_if(dict(step, binds=(), free=())), step.get("free", []))
        cond = self.getter(step["args"][0])
        branches = [self.compile_subblock(b) for b in step["blocks"]]
        outs, free = step["outs"], step.get("free", ())
        run, node, observe = self.run_steps, step["node"], self.observe

        def if_(env: list) -> None:
            steps, results = branches[0] if _condition(cond(env)) else branches[1]
            run(steps, env)
            _store(env, outs, tuple(get(env) for get in results), free, observe, node)

        return if_

    def compile_loop(self, step: dict) -> Step:
        trip_count, condition = self.getter(step["args"][0]), self.getter(step["args"][1])
        initial = [self.getter(r) for r in step["args"][2:]]
        body = step["blocks"][0]
        body_steps, body_results = self.compile_subblock(body)
        index_slot, carried_slots = body["inputs"][0], body["inputs"][1:]
        outs, free = step["outs"], step.get("free", ())
        run, node, observe = self.run_steps, step["node"], self.observe

        def loop(env: list) -> None:
            trips, go = _trip_count(trip_count(env)), _condition(condition(env))
            carried = [get(env) for get in initial]
            i = 0
            while go and i < trips:
                env[index_slot] = i
                for slot, value in zip(carried_slots, carried):
                    env[slot] = value
                run(body_steps, env)
                go = _condition(body_results[0](env))
                carried = [get(env) for get in body_results[1:]]
                i += 1
            for slot, value in zip(outs, carried):
                env[slot] = value
            if observe:
                observe(node, tuple(carried))
            for slot in free:
                env[slot] = None

        return loop

    def compile_subblock(self, block: dict) -> tuple[list[tuple[Step, int]], list[Callable]]:
        return self.compile_block(block["steps"]), [self.getter(r) for r in block["outputs"]]


def _condition(value: Any) -> bool:
    """A control-flow step's condition, a bool as TorchScript types it (plan.cpp's condition_of): a damaged plan's
    NaN or list there would run as Python's truth of it."""
    if type(value) is not bool:
        raise TypeError(f"a condition is {type(value).__name__}, not a bool")
    return value


def _trip_count(value: Any) -> int:
    if type(value) is not int:
        raise TypeError(f"a loop's trip count is {type(value).__name__}, not an int")
    return value


def _store(env: list, outs: list, values: tuple, free, observe, node: int) -> None:
    """A step's outputs into their slots (handed to `observe` where there is one), then the slots it was the last
    reader of released."""
    for slot, value in zip(outs, values):
        env[slot] = value
    if observe:
        observe(node, values)
    for slot in free:
        env[slot] = None
