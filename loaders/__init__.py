"""TorchScript in: read a `.pt` archive or a ScriptModule/ScriptFunction, freeze, inline and normalise its graph."""
from .torchscript import ScriptGraph, load_script

__all__ = ["ScriptGraph", "load_script"]
