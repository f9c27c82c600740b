"""Conversion: the pipeline loaders -> transpiler -> emitters -> a package's contents."""
from __future__ import annotations

import os
import time
from typing import Any, Callable, Optional, Sequence, Union

import torch

from jit2triton.deploy import cpp_runtime
from jit2triton.deploy.packaging.interpreter import Executor, placed_weights
from jit2triton.deploy.literals import encode
from jit2triton.deploy.package import PackageContents
from jit2triton.deploy.packaging.build_manifest import BuiltKernels, add_method, build_package, model_outputs
from jit2triton.deploy.packaging.cuda_graph_choice import choose_cuda_graph
from jit2triton.deploy.packaging.graph_regions import has_regions
from jit2triton.deploy.packaging.culprit import find_culprit
from jit2triton.deploy.packaging.output_dims import with_dims
from jit2triton.deploy.policy import library_of
from jit2triton.deploy.resolve import call_steps, resolve_op
from jit2triton.deploy.runtime_choice import DeviceLike
from jit2triton.deploy.signature import CHANNELS_LAST, describe
from jit2triton.emitters.backends import KernelsFailed, backend_for, backend_named
from jit2triton.loaders import load_script
from jit2triton.loaders.module_state import restore_state, state_values
from jit2triton.loaders.torchscript import NO_DEFAULT, ModelSource, check_model_path
from jit2triton.transpiler import fallbacks, pipeline
from jit2triton.transpiler.from_torchscript import from_torchscript
from jit2triton.transpiler.fuse import KERNEL_OP, FusionFailed
from jit2triton.transpiler.ir import Attr
from jit2triton.transpiler.build_plan import Plan
from jit2triton.transpiler.decompositions import undecomposed
from jit2triton.transpiler.precision import PrecisionPlan

from . import dims, precision
from . import reference_child
from .dim_ranges import checked_ranges
from .draw_rules import DrawRules, draw_rules
from .reference_child import IsolatedReference
from .dims import DynamicShapes
from .errors import (ConversionError, InputError, Jit2TritonError, ModelLoadError, PackageDeviceError, PackageError,
                     StepError)
from .inputs import inputs_at, with_other_values
from .verify import PackageRunner, Verifier, run_where_the_weights_are, tensor_error, tf32_note

Progress = Any

# Other values the model runs on at the example's shapes where it has ops with data-dependent output sizes, each
# moved so that masks such as `x > 0` count differently from the example and from each other
VALUE_SHIFTS = (0.5, -0.5, 1.0)
UNFOLDED = ("conv-BatchNorm folding left out: converted with it, the model differed from the model as loaded even "
            "with every op through ATen (folding's rounding changed a decision: a box, a label, a count)")
# Calls after the example's that a model with module state is observed over (state that grows over 3 calls and then
# stays, a streaming encoder's memory up to its maximum, is seen to vary)
LATER_CALLS = 4


# Conversion runs TorchScript (the reference, the example again and each draw) and the package as a deployment does:
# without autograd. With it, a model whose weights require grad records a graph per run, and the reference outputs
# verification keeps hold every run's activations (a scripted FCOS outgrew 21 GB converting on a 24 GB machine).
@torch.no_grad()
def convert_to_package(model: ModelSource, example_inputs: Union[Sequence[Any], torch.Tensor, None] = None,
                       device: DeviceLike = "cpu", backend: Optional[str] = None, map_location: DeviceLike = None,
                       progress: Optional[Progress] = None, verify: bool = True,
                       full_source_paths: bool = False, dynamic_shapes: DynamicShapes = None,
                       narrow_dims: bool = False, precision: Optional[str] = None,
                       accuracy: Optional[dict] = None,
                       io_precision: Optional[str] = None, *, budget: Optional[pipeline.Budget] = None,
                       input_ranges: Optional[dict] = None,
                       verify_inputs: Optional[Callable] = None) -> tuple[PackageContents, torch.device]:
    """Convert a TorchScript model (a `.pt` path, ScriptModule or ScriptFunction) for `device`.

    `example_inputs` fix the input signature (dtypes, shapes) and drive shape inference; inputs that the model
    gives defaults for may be left out. `backend` picks the kernel generator: "cpp" (C++/OpenMP, the default on
    the CPU), "triton" (the default on CUDA; on the CPU it runs under the Triton interpreter), or "aten" (no
    generated kernels: every op through ATen).

    With `verify` (the default) the package is run on the example inputs and on a fresh random draw and compared
    with the TorchScript model; a generated kernel that disagrees with ATen is taken out (its nodes run through
    ATen) and the package rebuilt, and the report says so. A package that still disagrees is refused.

    `dynamic_shapes` (see jit2triton/dims.py) makes dims of the inputs dynamic: the package serves every size in
    their ranges. Shape inference then also runs the model at a few other sizes, and verification at the ranges'
    ends. "auto" makes the inputs' batch dim dynamic where the model allows it, else converts static and says why.
    A range the model does not run over end to end is refused (jit2triton/dim_ranges.py), or with `narrow_dims`
    narrowed to what runs.

    `example_inputs` as a dict with a "forward" key (`{"forward": (x,), "encode": (x,)}`) converts the module's
    other methods named in it too, each with its own examples (and static shapes); each is verified on its own,
    starting from the module's saved state.

    `precision` ("fp16", "bf16"; default the model's own) makes a float32 model's package compute in that type
    but where float32 is kept (jit2triton/precision.py); verification then holds it to `accuracy` against the
    float32 model, moving nodes back to float32 until it meets it. Its inputs and outputs keep the model's dtypes
    unless `io_precision` is the same as `precision`.

    `budget` (pipeline.Budget) ends a conversion that runs past it with a ConversionError naming the stage.
    `input_ranges` and `verify_inputs` say where invented inputs are valid and give extra verification draws (see
    api.convert). Runs of the model on inputs conversion invents happen in a child process first
    (reference_child.py): a draw that crashes TorchScript there is skipped and named in the report.
    """
    options = {"budget": budget, "input_ranges": input_ranges, "verify_inputs": verify_inputs}
    if isinstance(dynamic_shapes, str):
        return _convert_auto(model, example_inputs, device, backend, map_location, progress, verify,
                             full_source_paths, dynamic_shapes, precision, accuracy, io_precision, options)
    say = progress or (lambda message: None)
    started = time.perf_counter()
    target = torch.device(device or "cpu")
    if target.type == "cuda" and not torch.cuda.is_available():
        raise PackageDeviceError("device='cuda' was asked for but this machine has no CUDA device; use device='cpu'")
    backend = backend_for(backend, target).name
    if backend == "triton":  # before loading the model: a process that cannot build the kernels says so at once
        from jit2triton.emitters.compile_triton import check_triton_target
        check_triton_target(target)
    forward_examples, method_examples = _per_method(example_inputs)
    if isinstance(model, (str, os.PathLike)):
        check_model_path(os.fspath(model))  # before the first progress line: a missing file is the whole answer
    say("loading TorchScript (freeze, inline, normalise)")
    reference_child.warm()  # (it imports torch while the model loads)
    stopwatch = pipeline.Stopwatch(say, budget)
    with stopwatch.stage("load"):
        script = _load_script(model, map_location=map_location, methods=list(method_examples))
    source = os.fspath(model) if isinstance(model, (str, os.PathLike)) else ""
    reduced = (precision, accuracy, io_precision)

    def convert_methods(script) -> PackageContents:
        primed = _state_after_methods(script, forward_examples, method_examples)
        contents = _convert_method(script, forward_examples, target, backend, source, say, stopwatch, verify,
                                   full_source_paths, dynamic_shapes, reduced, narrow_dims,
                                   _user_draws(verify_inputs, script.input_names), input_ranges, primed)
        for name, examples in method_examples.items():
            say(f"converting method {name}")
            add_method(contents, name, _convert_method(script.methods[name], examples, target, backend, source,
                                                       say, stopwatch, verify, full_source_paths, None, reduced))
        return contents
    try:
        contents = convert_methods(script)
    except fallbacks.Mismatch:
        if not script.folded:
            raise
        say("the model folded differs from the model as loaded even through ATen: converting it again without "
            "torch.jit.freeze's conv-BatchNorm folding")
        with stopwatch.stage("load_unfolded"):
            script = _load_script(model, map_location=map_location, methods=list(method_examples), fold=False)
        script.notes.append(UNFOLDED)
        contents = convert_methods(script)
    if verify and method_examples and script.state:
        contents = _check_methods_in_order(
            contents, script, forward_examples, method_examples, target, backend, say, stopwatch,
            lambda: convert_to_package(model, example_inputs, device, "aten", map_location, progress, verify,
                                       full_source_paths, dynamic_shapes, narrow_dims, *reduced, **options)[0])
    unconverted = [n for n in script.method_names if n != "forward" and n not in method_examples]
    if unconverted:
        contents.manifest["report"]["methods_not_converted"] = {
            name: "no example inputs: pass example_inputs={'forward': (...), " + repr(name) + ": (...)} to convert it"
            for name in unconverted}
    contents.files.update({f"extra/{name}": data for name, data in script.extra_files.items()})
    say(f"converted in {time.perf_counter() - started:.2f}s")
    return contents, target


def _check_methods_in_order(contents: PackageContents, script, forward_examples, method_examples: dict,
                            target: torch.device, backend: str, say: Progress, stopwatch: pipeline.Stopwatch,
                            through_aten: Callable[[], PackageContents]) -> PackageContents:
    """A module whose methods share state, its methods called in an order that exercises them against TorchScript's
    (method_sequences.py); where they differ, the contents `through_aten` builds (every op through ATen, checked
    so in turn), and where those differ too the model is refused. -> the contents that matched."""
    from .method_sequences import check_methods_in_order

    signatures = {"forward": contents.manifest["signature"]["inputs"],
                  **{n: contents.manifest["methods"][n]["signature"]["inputs"] for n in method_examples}}
    examples = {"forward": _complete_inputs(forward_examples, script.input_names, script.input_defaults),
                **{n: _complete_inputs(e, script.methods[n].input_names, script.methods[n].input_defaults)
                   for n, e in method_examples.items()}}
    say("verifying the methods called one after another")
    with stopwatch.stage("verify_methods_in_order"), PackageRunner(contents, target) as runner:
        module = runner.fresh()  # (from the saved state)
        mismatches, notes, order = check_methods_in_order(script, examples, signatures,
                                                          {"forward": module, **module.methods()}, module.attribute,
                                                          target)
    found = "; ".join(str(m) for m in mismatches[:2])
    if mismatches and backend != "aten":
        say(f"the methods called in the order {order} differ from TorchScript; every op through ATen instead")
        contents = through_aten()
        notes.append(f"called in the order {order}, the methods' generated kernels differed from TorchScript "
                     f"({found}); every op runs through ATen")
    elif mismatches:
        raise ConversionError(f"called in the order {order}, the converted methods do not match TorchScript "
                              f"({found}); this is a bug in jit2triton: {fallbacks.REPORT}")
    contents.manifest["report"]["verification"]["notes"] += notes
    verification = contents.manifest["report"]["verification"]
    if order:
        verification["methods_in_order"] = order
        if verification["status"] == "not compared":  # (forward refuses to run first: compared after the others)
            verification["status"] = "passed"
    return contents


def _state_after_methods(script, forward_examples, method_examples: dict) -> Optional[dict[str, Any]]:
    """Where forward refuses its example from the saved state (a decoder whose forward needs `encode` called first:
    TorchScript raises there too), the state the other methods leave, called on their examples in TorchScript, by
    attribute name: conversion observes forward from it. None where forward runs from the saved state."""
    if not method_examples or not script.state:
        return None
    inputs = _complete_inputs(forward_examples, script.input_names, script.input_defaults)
    try:
        with torch.jit.optimized_execution(False):
            script.function(*inputs)  # (from the saved state)
        return None
    except Exception:  # noqa: BLE001 - the model's own refusal: try again after the other methods
        pass
    module = script.function.module
    slots = [slot for s in [script, *script.methods.values()] for slot in s.state]
    restore_state(module, slots)
    with torch.jit.optimized_execution(False):
        for name, examples in method_examples.items():
            method = script.methods[name]
            function = getattr(method.function, "method", method.function)  # (without its restore of the state)
            function(*_complete_inputs(examples, method.input_names, method.input_defaults))
    values = state_values(module, script.state)
    restore_state(module, slots)
    return values


def _load_script(model: ModelSource, **options: Any):
    """load_script, where a .pt calls an op no library of this process registered: whose op it is, and what to do
    (torchvision::nms before `import torchvision`; an aten op of a newer torch)."""
    try:
        return load_script(model, **options)
    except ModelLoadError as err:
        op = getattr(err, "unknown_op", None)
        if op is None:
            raise
        path, library = os.fspath(model), library_of(op)
        if library is None:
            raise ModelLoadError(f"{path!r} calls op {op!r}, which this torch ({torch.__version__}) does not have: it "
                                 "was saved by another torch version; convert it with the torch that saved it, or "
                                 "re-export it with this one") from None
        raise ModelLoadError(f"{path!r} calls op {op!r}, which is not registered in this process: it belongs to the "
                             f"library {library}, not to torch. Load that library's ops before converting, as "
                             "torch.jit.load needs too: from Python, import the module that registers them (`import "
                             f"{library}` for most) before jit2triton.convert; from the CLI, `jit2triton convert "
                             f"--import {library}`") from None


def _per_method(example_inputs) -> tuple[Any, dict[str, Any]]:
    """(forward's examples, {other method: its examples}) of `example_inputs`, which is forward's examples or a
    dict of them by method name with a "forward" key."""
    if isinstance(example_inputs, dict) and "forward" in example_inputs:
        others = {name: value for name, value in example_inputs.items() if name != "forward"}
        if not all(isinstance(name, str) for name in others):
            raise ConversionError("example_inputs by method must be keyed by method names (strings)")
        return example_inputs["forward"], others
    return example_inputs, {}


def _convert_method(script, example_inputs, target: torch.device, backend: str, source: str, say: Progress,
                    stopwatch: pipeline.Stopwatch, verify: bool, full_source_paths: bool,
                    dynamic_shapes: DynamicShapes, reduced: tuple = (None, None, None),
                    narrow_dims: bool = False, user_draws: Sequence[list] = (),
                    input_ranges: Optional[dict] = None, primed: Optional[dict] = None) -> PackageContents:
    """One method of the model (forward, or another the user gave examples for) as a package's contents;
    `reduced`: (precision, accuracy, io_precision) as convert_to_package takes them; `user_draws`: the user's own
    verification inputs; `input_ranges`: the user's ranges of integer inputs (draw_rules.py); `primed`: the state
    to observe the method from, by attribute name, where it refuses its example from the saved state."""
    inputs = _complete_inputs(example_inputs, script.input_names, script.input_defaults)
    inputs = [_example_layout(x.to(target)) if isinstance(x, torch.Tensor) else x for x in inputs]
    dynamic = dims.resolve(dynamic_shapes, script.input_names, inputs)
    rules = draw_rules(script.graph, script.input_names, inputs, dynamic, input_ranges)
    isolated = IsolatedReference(script.function, stopwatch.remaining, stopwatch.check)
    range_notes: list[str] = []
    if dynamic:
        say("running the model at the ends of the dims' ranges")
        with stopwatch.stage("dim_ranges"):
            reference = lambda *xs: run_where_the_weights_are(isolated, list(xs))[0]  # noqa: E731
            dynamic, range_notes = checked_ranges(dynamic, reference, inputs, narrow_dims, rules)
    say(f"building the IR ({sum(1 for _ in script.graph.nodes())} top-level TorchScript nodes)")
    say("inferring shapes and dtypes from the example inputs" + (", rewriting for fusion" if backend != "aten" else ""))
    precision_plan, tolerance = precision.plan_for(*reduced, target, say)
    taken = precision.package_inputs(precision_plan, inputs)  # as the package takes them (io_precision)
    takes_none = _inputs_that_take_none(script, isolated, inputs)
    signature = {"inputs": _input_signature(script.input_names, script.input_defaults, taken, dynamic)}
    for position in takes_none:
        signature["inputs"][position]["optional"] = True
    if takes_none:
        user_draws = [*user_draws, [None if i in takes_none else x for i, x in enumerate(taken)]]
    if dynamic:
        signature["dims"] = dynamic.signature()
    verifier = None
    if verify:
        say("running TorchScript on the example inputs and a fresh draw, for verification")
        other_sizes = [(", ".join(f"{n}={k}" for n, k in sizes.items()),
                        rules.apply(inputs_at(dynamic, sizes, taken, 100 + i), 100 + i))
                       for i, sizes in enumerate(dynamic.bounds() + dynamic.draws(1, seed=1))] if dynamic else []
        with stopwatch.stage("reference"):
            verifier = Verifier(precision.reference(precision_plan, isolated), taken, signature["inputs"],
                                target, dynamic.example, other_sizes, user_draws, rules, tf32_note(script.graph, target))
        verifier.tolerance = tolerance
    stages = _MethodStages(script, inputs, dynamic, target, backend, full_source_paths, say, stopwatch,
                           precision_plan, verifier, signature, {"name": script.name, "source": source,
                                                                 "state": script.state})
    stages.rules, stages.isolated = rules, isolated
    stages.none_draws = [[None if i in takes_none else x for i, x in enumerate(inputs)]] if takes_none else []
    if primed is not None:  # (the package still starts from the saved state, as TorchScript's module does)
        stages.inputs = inputs + [_on_device(primed[slot.name], target) for slot in script.state]
    attempt = fallbacks.Attempt(kernels=backend != "aten", rewrites=backend != "aten")
    (contents, _, _), attempt = fallbacks.build_with_fallbacks(stages, attempt, say)
    if target.type == "cuda" and (contents.manifest["cuda_graph"] or has_regions(contents.manifest["plan"])):
        with stopwatch.stage("cuda_graph_timing"):
            choose_cuda_graph(contents, taken, target, say)
    contents.manifest["report"]["verification"] = stages.verification(attempt, range_notes + script.notes)
    contents.manifest["report"]["verification"]["notes"] += isolated.notes
    if verifier is not None:
        contents.manifest["report"]["verification"]["draws"] = rules.describe(taken)
    if precision_plan is not None:
        measured = []
        if verifier:
            with PackageRunner(contents, target) as run:
                measured = precision.measure(run, verifier)
        contents.manifest["report"]["precision"] = precision.report_section(precision_plan, tolerance, measured)
    contents.manifest["report"]["pass_seconds"] = stopwatch.report()
    if dynamic:
        contents.manifest["report"]["dynamic_dims"] = stages.signature["dims"]
    return contents


def _convert_auto(model: ModelSource, example_inputs, device: DeviceLike, backend: Optional[str],
                  map_location: DeviceLike, progress: Optional[Progress], verify: bool, full_source_paths: bool,
                  mode: str, precision: Optional[str] = None, accuracy: Optional[dict] = None,
                  io_precision: Optional[str] = None, options: Optional[dict] = None
                  ) -> tuple[PackageContents, torch.device]:
    """dynamic_shapes="auto": try a dynamic batch dim; when the model specialises on it (a reshape to the example's
    batch, a branch a trace baked in), convert it static and put the reason in the report."""
    if mode != "auto":
        raise ConversionError(f"dynamic_shapes={mode!r} is not known: give Dims (see jit2triton.Dim), or 'auto'")
    say = progress or (lambda message: None)
    script = _load_script(model, map_location=map_location)
    inputs = _complete_inputs(_per_method(example_inputs)[0], script.input_names, script.input_defaults)
    batch = dims.auto_batch(inputs)
    keywords = options or {}
    options = (device, backend, map_location, progress, verify, full_source_paths)
    why = "the model has no tensor input with a batch axis"
    if batch is not None:
        try:
            return convert_to_package(model, example_inputs, *options, batch, precision, accuracy, io_precision,
                                      **keywords)
        except ConversionError as err:
            why = str(err)
    say(f"the batch dim stays static: {why}")
    contents, target = convert_to_package(model, example_inputs, *options, None, precision, accuracy, io_precision,
                                          **keywords)
    contents.manifest["report"]["static_dims"] = {dims.AUTO_DIM: why}
    return contents, target


def _context(target: torch.device, inputs: list, dynamic: "dims.DynamicSpec", stopwatch: pipeline.Stopwatch,
             rules: DrawRules) -> pipeline.Context:
    """What the passes share: the target, the example inputs and, with dynamic dims, draws at other sizes (their
    integer inputs drawn where the model accepts them: draw_rules.py)."""
    ctx = pipeline.Context(target, inputs, _run_plan(target, stopwatch), stopwatch=stopwatch,
                           example_sizes=dict(dynamic.example),
                           draws=[(sizes, rules.apply(inputs_at(dynamic, sizes, inputs, seed=i), i))
                                  for i, sizes in enumerate(dynamic.draws())])
    ctx.value_draws = [rules.apply(with_other_values(inputs, seed=7 + i, shift=shift), 7 + i)
                       for i, shift in enumerate(VALUE_SHIFTS)]
    largest = dynamic.largest() if dynamic else None
    if largest is not None:
        seed = len(ctx.draws)
        ctx.largest = (largest, rules.apply(inputs_at(dynamic, largest, inputs, seed=seed), seed))
    if dynamic:  # kernels take the dynamic dims as arguments (both renderers, both runtimes)
        ctx.kernel_dims = {name: (d.min, d.max, dynamic.example[name]) for name, d in dynamic.dims.items()}
    return ctx


class _MethodStages:
    """The stages of one method's conversion, as the fallback ladder (transpiler/fallbacks.py) runs them: prepare
    (TorchScript's graph in our IR, typed and rewritten), build (the package) and check (verification)."""

    def __init__(self, script, inputs: list, dynamic: dims.DynamicSpec, target: torch.device, backend: str,
                 full_source_paths: bool, say: Progress, stopwatch: pipeline.Stopwatch,
                 precision_plan: Optional[PrecisionPlan], verifier: Optional[Verifier], signature: dict,
                 model_info: dict) -> None:
        self.script, self.dynamic, self.target, self.backend = script, dynamic, target, backend
        self.inputs = inputs + [_on_device(slot.initial, target) for slot in script.state]  # the state after them
        self.written = sum(slot.written for slot in script.state)
        self.full_source_paths, self.say, self.stopwatch = full_source_paths, say, stopwatch
        self.precision_plan, self.verifier, self.signature, self.model_info = (precision_plan, verifier, signature,
                                                                               model_info)
        self.verify_seconds = 0.0
        self.rounded: list[str] = []  # where outputs differ because a discontinuous op met rounding
        self.bisecting = False  # the build under check is a round of the ladder's bisection (rung 3)
        self.own_way_back = False  # the ops that round their own way were taken out, bought nothing, and are back
        self.none_draws: list[list] = []  # the example with Optional[Tensor] inputs None (pipeline.Context's)

    def prepare(self, attempt: fallbacks.Attempt) -> tuple[Any, pipeline.Context]:
        graph, ctx = self.prepared(attempt.rewrites, attempt.skipped, self.stopwatch)
        if "outputs" not in self.signature:  # the first graph prepared: the outputs, and a precision to hold
            if ctx.vary_values and not ctx.value_draws_ran:
                _fix_int_inputs(self.signature["inputs"])
            outputs = model_outputs(ctx.outputs, self.written)
            seen = [(ctx.example_sizes, outputs)] + [(sizes, model_outputs(out, self.written))
                                                    for sizes, out in ctx.draw_outputs]
            described = with_dims(describe(outputs[0] if len(outputs) == 1 else tuple(outputs)), seen)
            self.signature = {"inputs": self.signature["inputs"], "outputs": described,
                              **{k: v for k, v in self.signature.items() if k != "inputs"}}
            if self.precision_plan is not None and self.verifier is not None:
                with self.stopwatch.stage("precision_search"):
                    if precision.enforce(self.precision_plan, graph, ctx, self.verifier, self.written,
                                         self.through_aten, self.say):
                        graph, ctx = self.prepared(attempt.rewrites, attempt.skipped, self.stopwatch)
        ctx.refused = attempt.refused  # the kernels the ladder took out, for fusion
        return graph, ctx

    def prepared(self, rewrites: bool, skipped: set[str], stopwatch: pipeline.Stopwatch,
                 precision_plan: Optional[PrecisionPlan] = None) -> tuple[Any, pipeline.Context]:
        """TorchScript's graph in our IR, typed and (with `rewrites`) rewritten for fusion but for `skipped`; built
        anew each time, since a pass that failed may have left the last one half rewritten."""
        names = self.script.input_names + [f"self.{slot.name}" for slot in self.script.state]
        with stopwatch.stage("from_torchscript"):
            graph = from_torchscript(self.script.graph, names, self.script.name, self.full_source_paths)
        ctx = _context(self.target, self.inputs, self.dynamic, stopwatch, self.rules)
        ctx.crashes = self.isolated.crash
        ctx.none_draws = [draw + self.inputs[len(draw):] for draw in self.none_draws]  # (then the state)
        ctx.vary_values = any(type(x) is int for x in self.inputs)  # `range(n)`: a size an input's value may set
        own = len(self.inputs) - len(self.script.state)
        written = [position for position, slot in enumerate(self.script.state, own) if slot.written]
        ctx.state_feedback = [(position, rank - len(written)) for rank, position in enumerate(written)]
        ctx.later_calls = [with_other_values(self.inputs, seed=31 + i) for i in range(LATER_CALLS)] \
            if written else []
        ctx.precision = precision_plan or self.precision_plan
        backend = backend_named(self.backend)
        ctx.generated_gemm = backend.generated_gemm  # a GEMM over few rows may take its form
        ctx.generated_attention = backend.generated_attention  # attention over few keys may take its kernel
        ctx.generated_conv = backend.generated_conv  # a conv net's 1x1, depthwise, small convolutions may too
        ctx.scalars_by_value = backend.scalars_by_value
        ctx.nms_kernels = backend.nms_kernels
        pipeline.prepare(graph, ctx, generate_kernels=rewrites, skip=frozenset(skipped))
        return graph, ctx

    def through_aten(self, trial: PrecisionPlan) -> tuple[Any, pipeline.Context]:
        """The graph with `trial`'s precision, every op through ATen, quietly: the precision search's step."""
        try:
            return self.prepared(False, set(), pipeline.Stopwatch(), trial)
        except pipeline.PassFailed as failure:
            raise ConversionError(f"{failure}; this is a bug in jit2triton: {fallbacks.REPORT}") from None

    def build(self, prepared: tuple, attempt: fallbacks.Attempt) -> tuple[PackageContents, Plan, Any]:
        graph, ctx = prepared
        self.bisecting = attempt.bisection is not None  # (a round of rung 3's search: only pass or fail matters)
        self.own_way_back = attempt.own_way_back
        contents, sched = _build_package(graph, self.backend if attempt.kernels else "aten", ctx, self.signature,
                                         self.model_info, self.say)
        return contents, sched, graph

    def check(self, built: tuple) -> fallbacks.Verdict:
        contents, sched, graph = built
        verifier = self.verifier
        self.rounded = []  # (the notes of the build that ships: the last one checked)
        if verifier is None or not verifier.compared:
            return fallbacks.Verdict(passed=True)
        started = time.perf_counter()
        self.say(f"verifying against TorchScript on {verifier.compared} input sets")
        culprit = None
        with PackageRunner(contents, self.target) as run:
            with self.stopwatch.stage("verify"):
                mismatches = verifier.check(run)
                if mismatches and verifier.drop_unsteady():  # (TorchScript differs from itself there)
                    mismatches = verifier.check(run) if verifier.compared else []
            if mismatches and contents.manifest["kernels"] and not self.bisecting:
                with self.stopwatch.stage("culprit_search"), verifier.exact():
                    culprit = find_culprit(graph, sched, run.observe, verifier.failed_inputs, self.target,
                                           lambda actual, expected: tensor_error(actual, expected)[0])
        carried = cpp_runtime.carried_member()
        if not mismatches and carried is not None:  # the build that verified it, for a machine that cannot build one
            contents.files[carried[0]] = carried[1]
        self.verify_seconds += time.perf_counter() - started
        if not mismatches:
            return fallbacks.Verdict(passed=True)
        kernels = [node for node in sched.nodes if node.op == KERNEL_OP]
        blamed = culprit if culprit is not None and culprit.kind == "kernel" else None
        failed = fallbacks.Verdict(passed=False, kernel=blamed and blamed.node, error=blamed.error if blamed else 0.0,
                                   worst=max((m.error for m in mismatches), default=0.0),
                                   mismatches="; ".join(str(m) for m in mismatches[:4]),
                                   has_kernels=contents.manifest["backend"] != "aten", kernels=kernels,
                                   device_type=self.target.type,
                                   discontinuous=fallbacks.has_discontinuous_op(sched.nodes))
        if (culprit is not None and culprit.kind == "rounding" and not self.own_way_back
                and fallbacks.rounding_their_own_way(kernels, self.target.type)):
            return failed  # (the ops whose kernels round their own way go to ATen first: another box is not taken)
        if culprit is not None and culprit.kind == "rounding":
            node = culprit.node
            where = f" ({node.source})" if node.source else ""
            self.rounded.append(f"{node.op}{where} decided differently on values that agree with TorchScript's to "
                                f"rounding (the first value to differ; error {culprit.error:.3g}): the outputs after "
                                "it differ from TorchScript's on " + ", ".join(verifier.failed) + ", every kernel "
                                "before it matched ATen")
            self.say(f"outputs differ only after {node.op}{where}, which rounding decided; keeping the kernels")
            return fallbacks.Verdict(passed=True, rounding=True)
        return failed

    def verification(self, attempt: fallbacks.Attempt, notes: list[str]) -> dict[str, Any]:
        """The report's verification section: how it went, and every step down the fallback ladder."""
        verifier = self.verifier
        return {
            "status": ("skipped" if verifier is None else "not compared" if not verifier.compared else
                       "matched up to rounding" if self.rounded else "passed"),
            "input_sets": verifier.compared if verifier else 0,
            "seconds": round(self.verify_seconds, 3),
            "kernels_removed": attempt.removed,
            "runtime": "cpp" if verifier is not None and verifier.compared else None,  # (load()'s, always)
            "notes": (verifier.notes if verifier else []) + self.rounded + attempt.notes + notes,
        }


def _build_package(graph, backend: str, ctx: pipeline.Context, signature: dict, model_info: dict,
                   say: Progress) -> tuple[PackageContents, Plan]:
    """Fuse (unless every op runs through ATen), generate and compile kernels, and package the plan.
    -> (contents, the plan it holds, with its IR nodes)."""
    target = ctx.device
    # (without kernels, each op a rewrite wrote as pieces for them runs whole: transpiler/decompositions.py)
    built, plan_graph = BuiltKernels(backend), undecomposed(graph) if backend == "aten" else graph
    if backend != "aten":
        say(f"fusing and generating {backend} kernels")
        try:
            plan_graph = pipeline.lower(graph, ctx)
            kernels = [n.attrs[Attr.KERNEL] for n in plan_graph.walk() if n.op == KERNEL_OP]
            with ctx.stopwatch.stage("kernels"):
                files, section = build_kernels(kernels, backend, say, target)
            built = BuiltKernels(backend, kernels, files, section)
        except KernelsFailed as failed:  # a renderer bug in some kernels costs those kernels, not the others
            raise _generation_failed(plan_graph, failed) from None
        except (Jit2TritonError, FusionFailed):  # (FusionFailed: transpiler/fallbacks.py takes its nodes out)
            raise
        except Exception as err:  # a bug in fusion or a renderer that no single node explains: no kernels at all
            failure = f"generating kernels failed ({type(err).__name__}: {err}); every op runs through ATen"
            say(failure)
            built, plan_graph = BuiltKernels("aten", failure=failure), undecomposed(graph)
    sched = pipeline.plan(plan_graph, target, ctx.stopwatch)
    return build_package(sched, plan_graph, built, signature, model_info, target), sched


def _generation_failed(plan_graph, failed: KernelsFailed) -> fallbacks.GenerationFailed:
    """The nodes of the kernels that failed to render, each with its kernel's reason, for the ladder to run through
    ATen in the next build."""
    nodes, reasons, named = [], {}, []
    for node in plan_graph.walk():
        why = failed.failures.get(node.attrs[Attr.KERNEL].name) if node.op == KERNEL_OP else None
        if why is None:
            continue
        fused = node.attrs[Attr.FUSED]
        name = node.attrs[Attr.KERNEL].name
        named.append(f"kernel {name} ({', '.join(sorted({n.op for n in fused}))}) {why}")
        nodes += fused
        reasons.update((n.uid, f"kernel {name} {why}") for n in fused)
    return fallbacks.GenerationFailed(nodes, reasons, "; ".join(named))


def _on_device(value, target: torch.device):
    """A copy on the target (as every tensor the plan makes is there): the model may write its state in place, and
    the saved value must stay as it was."""
    if isinstance(value, list):
        return [_on_device(v, target) for v in value]
    return value.to(target, copy=True) if isinstance(value, torch.Tensor) else value


def _run_plan(target: torch.device, stopwatch: Optional[pipeline.Stopwatch] = None) -> pipeline.RunPlan:
    """The reference interpreter the transpiler types the graph with: the runtime's executor, every op through
    ATen, weights on the target device; the time budget checked at every step (a model that runs for minutes)."""
    stopwatch = stopwatch or pipeline.Stopwatch()

    def run(sched: Plan, inputs: list, observer) -> list:
        weights = placed_weights(sched.weights, sched.plan, target)
        inputs = [_fresh_containers(x) for x in inputs]  # (the plan may append to a list it is given: module state)

        def observe(node, values) -> None:
            stopwatch.check()
            observer(node, values)
        try:
            executor = Executor(sched.plan, weights, sched.node_table,
                                observe=observe if observer is not None else None)
        except PackageError as err:  # (this torch made the graph: an op it lacks is one no runtime runs)
            raise ConversionError(_unrunnable(sched, err)) from None
        try:  # (unobserved, as timing runs it: no check, which would slow every step)
            return executor(inputs)
        except StepError as err:
            raise ConversionError(f"running the model failed: {err}") from None
    return run


def _unrunnable(sched: Plan, err: PackageError) -> str:
    """Why the plan cannot run here, where the same torch made the graph: the first op of its call steps that
    resolves to nothing, with the model's line (the runtime's own words, of a torch that lacks it, would mislead)."""
    for step in call_steps(sched.plan):
        try:
            resolve_op(step["op"])
        except PackageError:
            entry = sched.node_table[step["node"]]
            where = f" ({entry['source']})" if entry.get("source") else ""
            return (f"the model's graph holds {step['op']}{where}, which neither runtime runs: jit2triton does not "
                    "support it yet; please report it with the model")
    return str(err)


def _inputs_that_take_none(script, isolated, inputs: list) -> set[int]:
    """The positions of Optional[Tensor] inputs given a tensor in the example that TorchScript also runs with None
    there (the model's `if mask is not None:`): the package takes None for them as well. One run of the model on
    the example with all of them None decides it; a model that refuses None there keeps them tensors."""
    graph_inputs = list(script.graph.inputs())[:len(script.input_names)]
    optional = {i for i, (v, x) in enumerate(zip(graph_inputs, inputs))
                if isinstance(x, torch.Tensor) and isinstance(v.type(), torch._C.OptionalType)
                and isinstance(v.type().getElementType(), torch._C.TensorType)}
    if not optional:
        return set()
    try:
        run_where_the_weights_are(isolated, [None if i in optional else x for i, x in enumerate(inputs)])
    except Exception:  # noqa: BLE001 - the model refuses None there, or TorchScript crashed on it: tensors only
        return set()
    return optional


def _fresh_containers(value: Any) -> Any:
    """`value` with new lists and dicts (the tensors in them shared): a plan that appends to a list it was given
    (`self.seen.append(y)` on the state) must leave the caller's list as it was, since passes run the example's inputs
    again and each run starts from the saved state."""
    if isinstance(value, list):
        return [_fresh_containers(v) for v in value]
    if isinstance(value, dict):
        return {k: _fresh_containers(v) for k, v in value.items()}
    return value


def build_kernels(kernels: list, backend: str, say: Progress,
                  device: DeviceLike = None) -> tuple[dict[str, bytes], dict[str, Any]]:
    """Package members and the manifest's backend section for the kernels. `device` is the conversion target;
    without it the triton backend targets the device this process can build for (the CPU under the interpreter)."""
    if not kernels:
        return {}, {}
    chosen = backend_named(backend)
    if not chosen.generates_kernels:
        raise ConversionError(f"the {backend} backend generates no kernels")
    return chosen.build(kernels, torch.device(device) if device is not None else None, say)


def _example_layout(x: torch.Tensor) -> torch.Tensor:
    """The layout the package is built for: the example's when it is channels-last (images a caller keeps
    channels-last would otherwise be copied into NCHW on every call), else contiguous (a view's strides, a
    broadcast's zeros, are the example's accident, not the caller's layout)."""
    channels_last = CHANNELS_LAST.get(x.dim())
    if channels_last is not None and not x.is_contiguous() and x.is_contiguous(memory_format=channels_last):
        return x
    return x.contiguous()


def _complete_inputs(example_inputs, names: list[str], defaults: list[Any]) -> list[Any]:
    if example_inputs is None:
        example_inputs = ()
    elif isinstance(example_inputs, torch.Tensor) or not isinstance(example_inputs, (tuple, list)):
        example_inputs = (example_inputs,)
    given = list(example_inputs)
    required = [n for n, d in zip(names, defaults) if d is NO_DEFAULT]
    if len(given) < len(required) or len(given) > len(names):
        raise InputError(
            f"the model takes inputs ({', '.join(names)}), {len(required)} without defaults; got {len(given)} "
            "example inputs. Pass example_inputs=(...) with one value per input, in order (on the command line: "
            "one --input per model input)")
    return given + list(defaults[len(given):])


def _user_draws(verify_inputs: Any, names: list[str]) -> list[list]:
    """The user's own verification inputs: `verify_inputs`, a callable giving input sets or a list of them, each a
    tuple (or list) of the model's inputs in order, as example_inputs is."""
    if verify_inputs is None:
        return []
    given = verify_inputs() if callable(verify_inputs) else verify_inputs
    try:
        draws = [list(d) if isinstance(d, (tuple, list)) else [d] for d in given]
    except TypeError:
        raise ConversionError(f"verify_inputs must give a list of input sets (each a tuple of the model's inputs "
                              f"{', '.join(names)}), got {type(given).__name__}") from None
    return draws


def _fix_int_inputs(signature: list[dict]) -> None:
    """The model ran at no other value of its int inputs during conversion (it refused each), so a size one of them
    sets may be fixed in the package: the package serves each at the example's value only, and both runtimes refuse
    another at the boundary with an InputError, not a failure inside the plan."""
    for entry in signature:
        if entry["type"] == "int" and "example" in entry:
            entry["fixed"] = True


def _with_elements(desc: dict) -> dict:
    """`desc` (an input's) with each list's or dict's "element": the one type all the example's elements had, which
    the runtime then requires of every element a call passes (a list of another length is the model's to take).
    A list of tensors that differ in shape is "fixed": checked item by item, as a tuple is. Conversion saw the
    model run at those shapes in that order only, and sizes they set may be fixed in the package (a torchvision
    detector's batched image size: another image failed deep in the plan, where it now gets an InputError naming
    the item). Where the elements differ otherwise (or there are none), only the container's kind is checked."""
    items = desc.get("items")
    if desc["type"] not in ("List", "Tuple", "Dict") or not items:
        return desc
    values = list(items.values()) if isinstance(items, dict) else items
    values = [_with_elements(v) for v in values]
    out = {**desc, "items": dict(zip(items, values)) if isinstance(items, dict) else values}
    if desc["type"] != "Tuple" and all(v == values[0] for v in values):
        out["element"] = values[0]
    elif desc["type"] == "List" and all(v["type"] == "Tensor" for v in values):
        out["fixed"] = True
    return out


def _input_signature(names: list[str], defaults: list[Any], inputs: list[Any],
                     dynamic: dims.DynamicSpec) -> list[dict[str, Any]]:
    signature = []
    for position, (name, default, value) in enumerate(zip(names, defaults, inputs)):
        entry = {"name": name, **_with_elements(describe(value))}
        for axis, dim in dynamic.axes.get(position, {}).items():
            entry["shape"][axis] = dim.name  # a dynamic dim: checked against its range (signature["dims"]) per call
        if isinstance(value, torch.Tensor) and not value.is_contiguous():  # (_example_layout kept it)
            entry["layout"] = "channels_last"  # inputs arrive so: one laid out otherwise is copied into it
        if isinstance(value, torch.Tensor) and not value.dtype.is_floating_point and value.numel():
            entry["range"] = [int(value.min()), int(value.max()) + 1]  # for random inputs that stay valid
        elif isinstance(value, (bool, int, float, str)):
            entry["example"] = value
        if default is not NO_DEFAULT:
            entry["default"] = encode(default)
        signature.append(entry)
    return signature

