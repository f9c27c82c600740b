// Generated from deploy/policy.py by `python -m jit2triton.deploy.policy`: edit that file, not this one.
#pragma once
#include <ATen/ATen.h>
#include <torch/version.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>

// The torch this runtime was built against, as messages name it (the Python extension passes torch.__version__;
// otherwise torch's TORCH_VERSION, from torch/version.h)
#ifndef J2T_TORCH_VERSION
#define J2T_TORCH_VERSION TORCH_VERSION
#endif

namespace jit2triton::policy {

constexpr const char* kFormat = "jit2triton-package";
constexpr int64_t kFormatVersion = 2;
constexpr const char* kSignatureMember = "signature.ed25519";
constexpr const char* kSignedPrefix = "jit2triton package signature v1\n";
constexpr const char* kRequiredMembers[] = {"manifest.json", "weights.bin", "checksums.json"};
constexpr const char* kMethodPrefix = "methods/";
constexpr const char* kMethodSharedFields[] = {"format", "format_version", "producer", "device", "model"};
constexpr int64_t kMaxSlots = 16777216;
constexpr int64_t kMaxArenaBytes = 1099511627776;
constexpr size_t kMaxGraphs = 8;
constexpr size_t kMaxSeen = 4096;
constexpr int64_t kAgeCalls = 1024;
constexpr int kReplayLaunches = 3;
constexpr double kLaunchUs = 4.0;
constexpr double kCopyBytesPerUs = 1500000.0;
constexpr int64_t kOwnCopyBytes = 1048576;

inline const std::map<std::string, at::ScalarType>& dtypes() {
  static const std::map<std::string, at::ScalarType> table = {
      {"float32", at::ScalarType::Float},
      {"float64", at::ScalarType::Double},
      {"float16", at::ScalarType::Half},
      {"bfloat16", at::ScalarType::BFloat16},
      {"int64", at::ScalarType::Long},
      {"int32", at::ScalarType::Int},
      {"int16", at::ScalarType::Short},
      {"int8", at::ScalarType::Char},
      {"uint8", at::ScalarType::Byte},
      {"bool", at::ScalarType::Bool},
      {"complex64", at::ScalarType::ComplexFloat},
      {"complex128", at::ScalarType::ComplexDouble},
  };
  return table;
}

constexpr double kCheckExactFraction = 0.01;
constexpr int kOutputsDiffer = 3;

// {relative, absolute} tolerance of j2t-run --torchscript per dtype
inline const std::map<std::string, std::pair<double, double>>& check_tolerances() {
  static const std::map<std::string, std::pair<double, double>> table = {
      {"float64", {1e-06, 1e-09}},
      {"float32", {0.001, 1e-05}},
      {"float16", {0.03, 0.001}},
      {"bfloat16", {0.06, 0.01}},
  };
  return table;
}

inline const std::map<std::string, int>& quantized_engines() {
  static const std::map<std::string, int> table = {
      {"fbgemm", 1},
      {"qnnpack", 2},
      {"onednn", 3},
      {"x86", 4},
  };
  return table;
}

constexpr const char* kReconvert = "re-run `jit2triton convert`";
constexpr const char* kTorchNamespaces[] = {"aten", "prim", "prims", "quantized", "_quantized", "quantization", "profiler", "cuda", "mkldnn", "mkldnn_prepacked", "mkl", "onednn", "fbgemm", "sparse", "c10d", "_c10d_functional", "_c10d_functional_autograd", "symm_mem", "static_runtime", "inductor", "inductor_prims", "rngprims", "debugprims", "_native", "_dtensor", "_test", "onnx", "export", "_caffe2"};

namespace message {
inline std::string not_found(const std::string& path) { return std::string("package not found: ") + path + std::string("; check the path or convert the model first"); }
inline std::string torchscript_file(const std::string& path) { return path + std::string(" is a TorchScript archive (or a torch.save file), not a jit2triton package; convert it with `jit2triton convert`"); }
inline std::string format_1(const std::string& path, const std::string& version) { return path + std::string(" is a package of format 1 (written by an earlier jit2triton 0.1); this jit2triton reads format ") + version + std::string(": convert the model again"); }
inline std::string unreadable(const std::string& path, const std::string& reason) { return path + std::string(" is not a readable jit2triton package (") + reason + std::string("); it may be truncated or corrupted. Copy it again or re-run `jit2triton convert`"); }
inline std::string incomplete(const std::string& path, const std::string& member) { return path + std::string(" has no ") + member + std::string(": it is not a complete jit2triton package; re-run `jit2triton convert`"); }
inline std::string checksums_damaged(const std::string& path) { return path + std::string(": checksums.json is damaged; re-run `jit2triton convert`"); }
inline std::string checksum_fails(const std::string& path, const std::string& member) { return path + std::string(": member ") + member + std::string(" fails its checksum, so the package was modified or corrupted; copy it again or re-run `jit2triton convert`"); }
inline std::string member_missing(const std::string& path, const std::string& member) { return path + std::string(" lacks member ") + member + std::string("; re-run `jit2triton convert`"); }
inline std::string manifest_unreadable(const std::string& path) { return path + std::string(": manifest.json is damaged; re-run `jit2triton convert`"); }
inline std::string not_a_package(const std::string& path) { return path + std::string(" is a torch archive but not a jit2triton package"); }
inline std::string newer_format(const std::string& path, const std::string& found, const std::string& version) { return path + std::string(" uses package format ") + found + std::string(", newer than this jit2triton reads (") + version + std::string("); upgrade jit2triton (pip install -U jit2triton)"); }
inline std::string unknown_format(const std::string& path, const std::string& version) { return path + std::string(" names a package format no jit2triton wrote (this one reads format ") + version + std::string("); the package is corrupted: re-run `jit2triton convert`"); }
inline std::string no_weights_index() { return std::string("the package's manifest is damaged (its weights index is not an object); re-run `jit2triton convert`"); }
inline std::string unknown_dtype(const std::string& name, const std::string& dtype) { return std::string("weight ") + name + std::string(" has dtype ") + dtype + std::string(", which no jit2triton writes; the package is corrupted"); }
inline std::string weight_outside(const std::string& name) { return std::string("weight ") + name + std::string(" lies outside weights.bin; the package is corrupted"); }
inline std::string weight_shape(const std::string& name) { return std::string("weight ") + name + std::string("'s shape does not match its bytes; the package is corrupted"); }
inline std::string weight_order(const std::string& name) { return std::string("weight ") + name + std::string("'s memory order is not a permutation of its dims; the package is corrupted"); }
inline std::string missing_op(const std::string& op, const std::string& version) { return std::string("op ") + op + std::string(" does not exist in this torch (") + version + std::string("); the package needs a torch that has it (convert and run with the same torch version)"); }
inline std::string library_op(const std::string& op, const std::string& library) { return std::string("op ") + op + std::string(" is not registered in this process: it belongs to the library ") + library + std::string(", not to torch. Load that library's ops before the package, as torch.jit.load needs too: from Python, import the module that registers them (`import ") + library + std::string("` for most), or pass `--import ") + library + std::string("` to jit2triton's run, bench and serve; from C++, link its ops library"); }
inline std::string packing_op(const std::string& op) { return std::string("the package's plan builds a constant at load with ") + op + std::string(", which is not an op that packs quantized weights; the package is corrupted: re-run `jit2triton convert`"); }
inline std::string packed_missing(const std::string& name) { return std::string("the package's plan reads packed constant ") + name + std::string(", which its packed list does not build before; the package is corrupted: re-run `jit2triton convert`"); }
inline std::string kernel_sizes(const std::string& kernel) { return std::string("kernel ") + kernel + std::string(" takes other sizes than the manifest says; re-run `jit2triton convert`"); }
inline std::string kernel_numbers(const std::string& kernel) { return std::string("kernel ") + kernel + std::string(" takes other arguments by value than the manifest says; re-run `jit2triton convert`"); }
inline std::string kernel_unaligned(const std::string& kernel) { return std::string("kernel ") + kernel + std::string("'s unaligned inputs are not argument positions; re-run `jit2triton convert`"); }
inline std::string kernel_zeroed(const std::string& kernel) { return std::string("kernel ") + kernel + std::string("'s zeroed outputs are not output positions; re-run `jit2triton convert`"); }
inline std::string other_torch(const std::string& made_with, const std::string& here) { return std::string("the package was made with torch ") + made_with + std::string(", and this is torch ") + here + std::string(": ATen op schemas and kernels change between minor versions (patch releases may differ). Convert the model again with this torch"); }
inline std::string cpu_kernels(const std::string& device, const std::string& device_repr) { return std::string("the package's kernels are compiled for the CPU and run only there: load it on the CPU (map_location='cpu' from Python, LoadOptions::device = \"cpu\" from C++, --device cpu in j2t-run); to run on ") + device + std::string(", convert the model with device=") + device_repr; }
inline std::string no_cuda(const std::string& built_for) { return std::string("the package was built for ") + built_for + std::string(" and this machine has no CUDA device; run it on a GPU machine or load it on the CPU (map_location='cpu' from Python, LoadOptions::device = \"cpu\" from C++, --device cpu in j2t-run)"); }
inline std::string no_cuda_for_kernels(const std::string& built_for) { return std::string("the package was built for ") + built_for + std::string(" and this machine has no CUDA device; run it on a GPU machine; its GPU kernels cannot run on the CPU, so convert the model again with device='cpu'"); }
inline std::string kernels_elsewhere(const std::string& built_for, const std::string& device, const std::string& device_repr) { return std::string("the package holds kernels compiled for ") + built_for + std::string(" and cannot run on ") + device + std::string("; convert the model again with device=") + device_repr; }
inline std::string new_dtype(const std::string& dtype) { return std::string("the package holds dtype ") + dtype + std::string(", which this jit2triton does not know: a newer jit2triton made it (upgrade: pip install -U jit2triton), or it is damaged (re-run `jit2triton convert`)"); }
inline std::string size_changed(const std::string& index, const std::string& got, const std::string& expected) { return std::string("kernel input ") + index + std::string(" has shape [") + got + std::string("], but the package was converted for [") + expected + std::string("]: a size the package fixed at conversion changed: a scalar input's value, a list input's length, or a count computed from the data (a mask's, nonzero's) that conversion did not see vary. Convert again with example inputs of the values you need; if the shapes and scalars are the example's, please report it with the model"); }
inline std::string unshaped_tensor(const std::string& label) { return label + std::string(" is a tensor whose shape the package's signature does not give; the package is corrupted: re-run `jit2triton convert`"); }
inline std::string missing_engine(const std::string& engine, const std::string& supported) { return std::string("the package's quantized weights are packed for the ") + engine + std::string(" quantized engine, which this torch does not have (it has: ") + supported + std::string("); load it where torch.backends.quantized.supported_engines lists ") + engine + std::string(", or convert the model on this machine (with torch.backends.quantized.engine set to one of those)"); }
}  // namespace message

// as unknown_op in policy.py: `quoted` is repr(op)
inline std::string unknown_op(const std::string& op, const std::string& quoted, const std::string& version) {
  std::string library = op.substr(0, op.find("::"));
  for (const char* name : kTorchNamespaces)
    if (library == name) return message::missing_op(quoted, version);
  return message::library_op(quoted, library);
}

}  // namespace jit2triton::policy
