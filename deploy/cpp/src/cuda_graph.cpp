// A straight-line GPU plan as CUDA graphs, as deploy/cuda_graph.py does: captured once per tuple of scalar inputs
// (which a graph bakes in), then a call copies the inputs into the graph's static buffers and replays it. Whether a
// plan qualifies was decided at convert time (the manifest's "cuda_graph").
#include "plan.h"

#ifdef J2T_WITH_CUDA

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>

#include <mutex>
#include <set>
#include <sstream>

namespace jit2triton {

namespace {

constexpr size_t kMaxGraphs = 8;  // distinct tuples of scalar inputs kept captured; beyond, calls run step by step

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

class GraphRunner {
 public:
  GraphRunner(std::function<c10::IValue(std::vector<c10::IValue>)> run, bool alias_outputs)
      : run_(std::move(run)), alias_outputs_(alias_outputs) {}

  c10::IValue operator()(std::vector<c10::IValue> inputs) {
    std::ostringstream key;
    for (const auto& x : inputs)
      if (!x.isTensor()) key << x.tagKind() << ':' << x << ';';
    std::lock_guard<std::mutex> lock(mutex_);  // replays share the static buffers
    auto it = graphs_.find(key.str());
    if (it == graphs_.end()) {
      // The first call with these scalars runs step by step, the second captures: a cold start pays no capture.
      if (graphs_.size() >= kMaxGraphs || seen_.insert(key.str()).second) return run_(std::move(inputs));
      it = graphs_.emplace(key.str(), capture(inputs)).first;
    }
    Captured& g = *it->second;
    for (size_t i = 0; i < inputs.size(); ++i)
      if (g.inputs[i].isTensor()) g.inputs[i].toTensor().copy_(inputs[i].toTensor(), /*non_blocking=*/true);
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
    auto current = at::cuda::getCurrentCUDAStream();
    auto side = at::cuda::getStreamFromPool();
    {
      at::cuda::CUDAStreamGuard guard(side);
      side.synchronize();
      current.synchronize();
      for (int i = 0; i < 2; ++i) run_(g->inputs);  // warm-up outside the graph: lazy initialisation, allocator pools
      side.synchronize();
      g->graph.capture_begin();
      g->outputs = run_(g->inputs);
      g->graph.capture_end();
    }
    return g;
  }

  std::function<c10::IValue(std::vector<c10::IValue>)> run_;
  bool alias_outputs_;
  std::mutex mutex_;
  std::map<std::string, std::unique_ptr<Captured>> graphs_;
  std::set<std::string> seen_;
};

std::shared_ptr<GraphRunner> make_graph_runner(std::function<c10::IValue(std::vector<c10::IValue>)> run,
                                               bool alias_outputs) {
  return std::make_shared<GraphRunner>(std::move(run), alias_outputs);
}

c10::IValue run_graph(GraphRunner& runner, std::vector<c10::IValue> inputs) { return runner(std::move(inputs)); }

}  // namespace jit2triton

#else

namespace jit2triton {

class GraphRunner {};

std::shared_ptr<GraphRunner> make_graph_runner(std::function<c10::IValue(std::vector<c10::IValue>)>, bool) {
  return nullptr;  // built without CUDA: there are no GPU plans to capture
}

c10::IValue run_graph(GraphRunner&, std::vector<c10::IValue>) {
  throw Error(Error::Kind::PackageDevice, "this jit2triton C++ runtime was built without CUDA");
}

}  // namespace jit2triton

#endif
