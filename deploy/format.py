"""The manifest's schema: each field of a package's manifest.json, its type, whether a package must have it, what a
reader takes when it is absent, and the check that refuses a damaged or unknown value, with the message it says.

The package reader (deploy/package.py: tools, conversion) calls `read_manifest`; the C++ runtime includes `deploy/cpp/src/manifest_schema.h`, generated from this file:

    python -m jit2triton.deploy.format > deploy/cpp/src/manifest_schema.h

(tests/test_manifest_schema.py fails while the checked-in header differs from what this file generates). A field
added here is checked by the runtime at load, read in Python as an attribute of `Manifest`, and, where
it has a `write`, recorded by save_package (deploy/package.py) from the manifest that
deploy/packaging/build_manifest.py built.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, make_dataclass
from typing import Any, Callable, Optional

from jit2triton.errors import CorruptPackageError, PackageVersionError

from .policy import MAX_SLOTS, RECONVERT

MAX_BYTES = 1 << 62  # a byte count or offset past this is damage (and would overflow a reader's arithmetic)

# A field's type, and how a message names it. "slots" are integers indexing the plan's slots, a "node" one indexing
# the node table; a "count" is an integer from 0 to the field's `most`.
TYPES = {"str": "a string", "int": "an integer", "bool": "true or false", "list": "a list", "object": "an object",
         "strs": "a list of strings", "count": "an integer", "slots": "a list of slots", "node": "a node",
         "refs": "a list of references", "tag": "a TorchScript type", "sizes": "a list of sizes",
         "shape": "a list of sizes and dim names"}
# A "refs" item, a reference to a value: [kind, what], kind one of these ("s": a slot, "c": a literal, "w": a weight,
# "wl": a list of weights, "p": a packed constant; transpiler/build_plan.py)
REF_KINDS = ("s", "c", "w", "wl", "p")
UPGRADE = "upgrade jit2triton (pip install -U jit2triton)"
# A "tag", a TorchScript type as nested lists: ["List", ["Optional", ["Tensor"]]] (transpiler/build_plan.py's
# _type_tag; literals.cpp's parse_type reads it). These kinds take exactly this many item types; any other kind's
# items, if it has some, are tags too. A tag nests at most TAG_DEPTH deep.
TAG_ARITY = {"Optional": 1, "List": 1, "Dict": 2}
TAG_DEPTH = 32


@dataclass(frozen=True)
class Field:
    name: str
    type: str  # a key of TYPES
    required: bool = True  # else absent (or null) means `default`
    default: Any = None
    doc: str = ""
    damaged: str = ""  # what the refusal of a bad value says is damaged (else: the field and its expected type)
    most: int = 0  # "count": the largest value a package may hold
    known: tuple[str, ...] = ()  # "str"/"strs": the values this jit2triton knows; another is refused as too new...
    unknown: str = ""  # ... with this message ({value}: the value's repr), a PackageVersionError
    write: Optional[Callable[[dict], Any]] = None  # the value a conversion records, from the manifest built so far


@dataclass(frozen=True)
class Section:
    name: str  # as messages name it: "the package's {name} is damaged (...)"
    fields: tuple[Field, ...]


# Format features a package may use beyond what every reader of its format version runs: a reader that does not know
# one would run the package wrongly (drop the module state it carries, the methods it holds), so it refuses it and
# asks for an upgrade. Each records whether a manifest uses it.
FEATURES: dict[str, Callable[[dict], bool]] = {
    "state": lambda m: bool(m.get("state")),  # module attributes the plan reads and writes (deploy/cpp/src/state.cpp)
    "methods": lambda m: bool(m.get("methods")),  # methods besides forward (deploy/cpp/src/module.cpp)
    "bound_dims": lambda m: bool(m["plan"].get("bound_dims")),  # sizes bound from tensors a step makes
    "host_weights": lambda m: bool(m["plan"].get("host_weights")),  # weights a GPU plan keeps on the CPU
    # kernels that take host numbers as arguments (KernelBuffer.by_value): a reader without it would pass a number
    # where a kernel reads a pointer
    "scalar_arguments": lambda m: any(k.get("by_value") for k in m.get("kernels", ())),
    # Triton kernels whose outputs the launcher zeroes first (they add into them atomically): a reader without it
    # would leave them uninitialised
    "zeroed_outputs": lambda m: any(e.get("zeroed") for e in ((m.get("triton") or {}).get("kernels") or {}).values()),
}

STEP_KINDS = ("call", "kernel", "if", "loop", "graph")

MANIFEST = Section("manifest", (
    Field("producer", "object", False, {}, "versions of jit2triton, torch, triton and Python that wrote it"),
    Field("device", "str", doc="the device type its kernels were built for: 'cpu' or 'cuda'"),
    Field("backend", "str", doc="the kernel generator: 'cpp', 'triton' or 'aten' (no kernels)"),
    Field("model", "object", False, {}, "the model's name and source"),
    Field("signature", "object", doc="its inputs and outputs (SIGNATURE)"),
    Field("plan", "object", doc="the execution plan (PLAN)"),
    Field("nodes", "list", doc="the node table: op and source line of each IR node a step names"),
    Field("kernels", "list", doc="the kernel index: name, buffers, sizes, inputs and outputs of each kernel"),
    # (optional to the schema: a method's manifest and a loaded package's hold none, their weights read already)
    Field("weights", "object", False, None, "the weights index: where each weight's bytes are in weights.bin"),
    Field("report", "object", False, {}, "the conversion report"),
    Field("ir", "str", False, "", "the IR the plan came from, as text"),
    Field("cuda_graph", "bool", False, None, "whether a straight-line CUDA plan runs as one graph (decided at "
                                             "conversion; absent in older packages, which decide at load)"),
    Field("state", "list", False, None, "module attributes the plan reads and writes (deploy/cpp/src/state.cpp)"),
    Field("methods", "object", False, None, "methods besides forward, each a manifest of its own (deploy/cpp/src/module.cpp)"),
    Field("runtime", "str", False, None, "'python' in packages of older jit2triton whose C++ runtime differed "
                                         "from TorchScript at conversion; the C++ runtime refuses them (never "
                                         "written now)"),
    Field("cpp", "object", False, None, "the C++ kernels' section (their instruction set)"),
    Field("triton", "object", False, None, "the Triton kernels' section (their launch metadata)"),
    Field("requires", "strs", False, (), "the FEATURES it uses, which a reader must know to run it",
          known=tuple(FEATURES), write=lambda m: [name for name, used in FEATURES.items() if used(m)],
          unknown="the package uses {value}, a feature of the package format this jit2triton does not know, "
                  "and would run wrongly without it; " + UPGRADE),
))
PRODUCER = Section("manifest", (Field("torch", "str", False, "", "the torch version that converted it"),))
SIGNATURE = Section("signature", (
    Field("inputs", "list", doc="one entry per input: name, type, dtype, shape, default"),
    Field("outputs", "object", doc="the type of what the model returns"),
    Field("dims", "object", False, None, "each dynamic dim's range: {name: {min, max}}"),
))
SIGNATURE_INPUT = Section("signature", (
    Field("name", "str", doc="the input's name, as the model's forward takes it"),
    Field("type", "str", doc="its TorchScript type: Tensor, int, float, bool, a container..."),
    # (a shape that was a number loaded in C++, which then refused every call, and was refused at load in Python:
    # sweep small@13682)
    Field("shape", "shape", False, None, "a tensor's sizes, each a number or a dynamic dim's name"),
))
# a container input's item or element type (deploy/signature.py's describe): checked where the runtime builds its check
SIGNATURE_ITEM = Section("signature", (
    Field("type", "str", doc="its TorchScript type: Tensor, int, float, bool, a container..."),
    Field("shape", "shape", False, None, "a tensor's sizes"),
    Field("items", "list", False, None, "a tuple's item types"),
    Field("element", "object", False, None, "a list's or dict's element type, where the example's were all one"),
    Field("fixed", "bool", False, None, "a list checked item by item, as a tuple: its example's tensors differed"),
))
PLAN = Section("plan", (
    Field("num_slots", "count", most=MAX_SLOTS, damaged="num_slots"),
    Field("inputs", "slots", doc="the slot of each input"),
    Field("outputs", "refs", doc="a reference per output"),
    Field("steps", "list"),
    Field("dims", "list", False, (), "where each dynamic dim is read: [name, input position, axis]"),
    Field("bound_dims", "strs", False, (), "dims bound from a tensor a step makes", damaged="its bound dims"),
    Field("arena", "object", False, None, "one buffer that planned kernel outputs are views of"),
    Field("host_weights", "strs", False, (), "weights a GPU plan keeps on the CPU"),
    Field("packed", "list", False, (), "constants built at load (a quantized op's packed weights)"),
))
STEP = Section("plan", (
    Field("kind", "str", known=STEP_KINDS,
          unknown="the package's plan has a step of kind {value}, which this jit2triton does not know; " + UPGRADE),
    Field("node", "node", damaged="a step names a node that is not in the node table"),
    Field("outs", "slots", False, ()),
    Field("free", "slots", False, ()),
    # (a string there read as a list of one-letter names in one runtime and as none in the other: mutation seed 602)
    Field("kwnames", "strs", False, (), "a call's keyword-only arguments, by name"),
    # (required: every step kind has them, and the C++ runtime reads them; optional here, a step without them ran in
    # Python and was refused in C++: sweep damageable@15682)
    Field("args", "refs", doc="its argument references (a call's, a kernel's inputs, a region's reads)"),
    # (a call building a list or dict types it so in the C++ runtime; a damaged one was refused there and ignored in
    # Python: agreement sweep, damageable@646)
    Field("type", "tag", False, None, "the TorchScript type of the container a call builds"),
))
CPP = Section("manifest's cpp section", (  # (the C++ backend's)
    Field("isa", "str", doc="the instruction set its kernels were compiled for (x86-64-v3...)"),
))
BLOCK = Section("plan", (  # an if's branch, a loop's body
    Field("inputs", "slots", doc="the slots its inputs go to (a loop's counter and carried values)"),
    Field("steps", "list"),
    Field("outputs", "refs", doc="a reference per output"),
))
# A weights index entry (a weight's place in weights.bin; deploy/package.py writes it, the weight readers (C++
# and Python) check each entry so). (A bool offset read as an integer in C++ and was refused in Python: sweep damageable@3630.)
WEIGHT = Section("weights index", (
    Field("dtype", "str", doc="its dtype's name, one of policy.DTYPES"),
    Field("shape", "sizes", doc="its sizes"),
    Field("offset", "count", most=MAX_BYTES, doc="where its bytes start in weights.bin"),
    Field("nbytes", "count", most=MAX_BYTES, doc="how many"),
    Field("memory_order", "sizes", False, None, "its dims outermost first, when not row-major"),
))
# A module state entry (deploy/cpp/src/state.cpp): an attribute the plan reads and writes, and its initial value
STATE = Section("module state", (
    Field("name", "str", doc="the attribute's name"),
    Field("written", "bool", doc="whether forward assigns it"),
    Field("compared", "bool", False, True, "whether verification compares it"),
    Field("weight", "str", False, None, "its initial tensor, a weight's name"),
    Field("weights", "strs", False, None, "its initial list of tensors, weights' names"),
    Field("type", "tag", False, None, "its container type, which the C++ runtime types its value by"),
))
KERNEL = Section("manifest", (
    Field("name", "str"),
    Field("num_buffers", "int", doc="how many buffers a step passes it: its inputs, then its outputs"),
    Field("sizes", "strs", False, (), "the dynamic dims it takes, in its `sizes` argument's order"),
))

# Every other key a runtime reads, by the part of the package it sits in. The sections above are checked at load
# from this file (by the runtime and the Python reader); these are checked where they are read (plan_check, signature, the kernel and
# weight loaders), and are named here so that the package is described in one place: tests/test_manifest_schema.py
# scans the runtime's and Python's sources and fails on a key read that neither a section nor this table declares. (Moving each
# part into a checked Section, with the C++ reader generated from it, is issue 45's next step.)
DECLARED: dict[str, dict[str, str]] = {
    "the package's envelope": {
        "format": "'jit2triton': what the file is", "format_version": "the package format's version"},
    "a plan step": {
        "kernel": "the kernel a step launches",
        "sizes": "the dynamic dims a kernel step passes, in the kernel's order", "op": "a call step's ATen op",
        "blocks": "an if's two branches, a loop's body", "binds": "sizes a step binds from its outputs",
        "out_types": "the types a call's outputs must have", "in_shapes": "a kernel's input shapes, checked per call",
        "in_strides": "a kernel's input strides, checked per call", "launches": "a graph step's captured launches",
        "by_value": "a kernel step's args that are host numbers, passed by value (its kernel's by_value)"},
    "a node table entry": {"source": "the model source line a node came from (op: its op)"},
    "a kernel index entry": {
        "function": "its symbol in the library or binary",
        "by_value": "its inputs that are host numbers (int64, float64) it takes by value",
        "arg_types": "each argument's type, as the launcher passes it", "grid": "its launch grid",
        "grid_items": "items its grid covers, from the dims (a dynamic grid)", "size_args": "the dims it is given",
        "unaligned": "(Triton) inputs compiled for any address, passed without an aligned copy",
        "zeroed": "(Triton) outputs the launcher zeroes before each launch: the kernel adds into them atomically",
        "pdl": "(Triton) the cubin waits first for the kernel before it: launched with programmatic dependent launch",
        "constants": "compile-time constants", "num_warps": "warps per program",
        "num_ctas": "CTAs per cluster (1)", "shared": "dynamic shared memory bytes", "binary": "its cubin's member",
        "cubin": "the compiled binary, in a loaded package", "arch": "the GPU architecture it was built for",
        "global_scratch_size": "global scratch bytes per program", "XBLOCK": "(in constants) items per program"},
    "a signature entry": {
        "dtype": "a tensor's dtype", "shape": "sizes and dim names", "default": "a default value",
        "example": "the example's value", "fixed": "an int the package serves at the example's value only; a list checked item by item",
        "optional": "an Optional[Tensor] that takes None", "items": "a tuple's item types",
        "fields": "a NamedTuple's field names", "element": "a list's or dict's element type",
        "layout": "a declared memory layout (channels_last)", "range": "a number's accepted range",
        "min": "a dim's least size", "max": "a dim's largest size (null: none)"},
    "a state entry": {"value": "the attribute's initial value, a literal"},
    "the arena": {"bytes": "the one buffer's size"},
    "a packed constant": {"op": "the packing op", "args": "its arguments", "engine": "the quantized engine"},
}

DAMAGED = "the package's {section} is damaged ({what}); " + RECONVERT
PYTHON_TYPES = {"str": str, "int": int, "bool": bool, "list": list, "object": dict, "strs": list[str], "count": int,
                "slots": list[int], "node": int}
Manifest = make_dataclass("Manifest", [(f.name, PYTHON_TYPES[f.type] if f.required or f.default is not None
                                        else Optional[PYTHON_TYPES[f.type]])
                                       for f in MANIFEST.fields], frozen=True)
Manifest.__doc__ = "A manifest as read through the schema: each MANIFEST field, its default where it was absent."


def read_manifest(manifest: Any) -> "Manifest":
    """The manifest checked against the schema (its kernel index and producer too), as a `Manifest`."""
    if not isinstance(manifest, dict):
        raise CorruptPackageError(DAMAGED.format(section="manifest", what="not an object"))
    check_fields(MANIFEST, manifest)
    check_fields(PRODUCER, manifest.get("producer") or {})
    check_fields(SIGNATURE, manifest["signature"])
    for entry in manifest["signature"]["inputs"]:
        check_fields(SIGNATURE_INPUT, entry)
    for kernel in manifest["kernels"]:
        check_fields(KERNEL, kernel)
    if manifest.get("cpp") is not None:
        check_fields(CPP, manifest["cpp"])
    return Manifest(**{f.name: _value(manifest, f) for f in MANIFEST.fields})


def written_fields(manifest: dict) -> dict:
    """The fields a conversion records from the manifest it built (each Field's `write`)."""
    return {f.name: f.write(manifest) for f in MANIFEST.fields if f.write is not None}


def check_fields(section: Section, value: Any, num_slots: int = 0, num_nodes: int = 0) -> None:
    """Refuse `value` (an object of `section`) unless each field is present where required, of its type, and known.
    `num_slots`, `num_nodes`: what a slot or a node indexes. An optional field that is null is taken out of `value`:
    absent, as the C++ reader takes it, so that a later `.get(name, default)` reads its default (a kernel's null
    `sizes` was refused in Python and ran in C++: agreement sweep, containers@1870)."""
    if not isinstance(value, dict):
        _refuse(section, "not an object")
    for f in section.fields:
        item = value.get(f.name)
        if item is None:
            if f.required:
                _refuse(section, f.damaged or f"no {f.name!r}")
            value.pop(f.name, None)
            continue
        if not _IS[f.type](item, f, num_slots, num_nodes):
            slot = f.type == "slots" or (f.type == "refs" and all(_is_ref(r, None) for r in item))
            _refuse(section, f.damaged or (f"a slot outside 0..{num_slots - 1}" if slot
                                           else f"{f.name!r} is not {TYPES[f.type]}"))
        for name in (item if f.type == "strs" else [item]) if f.known else ():
            if name not in f.known:
                raise PackageVersionError(f.unknown.format(value=repr(name)))


def _value(manifest: dict, f: Field) -> Any:
    value = manifest.get(f.name)
    return f.default if value is None else value


def _refuse(section: Section, what: str) -> None:
    raise CorruptPackageError(DAMAGED.format(section=section.name, what=what))


def _index(value: Any, limit: int) -> bool:
    return type(value) is int and 0 <= value < limit


# Whether a value is of a field's type: (value, field, num_slots, num_nodes) -> bool, per type
_IS: dict[str, Callable[[Any, Field, int, int], bool]] = {
    "str": lambda v, f, slots, nodes: isinstance(v, str),
    "int": lambda v, f, slots, nodes: type(v) is int,
    "bool": lambda v, f, slots, nodes: type(v) is bool,
    "list": lambda v, f, slots, nodes: isinstance(v, list),
    "object": lambda v, f, slots, nodes: isinstance(v, dict),
    "strs": lambda v, f, slots, nodes: isinstance(v, list) and all(isinstance(s, str) for s in v),
    "count": lambda v, f, slots, nodes: type(v) is int and 0 <= v <= f.most,
    "slots": lambda v, f, slots, nodes: isinstance(v, list) and all(_index(s, slots) for s in v),
    "node": lambda v, f, slots, nodes: _index(v, nodes),
    "refs": lambda v, f, slots, nodes: isinstance(v, list) and all(_is_ref(r, slots) for r in v),
    "tag": lambda v, f, slots, nodes: _is_tag(v, 0),
    "sizes": lambda v, f, slots, nodes: isinstance(v, list) and all(type(d) is int and d >= 0 for d in v),
    "shape": lambda v, f, slots, nodes: isinstance(v, list) and all(isinstance(d, str) or (type(d) is int and d >= 0)
                                                                    for d in v),
}


def _is_tag(v: Any, depth: int) -> bool:
    if not (isinstance(v, list) and v and isinstance(v[0], str)) or depth >= TAG_DEPTH:
        return False
    arity = TAG_ARITY.get(v[0])
    return (arity is None or len(v) == arity + 1) and all(_is_tag(item, depth + 1) for item in v[1:])


def _is_ref(r: Any, slots: Optional[int]) -> bool:
    """Whether `r` is a reference, its slot below `slots` (None: any integer)."""
    return (isinstance(r, list) and len(r) == 2 and isinstance(r[0], str) and r[0] in REF_KINDS
            and (r[0] != "s" or (type(r[1]) is int if slots is None else _index(r[1], slots))))


# --- the C++ header ------------------------------------------------------------------------------------------------

def _cpp_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


CPP_TYPES = {"str": "Str", "int": "Int", "bool": "Bool", "list": "List", "object": "Object", "strs": "Strs",
             "count": "Count", "slots": "Slots", "node": "Node", "refs": "Refs", "tag": "Tag",
             "sizes": "Sizes", "shape": "Shape"}


def _cpp_field(f: Field) -> str:
    unknown = [_cpp_string(part) for part in f.unknown.split("{value}")] if f.unknown else ['""', '""']
    return (f"    {{{_cpp_string(f.name)}, Type::{CPP_TYPES[f.type]}, {str(f.required).lower()}, "
            f"{_cpp_string(f.damaged)}, {f.most}, {{{', '.join(map(_cpp_string, f.known))}}}, "
            f"{unknown[0]}, {unknown[1]}}},")


def _cpp_section(function: str, section: Section) -> list[str]:
    return [f"inline void {function}(const json::Value& value, const Limits& limits = {{}}) {{",
            "  static const std::vector<Field> fields = {",
            *(_cpp_field(f) for f in section.fields),
            "  };",
            f"  check({_cpp_string(section.name)}, fields, value, limits);",
            "}", ""]


# The C++ twin of check_fields (above): what each type admits and what a refusal says.
CPP_CHECK = """\
enum class Type { Str, Int, Bool, List, Object, Strs, Count, Slots, Node, Refs, Tag, Sizes, Shape };

inline const char* type_words(Type type) {
  static const char* words[] = {%(words)s};
  return words[static_cast<int>(type)];
}

struct Field {
  const char* name;
  Type type;
  bool required;
  const char* damaged;  // what a refusal says is damaged ("": the field and its type)
  int64_t most;         // Type::Count: the largest value
  std::set<std::string> known;  // Str, Strs: the values this jit2triton knows ...
  const char* unknown_before;   // ... and the message refusing another, around its repr
  const char* unknown_after;
};

struct Limits {
  int64_t num_slots = 0, num_nodes = 0;  // what a slot and a node index
};

[[noreturn]] inline void damaged(const std::string& section, const std::string& what) {
  throw Error(Error::Kind::CorruptPackage, "the package's " + section + " is damaged (" + what + "); " + policy::kReconvert);
}

inline bool in_range(const json::Value& v, int64_t limit) {
  return v.kind == json::Value::Kind::Int && v.integer >= 0 && v.integer < limit;
}

// A reference: [kind, what], kind one of REF_KINDS; a slot's below num_slots (negative: any integer)
inline bool is_ref(const json::Value& r, int64_t num_slots) {
  static const std::set<std::string> kinds = {%(ref_kinds)s};
  if (!r.is_array() || r.size() != 2 || !r[0].is_string() || !kinds.count(r[0].as_string())) return false;
  if (r[0].as_string() != "s") return true;
  return num_slots < 0 ? r[1].kind == json::Value::Kind::Int : in_range(r[1], num_slots);
}

// A TorchScript type as nested lists (format.py's _is_tag): kinds in TAG_ARITY take exactly that many item types
inline bool is_tag(const json::Value& v, int64_t depth) {
  static const std::map<std::string, size_t> arity = {%(arity)s};
  if (!v.is_array() || v.size() == 0 || !v[0].is_string() || depth >= %(depth)d) return false;
  auto known = arity.find(v[0].as_string());
  if (known != arity.end() && v.size() != known->second + 1) return false;
  for (size_t i = 1; i < v.size(); ++i)
    if (!is_tag(v[i], depth + 1)) return false;
  return true;
}

inline bool all_of(const json::Value& v, bool (*test)(const json::Value&, int64_t), int64_t limit) {
  if (!v.is_array()) return false;
  for (const auto& item : v.items)
    if (!test(item, limit)) return false;
  return true;
}

inline bool is(const json::Value& v, const Field& f, const Limits& limits) {
  auto is_string = [](const json::Value& x, int64_t) { return x.is_string(); };
  auto is_size = [](const json::Value& x, int64_t) { return x.kind == json::Value::Kind::Int && x.integer >= 0; };
  auto is_dim = [](const json::Value& x, int64_t) {  // a size, or a dynamic dim's name
    return x.is_string() || (x.kind == json::Value::Kind::Int && x.integer >= 0);
  };
  switch (f.type) {
    case Type::Str: return v.is_string();
    case Type::Int: return v.kind == json::Value::Kind::Int;
    case Type::Bool: return v.kind == json::Value::Kind::Bool;
    case Type::List: return v.is_array();
    case Type::Object: return v.is_object();
    case Type::Strs: return all_of(v, is_string, 0);
    case Type::Count: return v.kind == json::Value::Kind::Int && v.integer >= 0 && v.integer <= f.most;
    case Type::Slots: return all_of(v, in_range, limits.num_slots);
    case Type::Node: return in_range(v, limits.num_nodes);
    case Type::Refs: return all_of(v, is_ref, limits.num_slots);
    case Type::Tag: return is_tag(v, 0);
    case Type::Sizes: return all_of(v, is_size, 0);
    case Type::Shape: return all_of(v, is_dim, 0);
  }
  return false;
}

inline void check(const char* section, const std::vector<Field>& fields, const json::Value& value, const Limits& limits) {
  if (!value.is_object()) damaged(section, "not an object");
  for (const Field& f : fields) {
    const json::Value* v = value.find(f.name);
    if (!v || v->is_null()) {
      if (f.required) damaged(section, *f.damaged ? f.damaged : "no " + repr(f.name));
      continue;
    }
    if (!is(*v, f, limits)) {
      if (*f.damaged) damaged(section, f.damaged);
      // (references that would be right with any slot: one of their slots is outside)
      if (f.type == Type::Slots || (f.type == Type::Refs && all_of(*v, is_ref, -1)))
        damaged(section, "a slot outside 0.." + std::to_string(limits.num_slots - 1));
      damaged(section, repr(f.name) + " is not " + type_words(f.type));
    }
    if (f.known.empty()) continue;
    std::vector<const json::Value*> names;  // a Str's value, or each of a Strs'
    if (f.type == Type::Strs)
      for (const auto& item : v->items) names.push_back(&item);
    else
      names.push_back(v);
    for (const json::Value* name : names)
      if (!f.known.count(name->as_string()))
        throw Error(Error::Kind::PackageVersion, f.unknown_before + repr(name->as_string()) + f.unknown_after);
  }
}
""" % {"words": ", ".join(_cpp_string(TYPES[t]) for t in CPP_TYPES),
       "ref_kinds": ", ".join(_cpp_string(k) for k in REF_KINDS),
       "arity": ", ".join(f"{{{_cpp_string(k)}, {n}}}" for k, n in TAG_ARITY.items()), "depth": TAG_DEPTH}


def cpp_header() -> str:
    lines = [
        "// Generated from deploy/format.py by `python -m jit2triton.deploy.format`: edit that file, not this one.",
        "#pragma once",
        "",
        "#include <cstdint>",
        "#include <map>",
        "#include <set>",
        "#include <string>",
        "#include <vector>",
        "",
        "#include \"jit2triton/jit2triton.h\"",
        "#include \"json.h\"",
        "#include \"package.h\"",
        "#include \"policy.h\"",
        "",
        "namespace jit2triton::manifest_schema {",
        "",
        CPP_CHECK,
    ]
    for function, section in (("check_manifest", MANIFEST), ("check_producer", PRODUCER),
                              ("check_signature", SIGNATURE), ("check_signature_input", SIGNATURE_INPUT),
                              ("check_signature_item", SIGNATURE_ITEM),
                              ("check_plan", PLAN), ("check_step", STEP), ("check_block", BLOCK),
                              ("check_kernel", KERNEL), ("check_cpp", CPP), ("check_weight", WEIGHT),
                              ("check_state", STATE)):
        lines += _cpp_section(function, section)
    lines += [
        "// The manifest, its producer, signature, plan and kernel index, as read_manifest checks them in Python.",
        "inline void check_all(const json::Value& manifest) {",
        "  check_manifest(manifest);",
        "  if (const json::Value* producer = manifest.find(\"producer\"); producer && !producer->is_null())",
        "    check_producer(*producer);",
        "  check_signature(manifest.at(\"signature\"));",
        "  for (const auto& entry : manifest.at(\"signature\").at(\"inputs\").items) check_signature_input(entry);",
        "  for (const auto& kernel : manifest.at(\"kernels\").items) check_kernel(kernel);",
        "  if (const json::Value* cpp = manifest.find(\"cpp\"); cpp && !cpp->is_null()) check_cpp(*cpp);",
        "}",
        "",
        "}  // namespace jit2triton::manifest_schema",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(cpp_header())
