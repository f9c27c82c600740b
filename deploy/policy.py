"""The one source of what Python and the C++ runtime must agree on: the package format's constants, the runtime policy numbers,
the dtype table and the messages a package is refused with.

Python imports this module; the C++ runtime includes `deploy/cpp/src/policy.h`, generated from it:

    python -m jit2triton.deploy.policy > deploy/cpp/src/policy.h

(tests/test_structure.py fails while the checked-in header differs from what this file generates, so the two cannot
drift). A message is a template whose `{fields}` are filled with text as given: callers quote names themselves
(`repr(path)` in Python, `repr(path)` in C++), so both say exactly the same thing.
"""
from __future__ import annotations

import re
import sys

# --- the package format ------------------------------------------------------------------------------------------
FORMAT = "jit2triton-package"
FORMAT_VERSION = 2  # 1: a hand-written zip (jit2triton 0.1 before torch's container); refused with a clear message
SIGNATURE_MEMBER = "signature.ed25519"
SIGNED_PREFIX = "jit2triton package signature v1\n"  # what a signature signs, before checksums.json's bytes
REQUIRED_MEMBERS = ("manifest.json", "weights.bin", "checksums.json")
# Methods besides forward (`@torch.jit.export def encode`): each a plan of its own, under manifest["methods"][name],
# with its weights and files named under this prefix; a method's manifest is these fields of the package's and its own
METHOD_PREFIX = "methods/"
METHOD_SHARED_FIELDS = ("format", "format_version", "producer", "device", "model")

# --- runtime policy ------------------------------------------------------------------------------------------------
MAX_ARENA_BYTES = 1 << 40  # a plan's arena larger than this is refused as damaged (1 TiB)
MAX_SLOTS = 1 << 24  # a plan naming more value slots is refused as damaged (no model comes near)
MAX_GRAPHS = 8  # CUDA graphs kept per plan or region (distinct shapes or scalar inputs); see deploy/cpp/src/cuda_graph.cpp
MAX_SEEN = 4096  # keys whose sightings are counted (a key's second sighting captures); bounded so they cannot pile up
AGE_CALLS = 1024  # every this many calls the sighting counts halve, so which shapes hold graphs follows the traffic
REPLAY_LAUNCHES = 3  # a region's replay: one multi-tensor copy in, the graph, one multi-tensor copy out
LAUNCH_US = 4.0  # what a replay saves per step: the host's launch cost, which a graph does not pay
COPY_BYTES_PER_US = 1.5e6  # what copying inputs in and outputs out of a graph's buffers costs
# A tensor this large is copied into or out of a graph's buffers on its own (a device memcpy) instead of in the
# multi-tensor copy: on an H100, _foreach_copy_ moved an 8 MiB fp16 tensor in 18 us, where copy_ took 4.3 us; for
# small tensors the one shared launch is what matters.
OWN_COPY_BYTES = 1 << 20

# --- outputs against TorchScript's: convert-time verification (jit2triton/verify.py), `jit2triton run --check` and
# j2t-run --torchscript hold them to these: an output's largest error within RELATIVE of its largest magnitude plus
# ABSOLUTE, per dtype (others: float32's); integers and bools with at most EXACT_FRACTION of the elements flipped.
CHECK_RELATIVE_TOLERANCE = {"float64": 1e-6, "float32": 1e-3, "float16": 3e-2, "bfloat16": 6e-2}
CHECK_ABSOLUTE_TOLERANCE = {"float64": 1e-9, "float32": 1e-5, "float16": 1e-3, "bfloat16": 1e-2}
CHECK_EXACT_FRACTION = 1e-2
OUTPUTS_DIFFER = 3  # the exit code of a comparison that ran and failed (2: a mistake in the command, as the CLI's)

# --- dtypes a package may hold: manifest name -> ATen scalar type ---------------------------------------------------
DTYPES = {
    "float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16", "int64": "Long",
    "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte", "bool": "Bool", "complex64": "ComplexFloat",
    "complex128": "ComplexDouble",
}

# --- packed constants: the ops a plan's "packed" list may run at load are op facts (deploy/op_facts.py) --------------
# torch.backends.quantized's engine names -> at::QEngine's values
QUANTIZED_ENGINES = {"fbgemm": 1, "qnnpack": 2, "onednn": 3, "x86": 4}

# --- messages ------------------------------------------------------------------------------------------------------
RECONVERT = "re-run `jit2triton convert`"
# How to load a package on the CPU, in the words of each caller: the runtime serves Python, C++ and j2t-run
ON_THE_CPU = ("load it on the CPU (map_location='cpu' from Python, LoadOptions::device = \"cpu\" from C++, "
              "--device cpu in j2t-run)")
# The op namespaces torch registers itself. An op of another (torchvision::nms, a custom op) is a library's: the
# process must have loaded that library's ops before the package, as torch.jit.load needs too.
# (torch._C._jit_get_all_schemas() of torch 2.13, and cuda, fbgemm and _caffe2 of its CUDA and older builds)
TORCH_NAMESPACES = ("aten", "prim", "prims", "quantized", "_quantized", "quantization", "profiler", "cuda", "mkldnn",
                    "mkldnn_prepacked", "mkl", "onednn", "fbgemm", "sparse", "c10d", "_c10d_functional",
                    "_c10d_functional_autograd", "symm_mem", "static_runtime", "inductor", "inductor_prims",
                    "rngprims", "debugprims", "_native", "_dtensor", "_test", "onnx", "export", "_caffe2")
MESSAGES = {
    "not_found": "package not found: {path}; check the path or convert the model first",
    "torchscript_file": "{path} is a TorchScript archive (or a torch.save file), not a jit2triton package; convert it "
                        "with `jit2triton convert`",
    "format_1": "{path} is a package of format 1 (written by an earlier jit2triton 0.1); this jit2triton reads format "
                "{version}: convert the model again",
    "unreadable": "{path} is not a readable jit2triton package ({reason}); it may be truncated or corrupted. Copy it "
                  "again or " + RECONVERT,
    "incomplete": "{path} has no {member}: it is not a complete jit2triton package; " + RECONVERT,
    "checksums_damaged": "{path}: checksums.json is damaged; " + RECONVERT,
    "checksum_fails": "{path}: member {member} fails its checksum, so the package was modified or corrupted; copy it "
                      "again or " + RECONVERT,
    "member_missing": "{path} lacks member {member}; " + RECONVERT,
    "manifest_unreadable": "{path}: manifest.json is damaged; " + RECONVERT,
    "not_a_package": "{path} is a torch archive but not a jit2triton package",
    "newer_format": "{path} uses package format {found}, newer than this jit2triton reads ({version}); upgrade "
                    "jit2triton (pip install -U jit2triton)",
    "unknown_format": "{path} names a package format no jit2triton wrote (this one reads format {version}); the "
                      "package is corrupted: " + RECONVERT,
    "no_weights_index": "the package's manifest is damaged (its weights index is not an object); " + RECONVERT,
    "unknown_dtype": "weight {name} has dtype {dtype}, which no jit2triton writes; the package is corrupted",
    "weight_outside": "weight {name} lies outside weights.bin; the package is corrupted",
    "weight_shape": "weight {name}'s shape does not match its bytes; the package is corrupted",
    "weight_order": "weight {name}'s memory order is not a permutation of its dims; the package is corrupted",
    "missing_op": "op {op} does not exist in this torch ({version}); the package needs a torch that has it (convert "
                  "and run with the same torch version)",
    "library_op": "op {op} is not registered in this process: it belongs to the library {library}, not to torch. "
                  "Load that library's ops before the package, as torch.jit.load needs too: from Python, import the "
                  "module that registers them (`import {library}` for most), or pass `--import {library}` to "
                  "jit2triton's run, bench and serve; from C++, link its ops library",
    "packing_op": "the package's plan builds a constant at load with {op}, which is not an op that packs quantized "
                  "weights; the package is corrupted: " + RECONVERT,
    "packed_missing": "the package's plan reads packed constant {name}, which its packed list does not build before; "
                      "the package is corrupted: " + RECONVERT,
    # a Triton kernel's launch entry against the kernel index (deploy/triton_kernels.py, cuda_kernels.cpp)
    "kernel_sizes": "kernel {kernel} takes other sizes than the manifest says; " + RECONVERT,
    "kernel_numbers": "kernel {kernel} takes other arguments by value than the manifest says; " + RECONVERT,
    "kernel_unaligned": "kernel {kernel}'s unaligned inputs are not argument positions; " + RECONVERT,
    "kernel_zeroed": "kernel {kernel}'s zeroed outputs are not output positions; " + RECONVERT,
    "other_torch": "the package was made with torch {made_with}, and this is torch {here}: ATen op schemas and "
                   "kernels change between minor versions (patch releases may differ). Convert the model again with "
                   "this torch",
    "cpu_kernels": "the package's kernels are compiled for the CPU and run only there: " + ON_THE_CPU + "; to run on "
                   "{device}, convert the model with device={device_repr}",
    "no_cuda": "the package was built for {built_for} and this machine has no CUDA device; run it on a GPU machine "
               "or " + ON_THE_CPU,
    "no_cuda_for_kernels": "the package was built for {built_for} and this machine has no CUDA device; run it on a GPU "
                           "machine; its GPU kernels cannot run on the CPU, so convert the model again with "
                           "device='cpu'",
    "kernels_elsewhere": "the package holds kernels compiled for {built_for} and cannot run on {device}; convert the "
                         "model again with device={device_repr}",
    "new_dtype": "the package holds dtype {dtype}, which this jit2triton does not know: a newer jit2triton made it "
                 "(upgrade: pip install -U jit2triton), or it is damaged (" + RECONVERT + ")",
    "size_changed": "kernel input {index} has shape [{got}], but the package was converted for [{expected}]: a size "
                    "the package fixed at conversion changed: a scalar input's value, a list input's length, or a "
                    "count computed from the data (a mask's, nonzero's) that conversion did not see vary. Convert "
                    "again with example inputs of the values you need; if the shapes and scalars are the example's, "
                    "please report it with the model",
    # (a null shape read as none in C++, which then expected a 0-d tensor; agreement sweep small@48106)
    "unshaped_tensor": "{label} is a tensor whose shape the package's signature does not give; the package is "
                       "corrupted: " + RECONVERT,
    "missing_engine": "the package's quantized weights are packed for the {engine} quantized engine, which this torch "
                      "does not have (it has: {supported}); load it where torch.backends.quantized.supported_engines "
                      "lists {engine}, or convert the model on this machine (with torch.backends.quantized.engine set "
                      "to one of those)",
}


def message(key: str, **fields) -> str:
    return MESSAGES[key].format(**{k: str(v) for k, v in fields.items()})


# The runtime's own ops (deploy/cpp/src/native_ops.cpp): registered when the runtime loads, no library to import
RUNTIME_NAMESPACE = "j2t"


def library_of(op: str) -> "str | None":
    """The library an op not found belongs to (`torchvision` for torchvision::nms), or None for torch's own and the
    runtime's."""
    namespace = op.partition("::")[0]
    return None if namespace in TORCH_NAMESPACES or namespace == RUNTIME_NAMESPACE else namespace


def unknown_op(op: str, version: str) -> str:
    """Why `op` (`aten::add.Tensor`) is not found: a torch without it, or a library's op whose library is not loaded."""
    library = library_of(op)
    if library is None:
        return message("missing_op", op=repr(op), version=version)
    return message("library_op", op=repr(op), library=library)


# --- the C++ header ------------------------------------------------------------------------------------------------

def _cpp_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _cpp_message(key: str, template: str) -> str:
    """A template as a C++ function of its fields (strings), in the order they first appear."""
    fields = list(dict.fromkeys(re.findall(r"{(\w+)}", template)))
    params = ", ".join(f"const std::string& {f}" for f in fields)
    parts = [p for p in re.split(r"({\w+})", template) if p]
    body = " + ".join(p[1:-1] if re.fullmatch(r"{\w+}", p) else f"std::string({_cpp_string(p)})" for p in parts)
    return f"inline std::string {key}({params}) {{ return {body}; }}"


def cpp_header() -> str:
    lines = [
        "// Generated from deploy/policy.py by `python -m jit2triton.deploy.policy`: edit that file, not this one.",
        "#pragma once",
        "#include <ATen/ATen.h>",
        "#include <torch/version.h>",
        "",
        "#include <cstddef>",
        "#include <cstdint>",
        "#include <map>",
        "#include <string>",
        "#include <utility>",
        "",
        "// The torch this runtime was built against, as messages name it (the Python extension passes torch.__version__;",
        "// otherwise torch's TORCH_VERSION, from torch/version.h)",
        "#ifndef J2T_TORCH_VERSION",
        "#define J2T_TORCH_VERSION TORCH_VERSION",
        "#endif",
        "",
        "namespace jit2triton::policy {",
        "",
        f"constexpr const char* kFormat = {_cpp_string(FORMAT)};",
        f"constexpr int64_t kFormatVersion = {FORMAT_VERSION};",
        f"constexpr const char* kSignatureMember = {_cpp_string(SIGNATURE_MEMBER)};",
        f"constexpr const char* kSignedPrefix = {_cpp_string(SIGNED_PREFIX)};",
        "constexpr const char* kRequiredMembers[] = {" + ", ".join(map(_cpp_string, REQUIRED_MEMBERS)) + "};",
        f"constexpr const char* kMethodPrefix = {_cpp_string(METHOD_PREFIX)};",
        "constexpr const char* kMethodSharedFields[] = {" + ", ".join(map(_cpp_string, METHOD_SHARED_FIELDS)) + "};",
        f"constexpr int64_t kMaxSlots = {MAX_SLOTS};",
        f"constexpr int64_t kMaxArenaBytes = {MAX_ARENA_BYTES};",
        f"constexpr size_t kMaxGraphs = {MAX_GRAPHS};",
        f"constexpr size_t kMaxSeen = {MAX_SEEN};",
        f"constexpr int64_t kAgeCalls = {AGE_CALLS};",
        f"constexpr int kReplayLaunches = {REPLAY_LAUNCHES};",
        f"constexpr double kLaunchUs = {LAUNCH_US!r};",
        f"constexpr double kCopyBytesPerUs = {COPY_BYTES_PER_US!r};",
        f"constexpr int64_t kOwnCopyBytes = {OWN_COPY_BYTES};",
        "",
        "inline const std::map<std::string, at::ScalarType>& dtypes() {",
        "  static const std::map<std::string, at::ScalarType> table = {",
        *(f"      {{{_cpp_string(name)}, at::ScalarType::{aten}}}," for name, aten in DTYPES.items()),
        "  };",
        "  return table;",
        "}",
        "",
        f"constexpr double kCheckExactFraction = {CHECK_EXACT_FRACTION!r};",
        f"constexpr int kOutputsDiffer = {OUTPUTS_DIFFER};",
        "",
        "// {relative, absolute} tolerance of j2t-run --torchscript per dtype",
        "inline const std::map<std::string, std::pair<double, double>>& check_tolerances() {",
        "  static const std::map<std::string, std::pair<double, double>> table = {",
        *(f"      {{{_cpp_string(name)}, {{{CHECK_RELATIVE_TOLERANCE[name]!r}, {CHECK_ABSOLUTE_TOLERANCE[name]!r}}}}},"
          for name in CHECK_RELATIVE_TOLERANCE),
        "  };",
        "  return table;",
        "}",
        "",
        "inline const std::map<std::string, int>& quantized_engines() {",
        "  static const std::map<std::string, int> table = {",
        *(f"      {{{_cpp_string(name)}, {value}}}," for name, value in QUANTIZED_ENGINES.items()),
        "  };",
        "  return table;",
        "}",
        "",
        f"constexpr const char* kReconvert = {_cpp_string(RECONVERT)};",
        "constexpr const char* kTorchNamespaces[] = {" + ", ".join(map(_cpp_string, TORCH_NAMESPACES)) + "};",
        "",
        "namespace message {",
        *(_cpp_message(key, template) for key, template in MESSAGES.items()),
        "}  // namespace message",
        "",
        "// as unknown_op in policy.py: `quoted` is repr(op)",
        "inline std::string unknown_op(const std::string& op, const std::string& quoted, const std::string& version) {",
        "  std::string library = op.substr(0, op.find(\"::\"));",
        "  for (const char* name : kTorchNamespaces)",
        "    if (library == name) return message::missing_op(quoted, version);",
        "  return message::library_op(quoted, library);",
        "}",
        "",
        "}  // namespace jit2triton::policy",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(cpp_header())
