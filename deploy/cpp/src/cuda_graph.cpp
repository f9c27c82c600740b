// Plans as CUDA graphs (the reference interpreter has none). A straight-line GPU plan runs whole as graphs captured once
// per tuple of scalar inputs (which a graph bakes in); a call copies the inputs into the graph's static buffers and
// replays it. Whether a plan qualifies was decided at convert time (the manifest's "cuda_graph"). A plan with
// control flow runs its `graph` steps (regions, deploy/packaging/graph_regions.py) as graphs keyed by their inputs' layouts
// and scalar values.
#include "graph_admission.h"
#include "plan.h"
#include "policy.h"

#ifdef J2T_WITH_CUDA

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <set>

namespace jit2triton {

namespace {

using policy::kCopyBytesPerUs;  // deploy/policy.py
using policy::kLaunchUs;
using policy::kMaxSeen;
using policy::kReplayLaunches;

// `n` after `tag`, then `end`, written in place: a key is built every time a region or a plan runs, so no
// temporary strings
void append(std::string& key, char tag, int64_t n, char end) {
  char digits[24];
  auto written = std::to_chars(digits, digits + sizeof digits, n).ptr;
  key += tag;
  key.append(digits, written);
  key += end;
}

// What a graph is specialised to: each tensor's layout (when `layouts`) and each other value, exactly (doubles by
// their bits). False when a value must not be captured: a CPU tensor (a graph reads its values on the host once,
// at capture) or a container (its tensors would not be copied into static buffers). Built with string appends:
// iostreams in an extension module can meet another libstdc++'s locale (a crash seen on the GPU machine).
// The math modes a capture bakes in (the kernels cuDNN and cuBLAS chose under them): TF32 for convolutions and
// GEMMs, reduced-precision GEMM reductions, deterministic and benchmarked cuDNN. A graph captured with TF32 off
// (verification compares in exact float32) replayed its float32 kernels after TF32 came back on: FCOS at 0.80x
// TorchScript where it runs at 1.20x. A getter that refuses a mix of torch's old and new precision settings
// counts as a mode of its own.
void append_math_mode(std::string& key) {
  auto& context = at::globalContext();
  auto flag = [&](auto get) -> int {
    try {
      return static_cast<int>(get());
    } catch (const c10::Error&) {
      return 9;
    }
  };
  key += 'M';
  key += static_cast<char>('0' + flag([&] { return context.allowTF32CuDNN(); }));
  key += static_cast<char>('0' + flag([&] { return context.allowTF32CuBLAS(); }));
  key += static_cast<char>('0' + flag([&] { return context.float32MatmulPrecision(); }));
  key += static_cast<char>('0' + flag([&] { return context.allowFP16ReductionCuBLAS(); }));
  key += static_cast<char>('0' + flag([&] { return context.allowBF16ReductionCuBLAS(); }));
  key += static_cast<char>('0' + flag([&] { return context.deterministicCuDNN(); }));
  key += static_cast<char>('0' + flag([&] { return context.benchmarkCuDNN(); }));
  key += ';';
}

bool graph_key(const std::vector<c10::IValue>& values, bool layouts, std::string& key) {
  key.clear();
  append_math_mode(key);
  for (const auto& v : values) {
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (!t.is_cuda()) return false;
      if (!layouts) continue;
      append(key, 'T', static_cast<int>(t.scalar_type()), '@');
      append(key, '@', t.get_device(), '[');
      for (auto d : t.sizes()) append(key, ',', d, ',');
      key += '/';
      for (auto d : t.strides()) append(key, ',', d, ',');
      key += ']';
    } else if (v.isDouble()) {
      double d = v.toDouble();
      int64_t bits;
      std::memcpy(&bits, &d, sizeof bits);
      append(key, 'D', bits, ';');
    } else if (v.isInt()) {
      append(key, 'I', v.toInt(), ';');
    } else if (v.isBool()) {
      key += v.toBool() ? "B1;" : "B0;";
    } else if (v.isNone()) {
      key += "N;";
    } else if (v.isString()) {
      const std::string& text = v.toStringRef();
      key += "S" + std::to_string(text.size()) + ":" + text + ";";
    } else if (v.isDevice()) {
      key += "V" + v.toDevice().str() + ";";
    } else {
      return false;
    }
  }
  return true;
}

// A graph's buffer for an input, in the input's own strides where they allow it (a strided view stays strided, so
// a kernel that indexes it with those strides needs no copy inside the graph); an expanded input is cloned.
at::Tensor static_copy(const at::Tensor& x) {
  for (auto s : x.strides())
    if (s == 0) return x.clone();
  return at::empty_strided(x.sizes(), x.strides(), x.options()).copy_(x);
}

int64_t tensor_bytes(const std::vector<c10::IValue>& values) {
  int64_t bytes = 0;
  for (const auto& v : values)
    if (v.isTensor()) bytes += v.toTensor().numel() * v.toTensor().element_size();
  return bytes;
}

// `from` into `to`: small tensors in one launch (a multi-tensor copy), large ones each on its own (a memcpy, several
// times faster per byte than the multi-tensor copy).
void copy_tensors(const std::vector<at::Tensor>& to, const std::vector<at::Tensor>& from) {
  std::vector<at::Tensor> small_to, small_from;
  for (size_t i = 0; i < to.size(); ++i) {
    if (to[i].numel() * static_cast<int64_t>(to[i].element_size()) >= policy::kOwnCopyBytes) {
      to[i].copy_(from[i]);
    } else {
      small_to.push_back(to[i]);
      small_from.push_back(from[i]);
    }
  }
  if (!small_to.empty()) at::_foreach_copy_(small_to, small_from);
}

// The inputs into a graph's buffers.
void copy_in(std::vector<c10::IValue>& statics, const std::vector<c10::IValue>& inputs) {
  std::vector<at::Tensor> to, from;
  for (size_t i = 0; i < statics.size(); ++i)
    if (statics[i].isTensor()) {
      to.push_back(statics[i].toTensor());
      from.push_back(inputs[i].toTensor());
    }
  copy_tensors(to, from);
}

c10::IValue copy_out(const c10::IValue& v);

// Copies of a region's outputs, the plain tensors among them copied as the inputs are.
std::vector<c10::IValue> copy_outputs(const std::vector<c10::IValue>& outputs) {
  std::vector<c10::IValue> copied;
  std::vector<at::Tensor> fresh, from;
  std::vector<size_t> where;
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (outputs[i].isTensor()) {
      from.push_back(outputs[i].toTensor());
      fresh.push_back(at::empty_like(from.back()));
      where.push_back(i);
      copied.emplace_back();
    } else {
      copied.push_back(copy_out(outputs[i]));
    }
  }
  copy_tensors(fresh, from);
  for (size_t k = 0; k < where.size(); ++k) copied[where[k]] = fresh[k];
  return copied;
}

c10::IValue copy_out(const c10::IValue& v) {
  if (v.isTensor()) return v.toTensor().clone();
  if (v.isTuple()) {
    std::vector<c10::IValue> items;
    for (const auto& x : v.toTupleRef().elements()) items.push_back(copy_out(x));
    return c10::ivalue::Tuple::create(std::move(items));
  }
  if (v.isList()) {
    auto list = v.toList();
    c10::impl::GenericList out(list.elementType());
    for (const auto& x : list) out.push_back(copy_out(x));
    return out;
  }
  if (v.isGenericDict()) {
    auto dict = v.toGenericDict();
    c10::impl::GenericDict out(dict.keyType(), dict.valueType());
    for (const auto& kv : dict) out.insert(kv.key(), copy_out(kv.value()));
    return out;
  }
  return v;
}

}  // namespace

// Runs `run` outside a graph on a side stream (lazy initialisation, per-stream library state such as cuBLAS
// workspaces) with synchronising CUDA calls turned into errors. Returns false when the work syncs with the host (an
// op sizes its result by the data): a capture of it would fail, and a failed capture leaves torch's allocator and
// random generators in capture mode, so it must be found here, before capturing.
// Held while a graph is warmed up and captured: the sync-debug mode and the capture itself are global to the
// process, so two captures must not overlap (a thread that syncs while another warms up gets the error too).
std::mutex& capturing() {
  static std::mutex m;
  return m;
}

// Captures `run` into `graph` (in `pool` when given); false, with the capture ended, when it fails.
template <typename Run>
bool capture_into(at::cuda::CUDAGraph& graph, const Run& run, const decltype(at::cuda::graph_pool_handle())* pool) {
  try {
    at::cuda::CUDAStreamGuard guard(at::cuda::getStreamFromPool());
    if (pool) graph.capture_begin(*pool); else graph.capture_begin();
    try {
      run();
    } catch (...) {
      try {
        graph.capture_end();
      } catch (...) {
      }
      throw;
    }
    graph.capture_end();
  } catch (...) {  // a sync the debug mode missed: the step-by-step run that follows raises any real error itself
    (void)cudaGetLastError();
    return false;
  }
  return true;
}

bool warm_up(const std::function<void()>& run, int times) {
  auto current = at::cuda::getCurrentCUDAStream();
  auto side = at::cuda::getStreamFromPool();
  auto& state = c10::cuda::warning_state();
  auto previous = state.get_sync_debug_mode();
  bool ok = true;
  {
    at::cuda::CUDAStreamGuard guard(side);
    current.synchronize();
    state.set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
    try {
      for (int i = 0; i < times; ++i) run();
    } catch (const std::exception& err) {
      state.set_sync_debug_mode(previous);
      if (std::string(err.what()).find("synchroniz") == std::string::npos) throw;
      ok = false;
    }
    state.set_sync_debug_mode(previous);
    side.synchronize();
  }
  return ok;
}

class GraphRunner {
 public:
  GraphRunner(std::function<c10::IValue(std::vector<c10::IValue>)> run, bool alias_outputs, bool by_shape)
      : run_(std::move(run)), alias_outputs_(alias_outputs), by_shape_(by_shape) {}

  c10::IValue operator()(std::vector<c10::IValue> inputs) {
    std::string key;
    // a graph bakes its shapes in: keyed by them when the package has dynamic dims, else the input check fixed them
    if (!graph_key(inputs, /*layouts=*/by_shape_, key)) return run_(std::move(inputs));
    std::lock_guard<std::mutex> lock(mutex_);  // replays share the static buffers
    if (refused_) return run_(std::move(inputs));
    admission_.sighted(key);
    auto it = graphs_.find(key);
    if (it == graphs_.end()) {
      // The first call with these scalars runs step by step, the second captures: a cold start pays no capture.
      if (!admission_.admit(key, graphs_)) return run_(std::move(inputs));
      auto captured = capture(inputs);
      if (!captured) {
        refused_ = true;  // the plan syncs with the host: it always runs step by step
        return run_(std::move(inputs));
      }
      admission_.make_room(graphs_);
      it = graphs_.emplace(key, std::move(captured)).first;
    }
    Captured& g = *it->second;
    copy_in(g.inputs, inputs);
    g.graph.replay();
    return alias_outputs_ ? g.outputs : copy_out(g.outputs);
  }

 private:
  struct Captured {
    std::vector<c10::IValue> inputs;
    at::cuda::CUDAGraph graph;
    c10::IValue outputs;
  };

  std::unique_ptr<Captured> capture(const std::vector<c10::IValue>& inputs) {
    auto g = std::make_unique<Captured>();
    for (const auto& x : inputs) g->inputs.push_back(x.isTensor() ? c10::IValue(x.toTensor().clone()) : x);
    std::lock_guard<std::mutex> lock(capturing());
    if (!warm_up([&] { run_(g->inputs); }, 2)) return nullptr;
    if (!capture_into(g->graph, [&] { g->outputs = run_(g->inputs); }, nullptr)) return nullptr;
    return g;
  }

  std::function<c10::IValue(std::vector<c10::IValue>)> run_;
  bool alias_outputs_, by_shape_;
  bool refused_ = false;
  std::mutex mutex_;
  std::map<std::string, std::unique_ptr<Captured>> graphs_;
  Admission admission_;
};

// One `graph` step: graphs keyed by its inputs' layouts and scalar values, each captured on the second time its key
// is seen, at most kMaxGraphs (Admission). A key whose graph would cost more in copies than it saves in launches, or whose
// warm-up syncs with the host, runs step by step from then on. Outputs are always copies: inside
// a loop the next iteration's replay overwrites the graph's memory.
class RegionGraphs {
 public:
  RegionGraphs(RegionRun run, int launches) : run_(std::move(run)), launches_(launches) {}

  // False once a warm-up found that the region's steps sync with the host (an index by a mask, a nonzero): they do
  // whatever the key, so from then on it runs step by step with no key built, as a whole plan does (GraphRunner).
  bool may_replay() const { return !syncs_.load(std::memory_order_relaxed); }

  bool operator()(const std::vector<c10::IValue>& inputs, std::vector<c10::IValue>& outputs) {
    if (!may_replay()) return false;
    thread_local std::string key;  // (keeps its capacity from run to run)
    if (!graph_key(inputs, /*layouts=*/true, key)) return false;
    std::lock_guard<std::mutex> lock(mutex_);
    admission_.sighted(key);
    auto it = graphs_.find(key);
    if (it == graphs_.end()) {
      if (refused_.count(key) || !admission_.admit(key, graphs_)) return false;
      auto captured = capture(inputs);
      if (!captured) {
        if (refused_.size() >= kMaxSeen) refused_.clear();
        refused_.insert(key);
        return false;
      }
      admission_.make_room(graphs_);
      it = graphs_.emplace(key, std::move(captured)).first;
    }
    Captured& g = *it->second;
    copy_in(g.inputs, inputs);
    g.graph.replay();
    outputs = copy_outputs(g.outputs);
    return true;
  }

 private:
  struct Captured {
    std::vector<c10::IValue> inputs, outputs;
    at::cuda::CUDAGraph graph;
  };

  // A replay costs three launches (the copy in, the graph, the copy out) and the bytes it copies.
  bool worth(int64_t bytes) const { return launches_ > kReplayLaunches && bytes / kCopyBytesPerUs < kLaunchUs * launches_; }

  std::unique_ptr<Captured> capture(const std::vector<c10::IValue>& inputs) {
    int64_t bytes = tensor_bytes(inputs);
    if (!worth(bytes)) return nullptr;
    auto g = std::make_unique<Captured>();
    for (const auto& x : inputs) g->inputs.push_back(x.isTensor() ? c10::IValue(static_copy(x.toTensor())) : x);
    std::lock_guard<std::mutex> lock(capturing());
    if (!warm_up([&] { run_(g->inputs); }, 1)) {
      syncs_ = true;
      return nullptr;
    }
    if (!pool_set_) {
      pool_ = at::cuda::graph_pool_handle();  // shared by this region's graphs: they never run at once
      pool_set_ = true;
    }
    if (!capture_into(g->graph, [&] { g->outputs = run_(g->inputs); }, &pool_)) return nullptr;
    bytes += tensor_bytes(g->outputs);
    if (!worth(bytes)) return nullptr;
    return g;
  }

  RegionRun run_;
  int launches_;
  std::atomic<bool> syncs_{false};
  std::mutex mutex_;
  std::map<std::string, std::unique_ptr<Captured>> graphs_;
  Admission admission_;
  std::set<std::string> refused_;
  decltype(at::cuda::graph_pool_handle()) pool_{0, 0};
  bool pool_set_ = false;
};

std::shared_ptr<GraphRunner> make_graph_runner(std::function<c10::IValue(std::vector<c10::IValue>)> run,
                                               bool alias_outputs, bool by_shape) {
  return std::make_shared<GraphRunner>(std::move(run), alias_outputs, by_shape);
}

c10::IValue run_graph(GraphRunner& runner, std::vector<c10::IValue> inputs) { return runner(std::move(inputs)); }

std::shared_ptr<RegionGraphs> make_region_graphs(RegionRun run, int launches) {
  return std::make_shared<RegionGraphs>(std::move(run), launches);
}

bool replay_region(RegionGraphs& region, const std::vector<c10::IValue>& inputs, std::vector<c10::IValue>& outputs) {
  return region(inputs, outputs);
}

bool region_may_replay(const RegionGraphs& region) { return region.may_replay(); }

}  // namespace jit2triton

#else

namespace jit2triton {

class GraphRunner {};
class RegionGraphs {};

std::shared_ptr<RegionGraphs> make_region_graphs(RegionRun, int) { return nullptr; }

bool replay_region(RegionGraphs&, const std::vector<c10::IValue>&, std::vector<c10::IValue>&) { return false; }

bool region_may_replay(const RegionGraphs&) { return false; }

std::shared_ptr<GraphRunner> make_graph_runner(std::function<c10::IValue(std::vector<c10::IValue>)>, bool, bool) {
  return nullptr;  // built without CUDA: there are no GPU plans to capture
}

c10::IValue run_graph(GraphRunner&, std::vector<c10::IValue>) {
  throw Error(Error::Kind::PackageDevice, "this jit2triton C++ runtime was built without CUDA");
}

}  // namespace jit2triton

#endif
