"""The conversion pipeline, in order: every pass the transpiler runs, each a record in `PASSES`.

    TorchScript graph ─▶ from_torchscript ─▶ prepare ─▶ (rewrite, when kernels are generated) ─▶ lower ─▶ plan

The prepare passes type every value (by running the plan once on the example inputs) and, for a reduced-precision
package, rewrite the graph to float16/bfloat16 where the rules allow (precision.py) and type it again; the rewrites
reshape the graph for fusion and must each leave a graph that still runs through ATen alone (the plan before
fusion is verification's reference). Lowering fuses what it can into kernels, joins sibling kernels, makes the
GEMMs and convolutions timed faster as templates into template kernels, each taking the pointwise kernel after it,
and planning turns the result into the plan the runtimes run. The face (`jit2triton/conversion.py`) supplies the
one thing the transpiler cannot: an interpreter to run a plan with (`Context.run_plan`, the runtime's executor).
A pass imports no other pass (tests/test_structure.py): what two passes share lives in ir, kernel_ir, or a module
of shapes and forms (conv_templates, convs), and a rewrite that tries a candidate graph runs it through the context
(`Context.trial_run`).
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
from .count_draws import KEEP_FRACTIONS, Thinner, counted_only_by_masks, mask_values
from .data_sizes import mark_data_dependent
from .decompose_mha import decompose_mha
from .fold_shapes import fold_shapes
from .functionalize import functionalize
from .fuse import fuse
from .fuse_attention import fuse_attention
from .infer_shapes import ShapeRecorder, type_carried_values
from .infer_unobserved import infer_unobserved
from .kernel_alignment import mark_misaligned_inputs
from .ir import Attr, Graph, undefined_reads
from .op_table import lookup
from .merge_kernels import merge_kernels
from .gemm_forms import gemm_forms
from .gemm_kernels import gemm_kernels
from .attention_kernels import attention_kernels
from .gpu_nms import gpu_nms
from .store_through_copies import store_through_copies
from .conv_kernels import conv_kernels
from .epilogues import take_epilogues
from .native_ops import native_ops
from .onednn_linear import onednn_linear
from .onednn_conv import as_it_will_run, onednn_conv
from .pixel_convs import pixel_convs
from .place_on_device import place_on_device
from .build_plan import Plan, build_plan
from .channels_last import channels_last
from .plan_arena import plan_arena
from .precision import PrecisionPlan, cast_floats, reduce_precision
from .complex_magnitude import complex_magnitude
from .shared_masks import share_mask_counts
from .loop_counts import count_masks_before_loops, read_ints_before_loops
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
    # The example's inputs with each Optional[Tensor] input the model also takes as None set to None: the branches
    # that run then are observed too (the package takes None there, as TorchScript's method does)
    none_draws: list[list] = field(default_factory=list)
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
    # The generated attention's hook (attention_kernels.Generated), likewise
    generated_attention: Optional[Callable] = None
    # The generated convolutions' hook (onednn_conv.py times them), where the face generates C++ kernels
    generated_conv: Optional[Callable] = None
    scalars_by_value: bool = False  # kernels take host numbers as arguments (the backend's launchers pass them)
    nms_kernels: bool = False  # the backend renders torchvision's NMS as kernels (gpu_nms.py)
    # Whether an invented draw (inputs, its name) crashes TorchScript itself (the face runs it in a child process
    # first): such a draw is skipped, not run here
    crashes: Callable[[list, str], Optional[str]] = lambda inputs, name: None

    # Trial runs of a candidate graph through ATen, for the rewrites that try one and keep it where it runs (and
    # runs faster): here, so that a rewrite needs no planner of its own (a pass imports no other pass)
    def trial_run(self, graph: Graph) -> Callable[[], list]:
        """A call of the graph's plan through ATen on copies of the example inputs."""
        sched = build_plan(graph)
        return lambda: self.run_plan(sched, _copied(self.example_inputs), None)

    def runs_at_every_draw(self, graph: Graph, draws: Optional[list] = None) -> bool:
        """Whether the graph runs at the example and the other sizes conversion observes (dynamic dims; other input
        values): a view the new strides allow at one size may not at another."""
        sched = build_plan(graph)
        try:
            for _, inputs in (draws or []) + list(self.draws):
                self.run_plan(sched, _copied(inputs), None)
        except Exception:  # noqa: BLE001 - any failure means it does not run there
            return False
        return True


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
    for inputs in ctx.none_draws:
        recorder.next_draw(ctx.example_sizes)  # (a None is not a type of the input: the example's tensor is)
        recorder.observe_values([v for v, x in zip(graph.inputs, inputs) if x is not None],
                                [x for x in inputs if x is not None])
        try:
            ctx.draw_outputs.append((ctx.example_sizes, ctx.run_plan(sched, inputs, recorder)))
        except TimeBudgetError:
            raise
        except Jit2TritonError:  # (TorchScript ran it before it was drawn: no draw is made the model refuses)
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
    counted = _thinned_draws(graph, sched, ctx, recorder)
    recorder.annotate()
    type_carried_values(graph)
    mark_data_dependent(graph, recorder, counted)  # sizes computed from data: opaque but where the draws saw them
    graph.misaligned = set(recorder.misaligned)
    for node in graph.walk():  # (a node with no outputs is never observed: not known to be unreached)
        if node.outputs and node.op != "prim::Constant" and node.uid not in recorder.ran:
            node.attrs[Attr.UNREACHED] = True
        else:
            node.attrs.pop(Attr.UNREACHED, None)
    ctx.recorder = recorder
    return graph


def _thinned_draws(graph: Graph, sched: Plan, ctx: Context, recorder: ShapeRecorder) -> frozenset:
    """Run the example again with the masks that set counts thinned and NMS's kept boxes cut (count_draws.py), for
    shapes only; -> the uids of the nodes whose counts every such draw changed (none when a draw failed: the model
    would not take a thinner mask, and the sizes after those nodes stay opaque)."""
    masks = mask_values(graph)
    truncated = {node.uid for node in graph.walk() if lookup(node.op).keeps_best}
    if not masks and not truncated:
        return frozenset()
    thinned = set(masks)
    for number, keep in enumerate(KEEP_FRACTIONS):
        thinner = Thinner(recorder, sched.nodes, masks, keep, seed=number)
        inputs = thinner.inputs(graph.inputs, _copied(ctx.example_inputs))
        recorder.next_draw(ctx.example_sizes)
        recorder.observe_values(graph.inputs, inputs)
        try:
            ctx.run_plan(sched, inputs, thinner)
        except TimeBudgetError:
            raise
        except Exception:  # noqa: BLE001 - any failure: the counts stay opaque
            recorder.drop_draw()
            return frozenset()
        if not thinner.changed:
            return frozenset()
        thinned &= thinner.thinned  # (a mask inside a branch one draw did not take is not known to be thinned)
        truncated &= thinner.truncated
    return frozenset(counted_only_by_masks(graph, thinned) | truncated)


def _bind_sizes(graph: Graph, ctx: Context) -> Graph:
    """Opaque sizes read at run time (bind_sizes.py); in a package without dynamic dims, the counts read from data,
    which then make the dims kernels take."""
    if ctx.example_sizes:
        bind_opaque_sizes(graph, ctx.recorder, ctx.kernel_dims)
    else:  # (set again at each build: a build after verification took kernels out may bind none)
        ctx.kernel_dims = bind_opaque_sizes(graph, ctx.recorder, None) or None
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
    """A state value copied (jit2triton/verify.py's copy_value, which this stage may not import)."""
    if isinstance(value, list):
        return [_copied(v) for v in value]
    if isinstance(value, dict):
        return {k: _copied(v) for k, v in value.items()}
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
        ctx.none_draws = [to_reduced(inputs) for inputs in ctx.none_draws]
        ctx.later_calls = [to_reduced(inputs) for inputs in ctx.later_calls]
        ctx.largest = ctx.largest and (ctx.largest[0], to_reduced(ctx.largest[1]))
    ctx.draw_outputs.clear()
    return observe(graph, ctx)


ALL_DEVICES = ("cpu", "cuda")
STAGES = ("prepare", "rewrite", "lower", "plan")


@dataclass(frozen=True)
class Pass:
    """One stage of the conversion. `run(graph, ctx)` rewrites the graph in place, or returns the graph that takes
    its place (fusion works on a copy; planning turns the graph into a Plan). `stage` says which part of the pipeline
    runs it:

      prepare  types every value (the graph still runs through ATen alone: verification's reference);
      rewrite  reshapes the graph for fusion, when kernels are generated (the graph still runs through ATen alone);
      lower    fuses what can be generated into kernels, and gives template kernels their epilogues;
      plan     the plan the runtimes run.

    `optional`: the pass only makes the graph faster, so one that fails is skipped (fallbacks.py's first rung); the
    others type the graph or keep generated kernels safe. `rounds`: an optional rewrite that computes some op
    otherwise, so that its result may round otherwise (another algorithm, layout or form of a convolution or a
    GEMM, an op written as others); the ladder leaves these out where a decision turned on rounding, and keeps the
    rest (sizes bound at run time, shape arithmetic folded). `devices`: the device types it runs for (a pass that
    can be forced on elsewhere by its MODE switch, for tests, decides for itself)."""
    name: str
    run: Callable[[Any, "Context"], Any]
    stage: str
    optional: bool = False
    devices: tuple[str, ...] = ALL_DEVICES
    rounds: bool = False

    def __post_init__(self) -> None:
        if self.stage not in STAGES:  # (a misspelt stage would never run)
            raise ValueError(f"pass {self.name}: stage {self.stage!r} is not one of {STAGES}")


PASSES: list[Pass] = [
    Pass("place_on_device", lambda g, c: place_on_device(g, c.device), "prepare"),
    Pass("observe", observe, "prepare"),
    # a reduced-precision package: float16/bfloat16 but where float32 is kept, then typed again
    Pass("reduce_precision", _reduce_precision, "prepare"),
    Pass("fold_shapes", lambda g, c: fold_shapes(g, c.recorder), "rewrite", optional=True),  # shape arithmetic
    Pass("unpack_splits", lambda g, c: unpack_splits(g), "rewrite", optional=True),  # chunk/split: a view per piece
    Pass("fuse_attention", lambda g, c: fuse_attention(g), "rewrite", optional=True,
         rounds=True),  # softmax attention: one call
    Pass("decompose_mha", lambda g, c: decompose_mha(g), "rewrite", optional=True,
         rounds=True),  # MHA fast path: linear + SDPA
    Pass("functionalize", lambda g, c: functionalize(g), "rewrite", optional=True),  # unseen in-place writes
    Pass("complex_magnitude", lambda g, c: complex_magnitude(g), "rewrite", optional=True,
         rounds=True),  # |z| in a kernel
    Pass("split_conv_bias", lambda g, c: split_conv_bias(g, c.device.type), "rewrite", optional=True, rounds=True,
         devices=("cuda",)),  # the bias fuses after the convolution
    Pass("split_norms", lambda g, c: split_norms(g, c.device.type), "rewrite", optional=True,
         rounds=True),  # CUDA: few huge rows
    Pass("gemm_forms", lambda g, c: gemm_forms(g, c.device.type, c.kernel_dims, c.generated_gemm), "rewrite",
         optional=True, rounds=True),  # CUDA: each GEMM's fastest form
    Pass("pixel_convs", lambda g, c: pixel_convs(g, c.device.type), "rewrite", optional=True, rounds=True,
         devices=("cpu",)),  # 1x1 convolutions of one pixel as GEMMs, gate stored
    Pass("onednn_linear", lambda g, c: onednn_linear(g, c.device.type, c.example_sizes), "rewrite", optional=True,
         rounds=True, devices=("cpu",)),  # where oneDNN is faster
    Pass("check_indices", lambda g, c: check_indices(g), "rewrite"),  # generated gathers clamp: bad indices raise
    # after check_indices: the shared count's integer indices are in range by construction
    Pass("share_mask_counts", lambda g, c: share_mask_counts(g), "rewrite", optional=True),  # one nonzero per mask
    # conv nets: channels-last activations, where timing says faster (timed with the convolutions fused as the next
    # pass fuses them: channels-last through ATen's convolutions alone can be the slower, fused the faster)
    Pass("channels_last", lambda g, c: channels_last(g, c, then=as_it_will_run), "rewrite", optional=True, rounds=True),
    Pass("onednn_conv", onednn_conv, "rewrite", optional=True, rounds=True,
         devices=("cpu",)),  # fused oneDNN convolutions
    Pass("reobserve", observe, "rewrite"),  # the rewrites made new values (a fused attention's output's strides)
    Pass("infer_unobserved", lambda g, c: infer_unobserved(g), "rewrite"),  # branches the example did not take
    Pass("bind_sizes", _bind_sizes, "rewrite", optional=True),  # opaque sizes read at run time
    # a loop's per-slice masks counted once before it (no sync per iteration): after the sizes are typed and bound,
    # since it keeps every value's size and only changes how the count is read. CUDA only: the CPU has no sync to
    # save, and there the counting first and nonzero_static cost more than they save (docs/benchmarks.md)
    Pass("count_masks_before_loops", lambda g, c: count_masks_before_loops(g), "rewrite", optional=True,
         devices=("cuda",)),
    # a loop's reads of numbers out of a tensor it does not change: the tensor read once before it (loop_counts.py)
    Pass("read_ints_before_loops", lambda g, c: read_ints_before_loops(g), "rewrite", optional=True),
    Pass("fuse", lambda g, c: fuse(g, c.device.type, c.refused, c.kernel_dims, c.scalars_by_value),
         "lower"),  # returns a fused copy
    Pass("merge_kernels", lambda g, c: merge_kernels(g), "lower"),  # siblings over one iteration space
    Pass("gemm_kernels", lambda g, c: gemm_kernels(g, c.refused), "lower"),  # the GEMMs given the generated form
    # short-sequence attention, where timed faster than ATen's
    Pass("attention_kernels", lambda g, c: attention_kernels(g, c.refused, c.generated_attention), "lower"),
    Pass("store_through_copies", lambda g, c: store_through_copies(g), "lower"),  # an attention's output copied
    Pass("conv_kernels", lambda g, c: conv_kernels(g, c.refused), "lower"),  # convolutions onednn_conv marked
    Pass("epilogues", lambda g, c: take_epilogues(g), "lower"),  # a template kernel takes the pointwise one after it
    # torchvision's NMS as ATen's sort and two kernels (CUDA: its keep walk waits on a load per kept box)
    Pass("gpu_nms", lambda g, c: gpu_nms(g, c.device.type, c.refused, c.nms_kernels), "lower"),
    Pass("native_ops", lambda g, c: native_ops(g, c.refused), "lower", devices=("cpu",)),  # the runtime's own kernels
    Pass("kernel_alignment", lambda g, c: mark_misaligned_inputs(g), "lower"),  # inputs seen unaligned: no vector loads
    Pass("build_plan", lambda g, c: build_plan(g), "plan"),  # the graph becomes a Plan
    Pass("plan_arena", lambda sched, c: plan_arena(sched.plan, sched.nodes), "plan", devices=("cpu",)),
]
# Rewrites that only make the graph faster: one that fails is skipped (its bug costs speed, never the conversion).
OPTIONAL_REWRITES = frozenset(p.name for p in PASSES if p.optional)
ROUNDING_REWRITES = frozenset(p.name for p in PASSES if p.rounds)


def passes(stage: str, device_type: Optional[str]) -> list[Pass]:
    """The passes of one stage that run for this device type (None: those that run for every device), in order."""
    return [p for p in PASSES if p.stage == stage and (device_type in p.devices if device_type else
                                                        p.devices == ALL_DEVICES)]


class PassFailed(Exception):
    """A pass raised something other than a jit2triton error (a bug in it): which pass, and what it raised.
    `after_rewrites`: the example failed to run when typed again after the optional rewrites (it ran before them),
    so one of them broke the graph."""

    def __init__(self, name: str, error: BaseException, after_rewrites: bool = False) -> None:
        super().__init__(f"pass {name} failed ({type(error).__name__}: {error})")
        self.name = name
        self.after_rewrites = after_rewrites


def prepare(graph: Graph, ctx: Context, generate_kernels: bool, skip: frozenset = frozenset()) -> Graph:
    """Every pass before fusion, in order, but those in `skip`; the graph they leave still runs through ATen alone.
    A pass that fails with anything but a jit2triton error (which says what the user can do) raises PassFailed:
    the graph may be half rewritten, so the caller starts again from TorchScript's graph."""
    stages = ("prepare", "rewrite") if generate_kernels else ("prepare",)
    todo = [p for stage in stages for p in passes(stage, ctx.device.type) if p.name not in skip]
    for done, step in enumerate(todo, 1):
        ctx.stopwatch.say(f"pass {step.name} {done}/{len(todo)}")
        try:
            with ctx.stopwatch.stage(step.name):
                step.run(graph, ctx)
            dangling = undefined_reads(graph) if step.optional else []
            if dangling:  # (a rewrite after the graph was last typed fails no run: caught here, not at planning)
                raise PassFailed(step.name, ValueError(f"it left reads of {', '.join(map(repr, dangling[:3]))}, "
                                                       "which nothing defines"))
        except PassFailed:
            raise
        except TimeBudgetError:
            raise
        except ConversionError as err:
            if step.run is observe and step.stage == "rewrite" and any(p.optional for p in todo[:done - 1]):
                raise PassFailed(step.name, err, after_rewrites=True) from err
            raise
        except Jit2TritonError:
            raise
        except Exception as err:  # noqa: BLE001 - any bug in a pass
            raise PassFailed(step.name, err) from err
    return graph


def lower(graph: Graph, ctx: Context) -> Graph:
    """A copy of the prepared graph with its lowerable nodes fused into kernels (`ctx.refused` stay ATen), sibling
    kernels over one iteration space merged into one, and the template kernels with their epilogues."""
    for step in passes("lower", ctx.device.type):
        with ctx.stopwatch.stage(step.name):
            graph = _replaced(graph, step.run(graph, ctx))
    return graph


def plan(graph: Graph, device: Optional[torch.device] = None, stopwatch: Optional[Stopwatch] = None) -> Plan:
    """The plan the runtimes run; for a CPU target, with its kernels' intermediate outputs in one arena. (No
    context: the planning passes read nothing but the graph, and verification plans graphs of its own.)"""
    stopwatch = stopwatch or Stopwatch()
    sched: Any = graph
    for step in passes("plan", device.type if device is not None else None):
        with stopwatch.stage(step.name):
            sched = _replaced(sched, step.run(sched, None))
    return sched


def _replaced(current: Any, result: Any) -> Any:
    """What a pass leaves: the graph or plan it returned, else the one it rewrote in place."""
    return result if isinstance(result, (Graph, Plan)) else current
