"""The public API: `convert` a TorchScript model, `load` a package, call it like the model.

Loading needs only `deploy/`; the converter's stages (loaders, transpiler, emitters) are imported by `convert`, so a
process that only serves packages never pays for them.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import tempfile
import warnings
from typing import Any, Callable, Optional, Sequence, Union

import torch

from jit2triton.deploy.literals import decode
from jit2triton.deploy.package import PackageContents, save_package
from jit2triton.deploy.runtime_choice import DeviceLike, load_runtime
from jit2triton.deploy.signature import format_input, format_type

from .errors import InputError, PackageDeviceError
from .module_face import TorchModuleFace

DEFAULT_TIMEOUT_S = 600.0  # convert's time budget: DenseNet-121 takes 25 s on an H200 alone

Progress = Any  # Callable[[str], None]


class Converted(TorchModuleFace):
    """A converted model: call it like the TorchScript model; `save` it; read its report and generated code. What
    else code written for a torch.jit module calls on it (`.to`, `.half()`, `.training`, `state_dict()`, the
    attributes the model writes) is in module_face.py."""

    def __init__(self, contents: Union[PackageContents, Callable[[], PackageContents]], runtime: Any,
                 methods: Optional[dict[str, Callable]] = None) -> None:
        self._package = contents  # the contents, or what reads them when first asked (CppRuntime.contents)
        self._runtime = runtime
        self._call = getattr(runtime, "fastest_call", runtime)  # the C++ runtime's module, where it can be
        self._methods = methods or {}  # the other methods converted (`encode`), each callable like forward

    def __call__(self, *inputs: Any, **named: Any) -> Any:
        if named:  # by input name, as TorchScript's forward takes them
            inputs = self._bind(inputs, named, self._contents.manifest["signature"]["inputs"])
        return self._call(*inputs)

    def forward(self, *inputs: Any, **named: Any) -> Any:
        return self(*inputs, **named)

    def __getattr__(self, name: str) -> Any:
        """The model's other methods, as TorchScript's module has them: `m.encode(x)`."""
        methods = self.__dict__.get("_methods", {})
        if name in methods:
            return functools.partial(self._call_method, name)
        if name.startswith("_") or "_package" not in self.__dict__:
            raise AttributeError(name)
        try:
            return self._state_attribute(name)  # an attribute the model writes: `m.calls`
        except AttributeError as err:
            if str(err) != name:
                raise
        skipped = self._contents.manifest.get("report", {}).get("methods_not_converted", {})
        if name in skipped:
            raise AttributeError(f"method {name!r} of the model was not converted: {skipped[name]}")
        raise AttributeError(f"the converted model has no method {name!r}; its methods are "
                             f"{', '.join(['forward', *methods])}")

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self._methods))

    def _call_method(self, name: str, *inputs: Any, **named: Any) -> Any:
        if named:
            inputs = self._bind(inputs, named, self._contents.manifest["methods"][name]["signature"]["inputs"])
        return self._methods[name](*inputs)

    def eval(self) -> "Converted":
        """A package is always in inference mode: as torch.jit's, for code that calls it after loading."""
        return self

    def train(self, mode: bool = True) -> "Converted":
        if mode:
            raise InputError("a converted model runs inference only; it cannot be put in training mode")
        return self

    def _to_device(self, device: Union[str, torch.device]) -> "Converted":
        """This module where it already runs; elsewhere, a package whose ops all run through ATen loads again
        there (as map_location would), and one with compiled kernels cannot move (convert it for that device)."""
        device = torch.device(device)
        if device.type == self.device.type and (device.index is None or device == self.device):
            return self
        if self._contents.manifest.get("kernels") or any(m.get("kernels") for m in
                                                         self._contents.manifest.get("methods", {}).values()):
            raise PackageDeviceError(
                f"the package's kernels are compiled for {self.device.type} and cannot run on {device.type}: convert "
                f"the model again with device={device.type!r}")
        return _as_loaded(self._contents, device)

    def cuda(self, device: Union[int, str, torch.device, None] = None, non_blocking: bool = False) -> "Converted":
        return self.to(torch.device("cuda", device) if isinstance(device, int) else torch.device(device or "cuda"))

    def cpu(self) -> "Converted":
        return self.to("cpu")

    def _bind(self, inputs: tuple, named: dict[str, Any], signature: list[dict]) -> tuple:
        names = [d["name"] for d in signature]
        unknown = [n for n in named if n not in names]
        if unknown:
            raise InputError(f"unknown input {unknown[0]!r}; the model takes ({', '.join(names)})")
        twice = [n for n in named if names.index(n) < len(inputs)]
        if twice:
            raise InputError(f"input {twice[0]!r} was given by position and by name; give it once")
        last = max(names.index(n) for n in named)
        bound = list(inputs)
        for position in range(len(inputs), last + 1):
            name, entry = names[position], signature[position]
            if name in named:
                bound.append(named[name])
            elif "default" in entry:
                bound.append(decode(entry["default"]))
            else:
                raise InputError(f"input {name!r} has no default; pass it (by position or as {name}=...)")
        return tuple(bound)

    @property
    def _contents(self) -> PackageContents:
        if not isinstance(self._package, PackageContents):
            self._package = self._package()  # for reports and saving: the C++ runtime has its own
        return self._package

    def save(self, path: Union[str, os.PathLike], _extra_files: Optional[dict[str, Union[str, bytes]]] = None,
             signing_key: Union[str, os.PathLike, None] = None) -> None:
        """Write the package; `_extra_files` (name -> text or bytes) are stored beside it, as torch.jit.save's, and
        replace files of the same name carried from the model's .pt. `signing_key`, the path of an Ed25519 private
        key (`jit2triton keygen`), signs it, so that a `load` with `trusted_keys` accepts it."""
        contents = self._contents
        if _extra_files:
            extra = {f"extra/{name}": data.encode() if isinstance(data, str) else bytes(data)
                     for name, data in _extra_files.items()}
            contents = dataclasses.replace(contents, files={**contents.files, **extra})
        save_package(contents, os.fspath(path), signing_key)

    def extra_files(self) -> dict[str, bytes]:
        """Every extra file the package holds (from the model's .pt, or given to save)."""
        return {name[len("extra/"):]: data for name, data in self._contents.files.items() if name.startswith("extra/")}

    def summary(self) -> dict[str, Any]:
        return dict(self._contents.manifest.get("report") or {})  # (a package's report is optional)

    def report(self) -> str:
        manifest = self._contents.manifest
        model = (manifest.get("model") or {}).get("name", "?")  # (optional, as the report is)
        head = f"model {model} -> {manifest['backend']} on {manifest['device']}"
        from jit2triton.transpiler.report import format_report
        try:
            return head + "\n" + format_report(manifest.get("report") or {}, manifest["nodes"])
        except (KeyError, TypeError, AttributeError, ValueError):  # (the report is optional: nothing runs by it)
            return head + "\n" + "the package holds no conversion report, or a damaged one"

    @property
    def code(self) -> str:
        sources = {n: data for n, data in self._contents.files.items() if n.startswith("kernels/")}
        if not sources:
            return "# no generated kernels: every op of this package runs through ATen (see report())\n"
        return "\n\n".join(f"# ---- {name}\n{data.decode()}" for name, data in sorted(sources.items()))

    @property
    def manifest(self) -> dict[str, Any]:
        return self._contents.manifest

    @property
    def device(self) -> torch.device:
        return self._runtime.device

    @property
    def runtime(self) -> str:
        """What runs the plan: "cpp", the C++ runtime (the only one)."""
        return self._runtime.name

    def signature(self, method: str = "forward") -> str:
        manifest = self._contents.manifest
        sig = manifest["signature"] if method == "forward" else manifest["methods"][method]["signature"]
        args = ", ".join(f"{d['name']}: {format_input(d)}" + (f" = {decode(d['default'])!r}" if "default" in d else "")
                         for d in sig["inputs"])
        return f"({args}) -> {format_type(sig['outputs'])}"


def convert(model, example_inputs: Union[Sequence[Any], torch.Tensor, None] = None, device: DeviceLike = "cpu",
            backend: Optional[str] = None, map_location: DeviceLike = None,
            progress: Optional[Progress] = None, verify: bool = True, full_source_paths: bool = False,
            dynamic_shapes: Any = None, choices: str = "timed", narrow_dims: bool = False,
            precision: Optional[str] = None, accuracy: Optional[dict] = None,
            io_precision: Optional[str] = None, timeout: Optional[float] = DEFAULT_TIMEOUT_S,
            input_ranges: Optional[dict] = None, verify_inputs: Any = None) -> Converted:
    """Convert a TorchScript model (a `.pt` path, ScriptModule or ScriptFunction) for `device`. The module returned
    runs in the runtime `jit2triton.load` gives the package (the C++ one where it can), as the saved package will.

    `example_inputs` fix the input signature (dtypes, shapes) and drive shape inference; inputs that the model
    gives defaults for may be left out. `backend` picks the kernel generator: "cpp" (C++/OpenMP, the default on
    the CPU), "triton" (the default on CUDA; on the CPU it runs under the Triton interpreter), or "aten" (no
    generated kernels: every op through ATen).

    `verify` (default on) runs the package on the example inputs and a fresh random draw against the TorchScript
    model; a generated kernel that disagrees with ATen is taken out and named in the report, and a package that
    still disagrees is refused with a ConversionError. Kernel comments name source files as the model imports them
    (relative to its import root or the working folder); `full_source_paths=True` keeps this machine's full paths.

    `dynamic_shapes` makes input dims dynamic, as torch.export's does: `{"input_ids": {0: batch, 1: seq}}` with
    `batch = jit2triton.Dim("batch", min=1, max=64)`, by input name or position. The package then serves every size
    in those ranges and refuses others with an InputError naming the dim. `dynamic_shapes="auto"` makes the inputs'
    batch axis dynamic (one dim, `batch`, 1 and up) where the model allows it, else converts static and says why in
    the report. Each range is run through the model at its ends first: one it does not serve end to end (a seq
    longer than its position table) is refused with a ConversionError naming the dim and the largest size that
    ran, or with `narrow_dims=True` narrowed to what ran (the report says so).

    Some choices are made by timing candidates on this machine (oneDNN or ATen for a GEMM, channels-last, a GEMM's
    form on CUDA, one CUDA graph or step by step); the report lists each with its times and margin.
    `choices="fixed"` times nothing and takes fixed answers instead, the same on every machine: a reproducible build.

    `precision="fp16"` or `"bf16"` converts a float32 model to compute in that type (weights stored in it; inputs
    and outputs keep the model's dtypes, cast at the boundary), but where the op table keeps float32 (softmax, norms'
    statistics, large sums, exp/log/pow). Verification then compares the package with the float32 model and holds
    it to `accuracy={"rtol": ..., "atol": ...}` (an output's largest error at most atol + rtol times its largest
    magnitude; defaults per type in jit2triton/precision.py): nodes whose reduced precision makes it miss move back
    to float32. The report's `precision` section gives each output's max-abs and relative error, top-1 agreement
    for 2-D logits, and every node that stayed float32 with why, by source line. `io_precision=precision` makes the
    package take and give the model's float32 inputs and outputs in the reduced type too (no cast at the boundary).

    `timeout` (seconds; None for none) ends a conversion that runs past it with a ConversionError naming the stage
    that took the time. Conversion runs the model on inputs it invents (verification's fresh draw, the dims' other
    sizes), each first in a child process, so that a draw that crashes TorchScript itself is skipped and named in the
    report rather than taking this process with it. Integer inputs are drawn where the graph says they are valid
    (indices within their table, offsets sorted, lengths within the axis they measure; the report's
    `verification["draws"]` says how each input was drawn); `input_ranges={"lengths": (1, "T")}` says it where the
    graph cannot (inclusive ends, each a number or a Dim's name), and `verify_inputs` (a list of input tuples, or a
    callable giving one) adds input sets of your own to verification.
    """
    from jit2triton.transpiler import pipeline, timing

    from .conversion import convert_to_package
    budget = pipeline.Budget.starting_now(timeout)
    with timing.recording(choices) as made:
        contents, target = convert_to_package(model, example_inputs, device, backend, map_location, progress, verify,
                                              full_source_paths, dynamic_shapes, narrow_dims=narrow_dims,
                                              precision=precision, accuracy=accuracy, io_precision=io_precision,
                                              budget=budget, input_ranges=input_ranges, verify_inputs=verify_inputs)
    contents.manifest["report"]["timed_choices"] = [choice.as_report() for choice in made]
    _training_mode_hint(model, contents.manifest["nodes"])
    return _as_loaded(contents, target)


def _as_loaded(contents: PackageContents, target: torch.device) -> Converted:
    """The converted model in the runtime `jit2triton.load` gives its package, so what is called right after
    converting is what ships, CUDA graphs and arena included. The package is saved to a temporary file for it: the
    runtime loads from files, and copies the weights as it does."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "converted.j2t")
        save_package(contents, path)
        loaded = load_runtime(path, map_location=target, built_here=True)
    return Converted(contents, loaded.runtime, loaded.methods)


def _training_mode_hint(model: Any, nodes: list[dict]) -> None:
    """A warning where the model was traced or saved in training mode: torch.jit.trace records dropout and batch norm
    as they ran, so the package does what the model did in training (random dropout, batch statistics), which is
    seldom what an inference package is for."""
    in_training = [n for n in nodes if "training mode" in str(n.get("why", ""))]
    if not in_training and not getattr(model, "training", False):
        return
    where = (f": {in_training[0]['op']} at {in_training[0].get('source') or 'an unknown line'} runs as in training"
             if in_training else " (its `training` is True)")
    warnings.warn(f"the model was traced or saved in training mode{where}; for inference, call model.eval() before "
                  "torch.jit.trace (or torch.jit.script) and convert again", TrainingModeWarning, stacklevel=3)


class TrainingModeWarning(UserWarning):
    """The model converted was in training mode: dropout and batch norm as in training."""


def load(path: Union[str, os.PathLike], map_location: DeviceLike = None, num_threads: Optional[int] = None,
         cuda_graphs: bool = True, alias_outputs: bool = False, runtime: Optional[str] = None,
         mmap: bool = False, _extra_files: Optional[dict[str, Any]] = None,
         trusted_keys: Optional[Sequence[Union[str, os.PathLike]]] = None) -> Converted:
    """Load a `.j2t` package; `map_location` moves it to another device, as torch.jit.load's does.

    `num_threads` caps the C++ kernels' OpenMP threads (default: torch.get_num_threads()). On CUDA a plan of
    straight-line GPU work runs as one CUDA graph unless `cuda_graphs=False`; its outputs are copies unless
    `alias_outputs=True` (then the next call overwrites them).

    The package runs in the C++ runtime, the one conversion verified it in and C++ programs link (no per-step
    Python work): built on first use, once per machine and torch version, and cached; where no compiler is at hand,
    the build the package carries, if it was made with this jit2triton, torch and Python; else a
    RuntimeUnavailableError says what to install. `runtime` ("auto" or "cpp") is kept for older code. Weights are copied
    at load, so later changes to the file cannot reach the module; `mmap=True` maps them instead (no copy; the
    file must not change while the module lives). `_extra_files` is filled as torch.jit.load fills it: each name
    the package holds (from the model's .pt, or given to save) gets its bytes, the others b"".

    `trusted_keys` (paths of Ed25519 public keys, `jit2triton keygen`; also read from JIT2TRITON_TRUSTED_KEYS)
    makes load refuse, with a SignatureError, a package that none of them signed, before reading anything from
    it. A package holds native code: load only packages you trust as you would a shared library."""
    loaded = load_runtime(path, runtime, map_location, num_threads, cuda_graphs, alias_outputs, mmap, trusted_keys)
    return _fill_extra_files(Converted(loaded.contents, loaded.runtime, loaded.methods), _extra_files)


def _fill_extra_files(module: Converted, wanted: Optional[dict[str, Any]]) -> Converted:
    if wanted:
        held = module.extra_files()
        for name in wanted:
            wanted[name] = held.get(name, b"")
    return module


