"""What code written for a `torch.jit.load`ed module calls on it besides forward, on a loaded package: `.to` in every
form torch.jit's module takes, `.half()`/`.float()`, `.training`, the weights as `parameters()`/`state_dict()`, and the
attributes the model writes (`m.calls`).

A package is fixed at conversion: its device kind, its precision and its weights. So a call that would change one of
them answers with the package itself where it already is what was asked, and otherwise with a clear error that says
how to convert for it; the weights come back as copies (changing them cannot change the package, as it could not
change a frozen TorchScript module's constants).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Iterator, Optional

import torch

from .errors import InputError

_PRECISION_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


class TorchModuleFace:
    """Mixed into `Converted`, which provides `_contents`, `_runtime`, `device` and `_to_device`."""

    training = False  # a package runs inference only: as a torch.jit module after .eval()

    def to(self, *args: Any, **kwargs: Any):
        """As torch.jit's module takes it: `to(device)`, `to(dtype)`, `to(device, dtype)`, `to(tensor)`, each with
        `non_blocking=` (a package moves no tensor, so it changes nothing). A dtype must be the package's precision
        (converting to another is a conversion: `precision="fp16"`), a device one the package can run on."""
        device, dtype, _non_blocking, memory_format = torch._C._nn._parse_to(*args, **kwargs)  # TypeError as torch's
        if memory_format is not None:
            raise InputError(f"to(memory_format={memory_format}): a package's layouts are fixed at conversion (a conv "
                             "net runs channels-last where timing chose it); convert the model again instead")
        if dtype is not None:
            self._check_precision(dtype)
        return self if device is None else self._to_device(device)

    def half(self):
        return self.to(torch.float16)

    def float(self):
        return self.to(torch.float32)

    def double(self):
        return self.to(torch.float64)

    def bfloat16(self):
        return self.to(torch.bfloat16)

    def precision(self) -> Optional[torch.dtype]:
        """The floating type the package computes in: the one it was converted to (`precision=`), else its floating
        weights' (None for a package with no floating weight, which any floating `.to(dtype)` leaves as it is)."""
        section = self._contents.manifest.get("report", {}).get("precision")
        if section:
            return getattr(torch, section["dtype"])
        held = {w.dtype for w in self._contents.weights.values() if w.is_floating_point()}
        return max(held, key=lambda d: torch.finfo(d).bits) if held else None

    def _check_precision(self, dtype: torch.dtype) -> None:
        if not (dtype.is_floating_point or dtype.is_complex):  # torch.nn.Module.to's own refusal
            raise TypeError(f"nn.Module.to only accepts floating point or complex dtypes, but got desired dtype={dtype}")
        held = self.precision()
        if held is None or dtype == held:
            return
        how = (f"convert the model with precision={_PRECISION_NAMES[dtype]!r} (CLI: --precision "
               f"{_PRECISION_NAMES[dtype]})" if dtype in _PRECISION_NAMES and held == torch.float32 else
               f"convert the {dtype} model itself" if dtype not in _PRECISION_NAMES else
               "convert the float32 model with that precision")
        raise InputError(f"the package computes in {held} and cannot change precision once converted: {how}")

    # ---- the weights, as copies ------------------------------------------------------------------------------------

    def named_parameters(self, prefix: str = "", recurse: bool = True,
                         remove_duplicate: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
        """The package's floating-point weights, named as the package stores them (TorchScript's frozen names:
        `self_lin_weight` for `self.lin.weight`), as copies."""
        for name, weight in self._stored_weights().items():
            if weight.is_floating_point() or weight.is_complex():
                yield prefix + name, weight.detach().clone()

    def parameters(self, recurse: bool = True) -> Iterator[torch.Tensor]:
        for _, weight in self.named_parameters():
            yield weight

    def named_buffers(self, prefix: str = "", recurse: bool = True,
                      remove_duplicate: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
        """The package's other stored tensors (integer and bool tables), as copies."""
        for name, weight in self._stored_weights().items():
            if not (weight.is_floating_point() or weight.is_complex()):
                yield prefix + name, weight.detach().clone()

    def buffers(self, recurse: bool = True) -> Iterator[torch.Tensor]:
        for _, weight in self.named_buffers():
            yield weight

    def state_dict(self, *args: Any, prefix: str = "", keep_vars: bool = False) -> "OrderedDict[str, torch.Tensor]":
        """Every stored tensor by name, as copies; a package loads no state dict (its weights are its conversion's)."""
        return OrderedDict([*self.named_parameters(prefix), *self.named_buffers(prefix)])

    def load_state_dict(self, *args: Any, **kwargs: Any):
        raise InputError("a package's weights are fixed at conversion: load the state dict into the model, save it "
                         "with torch.jit.save and convert it again")

    def _stored_weights(self) -> dict[str, torch.Tensor]:
        state = set()  # the state's initial tensors are the attributes', not weights
        for entry in self._contents.manifest.get("state") or ():
            if isinstance(entry, dict):
                state |= {entry.get("weight"), *(entry.get("weights") or ())}
        return {name: w for name, w in self._contents.weights.items() if name not in state}

    # ---- module state: the attributes the model writes ----------------------------------------------------------

    def _state_attribute(self, name: str) -> Any:
        """The current value of an attribute the model writes (`self.calls`), as torch.jit's module shows it; an
        AttributeError where the package has no such state."""
        names = {e.get("name") for e in self._contents.manifest.get("state") or () if isinstance(e, dict)}
        if name not in names:
            if any(isinstance(n, str) and n.startswith(name + ".") for n in names):
                return _Submodule(self, name)  # `m.decoder.steps`: state of a submodule, named "decoder.steps"
            raise AttributeError(name)
        return self._runtime.attribute(name)  # (the C++ runtime holds it, and hands out a copy)


class _Submodule:
    """A submodule of the converted model as far as its written attributes go: `m.decoder.steps` reads the state
    the package holds as "decoder.steps" (deeper submodules nest the same way)."""

    def __init__(self, owner: TorchModuleFace, path: str) -> None:
        self._owner, self._path = owner, path

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            return self._owner._state_attribute(f"{self._path}.{name}")
        except AttributeError as err:
            if str(err) != f"{self._path}.{name}":
                raise
        raise AttributeError(f"the converted model's submodule {self._path!r} has no attribute {name!r} that the "
                             "model writes (a package keeps only those; its other attributes were folded in)")

    def __dir__(self) -> list[str]:
        prefix = self._path + "."
        return sorted({e["name"][len(prefix):].split(".")[0] for e in self._owner._contents.manifest.get("state") or ()
                       if isinstance(e, dict) and str(e.get("name", "")).startswith(prefix)})

    def __repr__(self) -> str:
        return f"<submodule {self._path!r} of a converted model: written attributes {', '.join(dir(self))}>"
