// jit2triton's C++ runtime: load a .j2t package and run it with no Python in the process.
//
//   auto m = jit2triton::load("model.j2t", "cuda");     // or "cpu", or "" for the device it was built for
//   std::vector<at::Tensor> out = m.forward({x});
//
// The package is read as data (torch's archive container of JSON and raw bytes: no pickle, no Python) and checked as the Python loader
// checks it; the plan then runs generated kernels (a shared library on the CPU, cubins through the CUDA driver on
// the GPU), ATen ops through torch's operator registry, and structured control flow. Every refusal and failure is a
// jit2triton::Error whose message says what is wrong and what to do.
#pragma once

#include <ATen/core/ivalue.h>

#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace jit2triton {

// The package format this runtime reads (deploy/package.py's FORMAT_VERSION).
constexpr int kPackageFormatVersion = 2;

class Error : public std::runtime_error {
 public:
  // The same families as the Python package's exceptions (jit2triton.errors), so errors from C++ and from Python
  // can be told apart the same way.
  enum class Kind {
    Package, CorruptPackage, PackageVersion, PackageDevice, Signature, Input, Step, ModelRaised,
    QuantizedEngine,  // a PackageDevice error: the quantized engine the package's packed weights need is missing
    SizeChanged,      // an Input error: a size the package fixed at conversion changed (Python: SizeChangedError)
  };

  Error(Kind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};

struct LoadOptions {
  std::string device;        // "cpu", "cuda", "cuda:1"; empty: the device the package was built for
  int num_threads = 0;       // OpenMP threads for CPU kernels; 0: at::get_num_threads()
  bool cuda_graphs = true;   // run a straight-line GPU plan as one CUDA graph
  bool alias_outputs = false;  // with CUDA graphs: return the graph's own output buffers (the next call reuses them)
  // false: the file is read once into memory the module owns, so a later change to the file (or its truncation)
  // cannot reach it, as with torch::jit::load. true: weights stay views of the mapped file (no copy; the file must
  // not change); every other member is still copied before it is checked.
  bool mmap = false;
  // Paths of Ed25519 public keys (PEM, as `jit2triton keygen` writes them), joined by those in the
  // JIT2TRITON_TRUSTED_KEYS environment variable (':'-separated). When any is set, a package that none of them
  // signed is refused (Error::Kind::Signature) before its manifest is read or any of its code is loaded.
  std::vector<std::string> trusted_keys;
  // Whether JIT2TRITON_TRUSTED_KEYS joins them. The Python extension passes the complete list (Python's loader
  // joins the variable itself; conversion's checks of a package it just built pass none).
  bool keys_from_environment = true;
};

class Plan;  // the loaded plan (internal)
struct StateStore;  // the attributes the model writes, shared by its methods (internal)

// One plan step's time in a profile (Module::set_profiling): wall time exclusive of the steps it holds (a loop, a
// branch, a region is charged only for what its inner steps do not account for), summed over the profiled calls.
struct StepTime {
  int node;            // the step's node in the package's manifest ("nodes")
  std::string op;      // what ran: the op ("aten::linear"), or "kernel NAME" for a generated kernel
  std::string source;  // the model source line it came from, where known
  double seconds;
  int64_t runs;        // how often it ran (a step in a loop runs once per trip)
};

// What a step made, as Module::observe hands it over: the step's node and its outputs (tensors cloned).
struct StepOutputs {
  int node;
  std::vector<c10::IValue> outputs;
};
using StepObserver = std::function<void(int node, const std::vector<c10::IValue>& outputs)>;

class Module {
 public:
  // Runs the model; the outputs (a tensor, or tuples, lists and dicts of them) flattened into tensors, in order.
  std::vector<at::Tensor> forward(const std::vector<c10::IValue>& inputs) const;
  // Runs the model and returns its output with its structure, as TorchScript's forward does, but that a NamedTuple
  // comes back as a plain tuple of its fields, in order: the package records a NamedTuple's name and field names
  // (signature()), not the field types a c10 NamedTuple type is made of, and torch's conversion of such a tuple to
  // Python makes a new class per call. The Python face (deploy/cpp_runtime.py) rebuilds the NamedTuples.
  c10::IValue call(const std::vector<c10::IValue>& inputs) const;

  // The inputs as `call` takes them (defaults filled, each checked against the signature, in the layout the
  // kernels read), or Error(Input) saying what is wrong: a server checks each request before it joins a batch.
  std::vector<c10::IValue> check_inputs(const std::vector<c10::IValue>& inputs) const;

  std::string device() const;  // where it runs: "cpu", "cuda:0"
  std::string signature() const;  // "(x: float32[4, 4]) -> float32[4]"
  bool uses_cuda_graph() const;
  // Random inputs that fit the signature (integer tensors within the range the example inputs spanned; scalars
  // take the example's value), for smoke tests and benchmarks. `sizes` picks dynamic dims' sizes by name (the
  // others take the example's).
  std::vector<c10::IValue> random_inputs(uint64_t seed = 0, const std::map<std::string, int64_t>& sizes = {}) const;
  // The package's members (name -> bytes) as read and checked at load: exactly what the module runs, valid while
  // it lives (for reports and re-saving, without reading the file again); and its weights as unpacked from them
  // (on the CPU, sharing those bytes).
  std::map<std::string, std::string_view> members() const;
  std::map<std::string, at::Tensor> weights() const;

  // The model's other methods converted with it (`@torch.jit.export def encode`), as TorchScript's module has
  // them: `m.method("encode").call({x})`. They share the module's state (attributes the model writes).
  std::vector<std::string> method_names() const;
  Module method(const std::string& name) const;  // throws Error(Input) naming the methods there are

  // Per-step timers (`jit2triton bench --profile`, `j2t-run --profile`): while on, every step of forward is timed,
  // CUDA work synchronised around each (load with cuda_graphs = false to see a GPU plan's steps). Turning it on
  // clears the times. Off, a call pays one pointer test per step. Profile one caller at a time.
  void set_profiling(bool on, bool host_only = false) const;  // host_only: no synchronisation around steps
  std::vector<StepTime> step_times() const;  // since profiling was turned on, in plan order

  // Conversion's culprit search (deploy/packaging/culprit.py): runs the plan on `inputs` (the model's, then the
  // values of its state, as the plan takes them) and returns what each step made, in the order made, at most
  // `per_node` times per node (a loop's iterations), tensors cloned. A step that fails ends the run: what came
  // before it is returned. Load with cuda_graphs = false; not alongside other calls.
  std::vector<StepOutputs> observe(const std::vector<c10::IValue>& inputs, int per_node) const;

  // The attributes the model writes (`self.calls`, a cache), as torch.jit's module shows them between calls: the
  // names, and a copy of one's current value (tensors cloned: changing it changes nothing in the module). Throws
  // Error(Input) for a name the package holds no state under.
  std::vector<std::string> attribute_names() const;
  c10::IValue attribute(const std::string& name) const;

  using Methods = std::map<std::string, std::shared_ptr<Plan>>;
  explicit Module(std::shared_ptr<Plan> plan, std::shared_ptr<const Methods> methods = nullptr,
                  std::shared_ptr<StateStore> state = nullptr)
      : plan_(std::move(plan)), methods_(std::move(methods)), state_(std::move(state)) {}

 private:
  std::shared_ptr<Plan> plan_;
  std::shared_ptr<const Methods> methods_;
  std::shared_ptr<StateStore> state_;
};

Module load(const std::string& path, const LoadOptions& options = {});
Module load(const std::string& path, const std::string& device);

}  // namespace jit2triton
