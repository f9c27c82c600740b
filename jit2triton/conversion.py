"""Conversion: the pipeline loaders -> transpiler -> emitters -> a package's contents."""
from __future__ import annotations

import os
import time
from typing import Any, Optional, Sequence, Union

import torch

from jit2triton.deploy.build_manifest import BuiltKernels, build_package, model_outputs
from jit2triton.deploy.executor import Executor
from jit2triton.deploy.literals import encode
from jit2triton.deploy.methods import add_method
from jit2triton.deploy.package import PackageContents
from jit2triton.deploy.runtime import DeviceLike, Runtime, placed_weights
from jit2triton.deploy.signature import CHANNELS_LAST, describe
from jit2triton.emitters.backends import backend_named
from jit2triton.loaders import load_script
from jit2triton.loaders.torchscript import NO_DEFAULT, ModelSource, check_model_path
from jit2triton.transpiler import pipeline
from jit2triton.transpiler.from_torchscript import from_torchscript
from jit2triton.transpiler.fuse import KERNEL_OP
from jit2triton.transpiler.op_table import lookup
from jit2triton.transpiler.symbolic import fit
from jit2triton.transpiler import timing
from jit2triton.transpiler.build_plan import Plan
from jit2triton.transpiler.precision import PrecisionPlan

from . import dims, precision
from .dim_ranges import checked_ranges
from .dims import DynamicShapes
from .errors import ConversionError, InputError, Jit2TritonError, PackageDeviceError, StepError
from .inputs import inputs_at, with_other_values
from .verify import Verifier, divergent_kernel, first_divergence, fused_values, observed_values, package_runner, \
    run_where_the_weights_are

Progress = Any

BACKENDS = ("cpp", "triton", "aten")
# Other values the model runs on at the example's shapes where it has ops with data-dependent output sizes, each
# moved so that masks such as `x > 0` count differently from the example and from each other
VALUE_SHIFTS = (0.5, -0.5, 1.0)
MAX_VERIFY_ROUNDS = 16  # each failed round takes one kernel out (the last, every kernel)


def convert_to_package(model: ModelSource, example_inputs: Union[Sequence[Any], torch.Tensor, None] = None,
                       device: DeviceLike = "cpu", backend: Optional[str] = None, map_location: DeviceLike = None,
                       progress: Optional[Progress] = None, verify: bool = True,
                       full_source_paths: bool = False, dynamic_shapes: DynamicShapes = None,
                       narrow_dims: bool = False, precision: Optional[str] = None,
                       accuracy: Optional[dict] = None,
                       io_precision: Optional[str] = None) -> tuple[PackageContents, torch.device]:
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
    """
    if isinstance(dynamic_shapes, str):
        return _convert_auto(model, example_inputs, device, backend, map_location, progress, verify,
                             full_source_paths, dynamic_shapes, precision, accuracy, io_precision)
    say = progress or (lambda message: None)
    started = time.perf_counter()
    target = torch.device(device or "cpu")
    if target.type == "cuda" and not torch.cuda.is_available():
        raise PackageDeviceError("device='cuda' was asked for but this machine has no CUDA device; use device='cpu'")
    backend = backend or ("triton" if target.type == "cuda" else "cpp")
    if backend not in BACKENDS:
        raise ConversionError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend == "cpp" and target.type != "cpu":
        raise ConversionError("the C++ backend generates CPU kernels; use device='cpu' or backend='triton'")
    if backend == "triton":  # before loading the model: a process that cannot build the kernels says so at once
        from jit2triton.emitters.compile_triton import check_triton_target
        check_triton_target(target)
    forward_examples, method_examples = _per_method(example_inputs)
    if isinstance(model, (str, os.PathLike)):
        check_model_path(os.fspath(model))  # before the first progress line: a missing file is the whole answer
    say("loading TorchScript (freeze, inline, normalise)")
    stopwatch = pipeline.Stopwatch(say)
    with stopwatch.stage("load"):
        script = load_script(model, map_location=map_location, methods=list(method_examples))
    source = os.fspath(model) if isinstance(model, (str, os.PathLike)) else ""
    reduced = (precision, accuracy, io_precision)
    contents = _convert_method(script, forward_examples, target, backend, source, say, stopwatch, verify,
                               full_source_paths, dynamic_shapes, reduced, narrow_dims)
    for name, examples in method_examples.items():
        say(f"converting method {name}")
        add_method(contents, name, _convert_method(script.methods[name], examples, target, backend, source, say,
                                                   stopwatch, verify, full_source_paths, None, reduced))
    unconverted = [n for n in script.method_names if n != "forward" and n not in method_examples]
    if unconverted:
        contents.manifest["report"]["methods_not_converted"] = {
            name: "no example inputs: pass example_inputs={'forward': (...), " + repr(name) + ": (...)} to convert it"
            for name in unconverted}
    contents.files.update({f"extra/{name}": data for name, data in script.extra_files.items()})
    say(f"converted in {time.perf_counter() - started:.2f}s")
    return contents, target


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
                    narrow_dims: bool = False) -> PackageContents:
    """One method of the model (forward, or another the user gave examples for) as a package's contents;
    `reduced`: (precision, accuracy, io_precision) as convert_to_package takes them."""
    inputs = _complete_inputs(example_inputs, script.input_names, script.input_defaults)
    inputs = [_example_layout(x.to(target)) if isinstance(x, torch.Tensor) else x for x in inputs]
    dynamic = dims.resolve(dynamic_shapes, script.input_names, inputs)
    range_notes: list[str] = []
    if dynamic:
        say("running the model at the ends of the dims' ranges")
        with stopwatch.stage("dim_ranges"):
            reference = lambda *xs: run_where_the_weights_are(script.function, list(xs))[0]  # noqa: E731
            dynamic, range_notes = checked_ranges(dynamic, reference, inputs, narrow_dims)
    state = [_on_device(slot.initial, target) for slot in script.state]  # the plan takes it after the inputs
    say(f"building the IR ({sum(1 for _ in script.graph.nodes())} top-level TorchScript nodes)")
    say("inferring shapes and dtypes from the example inputs" + (", rewriting for fusion" if backend != "aten" else ""))
    precision_plan, tolerance = precision.plan_for(*reduced, target, say)
    asked_backend = backend
    graph, ctx, backend, pass_notes = _prepared(script, inputs + state, dynamic, target, backend, full_source_paths,
                                                say, stopwatch, precision_plan)
    written = sum(slot.written for slot in script.state)
    taken = precision.package_inputs(precision_plan, inputs)  # as the package takes them (io_precision)
    outputs = model_outputs(ctx.outputs, written)
    output = outputs[0] if len(outputs) == 1 else tuple(outputs)
    seen = [(ctx.example_sizes, outputs)] + [(sizes, model_outputs(out, written)) for sizes, out in ctx.draw_outputs]
    signature = {"inputs": _input_signature(script.input_names, script.input_defaults, taken, dynamic),
                 "outputs": _with_dims(describe(output), seen)}
    if dynamic:
        signature["dims"] = dynamic.signature()
    model_info = {"name": script.name, "source": source, "state": script.state}
    verifier = None
    if verify:
        say("running TorchScript on the example inputs and a fresh draw, for verification")
        other_sizes = [(", ".join(f"{n}={k}" for n, k in sizes.items()), inputs_at(dynamic, sizes, taken, 100 + i))
                       for i, sizes in enumerate(dynamic.bounds() + dynamic.draws(1, seed=1))] if dynamic else []
        with stopwatch.stage("reference"):
            verifier = Verifier(precision.reference(precision_plan, script.function), taken, signature["inputs"],
                                target, dynamic.example, other_sizes)
        verifier.tolerance = tolerance
        if precision_plan is not None:
            def through_aten(trial):
                return _prepared(script, inputs + state, dynamic, target, "aten", full_source_paths,
                                 lambda message: None, pipeline.Stopwatch(), trial)[:2]
            with stopwatch.stage("precision_search"):
                if precision.enforce(precision_plan, graph, ctx, verifier, written, through_aten, say):
                    graph, ctx, backend, pass_notes = _prepared(script, inputs + state, dynamic, target,
                                                                asked_backend, full_source_paths, say, stopwatch,
                                                                precision_plan)
    try:
        contents, verification = _build_verified(graph, backend, ctx, signature, model_info, verifier, say,
                                                 rewritten=backend != "aten")
    except _RewritesDisagree as err:
        # A rewrite before fusion (GEMM forms, layouts, attention) changed the model beyond rounding: a bug, but the
        # user still gets a correct package, the one TorchScript's own graph makes through ATen.
        say(f"{err}; converting again as TorchScript wrote it, every op through ATen")
        graph, ctx, _, _ = _prepared(script, inputs + state, dynamic, target, "aten", full_source_paths, say,
                                     stopwatch, precision_plan)
        contents, verification = _build_verified(graph, "aten", ctx, signature, model_info, verifier, say,
                                                 rewritten=False)
        verification["notes"] = list(verification["notes"]) + [
            f"{err}; every op runs through ATen as TorchScript wrote it (please report it with the model)"]
    if pass_notes or script.notes or range_notes:
        verification["notes"] = list(verification["notes"]) + range_notes + script.notes + pass_notes
    if target.type == "cuda" and contents.manifest["cuda_graph"]:
        with stopwatch.stage("cuda_graph_timing"):
            _choose_cuda_graph(contents, taken, target, say)
    contents.manifest["report"]["verification"] = verification
    if precision_plan is not None:
        measured = precision.measure(package_runner(contents, target), verifier) if verifier else []
        contents.manifest["report"]["precision"] = precision.report_section(precision_plan, tolerance, measured)
    contents.manifest["report"]["pass_seconds"] = stopwatch.report()
    if dynamic:
        contents.manifest["report"]["dynamic_dims"] = signature["dims"]
    return contents


def _convert_auto(model: ModelSource, example_inputs, device: DeviceLike, backend: Optional[str],
                  map_location: DeviceLike, progress: Optional[Progress], verify: bool, full_source_paths: bool,
                  mode: str, precision: Optional[str] = None, accuracy: Optional[dict] = None,
                  io_precision: Optional[str] = None) -> tuple[PackageContents, torch.device]:
    """dynamic_shapes="auto": try a dynamic batch dim; when the model specialises on it (a reshape to the example's
    batch, a branch a trace baked in), convert it static and put the reason in the report."""
    if mode != "auto":
        raise ConversionError(f"dynamic_shapes={mode!r} is not known: give Dims (see jit2triton.Dim), or 'auto'")
    say = progress or (lambda message: None)
    script = load_script(model, map_location=map_location)
    inputs = _complete_inputs(_per_method(example_inputs)[0], script.input_names, script.input_defaults)
    batch = dims.auto_batch(inputs)
    options = (device, backend, map_location, progress, verify, full_source_paths)
    why = "the model has no tensor input with a batch axis"
    if batch is not None:
        try:
            return convert_to_package(model, example_inputs, *options, batch, precision, accuracy, io_precision)
        except ConversionError as err:
            why = str(err)
    say(f"the batch dim stays static: {why}")
    contents, target = convert_to_package(model, example_inputs, *options, None, precision, accuracy, io_precision)
    contents.manifest["report"]["static_dims"] = {dims.AUTO_DIM: why}
    return contents, target


def _prepared(script, inputs: list, dynamic: "dims.DynamicSpec", target: torch.device, backend: str,
              full_source_paths: bool, say: Progress, stopwatch: pipeline.Stopwatch,
              precision_plan: Optional[PrecisionPlan] = None) -> tuple[Any, pipeline.Context, str, list[str]]:
    """TorchScript's graph in our IR, typed and rewritten for fusion -> (graph, context, backend, notes). A pass
    that fails with an internal error (a bug) must not fail the conversion: a rewrite that only makes the graph
    faster is skipped, any other pass costs the generated kernels (every op through ATen); each time the graph is
    built again from TorchScript's, since the failed pass may have left it half rewritten. The notes say what was
    left out, for the report."""
    skipped: set[str] = set()
    notes: list[str] = []
    while True:
        names = script.input_names + [f"self.{slot.name}" for slot in script.state]
        with stopwatch.stage("from_torchscript"):
            graph = from_torchscript(script.graph, names, script.name, full_source_paths)
        ctx = _context(target, inputs, dynamic, stopwatch)
        ctx.precision = precision_plan
        ctx.generated_gemm = backend_named(backend).generated_gemm  # a GEMM over few rows may take its form
        try:
            pipeline.prepare(graph, ctx, generate_kernels=backend != "aten", skip=frozenset(skipped))
            return graph, ctx, backend, notes
        except pipeline.PassFailed as failure:
            if backend == "aten":
                raise ConversionError(f"{failure}; this is a bug in jit2triton: please report it with the "
                                      "model") from None
            if failure.name in pipeline.OPTIONAL_REWRITES and failure.name not in skipped:
                skipped.add(failure.name)
                notes.append(f"{failure}: converted without it (please report it with the model)")
            else:
                backend = "aten"
                notes.append(f"{failure}: every op runs through ATen (please report it with the model)")
            say(notes[-1])


def _context(target: torch.device, inputs: list, dynamic: "dims.DynamicSpec",
             stopwatch: pipeline.Stopwatch) -> pipeline.Context:
    """What the passes share: the target, the example inputs and, with dynamic dims, draws at other sizes."""
    ctx = pipeline.Context(target, inputs, _run_plan(target), stopwatch=stopwatch,
                           example_sizes=dict(dynamic.example),
                           draws=[(sizes, inputs_at(dynamic, sizes, inputs, seed=i))
                                  for i, sizes in enumerate(dynamic.draws())])
    ctx.value_draws = [with_other_values(inputs, seed=7 + i, shift=shift) for i, shift in enumerate(VALUE_SHIFTS)]
    largest = dynamic.largest() if dynamic else None
    if largest is not None:
        ctx.largest = (largest, inputs_at(dynamic, largest, inputs, seed=len(ctx.draws)))
    if dynamic:  # kernels take the dynamic dims as arguments (both renderers, both runtimes)
        ctx.kernel_dims = {name: (d.min, d.max, dynamic.example[name]) for name, d in dynamic.dims.items()}
    return ctx


class _RewritesDisagree(ConversionError):
    """The rewritten graph disagrees with TorchScript with every op through ATen: a rewrite, not a kernel, is wrong."""


def _build_verified(graph, backend: str, ctx: pipeline.Context, signature: dict, model_info: dict,
                    verifier: Optional[Verifier], say: Progress,
                    rewritten: bool = False) -> tuple[PackageContents, dict[str, Any]]:
    """Build the package and verify it against TorchScript; while it disagrees, take out the first kernel that
    diverges from ATen (or, when none does, every kernel) and build again. -> (contents, the report's
    verification section)."""
    removed: list[dict[str, Any]] = []
    rounded: list[str] = []  # where outputs differ because a discontinuous op met rounding, not a wrong kernel
    verify_seconds = 0.0
    for _ in range(MAX_VERIFY_ROUNDS):
        contents, sched = _build_package(graph, backend, ctx, signature, model_info, say)
        backend = contents.manifest["backend"]  # "aten" if generating kernels failed outright
        if verifier is None or not verifier.compared:
            break
        checked = time.perf_counter()
        say(f"verifying against TorchScript on {verifier.compared} input sets")
        with ctx.stopwatch.stage("verify"):
            mismatches = verifier.check(package_runner(contents, ctx.device))
        culprit = None
        if mismatches and contents.manifest["kernels"]:
            with ctx.stopwatch.stage("culprit_search"):
                culprit = _find_culprit(graph, sched, contents, verifier, ctx.device)
        verify_seconds += time.perf_counter() - checked
        if not mismatches:
            break
        if culprit is not None and culprit[0] == "rounding":
            _, node, error = culprit
            where = f" ({node.source})" if node.source else ""
            rounded.append(f"{node.op}{where} decided differently on values that agree with TorchScript's to "
                           f"rounding (the first value to differ; error {error:.3g}): the outputs after it differ from "
                           "TorchScript's on " + ", ".join(verifier.failed) + ", every kernel before it matched ATen")
            say(f"outputs differ only after {node.op}{where}, which rounding decided; keeping the kernels")
            break
        if culprit is not None:
            _, kernel, error = culprit
            name = kernel.attrs["kernel"].name
            why = f"verification: max rel. error {error:.3g} against ATen (kernel {name})"
            say(f"taking kernel {name} out: {why}")
            removed.append({"kernel": name, "error": error, "ops": [n.op for n in kernel.attrs["fused"]]})
            ctx.refused.update((node.uid, why) for node in kernel.attrs["fused"])
        elif backend != "aten":
            say("no single kernel is to blame: every op runs through ATen instead")
            removed.append({"kernel": "*", "error": max(m.error for m in mismatches), "ops": []})
            backend = "aten"
        else:
            listed = "; ".join(str(m) for m in mismatches[:4])
            if rewritten:
                raise _RewritesDisagree(f"the rewritten model does not match TorchScript ({listed})")
            raise ConversionError(f"the converted model does not match TorchScript ({listed}); this is a bug in "
                                  "jit2triton: please report it with the model")
    else:
        raise ConversionError(f"verification still failed after taking {len(removed)} kernels out; please report it, "
                              "or convert with backend='aten'")
    return contents, {
        "status": ("skipped" if verifier is None else "not compared" if not verifier.compared else
                   "matched up to rounding" if rounded else "passed"),
        "input_sets": verifier.compared if verifier else 0,
        "seconds": round(verify_seconds, 3),
        "kernels_removed": removed,
        "notes": (verifier.notes if verifier else []) + rounded,
    }


def _build_package(graph, backend: str, ctx: pipeline.Context, signature: dict, model_info: dict,
                   say: Progress) -> tuple[PackageContents, Plan]:
    """Fuse (unless every op runs through ATen), generate and compile kernels, and package the plan.
    -> (contents, the plan it holds, with its IR nodes)."""
    target = ctx.device
    built, plan_graph = BuiltKernels(backend), graph
    if backend != "aten":
        say(f"fusing and generating {backend} kernels")
        try:
            plan_graph = pipeline.lower(graph, ctx)
            kernels = [n.attrs["kernel"] for n in plan_graph.walk() if n.op == KERNEL_OP]
            with ctx.stopwatch.stage("kernels"):
                files, section = build_kernels(kernels, backend, say, target)
            built = BuiltKernels(backend, kernels, files, section)
        except Jit2TritonError:
            raise
        except Exception as err:  # a bug in fusion or a renderer that no single node explains: no kernels at all
            failure = f"generating kernels failed ({type(err).__name__}: {err}); every op runs through ATen"
            say(failure)
            built, plan_graph = BuiltKernels("aten", failure=failure), graph
    sched = pipeline.plan(plan_graph, target, ctx.stopwatch)
    return build_package(sched, plan_graph, built, signature, model_info, target), sched


def _on_device(value, target: torch.device):
    """A copy on the target (as every tensor the plan makes is there): the model may write its state in place, and
    the saved value must stay as it was."""
    if isinstance(value, list):
        return [_on_device(v, target) for v in value]
    return value.to(target, copy=True) if isinstance(value, torch.Tensor) else value


GRAPH_MARGIN = 0.97  # the graph stays unless the plan step by step takes under this share of its time...
HOST_HEADROOM = 0.75  # ... and the host queues a step-by-step call in under this share of it (the GPU is the limit)


def _choose_cuda_graph(contents: PackageContents, inputs: list, target: torch.device, say: Progress) -> None:
    """Whether a straight-line CUDA plan runs as one graph, by timing both on the example inputs, back to back. A
    graph saves the host's launches but copies every input in and output out of its buffers. Where the GPU is the
    limit (an MLP's 4096x1024x4096 fp16 GEMMs), the launches hide behind GPU work anyway and the copies are pure
    cost: there the plan runs step by step. Only with room to spare, though: a plan whose host work nearly fills
    the GPU's time becomes host-bound, and slower than the graph, as soon as the host is a little busier than it
    was while converting. Recorded in the manifest (and its report), so no runtime decides it."""
    what = "one CUDA graph or step by step"
    if timing.fixed():  # the graph, as the plan's shape decided
        timing.take_fixed(what, "graph", "graph")
        return
    graphed, stepwise = Runtime(contents, target), Runtime(contents, target, cuda_graphs=False)
    calls = 8
    batch = lambda runtime: lambda: [runtime(*inputs) for _ in range(calls)]  # noqa: E731
    try:
        with torch.no_grad():
            graphed(*inputs)  # runs step by step; the next call captures
            timed = {label: seconds / calls for label, seconds in timing.interleaved(
                {"graph": batch(graphed), "steps": batch(stepwise)}, rounds=10, budget_s=0.5,
                sync=torch.cuda.synchronize).items()}
            # the host's share: queueing the calls, timed without waiting for the GPU (after it drained)
            timed["host"] = timing.best_time(batch(stepwise), runs=5, budget_s=0.2, sync=lambda: None) / calls
            torch.cuda.synchronize()
    except Exception as err:  # noqa: BLE001 - a plan that cannot be timed keeps the decision made from its shape
        say(f"timing the CUDA graph failed ({type(err).__name__}); keeping it")
        return
    if not graphed.uses_cuda_graph:
        return
    use_graph = timed["steps"] >= GRAPH_MARGIN * timed["graph"] or timed["host"] >= HOST_HEADROOM * timed["steps"]
    contents.manifest["cuda_graph"] = use_graph
    timing.record(timing.Choice(what, "graph", "graph" if use_graph else "steps", GRAPH_MARGIN,
                                {k: round(v * 1e6, 1) for k, v in timed.items()}))
    contents.manifest["report"]["cuda_graph"] = dict({f"{k}_us": round(v * 1e6, 1) for k, v in timed.items()},
                                                     chosen=use_graph)
    say(f"CUDA graph: {timed['graph'] * 1e6:.0f} us a call, step by step {timed['steps'] * 1e6:.0f} us (the host "
        f"{timed['host'] * 1e6:.0f} us of it): " + ("one graph" if use_graph else "step by step"))


def _find_culprit(graph, sched, contents, verifier: Verifier, target: torch.device) -> Optional[tuple]:
    """Why the package disagrees with TorchScript on the cases that failed: ("kernel", node, error) for the first
    generated kernel that differs from ATen; ("rounding", node, error) when on every failed case the first value to
    differ is made by a discontinuous op (a comparison, a sort, NMS) from inputs that agreed, so rounding decided it;
    None when neither explains it."""
    before = pipeline.plan(graph)
    weights = placed_weights(before.weights, before.plan, target)
    rounding = None
    for name, inputs, _ in verifier.cases:
        if name not in verifier.failed:
            continue
        reference = observed_values(before.plan, weights, before.node_table, before.nodes, inputs, target)
        actual = fused_values(contents, sched.plan, sched.nodes, inputs, target)
        first = first_divergence(reference, actual, sched.nodes)
        if first is not None and first[0].op == KERNEL_OP:
            return ("kernel", *first)
        kernel = divergent_kernel(reference, actual, sched.nodes)  # after an ATen op that parted: the first kernel
        if first is not None and lookup(first[0].op).discontinuous:
            rounding = rounding or ("rounding", *first)
        elif kernel is not None:
            return ("kernel", *kernel)
        else:
            return None  # a failed case nothing explains
    return rounding


def _run_plan(target: torch.device) -> pipeline.RunPlan:
    """The reference interpreter the transpiler types the graph with: the runtime's executor, every op through
    ATen, weights on the target device."""
    def run(sched: Plan, inputs: list, observer) -> list:
        weights = placed_weights(sched.weights, sched.plan, target)
        try:
            return Executor(sched.plan, weights, sched.node_table, observe=observer)(inputs)
        except StepError as err:
            raise ConversionError(f"running the model failed: {err}") from None
    return run


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


def _input_signature(names: list[str], defaults: list[Any], inputs: list[Any],
                     dynamic: dims.DynamicSpec) -> list[dict[str, Any]]:
    signature = []
    for position, (name, default, value) in enumerate(zip(names, defaults, inputs)):
        entry = {"name": name, **describe(value)}
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


def _with_dims(desc: dict, seen: list[tuple[dict, list]]) -> dict:
    """The outputs' description with each tensor's dynamic sizes named (`dims`: "batch", "12*batch"), beside the
    example's: fitted to the outputs seen at the example and at each draw of the dims (`seen`: (sizes, outputs))."""
    if not seen[1:]:
        return desc
    draws = [sizes for sizes, _ in seen]

    def walk(d: dict, values: list) -> None:
        if d.get("type") == "Tensor" and all(isinstance(v, torch.Tensor) and v.dim() == len(d["shape"])
                                             for v in values):
            fitted = [fit([v.shape[axis] for v in values], draws) for axis in range(len(d["shape"]))]
            if any(not isinstance(n, int) for n in fitted):
                d["dims"] = [str(n) if n is not None else "?" for n in fitted]
        elif d.get("type") in ("Tuple", "List") and all(isinstance(v, (tuple, list)) and len(v) == len(d["items"])
                                                        for v in values):
            for i, item in enumerate(d["items"]):
                walk(item, [v[i] for v in values])
        elif d.get("type") == "Dict" and all(isinstance(v, dict) and v.keys() == d["items"].keys() for v in values):
            for key, item in d["items"].items():
                walk(item, [v[key] for v in values])

    walk(desc, [outputs[0] if len(outputs) == 1 else tuple(outputs) for _, outputs in seen])
    return desc
