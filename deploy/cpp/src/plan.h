// The execution plan of a package, compiled once at load into closures over numbered slots (as conversion's reference
// interpreter, deploy/packaging/interpreter.py, does in Python): a call copies its inputs into slots, runs the
// steps, reads the outputs.
#pragma once

#include <ATen/core/List.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>
#include <c10/core/Device.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "jit2triton/jit2triton.h"
#include "json.h"
#include "literals.h"
#include "package.h"
#include "policy.h"
#include "state.h"

namespace jit2triton {

// A call's values: the plan's numbered slots, and one operand stack that its op steps share, as TorchScript's
// interpreter keeps one per frame: a step pushes its arguments, the op pops them and pushes its results, and no step
// allocates a stack of its own.
struct Env {
  explicit Env(size_t num_slots) : slots(num_slots) { stack.reserve(8); }
  c10::IValue& operator[](size_t slot) { return slots[slot]; }
  const c10::IValue& operator[](size_t slot) const { return slots[slot]; }
  std::vector<c10::IValue> slots;
  torch::jit::Stack stack;  // empty between steps
};
// An argument: a slot read at run time, or a value fixed at load (a literal or a weight).
struct Ref {
  int slot = -1;
  c10::IValue constant;
  const c10::IValue& get(const Env& env) const { return slot >= 0 ? env[slot] : constant; }
};

// A generated kernel: reads `inputs`, writes `outputs` (allocated by the caller in the planned shape and dtype);
// `sizes` are the call's values of the dynamic dims it takes (the kernel's manifest "sizes"), or null.
using Launcher = std::function<void(std::vector<at::Tensor>& inputs, std::vector<at::Tensor>& outputs,
                                    const int64_t* sizes)>;
using Launchers = std::map<std::string, Launcher>;

// A backend's kernel loader (emitters/backends.py names it as its `cpp_loader`): every kernel of the package,
// loaded for `device`; `num_threads` (0: torch's count) is for loaders whose kernels take a thread count.
using KernelLoader = Launchers (*)(const Package& pkg, c10::Device device, int num_threads);
Launchers load_cpu_kernels(const Package& pkg, c10::Device device, int num_threads);
Launchers load_cuda_kernels(const Package& pkg, c10::Device device, int num_threads);
// Where the loader of Triton kernels on the CPU is set (the Python extension sets one that runs them under Triton's
// interpreter, in Python), load_cuda_kernels hands a CPU device to it; the C++ loader sets none, and refuses.
void set_interpreted_kernels(KernelLoader loader);
// Where set (the Python extension sets one that compiles, in Python), a C++ kernel library built for another CPU is
// rebuilt from the package's bundled source by `rebuilder(library, source, isa)`, which returns the new library's
// bytes; the C++ loader sets none, and refuses such a package.
using LibraryRebuilder = std::string (*)(std::string_view library, std::string_view source, const std::string& isa);
void set_library_rebuilder(LibraryRebuilder rebuilder);
// Where set (the Python extension sets one that compiles with Triton, in Python), cubins built for another GPU are
// rebuilt for this one (sm_`arch`) from the bundled sources: the package's Triton section with the rebuilt entries,
// and each kernel's new cubin by name. The C++ loader sets none, and refuses such a package.
struct RebuiltCubins {
  json::Value section;
  std::map<std::string, std::string> cubins;
};
using CubinRebuilder = RebuiltCubins (*)(const Package& pkg, int64_t arch, c10::Device device);
void set_cubin_rebuilder(CubinRebuilder rebuilder);

// A size in a plan: an int, or a polynomial over the dynamic dims ([[coef, [dim, ...]], ...], deploy/sizes.py),
// with each dim as its index into the call's dims (the plan's "dims" order).
struct Size {
  std::vector<std::pair<int64_t, std::vector<size_t>>> terms;  // a static size is one term with no dims
  int64_t operator()(const int64_t* dims) const {
    int64_t total = 0;
    for (const auto& [coef, names] : terms) {
      int64_t term = coef;
      for (size_t d : names) term *= dims[d];
      total += term;
    }
    return total;
  }
  bool dynamic() const { return terms.size() != 1 || !terms[0].second.empty(); }
};

inline size_t dim_index(const std::vector<std::string>& dims, const std::string& name) {
  auto it = std::find(dims.begin(), dims.end(), name);
  if (it == dims.end())
    throw Error(Error::Kind::CorruptPackage, "the package's plan is damaged (a kernel size names dim " + repr(name) +
                                                 ", which the plan does not read); " + policy::kReconvert);
  return static_cast<size_t>(it - dims.begin());
}

inline Size parse_size(const json::Value& v, const std::vector<std::string>& dims) {
  Size size;
  if (!v.is_array()) {
    size.terms.push_back({v.as_int(), {}});
    return size;
  }
  for (const auto& term : v.items) {
    std::vector<size_t> names;
    for (const auto& n : term[1].items) names.push_back(dim_index(dims, n.as_string()));
    size.terms.push_back({term[0].as_int(), std::move(names)});
  }
  return size;
}

class GraphRunner;
struct Step;

// The per-step timers of a profiled plan: exclusive wall time per node, as bench's Python StepProfiler keeps it.
class StepProfile {
 public:
  // `host_only`: no synchronisation around a step, so each step's time is its host work (and any wait for the
  // device the step itself makes): where a host-bound call spends its time
  StepProfile(c10::Device device, bool host_only) : device_(device), host_only_(host_only) {}
  void time(const Step& step, Env& env);
  struct Row {
    double seconds = 0;
    int64_t runs = 0;
  };
  const std::map<int, Row>& rows() const { return rows_; }

 private:
  void synchronize() const;
  c10::Device device_;
  bool host_only_;
  std::map<int, Row> rows_;
  std::vector<double> inner_;  // per open step: the time its inner steps took
};

struct Step {
  std::function<void(Env&)> run;
  int node;
  std::vector<int> outs;  // the slots it writes, for an observer (Plan::observe); none for a region's `graph` step
};

class Plan {
 public:
  // `state`: the module state this plan shares with the loaded module's other methods (state.h); null: its own
  Plan(Package pkg, const LoadOptions& options, std::shared_ptr<StateStore> state = nullptr);
  ~Plan();

  c10::IValue call(std::vector<c10::IValue> inputs) const;  // checks the inputs first
  // The inputs as call takes them (defaults filled, each checked, in the layout the kernels read), or Error(Input)
  std::vector<c10::IValue> checked_inputs(std::vector<c10::IValue> inputs) const;
  c10::IValue run(std::vector<c10::IValue> inputs) const;   // trusts them
  std::string signature() const;
  const Package& package() const { return pkg_; }
  void set_profiling(bool on, bool host_only = false);
  std::vector<StepTime> step_times() const;
  // Runs the plan on `inputs` (the model's, then the module state's values, in the plan's order) and hands each
  // step's outputs to `seen` as the step finishes (conversion's culprit search: Module::observe). Not alongside
  // other calls of this plan.
  c10::IValue observe(std::vector<c10::IValue> inputs, const StepObserver& seen) const;
  // Random inputs that fit the signature; `sizes` sets dynamic dims (the others take the example's size).
  std::vector<c10::IValue> random_inputs(uint64_t seed, const std::map<std::string, int64_t>& sizes = {}) const;

  c10::Device device;
  bool uses_cuda_graph = false;

 private:
  std::vector<c10::IValue> draw_inputs(uint64_t seed, const std::map<std::string, int64_t>& sizes) const;
  friend class Builder;
  Package pkg_;
  std::string built_for_;
  Launchers kernels_;
  std::vector<Step> steps_;
  std::vector<int> input_slots_;
  std::vector<std::function<const c10::IValue&(const Env&)>> outputs_;
  int num_slots_ = 0;
  // Dynamic dims, as one call binds them: each dim's size (-1: not yet) and the input axis that set it.
  struct Bound {
    std::vector<int64_t> size;
    std::vector<std::string> where;
  };
  std::vector<std::string> dim_names_;
  // Where each dynamic dim is read per call (plan "dims": input position and axis), in dim_names_ order; the
  // values go into the slot after the plan's own, for the kernels that take them.
  std::vector<std::pair<size_t, int64_t>> dim_sources_;
  std::vector<std::string> plan_dims_;  // their names, in that order, then the bound dims' (plan "bound_dims")
  size_t bound_dims_ = 0;  // sizes steps bind from the tensors they make (transpiler/bind_sizes.py): -1 until then
  using InputCheck = std::function<void(c10::IValue&, Bound&)>;  // throws Error(Input); may replace the value
  std::vector<InputCheck> checks_;  // per input
  struct DimRange {
    int64_t min, max;  // max -1: no upper bound
  };
  std::vector<std::string> input_names_;
  std::vector<c10::IValue> defaults_;  // per input; None marks "no default" when has_default_ is false
  std::vector<bool> has_default_;
  size_t required_ = 0;
  std::shared_ptr<GraphRunner> graph_;
  std::unique_ptr<ModelState> state_;
  std::set<std::string> host_weights_;  // weights the plan keeps on the CPU in a GPU package  // the module attributes the model writes (state.h), or null
  bool region_graphs_ = false;  // run `graph` steps as CUDA graphs (else as their steps)
  // The arena (transpiler/plan_arena.py): planned kernel outputs as fixed views into one buffer. A call takes a
  // made arena from the spares (or makes one) and gives it back when done, so concurrent calls never share one;
  // kernel steps find its views in the env's slot after the dims'.
  struct ArenaView {
    int64_t offset;  // bytes
    std::vector<int64_t> shape, strides;
    at::ScalarType dtype;
  };
  int64_t arena_bytes_ = 0;
  std::vector<ArenaView> arena_views_;
  mutable std::mutex arena_mutex_;
  mutable std::vector<c10::List<at::Tensor>> spare_arenas_;
  c10::List<at::Tensor> take_arena() const;
  void give_back_arena(c10::List<at::Tensor> arena) const;

  std::unique_ptr<StepProfile> profile_;  // null unless profiling: run_steps times each step through it
  mutable const StepObserver* observer_ = nullptr;  // set for one observe() call

  void run_steps(const std::vector<Step>& steps, Env& env) const;
  void build_input_checks();  // signature.cpp
  InputCheck input_check(const json::Value& d, const std::string& label, const std::vector<DimRange>& ranges,
                         bool contiguous) const;
  InputCheck container_check(const json::Value& d, const std::string& label, const std::vector<DimRange>& ranges,
                             bool contiguous) const;
  [[noreturn]] void step_failed(int node, const std::string& what) const;
};

// CUDA graphs (cuda_graph.cpp): a whole straight-line plan captured once per tuple of scalar inputs (and input
// shapes, `by_shape`, for a package with dynamic dims), replayed.
std::shared_ptr<GraphRunner> make_graph_runner(std::function<c10::IValue(std::vector<c10::IValue>)> run,
                                               bool alias_outputs, bool by_shape);
c10::IValue run_graph(GraphRunner& runner, std::vector<c10::IValue> inputs);
// A plan's `graph` step (a region of a plan with control flow): `run` runs its steps on the given inputs and
// returns its outputs. replay_region fills `outputs` and returns true when a captured graph ran; false tells the
// caller to run the steps itself. make_region_graphs returns null when built without CUDA.
class RegionGraphs;
using RegionRun = std::function<std::vector<c10::IValue>(const std::vector<c10::IValue>&)>;
std::shared_ptr<RegionGraphs> make_region_graphs(RegionRun run, int launches);
bool replay_region(RegionGraphs& region, const std::vector<c10::IValue>& inputs, std::vector<c10::IValue>& outputs);
bool region_may_replay(const RegionGraphs& region);  // false: its steps sync with the host, so it never will

std::string join_dims(at::IntArrayRef dims);  // "2, 3"

}  // namespace jit2triton
