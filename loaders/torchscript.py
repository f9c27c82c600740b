"""Read TorchScript and normalise its graph into the form the transpiler reads.

What comes out is one frozen, inlined `torch._C.Graph` per model: weights are constants (conv+BN folded by
`torch.jit.freeze`, but in a model whose outputs depend discretely on its values: discrete_outputs.py), calls are
inlined, constants propagated, and mutation removed where TorchScript proves it safe. `prim::If` / `prim::Loop`
stay: scripted control flow is part of the model. Verification's reference is the module as the user loaded it,
not the frozen one: the package must give the answer the user's model gives.
"""
from __future__ import annotations

import copy
import os
import re
import warnings
import zipfile
from dataclasses import dataclass, field
from typing import Any, Sequence, Union

import torch

from jit2triton.errors import ConversionError, ModelLoadError

from .discrete_outputs import discrete_decisions
from .mkldnn_form import dense_form
from .local_objects import objects_as_dicts
from .side_effects import drop_grad_modes, refuse_effects, refuse_unstored_layouts, refuse_unsupported
from .module_state import StateSlot, read_state, restore_state, thread_module_state
from .graph_nodes import all_nodes

ModelSource = Union[str, os.PathLike, torch.jit.ScriptModule, torch.jit.ScriptFunction]


@dataclass
class ScriptGraph:
    graph: torch._C.Graph  # frozen and inlined; the module's `self` input removed
    input_names: list[str]
    input_defaults: list[Any]  # per input: its default value, or `NO_DEFAULT`
    name: str
    function: Any = field(default=None, repr=False)  # runs the TorchScript as loaded: verification's reference
    extra_files: dict[str, bytes] = field(default_factory=dict)  # torch.jit.save(..., _extra_files=...) of a .pt
    # Module attributes forward() reads or writes (loaders/module_state.py): the graph takes their values after the
    # model's inputs and returns the written ones' new values after its outputs
    state: list[StateSlot] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what loading had to work around, for the report
    methods: dict[str, "ScriptGraph"] = field(default_factory=dict)  # the other methods asked for, by name
    method_names: list[str] = field(default_factory=list)  # every method the module has (forward first)
    folded: bool = False  # freezing ran its numerics-changing folding (conv-BatchNorm, conv-add, conv-mul) on it


NO_DEFAULT = object()


def load_script(source: ModelSource, map_location: Union[str, torch.device, None] = None,
                methods: Sequence[str] = (), fold: bool = True) -> ScriptGraph:
    """Accept a path to a `torch.jit.save` archive, a ScriptModule or a ScriptFunction; `methods` names the
    module's methods besides forward to read as well (`ScriptGraph.methods`). Without `fold`, freezing leaves out
    its numerics-changing folding whatever the model (with it: where the outputs do not depend discretely on values)."""
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        script = load_script(_read_archive(path, map_location), methods=methods, fold=fold)
        script.extra_files = _extra_files(path)
        return script
    if isinstance(source, torch.jit.ScriptFunction):
        if methods:
            raise ConversionError(f"a ScriptFunction has no methods; got example inputs for {', '.join(methods)}")
        return _from_function(source)
    if isinstance(source, torch.jit.ScriptModule):
        return _from_module(source, list(methods), fold)
    if isinstance(source, torch.nn.Module):
        raise ModelLoadError(
            f"got an eager {type(source).__name__}, not TorchScript; trace or script it first: "
            "torch.jit.trace(model, example_inputs) or torch.jit.script(model)")
    raise ModelLoadError(
        f"expected a path to a TorchScript archive, a ScriptModule or a ScriptFunction, got {type(source).__name__}")


def check_model_path(path: str) -> None:
    """A model path that names no readable file is refused before anything else runs."""
    if not os.path.exists(path):
        raise ModelLoadError(f"model file not found: {path!r}; check the path")
    if os.path.isdir(path) or not os.access(path, os.R_OK):
        raise ModelLoadError(f"cannot read model file {path!r}: it is a folder or not readable")


# torch.jit.load's words for an op no library of this process registered (torchvision::nms before torchvision is
# imported, an aten op of a newer torch)
_UNKNOWN_OP = re.compile(r"Unknown builtin op: (\w+::[\w.]*\w)")


def _read_archive(path: str, map_location) -> torch.jit.ScriptModule:
    check_model_path(path)
    if not zipfile.is_zipfile(path):
        raise ModelLoadError(
            f"{path!r} is not a TorchScript archive (not a zip file); save the model with torch.jit.save")
    _refuse_other_archives(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return torch.jit.load(path, map_location=map_location)
    except Exception as err:  # torch raises RuntimeError/ValueError with C++ traces; name the cause plainly
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        error = ModelLoadError(
            f"{path!r} could not be read as TorchScript ({first}); if it was written with torch.save, "
            "re-export it with torch.jit.save(torch.jit.trace(model, inputs), path)")
        unknown = _UNKNOWN_OP.search(first)
        error.unknown_op = unknown.group(1) if unknown else None  # (the face says whose op it is: conversion.py)
        raise error from None


def _extra_files(path: str) -> dict[str, bytes]:
    """The files torch.jit.save stored beside the model (`_extra_files`: tokenizer configs, label maps, versions)."""
    reader = torch._C.PyTorchFileReader(path)
    return {name[len("extra/"):]: bytes(reader.get_record(name)) for name in reader.get_all_records()
            if name.startswith("extra/")}


def _refuse_other_archives(path: str) -> None:
    """The other files torch's container holds, named for what they are instead of torch's reader error."""
    try:
        records = set(torch._C.PyTorchFileReader(path).get_all_records())
    except RuntimeError:
        return  # torch.jit.load's own error says what is wrong
    if "manifest.json" in records:
        raise ModelLoadError(f"{path!r} is already a jit2triton package; load it with jit2triton.load({path!r})")
    if "constants.pkl" not in records and "data.pkl" in records:
        raise ModelLoadError(
            f"{path!r} was written by torch.save (a state_dict or a pickled module), not torch.jit.save, so it holds "
            "no TorchScript: build the model in Python, load the weights into it, and export it with "
            "torch.jit.save(torch.jit.trace(model, inputs), path) (or torch.jit.script(model))")


def _from_module(module: torch.jit.ScriptModule, methods: list[str], fold: bool = True) -> ScriptGraph:
    if not hasattr(module, "forward"):
        raise ModelLoadError("the ScriptModule has no forward method to convert")
    names = list(module._c._method_names())
    unknown = [m for m in methods if m not in names or m == "forward"]
    if unknown:
        raise ConversionError(f"the module has no method {unknown[0]!r} to convert besides forward; its methods are "
                              f"{', '.join(names)}")
    module = module.eval()
    decisions: set[str] = set()
    folded = False  # the model has ops freezing's numerics-changing passes fold
    normed = False  # ... and BatchNorms among them
    for method in ["forward", *methods]:  # before freezing runs a file read whose path it knows
        unfrozen = getattr(module, method).graph.copy()
        inline_calls(unfrozen)
        refuse_effects(unfrozen)
        decisions.update(discrete_decisions(unfrozen))
        folded = folded or any(unfrozen.findAllNodes(op, True) for op in _FOLDED)
        normed = normed or bool(unfrozen.findAllNodes("aten::batch_norm", True))
    frozen, notes, numerics_kept = _freeze(module, methods, keep_numerics=bool(decisions) or not fold)
    if decisions and folded and fold:
        what = ("conv-BatchNorm folding" if normed else
                "torch.jit.freeze's folding of constant adds and multiplies into convolutions and linears")
        notes.append(f"{what} left out, with its merging of linears that read one input: the outputs depend "
                     f"discretely on the model's values (at "
                     f"{', '.join(sorted(decisions))}), where folding's rounding could pick another box, label or "
                     "count than the model does" + ("; BatchNorm computes its own formula, after the convolution"
                                                    if normed else ""))
    script = _method(frozen, "forward", _module_name(module), notes)
    script.methods = {name: _method(frozen, name, f"{_module_name(module)}.{name}", []) for name in methods}
    script.method_names = ["forward"] + sorted(n for n in names if n != "forward")
    script.folded = folded and not numerics_kept
    _run_as_loaded(script, module)
    return script


_FOLDED = ("aten::batch_norm", "aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::_convolution", "aten::linear")


def _run_as_loaded(script: ScriptGraph, module: torch.jit.ScriptModule) -> None:
    """Verification's reference for each method: the user's module as loaded (unfrozen, unfolded: its answer is the
    one to give), or a copy of it where the methods write module state (verification restores the saved state
    before each call), so that the user's own module is left as it was."""
    scripts = {"forward": script, **script.methods}
    reference = copy.deepcopy(module) if any(s.state for s in scripts.values()) else module
    for method, each in scripts.items():
        as_loaded = _OwnExecutor(getattr(reference, method))
        each.function = _StatefulReference(as_loaded, reference, each.state) if each.state else as_loaded


class _OwnExecutor:
    """A TorchScript method or function run by a graph executor of its own, so that verification's reference is
    TorchScript's plain interpreter whatever the user's object ran before.

    A method's executor keeps the first plan it makes for good: `torch.jit.optimized_execution(False)`, which
    verification runs the reference under, stops a plan being optimised, but not one already optimised from being
    used. A model the user warmed up before converting (a benchmark's three calls) answers from its fused plan from
    then on; on CUDA TorchScript's fuser rounds otherwise than ATen (a multiply-add as one FMA), and a detector's
    threshold turned that into another box (Faster R-CNN on an H200: refused with every op through ATen). Here the
    method's graph, its calls inlined, runs in a new function whose executor has never planned; the attributes
    `reference_child` reads (owner, name, graph, save_to_buffer) are the original's."""

    def __init__(self, original: Any) -> None:
        self.original = original
        graph = original.graph.copy()
        inline_calls(graph)  # (a call's own executor may hold an optimised plan too)
        self.run = torch._C._create_function_from_graph(f"{original.name}_reference", graph)
        owner = getattr(original, "owner", None)
        self.bound = () if owner is None else (owner,)
        arguments = original.schema.arguments[len(self.bound):]
        self.defaults = [a.default_value if a.has_default_value() else NO_DEFAULT for a in arguments]

    def __call__(self, *inputs: Any) -> Any:
        missing = self.defaults[len(inputs):]  # (the new function's schema has no defaults: TorchScript's are filled)
        if any(d is NO_DEFAULT for d in missing):
            return self.original(*inputs)  # (TorchScript's own message for a missing argument)
        return self.run(*self.bound, *inputs, *missing)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.original, name)


def _method(frozen: torch.jit.ScriptModule, method: str, name: str, notes: list[str]) -> ScriptGraph:
    """One method of the frozen module as a graph without `self`: its module state threaded through."""
    function = getattr(frozen, method)
    graph = function.graph.copy()
    schema = function.schema
    inline_calls(graph)  # first: the passes below must see the nodes of every function the graph calls
    drop_grad_modes(graph)
    refuse_effects(graph)
    objects_as_dicts(graph)
    state = thread_module_state(graph, frozen)
    self_input = next(iter(graph.inputs()))
    if self_input.uses():
        users = sorted({use.user.kind() for use in self_input.uses()})
        refuse_unsupported(graph, only=("prim::PythonOp",))  # (a call back into Python holds it: say so)
        raise ConversionError(
            f"after freezing, the graph still uses the module object itself through {users}, which jit2triton cannot "
            "carry into a package; please report it with the model")
    graph.eraseInput(0)
    _normalise(graph)
    refuse_unstored_layouts(graph, state)
    args = schema.arguments[1:]
    return ScriptGraph(graph, [a.name for a in args], [_default(a) for a in args], name, state=state, notes=notes)


def _freeze(module: torch.jit.ScriptModule, methods: list[str],
            keep_numerics: bool = False) -> tuple[torch.jit.ScriptModule, list[str], bool]:
    """torch.jit.freeze, and where one of its optional optimisations crashes (its conv folding has asserted on timm's
    FastViT), freezing without them: the model's semantics do not depend on them, only its speed. Where
    `keep_numerics`, none of them: `optimize_numerics=False` still concatenates linears that share an input
    (FrozenConcatLinear), and the merged GEMM rounds otherwise; in a detector whose box predictor's two linears read
    one input, that moved scores across the threshold (Faster R-CNN on an H200: 63 boxes where TorchScript gave 62,
    with every op through ATen, and the conversion refused). -> (the frozen module, notes for the report, whether
    the numerics-changing optimisations were left out)."""
    errors = []
    attempts = [("", lambda: torch.jit.freeze(module, methods)),
                ("without numerics-changing optimisations",
                 lambda: torch.jit.freeze(module, methods, optimize_numerics=False)),
                ("without TorchScript's frozen-graph optimisations", lambda: _freeze_only(module, methods))]
    first = 2 if keep_numerics else 0
    for numerics_kept, (how, attempt) in enumerate(attempts[first:], first):
        try:
            with warnings.catch_warnings():  # TorchScript's own deprecation notice is noise to a user converting away
                warnings.simplefilter("ignore", DeprecationWarning)
                frozen = attempt()
        except Exception as err:  # noqa: BLE001 - torch's own passes raise RuntimeErrors with C++ traces
            errors.append(_first_line(err))
            continue
        notes = [f"torch.jit.freeze failed ({errors[0]}); froze the model {how}"] if errors else []
        return frozen, notes, bool(numerics_kept)
    raise ConversionError(f"torch.jit.freeze failed on the model: {errors[-1]}") from None


def _freeze_only(module: torch.jit.ScriptModule, methods: list[str]) -> torch.jit.ScriptModule:
    """What torch.jit.freeze does before its optional graph optimisations: attributes to constants."""
    frozen = torch.jit.RecursiveScriptModule(torch._C._freeze_module(module._c, methods))
    torch.jit.RecursiveScriptModule._finalize_scriptmodule(frozen)
    return frozen


def _first_line(err: Exception) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0][:200] if lines else type(err).__name__


class _StatefulReference:
    """Verification's reference for a model with state: each call starts from the saved state, as each verification
    case does in the package, and returns the outputs with the written attributes' new values (both compared)."""

    def __init__(self, method, module: torch.jit.ScriptModule, state: list[StateSlot]) -> None:
        self.method, self.module, self.state = method, module, state

    def __call__(self, *inputs: Any) -> tuple:
        restore_state(self.module, self.state)
        output = self.method(*inputs)
        return output, read_state(self.module, self.state)

    def sequence(self, calls: list[list]) -> list[tuple]:
        """(outputs, written state) after each of `calls`, made one after another from the saved state: the state
        each call leaves is the next one's, as a deployed model is used."""
        restore_state(self.module, self.state)
        return [(self.method(*inputs), read_state(self.module, self.state)) for inputs in calls]


def _from_function(function: torch.jit.ScriptFunction) -> ScriptGraph:
    graph = function.graph.copy()
    inline_calls(graph)  # (as _method)
    drop_grad_modes(graph)
    refuse_effects(graph)
    objects_as_dicts(graph)
    _normalise(graph)
    refuse_unstored_layouts(graph)
    args = function.schema.arguments
    return ScriptGraph(graph, [a.name for a in args], [_default(a) for a in args], function.name,
                       function=_OwnExecutor(function))


CALLS = ("prim::CallFunction", "prim::CallMethod")
MAX_INLINE_ROUNDS = 64  # nested call depth, past any model's


def inline_calls(graph: torch._C.Graph) -> None:
    """TorchScript's inliner, round after round until no call is left. A round inlines each callee's cached "optimized"
    graph, which is itself inlined only where the callee first ran with TorchScript's optimisations on: a function
    first called under `torch.jit.optimized_execution(False)` (a user's plain run before converting) keeps its own
    calls, one level down per round (torchvision's detectors: 5 calls after one round, 0 after eight). A call no round
    inlines (its callee has no graph) stays, and refuse_unsupported refuses it by name."""
    before = None
    for _ in range(MAX_INLINE_ROUNDS):
        torch._C._jit_pass_inline(graph)
        if not any(graph.findAllNodes(kind, True) for kind in CALLS):
            return
        text = str(graph)  # (a round that changed nothing: the calls left have no graph to inline)
        if text == before:
            return
        before = text


def _normalise(graph: torch._C.Graph) -> None:
    dense_form(graph)  # (a model saved after torch.jit.optimize_for_inference: its MKL-DNN ops as dense ATen ones)
    _inline_fork_wait(graph)
    objects_as_dicts(graph)  # (what a forked function inlined just now makes)
    _fold_isinstance(graph)
    torch._C._jit_pass_constant_propagation(graph)
    torch._C._jit_pass_remove_mutation(graph)
    torch._C._jit_pass_dce(graph)
    refuse_unsupported(graph)


def _inline_fork_wait(graph: torch._C.Graph) -> None:
    """`torch.jit.fork` / `torch.jit.wait` run in order: each forked call is inlined where it was forked and its
    `wait` is its result (TorchScript's own pass), then calls in it inlined; a fork inside a forked call is inlined
    by the next round. A future the pass cannot follow to its wait (kept in a list) keeps its fork, which the plan
    refuses as an op neither runtime runs."""
    forks = len(graph.findAllNodes("prim::fork", True))
    if not forks:
        return
    while forks:
        torch._C._jit_pass_inline_fork_wait(graph)
        torch._C._jit_pass_dce(graph)
        inline_calls(graph)
        forks, before = len(graph.findAllNodes("prim::fork", True)), forks
        if forks >= before:
            return
    if not any(graph.findAllNodes(op, True) for op in _REMOTE_FUTURES):
        _futures_as_values(graph)


_REMOTE_FUTURES = ("prim::rpc_async", "prim::rpc_remote")  # futures no fork made: refused, never inlined


def _futures_as_values(graph: torch._C.Graph) -> None:
    """With every fork inlined, each future left (one kept in a list: `[torch.jit.fork(h, x) for h in heads]`)
    already holds its result, so its `wait` is the value itself, and a Future[T] typed value is a T."""
    for node in graph.findAllNodes("aten::wait", True):
        node.output().replaceAllUsesWith(node.input())
        node.destroy()
    for node in all_nodes(graph.block()):
        for value in node.outputs():
            value.setType(_without_futures(value.type()))


def _without_futures(t):
    if isinstance(t, torch._C.FutureType):
        return _without_futures(t.getElementType())
    if isinstance(t, torch._C.ListType):
        return torch._C.ListType(_without_futures(t.getElementType()))
    return t




def _fold_isinstance(graph: torch._C.Graph) -> None:
    """`isinstance` whose answer the inlined graph's types already give (torchvision's roi_align checks whether its
    Union[Tensor, List[Tensor]] argument is a list, and after inlining it is a Tensor) becomes a constant, so that
    constant propagation drops the branch not taken. On an Optional[T] (an input that may be None, a graph-network
    aggregation's optional edge features) the answer is a None test, which both runtimes run on each call: the
    example's value cannot decide it, as the next call may pass the other. Only a value of a type still open
    (Any, a Union, an Optional of one) keeps `prim::isinstance`, which conversion then refuses."""
    open_types = (torch._C.AnyType, torch._C.OptionalType, torch._C.UnionType)
    for node in graph.findAllNodes("prim::isinstance", True):
        given, candidates = node.input().type(), node.tys("types")
        if any(given.isSubtypeOf(candidate) for candidate in candidates):
            answer = True
        elif isinstance(given, torch._C.OptionalType) and not isinstance(given.getElementType(), open_types):
            _as_none_test(graph, node, any(given.getElementType().isSubtypeOf(c) for c in candidates),
                          any(torch._C.NoneType.get().isSubtypeOf(c) for c in candidates))
            continue
        elif isinstance(given, open_types):
            continue
        else:
            answer = False
        with graph.insert_point_guard(node):
            constant = graph.insertConstant(answer)
        node.output().replaceAllUsesWith(constant)
        node.destroy()


def _as_none_test(graph: torch._C.Graph, node: torch._C.Node, value_matches: bool, none_matches: bool) -> None:
    """`isinstance(x, types)` of an Optional[T] x (T a closed type, whose values all match `types` or none do): a
    constant where None and T's values agree, else `x is not None` (T matches) or `x is None` (None matches)."""
    with graph.insert_point_guard(node):
        if value_matches == none_matches:
            answer = graph.insertConstant(value_matches)
        else:
            test = graph.create("aten::__isnot__" if value_matches else "aten::__is__",
                                [node.input(), graph.insertConstant(None)])
            test.output().setType(torch._C.BoolType.get())
            answer = graph.insertNode(test).output()
    answer.node().copyMetadata(node)
    node.output().replaceAllUsesWith(answer)
    node.destroy()


def _default(argument) -> Any:
    return argument.default_value if argument.has_default_value() else NO_DEFAULT


def _module_name(module: torch.jit.ScriptModule) -> str:
    qualified = getattr(module, "original_name", None) or type(module).__name__
    return str(qualified)
