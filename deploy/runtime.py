"""The Python runtime: a loaded package, ready to call, in the reference interpreter (deploy/executor.py).

`jit2triton.load` runs the C++ runtime (deploy/cpp), the runtime of record; this one runs where that cannot: a
machine that can neither build it nor use the package's build, a package conversion found the C++ runtime to run
wrongly, and conversion itself. It checks
a package as the C++ runtime does (the same schema and messages) and runs its plan step by step, without CUDA graphs.
Everything that can be decided once is decided at load: compatibility with this machine, weights moved to the
device, the plan compiled into closures, the input check built.
"""
from __future__ import annotations

import importlib
from typing import Any, Optional, Union

import torch

from jit2triton.emitters.backends import BACKENDS
from jit2triton.errors import CorruptPackageError, Jit2TritonError, PackageDeviceError, PackageVersionError

from .executor import Executor
from .format import Manifest, read_manifest
from .literals import map_plan_literals
from .methods import method_contents, method_names
from .package import PackageContents
from .policy import RECONVERT, message
from .plan_check import check_dims, check_finite_nesting, check_inputs, check_plan
from .signature import NO_DEFAULT, InputChecker, output_rebuilder
from .state import StateStore, model_state

DeviceLike = Union[str, torch.device, dict, None]  # a dict maps the device saved to the one wanted, as torch.jit


class Runtime:
    name = "python"

    def __init__(self, contents: PackageContents, map_location: DeviceLike = None,
                 num_threads: Optional[int] = None, state: Optional[StateStore] = None) -> None:
        """`state`: the module state this plan shares with the loaded module's other methods (a new one if None)."""
        try:
            self._load(contents, map_location, num_threads, state)
        except (Jit2TritonError, torch.OutOfMemoryError):
            raise
        except (KeyError, TypeError, AttributeError, ValueError, IndexError, RuntimeError) as err:
            # a manifest field missing or of the wrong type, a device name torch does not know: the checks that
            # name their own problem raise our errors; only a damaged or hand-edited package gets here (found by
            # the mutation fuzz, tests/mutate_packages.py)
            raise CorruptPackageError(f"the package's manifest is damaged "
                                      f"({type(err).__name__}: {err}); {RECONVERT}") from None

    def _load(self, contents: PackageContents, map_location: DeviceLike, num_threads: Optional[int],
              state: Optional[StateStore]) -> None:
        manifest = read_manifest(contents.manifest)
        check_compatible(manifest)
        check_plan(manifest.plan, len(manifest.nodes), manifest.kernels, contents.weights)
        check_inputs(manifest.plan, manifest.signature, manifest.state)
        check_dims(manifest.plan, manifest.signature)
        self.device = target_device(manifest, map_location)
        self.contents = contents
        plan = retarget_devices(manifest.plan, torch.device(manifest.device).type, self.device)
        weights = placed_weights(contents.weights, manifest.plan, self.device)
        kernels = load_kernels(contents, num_threads, self.device)
        self.executor = Executor(plan, weights, manifest.nodes, kernels=kernels, device=self.device)
        signature = manifest.signature["inputs"]
        defaults = [d["default"] if "default" in d else NO_DEFAULT for d in signature]
        self.check_inputs = InputChecker(signature, self.device, defaults, contiguous=bool(kernels),
                                         dims=manifest.signature.get("dims"))
        self.run = self.executor
        self.uses_cuda_graph = False  # (the C++ runtime's business)
        self.state = model_state(manifest.state, weights, self.device, state)  # attributes the model writes
        self.nested_outputs = manifest.signature["outputs"].get("type") != "Tensor"
        self.rebuild_outputs = output_rebuilder(manifest.signature["outputs"])  # the NamedTuples, if it returns any

    def __call__(self, *inputs: Any) -> Any:
        inputs = self.check_inputs(inputs)
        outputs = self.run(inputs) if self.state is None else self.state.run(self.run, inputs)
        if self.nested_outputs:
            check_finite_nesting(outputs)
        output = outputs[0] if len(outputs) == 1 else tuple(outputs)
        return output if self.rebuild_outputs is None else self.rebuild_outputs(output)


def python_runtimes(contents: PackageContents, device: DeviceLike = None,
                    num_threads: Optional[int] = None) -> tuple[Runtime, dict]:
    """The Python runtime of forward and of each other method, sharing one module state."""
    state = StateStore()
    return (Runtime(contents, device, num_threads, state=state),
            {name: Runtime(method_contents(contents, name), device, num_threads, state=state)
             for name in method_names(contents.manifest)})


def placed_weights(weights: dict[str, torch.Tensor], plan: dict, device: torch.device) -> dict[str, torch.Tensor]:
    """The weights where the plan runs: on `device`, but those the plan keeps on the CPU (its "host_weights")."""
    host = set(plan.get("host_weights", ()))
    return {name: w.to("cpu" if name in host else device) for name, w in weights.items()}


def load_kernels(contents: PackageContents, num_threads: Optional[int], device: DeviceLike = None) -> dict:
    """A launcher per kernel, from the loader its backend names. `device` is where they run; without it, the
    device type the package was built for."""
    backend = BACKENDS.get(contents.manifest["backend"])
    if backend is None:
        raise PackageVersionError(f"the package uses kernel backend {contents.manifest['backend']!r}, which this "
                                  "jit2triton does not know; upgrade jit2triton")
    if backend.python_loader is None or not contents.manifest["kernels"]:
        return {}
    target = torch.device(device) if device is not None else torch.device(contents.manifest["device"])
    return importlib.import_module(backend.python_loader).load_kernels(contents, num_threads, target)


def check_compatible(manifest: Manifest) -> None:
    made_with = manifest.producer.get("torch") or ""
    if _release(made_with) != _release(torch.__version__):
        raise PackageVersionError(message("other_torch", made_with=made_with or "unknown", here=torch.__version__))


def _release(version: str) -> str:
    """"2.13" of "2.13.0+cpu": what must match between the torch that made a package and the one running it."""
    return ".".join(version.split("+")[0].split(".")[:2])


def resolve_map_location(map_location: DeviceLike, built_for: str) -> Union[str, torch.device, None]:
    """torch.jit.load's map_location forms: a device (or its name), or a dict from the device the package was built
    for to the one to load it on; a dict without that device leaves it where it was built. A package records only
    its device type (its kernels run on any GPU of the same architecture), so a "cuda:0" key applies to a CUDA
    package as "cuda" does (an exact "cuda" key first)."""
    if not isinstance(map_location, dict):
        return map_location
    built = torch.device(built_for)
    keys = {}
    for saved, wanted in map_location.items():
        try:
            keys[saved] = torch.device(saved)
        except (RuntimeError, TypeError):
            raise PackageDeviceError(f"map_location has a key {saved!r} that is not a device (use names like "
                                     "'cpu', 'cuda' or 'cuda:0')") from None
    for saved, wanted in map_location.items():
        if keys[saved] == built:
            return wanted
    for saved, wanted in map_location.items():
        if keys[saved].type == built.type:
            return wanted
    return None


def target_device(manifest: Manifest, map_location: DeviceLike) -> torch.device:
    built_for = torch.device(manifest.device)
    map_location = resolve_map_location(map_location, manifest.device)
    device = torch.device(map_location) if map_location is not None else built_for
    if device.type != built_for.type and manifest.kernels and built_for.type == "cpu":
        raise PackageDeviceError(message("cpu_kernels", device=device.type, device_repr=repr(device.type)))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise PackageDeviceError(message("no_cuda_for_kernels" if manifest.kernels else "no_cuda", built_for=built_for))
    if device.type != built_for.type and manifest.kernels:
        raise PackageDeviceError(message("kernels_elsewhere", built_for=built_for.type, device=device.type,
                                         device_repr=repr(device.type)))
    return device


def retarget_devices(plan: dict, built_for: str, device: torch.device) -> dict:
    """Device literals that named the build device now name the run device (as torch.jit.load's map_location)."""
    if built_for == device.type and device.index is None:
        return plan

    def move(value):
        if isinstance(value, torch.device) and value.type == built_for:
            return device
        if isinstance(value, (list, tuple)):
            return type(value)(move(v) for v in value)
        return value

    return map_plan_literals(plan, move)
