"""A package's contents from a conversion's plan: the manifest (its fields as deploy/format.py describes them; those
the schema writes itself are added when it is saved), the weights the plan and the module state hold, and the
kernels' files. Conversion calls it once per build; nothing that loads a package imports it.

The manifest's fields are written here and nowhere else (tests/test_structure.py holds it): what conversion decides
after a build (the runtime verification found right, the CUDA graph timing's choice, the methods) is set through
the functions at the end of this file. The report, which no runtime reads, is the exception: each stage writes its
own section."""
from __future__ import annotations

import platform
from dataclasses import dataclass, field
from typing import Any

import torch

from jit2triton.emitters.build import kernel_index
from jit2triton.errors import ConversionError
from jit2triton.transpiler.ir import Attr
from jit2triton.transpiler.report import packed_summary, summarize
from jit2triton.version import __version__

from .graph_regions import capturable, group_regions, without_regions, worth_capturing
from ..literals import encode
from ..policy import METHOD_PREFIX, METHOD_SHARED_FIELDS
from ..package import PackageContents
from ..signature import with_named_tuples


@dataclass
class BuiltKernels:
    """What generating the kernels gave: the backend that made them ("aten" when none could be), the kernel IR of
    each, the package members (sources, binaries), the manifest's section for the backend, and why generation
    failed outright, if it did."""
    backend: str
    kernels: list = field(default_factory=list)
    files: dict[str, bytes] = field(default_factory=dict)
    section: dict[str, Any] = field(default_factory=dict)
    failure: str = ""


def build_package(sched, plan_graph, built: BuiltKernels, signature: dict, model_info: dict,
                  target: torch.device) -> PackageContents:
    """`sched`: the plan (transpiler/build_plan.py) of `plan_graph`, the IR after lowering."""
    state_entries, state_weights = state_section(model_info["state"])
    manifest = {
        "producer": {"jit2triton": __version__, "torch": torch.__version__, "triton": _triton_version(),
                     "python": platform.python_version()},
        "device": target.type,
        "backend": built.backend,
        "model": {k: v for k, v in model_info.items() if k != "state"},
        "signature": dict(signature, outputs=with_named_tuples(signature["outputs"], plan_graph.returns)),
        "plan": sched.plan,
        "nodes": sched.node_table,
        "kernels": kernel_index(built.kernels, built.backend),
        "report": dict(summarize(sched.node_table), **packed_summary(sched.plan),
                       folded_nodes=sum(1 for n in plan_graph.walk() if Attr.FOLDED_FROM in n.attrs),
                       **({"generation_failed": built.failure} if built.failure else {})),
        "ir": str(plan_graph),
        **built.section,
        **({"state": state_entries} if state_entries else {}),
    }
    # Decided here, once, for every runtime that loads the package: whether its plan may run as one CUDA graph.
    # (on CUDA, nodes that make CPU tensors: a graph would run their work once, when captured)
    on_host = frozenset(i for i, node in enumerate(sched.nodes) if target.type == "cuda"
                        and any(v.type.is_tensor and v.type.device == "cpu" for v in node.outputs))
    # (a write to an internal tensor is as good inside the whole-plan graph as outside it; one that reaches an
    # input would write the graph's copy of it, so then the plan is not captured whole)
    manifest["cuda_graph"] = (not sched.writes_inputs and capturable(sched.plan, on_host, sched.counts)
                              and worth_capturing(sched.plan, manifest["signature"]))
    if not manifest["cuda_graph"] and target.type == "cuda":  # then its straight-line runs may, one by one
        manifest["plan"] = group_regions(sched.plan, sched.node_table, on_host, sched.counts)
    weights = {name: w.to("cpu") for name, w in {**sched.weights, **state_weights}.items()}
    return PackageContents(manifest, weights, built.files)


def state_section(slots: list) -> tuple[list[dict], dict[str, torch.Tensor]]:
    """The manifest's `state` (the module attributes the plan takes and returns) and the
    tensors among them, stored as weights."""
    entries, tensors = [], {}
    for slot in slots:
        entry = {"name": slot.name, "written": slot.written, **({} if slot.compared else {"compared": False})}
        if isinstance(slot.initial, torch.Tensor):
            entry["weight"] = tensors_name = f"state/{slot.name}"
            tensors[tensors_name] = slot.initial
        elif isinstance(slot.initial, list) and (slot.initial or slot.type == "List[Tensor]") \
                and all(isinstance(t, torch.Tensor) for t in slot.initial):
            entry["weights"] = [f"state/{slot.name}/{i}" for i in range(len(slot.initial))]  # anchors cached per size
            tensors.update(zip(entry["weights"], slot.initial))
        else:
            if isinstance(slot.initial, (list, dict)) and slot.type:  # (an empty one says nothing of its items,
                entry["type"] = type_tag(slot.type)                     # which the C++ runtime's ops need)
            try:
                entry["value"] = encode(slot.initial)
            except TypeError:
                raise ConversionError(f"module attribute {slot.name!r}, which forward() reads or writes, holds a "
                                      f"{type(slot.initial).__name__}, which a package cannot store") from None
        entries.append(entry)
    return entries, tensors


def type_tag(text: str) -> list:
    """A TorchScript type as written (`Dict[str, List[Tensor]]`) as the nested lists a plan's container steps record
    (transpiler/build_plan.py): ["Dict", ["str"], ["List", ["Tensor"]]]."""
    def parse(at: int) -> tuple[list, int]:
        end = at
        while end < len(text) and text[end] not in "[],":
            end += 1
        tag = [text[at:end].strip()]
        if end < len(text) and text[end] == "[":
            end += 1
            while True:
                inner, end = parse(end)
                tag.append(inner)
                while end < len(text) and text[end] == " ":
                    end += 1
                end += 1  # past "," or "]"
                if text[end - 1] == "]":
                    break
        return tag, end
    return parse(0)[0]


def model_outputs(outputs: list, written_state: int) -> list:
    """The model's own outputs of a plan's: the written module state comes after them."""
    return list(outputs[:len(outputs) - written_state])


def _triton_version() -> str:
    try:
        import triton
        return triton.__version__
    except ImportError:
        return ""


# ---- what conversion decides after a build ----------------------------------------------------------------------

def set_cuda_graph(contents: PackageContents, use_graph: bool, timed_us: dict[str, float]) -> None:
    """The CUDA graph timing's choice (packaging/cuda_graph_choice.py), over the one the plan's shape made."""
    contents.manifest["cuda_graph"] = use_graph
    contents.manifest["report"]["cuda_graph"] = dict({f"{k}_us": v for k, v in timed_us.items()}, chosen=use_graph)


def set_graph_regions(contents: PackageContents, use_regions: bool, timed_us: dict[str, float]) -> None:
    """The timing's choice for a plan with CUDA graph regions: kept, or each region put back as its steps."""
    if not use_regions:
        contents.manifest["plan"] = without_regions(contents.manifest["plan"])
    contents.manifest["report"]["cuda_graph"] = dict({f"{k}_us": v for k, v in timed_us.items()}, regions=use_regions)


def add_method(contents: PackageContents, name: str, method: PackageContents) -> None:
    """Store `method` (converted as a package of its own) in `contents` as method `name` (the C++ runtime's
    module.cpp reads it back)."""
    prefix = f"{METHOD_PREFIX}{name}/"
    own = {k: v for k, v in method.manifest.items() if k not in METHOD_SHARED_FIELDS}
    contents.manifest.setdefault("methods", {})[name] = own
    contents.weights.update({prefix + k: w for k, w in method.weights.items()})
    contents.files.update({prefix + k: data for k, data in method.files.items() if not k.startswith("extra/")})
