"""The conversion pipeline, in order: every pass the transpiler runs, each a function `(graph, context) -> graph`.

    TorchScript graph ─▶ from_torchscript ─▶ PREPARE ─▶ (REWRITES, when kernels are generated) ─▶ fuse
                      ─▶ merge_kernels ─▶ gemm_kernels, conv_kernels ─▶ epilogues ─▶ build_plan
                      ─▶ plan_arena (CPU)

PREPARE types every value (by running the plan once on the example inputs) and, for a reduced-precision package,
rewrites the graph to float16/bfloat16 where the rules allow (precision.py) and types it again; REWRITES reshape
the graph for fusion and must each leave a graph that still runs through ATen alone (the plan before fusion is
verification's reference). `fuse` lowers and fuses what it can into kernels, `merge_kernels` joins sibling
kernels, the GEMMs and convolutions timed faster as templates become template kernels, each taking the pointwise
kernel after it, and `build_plan` turns the result into the plan the runtimes run. The face
(`jit2triton/conversion.py`) supplies the one thing the transpiler cannot: an interpreter to run a plan with
(`Context.run_plan`, the runtime's executor), so no stage imports a later one.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

import torch

from jit2triton.errors import ConversionError, Jit2TritonError, TimeBudgetError

from .bind_sizes import bind_opaque_sizes
from .check_indices import check_indices
from .data_sizes import mark_data_dependent
from .decompose_mha import decompose_mha
from .fold_shapes import fold_shapes
from .functionalize import functionalize
from .fuse import fuse
from .fuse_attention import fuse_attention
from .infer_shapes import ShapeRecorder
from .infer_unobserved import infer_unobserved
from .ir import Graph
from .op_table import lookup
from .merge_kernels import merge_kernels
from .gemm_forms import gemm_forms
from .gemm_kernels import gemm_kernels
from .conv_kernels import conv_kernels
from .epilogues import take_epilogues
from .onednn_linear import onednn_linear
from .onednn_conv import as_it_will_run, onednn_conv
from .pixel_convs import pixel_convs
from .place_on_device import place_on_device
from .build_plan import Plan, build_plan
from .channels_last import channels_last
from .plan_arena import plan_arena
from .precision import PrecisionPlan, cast_floats, reduce_precision
from .split_conv_bias import split_conv_bias
from .split_norms import split_norms
from .unpack_splits import unpack_splits

RunPlan = Callable[[Plan, list, Optional[Callable]], list]  # (plan, inputs, observer) -> outputs


@dataclass
class Budget:
    """A conversion's time budget: `seconds` from its start, ending at `deadline` (time.monotonic())."""
    seconds: float
    deadline: float

    @classmethod
    def starting_now(cls, seconds: Optional[float]) -> Optional["Budget"]:
        if seconds is None:
            return None
        if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not seconds > 0:
            raise ConversionError(f"timeout must be a positive number of seconds (or None: no budget), got "
                                  f"{seconds!r}")
        return cls(float(seconds), time.monotonic() + seconds)


class Stopwatch:
    """Seconds spent in each stage of a conversion, keyed by stage name in the order first met (a stage met again,
    in a second build after verification took a kernel out, adds to its time): the report's `pass_seconds`, so a
    model that converts slowly says where the time went. `say` is the conversion's progress callback.

    With a `budget`, a stage that starts or ends past its deadline (and a long stage that calls `check` as it goes)
    ends the conversion with a ConversionError naming the stage the time went to."""

    def __init__(self, say: Optional[Callable[[str], None]] = None, budget: Optional[Budget] = None) -> None:
        self.seconds: dict[str, float] = {}
        self.say = say or (lambda message: None)
        self.budget = budget
        self.active: list[tuple[str, float]] = []  # the stages running, with when each started
        self.last = ""  # the stage that ended last

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        self.check()
        start = time.perf_counter()
        self.active.append((name, start))
        try:
            yield
        finally:
            self.active.pop()
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
            self.last = name
        self.check()

    def remaining(self) -> Optional[float]:
        """Seconds left in the budget (None: no budget)."""
        return None if self.budget is None else max(0.0, self.budget.deadline - time.monotonic())

    def check(self) -> None:
        """A ConversionError naming the stage the time went to, once the budget is spent."""
        if self.budget is None or time.monotonic() < self.budget.deadline:
            return
        stage, started = self.active[-1] if self.active else (self.last or "load", None)
        spent = self.seconds.get(stage, 0.0) + (time.perf_counter() - started if started is not None else 0.0)
        slowest = sorted(self.seconds.items(), key=lambda item: -item[1])[:3]
        raise TimeBudgetError(
            f"the conversion ran past its time budget of {self.budget.seconds:g} s in stage {stage} ({spent:.1f} s "
            "there)" + (f"; the slowest finished stages: {', '.join(f'{n} {t:.1f} s' for n, t in slowest)}"
                        if slowest else "")
            + ". Pass a larger timeout= (--timeout on the command line), or None for no budget")

    def report(self) -> dict[str, float]:
        return {name: round(seconds, 3) for name, seconds in self.seconds.items()}


@dataclass
class Context:
    device: torch.device
    example_inputs: list
    run_plan: RunPlan
    recorder: Optional[ShapeRecorder] = None
    outputs: list = field(default_factory=list)  # the model's outputs on the example inputs
    draw_outputs: list = field(default_factory=list)  # (sizes, outputs) at each draw of the dynamic dims
    # Dynamic dims: their sizes in the example inputs, and other draws of them (sizes, inputs) to observe as well
    example_sizes: dict[str, int] = field(default_factory=dict)
    draws: list[tuple[dict[str, int], list]] = field(default_factory=list)
    # ... and where the model runs there, the ranges' largest sizes: a size that only grows past 1 late (a conv
    # net's last feature map, ceil(H / 32)) looks static at small draws
    largest: Optional[tuple[dict[str, int], list]] = None
    # The example inputs' shapes with other values: run where the model has ops whose output sizes depend on data
    # (a mask's count), so that those sizes are seen to vary and no kernel is fitted to the example's count
    value_draws: list[list] = field(default_factory=list)
    # ... also run where values other than data may set sizes: an integer input (`for _ in range(n)`)
    vary_values: bool = False
    value_draws_ran: int = 0  # how many of them the model ran on (the others it refused)
    # Module state: (input position, output position) of each attribute the model writes. The model is also run as
    # a sequence of calls, each on `later_calls`' inputs with the state the call before returned, so that state
    # whose size changes between calls (a cache grown by `cat`) is seen to vary and no kernel is fitted to its size
    state_feedback: list[tuple[int, int]] = field(default_factory=list)
    later_calls: list[list] = field(default_factory=list)
    # Whether generated kernels may take the dynamic dims as arguments (name -> (min, max, example)); else values
    # with dynamic sizes run through ATen
    kernel_dims: Optional[dict[str, tuple]] = None
    refused: dict[int, str] = field(default_factory=dict)  # node uid -> why it must run through ATen
    stopwatch: Stopwatch = field(default_factory=Stopwatch)  # each pass's seconds, and progress as passes start
    precision: Optional[PrecisionPlan] = None  # a reduced-precision package: its type, and what stays float32
    # The generated GEMM form's hook (gemm_forms.Generated), where the face generates Triton kernels: the transpiler
    # cannot import the emitters that render and time it
    generated_gemm: Optional[Callable] = None
    # The generated convolutions' hook (onednn_conv.py times them), where the face generates C++ kernels
    generated_conv: Optional[Callable] = None
    # Whether an invented draw (inputs, its name) crashes TorchScript itself (the face runs it in a child process
    # first): such a draw is skipped, not run here
    crashes: Callable[[list, str], Optional[str]] = lambda inputs, name: None


def observe(graph: Graph, ctx: Context) -> Graph:
    """Run the graph on the example inputs (and on each draw of the dynamic dims) through ATen and write every
    value's dtype, shape and strides into the IR: the reference interpreter behind shape inference."""
    sched = build_plan(graph)
    recorder = ShapeRecorder(sched.nodes)
    recorder.next_draw(ctx.example_sizes)
    recorder.observe_values(graph.inputs, ctx.example_inputs)
    try:
        ctx.outputs = ctx.run_plan(sched, ctx.example_inputs, recorder)
    except TimeBudgetError:
        raise
    except ConversionError as err:
        raise ConversionError(f"on the example inputs, {err}") from None
    if ctx.vary_values or any(lookup(node.op).data_dependent_size for node in graph.walk()):  # a mask's count
        for number, inputs in enumerate(ctx.value_draws, 1):
            if ctx.crashes(inputs, f"other values {number} (for data-dependent sizes)"):
                continue
            recorder.next_draw(ctx.example_sizes)
            recorder.observe_values(graph.inputs, inputs)
            try:
                ctx.draw_outputs.append((ctx.example_sizes, ctx.run_plan(sched, inputs, recorder)))
                ctx.value_draws_ran += 1
            except TimeBudgetError:
                raise
            except Jit2TritonError:  # the model refuses these values (an assert on them): nothing learnt
                recorder.drop_draw()
    _observe_later_calls(graph, sched, ctx, recorder)
    for sizes, inputs in ctx.draws + ([ctx.largest] if ctx.largest is not None else []):
        at = ", ".join(f"{name}={n}" for name, n in sizes.items())
        crashed = ctx.crashes(inputs, f"dims at {at}")
        if crashed:
            raise ConversionError(f"the model does not run with its dynamic dims at {at}: TorchScript itself "
                                  f"crashed there ({crashed}). Give the dims ranges the model runs over")
    for sizes, inputs in ctx.draws:
        recorder.next_draw(sizes)
        recorder.observe_values(graph.inputs, inputs)
        try:
            ctx.draw_outputs.append((sizes, ctx.run_plan(sched, inputs, recorder)))
        except TimeBudgetError:
            raise
        except ConversionError as err:
            at = ", ".join(f"{name}={n}" for name, n in sizes.items())
            raise ConversionError(f"the model does not run with its dynamic dims at {at}: {err}. It specialises on "
                                  "those sizes (a reshape to a constant shape, or a branch a trace baked in): "
                                  "declare the dim static, or give it a range the model accepts") from None
    if ctx.largest is not None:
        sizes, inputs = ctx.largest
        recorder.next_draw(sizes)
        recorder.observe_values(graph.inputs, inputs)
        try:
            ctx.draw_outputs.append((sizes, ctx.run_plan(sched, inputs, recorder)))
        except TimeBudgetError:
            raise
        except ConversionError as err:  # each dim's end ran on its own (jit2triton/dim_ranges.py), not together
            at = ", ".join(f"{name}={n}" for name, n in sizes.items())
            raise ConversionError(f"each dim's range runs on its own, but with every dim at its largest ({at}) the "
                                  f"model fails: {err}. Narrow one of the ranges") from None
    recorder.annotate()
    mark_data_dependent(graph, recorder)  # sizes computed from data stay opaque even where no draw varied them
    ctx.recorder = recorder
    return graph


def _observe_later_calls(graph: Graph, sched: Plan, ctx: Context, recorder: ShapeRecorder) -> None:
    """Run the model as a sequence of calls after the example's, each taking the state the one before returned."""
    if not ctx.state_feedback:
        return
    previous = ctx.outputs
    for inputs in ctx.later_calls:
        inputs = list(inputs)
        for position, output in ctx.state_feedback:  # (copies: the plan may write its state in place, and the
            inputs[position] = _copied(previous[output])  # example's inputs are run again by later passes)
        recorder.next_draw(ctx.example_sizes)
        recorder.observe_values(graph.inputs, inputs)
        try:
            previous = ctx.run_plan(sched, inputs, recorder)
        except TimeBudgetError:
            raise
        except Jit2TritonError:  # the model refuses this call (an assert on its state): nothing more to learn
            recorder.drop_draw()
            return
        ctx.draw_outputs.append((ctx.example_sizes, previous))


def _copied(value: Any) -> Any:
    if isinstance(value, list):
        return [_copied(v) for v in value]
    return value.clone() if isinstance(value, torch.Tensor) else value


def _reduce_precision(graph: Graph, ctx: Context) -> Graph:
    """A reduced-precision package: float16/bfloat16 but where float32 is kept, typed again."""
    if ctx.precision is None:
        return graph
    reduce_precision(graph, ctx.precision)
    if ctx.precision.io_reduced:  # typed again with inputs as the package takes them
        to_reduced = lambda inputs: cast_floats(inputs, "float32", ctx.precision.dtype)  # noqa: E731
        ctx.example_inputs = to_reduced(ctx.example_inputs)
        ctx.draws = [(sizes, to_reduced(inputs)) for sizes, inputs in ctx.draws]
        ctx.value_draws = [to_reduced(inputs) for inputs in ctx.value_draws]
        ctx.later_calls = [to_reduced(inputs) for inputs in ctx.later_calls]
        ctx.largest = ctx.largest and (ctx.largest[0], to_reduced(ctx.largest[1]))
    ctx.draw_outputs.clear()
    return observe(graph, ctx)


Pass = Callable[[Graph, Context], Any]

PREPARE: list[tuple[str, Pass]] = [
    ("place_on_device", lambda g, c: place_on_device(g, c.device)),
    ("observe", observe),
    # a reduced-precision package: float16/bfloat16 but where float32 is kept, then typed again
    ("reduce_precision", lambda g, c: _reduce_precision(g, c)),
]
REWRITES: list[tuple[str, Pass]] = [
    ("fold_shapes", lambda g, c: fold_shapes(g, c.recorder)),  # shape arithmetic becomes constants
    ("unpack_splits", lambda g, c: unpack_splits(g)),  # chunk/split/unbind into one view per piece
    ("fuse_attention", lambda g, c: fuse_attention(g)),  # written-out softmax attention into one ATen call
    ("decompose_mha", lambda g, c: decompose_mha(g)),  # nn.MultiheadAttention's fast path into linear + SDPA
    ("functionalize", lambda g, c: functionalize(g)),  # in-place writes nothing else sees become functional
    ("split_conv_bias", lambda g, c: split_conv_bias(g, c.device.type)),  # on CUDA the bias fuses after the conv
    ("split_norms", lambda g, c: split_norms(g, c.device.type)),  # CUDA: norms of few huge rows in parallel pieces
    ("gemm_forms", lambda g, c: gemm_forms(g, c.device.type, c.kernel_dims, c.generated_gemm)),  # CUDA: each GEMM's fastest form
    ("pixel_convs", lambda g, c: pixel_convs(g, c.device.type)),  # CPU: 1x1 convs of one pixel as GEMMs, gate stored
    ("onednn_linear", lambda g, c: onednn_linear(g, c.device.type, c.example_sizes)),  # CPU: where oneDNN is faster
    ("check_indices", lambda g, c: check_indices(g)),  # generated gathers clamp: a bad index must still raise
    # conv nets: channels-last activations, where timing says faster (timed with the convolutions fused as the next
    # pass fuses them: channels-last through ATen's convolutions alone can be the slower, fused the faster)
    ("channels_last", lambda g, c: channels_last(g, c, then=as_it_will_run)),
    ("onednn_conv", onednn_conv),  # CPU, channels-last nets: fused oneDNN convolutions, where timing says faster
    ("reobserve", observe),  # the rewrites made new values (a fused attention's output has its own strides)
    ("infer_unobserved", lambda g, c: infer_unobserved(g)),  # branches the example inputs did not take
    ("bind_sizes", lambda g, c: bind_opaque_sizes(g, c.recorder, c.kernel_dims)),  # opaque sizes read at run time
]


# Rewrites that only make the graph faster: one that fails is skipped (its bug costs speed, never the conversion).
# The others type the graph or keep generated kernels safe, so without them no kernels are generated.
OPTIONAL_REWRITES = frozenset({"bind_sizes", "fold_shapes", "unpack_splits", "fuse_attention", "decompose_mha",
                               "functionalize", "split_conv_bias", "split_norms", "gemm_forms", "pixel_convs",
                               "onednn_linear", "channels_last", "onednn_conv"})


class PassFailed(Exception):
    """A pass raised something other than a jit2triton error (a bug in it): which pass, and what it raised."""

    def __init__(self, name: str, error: BaseException) -> None:
        super().__init__(f"pass {name} failed ({type(error).__name__}: {error})")
        self.name = name


def prepare(graph: Graph, ctx: Context, generate_kernels: bool, skip: frozenset = frozenset()) -> Graph:
    """Every pass before fusion, in order, but those in `skip`; the graph they leave still runs through ATen alone.
    A pass that fails with anything but a jit2triton error (which says what the user can do) raises PassFailed:
    the graph may be half rewritten, so the caller starts again from TorchScript's graph."""
    passes = [(name, run) for name, run in PREPARE + (REWRITES if generate_kernels else []) if name not in skip]
    for done, (name, run) in enumerate(passes, 1):
        ctx.stopwatch.say(f"pass {name} {done}/{len(passes)}")
        try:
            with ctx.stopwatch.stage(name):
                run(graph, ctx)
        except Jit2TritonError:
            raise
        except Exception as err:  # noqa: BLE001 - any bug in a pass
            raise PassFailed(name, err) from err
    return graph


def lower(graph: Graph, ctx: Context) -> Graph:
    """A copy of the prepared graph with its lowerable nodes fused into kernels (`ctx.refused` stay ATen), and
    sibling kernels over one iteration space merged into one."""
    with ctx.stopwatch.stage("fuse"):
        fused = fuse(graph, ctx.device.type, ctx.refused, ctx.kernel_dims)
    with ctx.stopwatch.stage("merge_kernels"):
        merged = merge_kernels(fused)
    with ctx.stopwatch.stage("gemm_kernels"):
        gemm_kernels(merged, ctx.refused)  # the GEMMs gemm_forms gave the generated form
    with ctx.stopwatch.stage("conv_kernels"):
        conv_kernels(merged, ctx.refused)  # the convolutions onednn_conv gave the generated form
    with ctx.stopwatch.stage("epilogues"):
        take_epilogues(merged)  # each template kernel computes the pointwise kernel after it
    return merged


def plan(graph: Graph, device: Optional[torch.device] = None, stopwatch: Optional[Stopwatch] = None) -> Plan:
    """The plan the runtimes run; for a CPU target, with its kernels' intermediate outputs in one arena."""
    stopwatch = stopwatch or Stopwatch()
    with stopwatch.stage("build_plan"):
        sched = build_plan(graph)
    if device is not None and device.type == "cpu":
        with stopwatch.stage("plan_arena"):
            plan_arena(sched.plan, sched.nodes)
    return sched
