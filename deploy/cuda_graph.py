"""Run plans as CUDA graphs: static input buffers, a capture, then a call is "copy inputs in, replay, copy
outputs out" with no per-step Python work.

`GraphRunner` runs a whole straight-line plan as one graph; its outputs are copied out of the graph's memory unless
the caller asks to alias them (then the next call overwrites them). `RegionGraphs` runs one `graph` step of a plan
with control flow (deploy/graph_regions.py says which steps form one), inside a loop body replayed once per
iteration; its outputs are always copies, since a later iteration's replay overwrites the graph's memory.
"""
from __future__ import annotations

import threading
import warnings
from typing import Any, Callable, Optional

import torch

from .policy import (AGE_CALLS, COPY_BYTES_PER_US, LAUNCH_US, MAX_GRAPHS, MAX_SEEN, OWN_COPY_BYTES,
                     REPLAY_LAUNCHES)


class NotCapturable(Exception):
    """The work synchronises with the host (an op sizes its result by the data, or copies to the host): a graph
    cannot hold it."""


# Held while a graph is warmed up and captured: the sync-debug mode and the capture itself are global to the
# process, so two captures must not overlap. (A thread that syncs with the host while another warms up a graph gets
# the sync error too: serve a GPU model from one thread, or load it with cuda_graphs=False.)
_CAPTURING = threading.Lock()


def _warm_up(run: Callable[[], Any], times: int) -> None:
    """Runs outside a graph on a side stream (lazy initialisation, per-stream library state), with synchronising
    CUDA calls turned into errors: an op that syncs would make the capture fail, and a failed capture leaves
    torch's allocator and random generators in capture mode, so it must be found here, before capturing."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings():  # torch calls the mode "a prototype feature"; a sync it misses fails the capture
        warnings.simplefilter("ignore")
        torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.stream(stream):
            for _ in range(times):
                run()
    except RuntimeError as err:
        if "synchroniz" not in str(err):
            raise
        raise NotCapturable(str(err)) from None
    finally:
        torch.cuda.set_sync_debug_mode(previous)
        torch.cuda.current_stream().wait_stream(stream)


class Admission:
    """Which keys (shapes, scalars) hold CUDA graphs when more come than MAX_GRAPHS places, as in a server seeing
    many sequence lengths. Every call counts a sighting of its key; the counts halve every AGE_CALLS calls, so they
    follow the traffic. A key is captured on its second sighting into a free place, or into the place of the held
    key seen least, if this key was seen more: the frequent shapes keep graphs, and a burst of new shapes cannot
    make call after call capture (a newcomer must out-count the graph it would replace)."""

    def __init__(self) -> None:
        self.counts: dict = {}
        self.calls = 0

    def sighted(self, key) -> None:
        self.calls += 1
        if self.calls >= AGE_CALLS:
            self.calls = 0
            self.counts = {k: n // 2 for k, n in self.counts.items() if n > 1}
        if key not in self.counts and len(self.counts) >= MAX_SEEN:  # bounded: keys seen once go first
            self.counts = {k: n for k, n in self.counts.items() if n > 1}
            if len(self.counts) >= MAX_SEEN:
                self.counts.clear()
        self.counts[key] = self.counts.get(key, 0) + 1

    def admit(self, key, graphs: dict) -> bool:
        """Whether to capture `key` (sighted, not held) now; once captured, `make_room` before storing it."""
        count = self.counts.get(key, 0)
        return count >= 2 and (len(graphs) < MAX_GRAPHS or self.counts.get(self._least(graphs), 0) < count)

    def make_room(self, graphs: dict) -> None:
        """Drops the least-seen graph when every place is taken (after the capture, so a failed one evicts none)."""
        if len(graphs) >= MAX_GRAPHS:
            del graphs[self._least(graphs)]

    def _least(self, graphs: dict):
        return min(graphs, key=lambda k: self.counts.get(k, 0))


class _Captured:
    def __init__(self, run: Callable[[list], list], inputs: list) -> None:
        self.inputs = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
        with _CAPTURING:
            _warm_up(lambda: run(self.inputs), times=2)
            self.graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(self.graph):
                    self.outputs = run(self.inputs)
            except Exception as err:  # noqa: BLE001 - a sync the debug mode missed: the steps still run
                raise NotCapturable(str(err)) from err


class GraphRunner:
    """Scalars (ints, floats, bools) passed as inputs are baked into a graph when it is captured, so each distinct
    tuple of them gets its own graph.

    The first call with a tuple runs step by step and the second captures: a process that needs one answer (a
    cold start) never pays for warm-up runs and a capture it will not replay."""

    def __init__(self, run: Callable[[list], list], alias_outputs: bool = False, by_shape: bool = False) -> None:
        self.run = run
        self.alias_outputs = alias_outputs
        self.by_shape = by_shape  # dynamic dims: the input check fixed dtypes only, so shapes are part of the key
        self.graphs: dict[tuple, _Captured] = {}
        self.admission = Admission()
        self.refused = False  # the plan synchronises with the host: it always runs step by step
        self.lock = threading.Lock()  # replays share the static buffers

    def __call__(self, inputs: list) -> list:
        key = _key(inputs, layouts=self.by_shape)  # else the input check fixed the tensors' shapes and dtypes
        with self.lock:
            captured = None
            if key is not None and not self.refused:
                self.admission.sighted(key)
                captured = self.graphs.get(key)
                if captured is None and self.admission.admit(key, self.graphs):
                    try:
                        captured = _Captured(self.run, inputs)
                    except NotCapturable:
                        self.refused = True
                    else:
                        self.admission.make_room(self.graphs)
                        self.graphs[key] = captured
            if captured is not None:
                _copy_in(captured.inputs, inputs)
                captured.graph.replay()
                return list(captured.outputs) if self.alias_outputs else _copy_outputs(captured.outputs)
        return self.run(inputs)


def _copy_in(statics: list, inputs: list) -> None:
    """The inputs into the graph's buffers: small tensors in one launch (a multi-tensor copy), large ones each on its
    own (a memcpy, several times faster per byte)."""
    _copy_pairs([(s, x) for s, x in zip(statics, inputs) if isinstance(s, torch.Tensor)])


def _copy_pairs(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    small = []
    for to, source in pairs:
        if to.numel() * to.element_size() >= OWN_COPY_BYTES:
            to.copy_(source)
        else:
            small.append((to, source))
    if small:
        torch._foreach_copy_([t for t, _ in small], [x for _, x in small])


def _copy_outputs(outputs: list) -> list:
    """Copies of the graph's outputs, the plain tensors among them copied as the inputs are."""
    copied = [o if isinstance(o, torch.Tensor) else _copy_out(o) for o in outputs]
    tensors = [i for i, o in enumerate(outputs) if isinstance(o, torch.Tensor)]
    if tensors:
        fresh = [torch.empty_like(outputs[i]) for i in tensors]
        _copy_pairs(list(zip(fresh, [outputs[i] for i in tensors])))
        for i, t in zip(tensors, fresh):
            copied[i] = t
    return copied


def _copy_out(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (list, tuple)):
        return type(value)(_copy_out(v) for v in value)
    if isinstance(value, dict):
        return {k: _copy_out(v) for k, v in value.items()}
    return value


_SCALARS = (bool, int, float, str, torch.dtype, torch.device, type(None))


def _key(values: list, layouts: bool = True) -> Optional[tuple]:
    """What a graph is specialised to: each tensor input's layout and each other input's value (a graph bakes
    those in). None when an input must not be captured: a CPU tensor (a graph reads its values on the host once,
    when it is captured), or a container (its tensors would not be copied into static buffers)."""
    key = []
    for v in values:
        if isinstance(v, torch.Tensor):
            if not v.is_cuda:
                return None
            if layouts:
                key.append((v.shape, v.stride(), v.dtype, v.device.index))
        elif isinstance(v, float):
            key.append((float, v.hex()))  # by its bits: -0.0 and 0.0 are equal as keys, not as graphs
        elif isinstance(v, _SCALARS):
            key.append((type(v), v))  # typed: 1, 1.0 and True are equal as keys, not as graphs
        else:
            return None
    return tuple(key)


class RegionGraphs:
    """One `graph` step: graphs keyed by its inputs' layouts and scalar values, each captured on the second time
    its key is seen (a region run once never pays for a capture), at most MAX_GRAPHS of them (`Admission`). A key
    whose graph would cost more in copies than it saves in launches, or whose capture fails (an op CUDA graphs do
    not allow), runs step by step from then on."""

    def __init__(self, step: dict, steps: list, run_steps: Callable[[list, list], None], num_slots: int,
                 pool: Any, sizes_slot: Optional[int] = None) -> None:
        """`sizes_slot`: where the call's dynamic dims are (kernels inside read them), or None in a static plan; a
        graph is also specialised to them (a kernel's grid and allocations follow the dims, not only its inputs)."""
        self.steps, self.run_steps, self.num_slots, self.pool = steps, run_steps, num_slots, pool
        self.sizes_slot = sizes_slot
        self.in_slots = [ref[1] for ref in step["args"]]
        self.out_slots = step["outs"]
        self.free = step.get("free", ())
        self.launches = step["launches"]
        self.graphs: dict[tuple, _CapturedRegion] = {}
        self.admission = Admission()
        self.refused: set[tuple] = set()
        self.lock = threading.Lock()  # replays share the static buffers

    def __call__(self, env: list) -> None:
        inputs = [env[slot] for slot in self.in_slots]
        key = _key(inputs)
        sizes = None
        if self.sizes_slot is not None:
            sizes = env[self.sizes_slot]
            if key is not None:
                key += (tuple(sizes.values()),)  # one call's dims always come in the plan's order
        if key is not None:
            with self.lock:
                self.admission.sighted(key)
                captured = self.graphs.get(key)
                if captured is None and key not in self.refused and self.admission.admit(key, self.graphs):
                    captured = self.capture(inputs, sizes)
                    if captured is None:
                        if len(self.refused) >= MAX_SEEN:
                            self.refused.clear()
                        self.refused.add(key)
                    else:
                        self.admission.make_room(self.graphs)
                        self.graphs[key] = captured
                if captured is not None:
                    _copy_in(captured.inputs, inputs)
                    captured.graph.replay()
                    outputs = _copy_outputs(captured.outputs)
            if captured is not None:
                for slot, value in zip(self.out_slots, outputs):
                    env[slot] = value
                for slot in self.free:
                    env[slot] = None
                return
        self.run_steps(self.steps, env)

    def capture(self, inputs: list, sizes: Optional[dict]) -> Optional["_CapturedRegion"]:
        """A replay costs three launches (the copy in, the graph, the copy out) and the bytes it copies: a region
        that launches no more than that, or copies too much, runs step by step."""
        copied = sum(x.numel() * x.element_size() for x in inputs if isinstance(x, torch.Tensor))
        if self.launches <= REPLAY_LAUNCHES or copied / COPY_BYTES_PER_US >= LAUNCH_US * self.launches:
            return None
        try:
            captured = _CapturedRegion(self, inputs, sizes)
        except NotCapturable:
            return None
        copied += sum(o.numel() * o.element_size() for o in captured.outputs if isinstance(o, torch.Tensor))
        if copied / COPY_BYTES_PER_US >= LAUNCH_US * self.launches:
            return None
        return captured

    def run_on(self, inputs: list, sizes: Optional[dict]) -> list:
        env = [None] * self.num_slots
        for slot, value in zip(self.in_slots, inputs):
            env[slot] = value
        if self.sizes_slot is not None:
            env[self.sizes_slot] = sizes
        self.run_steps(self.steps, env)
        return [env[slot] for slot in self.out_slots]


def _static_copy(x: torch.Tensor) -> torch.Tensor:
    """A graph's buffer for an input, in the input's own strides where they allow it (a strided view stays strided,
    so a kernel that indexes it with those strides needs no copy inside the graph)."""
    if 0 in x.stride():  # an expanded input: a clone, as a buffer cannot repeat its elements
        return x.clone()
    return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device).copy_(x)


class _CapturedRegion:
    def __init__(self, region: RegionGraphs, inputs: list, sizes: Optional[dict]) -> None:
        self.inputs = [_static_copy(x) if isinstance(x, torch.Tensor) else x for x in inputs]
        with _CAPTURING:
            _warm_up(lambda: region.run_on(self.inputs, sizes), times=1)
            self.graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(self.graph, pool=region.pool):
                    self.outputs = region.run_on(self.inputs, sizes)
            except Exception as err:  # noqa: BLE001 - a sync the debug mode missed: the steps still run
                raise NotCapturable(str(err)) from err
