#include "plan.h"
#include "manifest_schema.h"
#include "op_facts.h"
#include "host_ops.h"
#include "plan_check.h"
#include "scalar_ops.h"
#include "policy.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <ATen/ScalarOps.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/jit/runtime/operator.h>
#include <torch/version.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <set>

namespace jit2triton {

using c10::IValue;
using json::Value;

namespace {

// `x` in exactly `strides`: a copy, except that a dim the kernel reads
// broadcast (stride 0, as ATen gave it while converting) keeps stride 0 and only its first element is copied. The
// kernel reads that element for every index of the dim; the values along it are one value repeated (a broadcast),
// however the producer laid them out this time.
at::Tensor into_layout(const at::Tensor& x, at::IntArrayRef strides) {
  at::Tensor source = x;
  bool broadcast = false;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (strides[d] == 0 && x.size(d) > 1) {
      source = source.narrow(d, 0, 1);
      broadcast = true;
    }
  at::Tensor dense = at::empty_strided(source.sizes(), strides, x.options()).copy_(source);
  return broadcast ? dense.as_strided(x.sizes(), strides) : dense;
}

// A host number a kernel takes by value, as the 64 bits its launcher passes: an int's, a float's (a double) IEEE
// bits; the kernel reads them as its i64 or fp64 argument.
int64_t number_bits(const IValue& v) {
  if (v.isInt()) return v.toInt();
  if (v.isDouble()) {
    double x = v.toDouble();
    int64_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    return bits;
  }
  throw std::runtime_error("a kernel takes a number there, and the plan gave it a " + v.tagKind());
}

std::vector<int> ints(const Value* v) {
  std::vector<int> out;
  if (v)
    for (const auto& x : v->items) out.push_back(static_cast<int>(x.as_int()));
  return out;
}

void release(Env& env, const std::vector<int>& slots) {
  for (int s : slots) env[s] = IValue();
}

// A call's size table: every dynamic dim, resolved once at the start of the call (bound ones when the step that
// makes them runs), in one CPU int64 tensor every step reads in place.
at::Tensor size_table(const std::vector<int64_t>& dims) {
  at::Tensor table = at::empty({static_cast<int64_t>(dims.size())}, at::TensorOptions().dtype(at::kLong));
  std::copy(dims.begin(), dims.end(), table.mutable_data_ptr<int64_t>());  // (at::tensor deduces a type and copies through a temporary)
  return table;
}

// A shape or strides list of a plan: fixed (evaluated once, at load), or evaluated at each call's dims.
struct Shape {
  std::vector<Size> sizes;
  std::vector<int64_t> fixed;
  bool dynamic = false;
  at::IntArrayRef at(const int64_t* dims, std::vector<int64_t>& scratch) const {
    if (!dynamic) return fixed;
    scratch.clear();
    for (const auto& s : sizes) scratch.push_back(s(dims));
    return scratch;
  }
};

Shape parse_shape(const Value& list, const std::vector<std::string>& dims) {
  Shape shape;
  for (const auto& v : list.items) {
    shape.sizes.push_back(parse_size(v, dims));
    shape.dynamic |= shape.sizes.back().dynamic();
  }
  if (!shape.dynamic)
    for (const auto& s : shape.sizes) shape.fixed.push_back(s(nullptr));
  return shape;
}

// A control-flow step's condition and trip count, as TorchScript types them (a damaged plan may hold another value
// there: a clean error, not IValue's internal assert)
bool condition_of(const IValue& v) {
  if (!v.isBool()) throw std::invalid_argument("a condition is " + v.tagKind() + ", not a bool");
  return v.toBool();
}

int64_t trip_count_of(const IValue& v) {
  if (!v.isInt()) throw std::invalid_argument("a loop's trip count is " + v.tagKind() + ", not an int");
  return v.toInt();
}

}  // namespace

// ---- compiling the plan -----------------------------------------------------------------------------------------

class Builder {
 public:
  Builder(Plan& plan, const Value& plan_json) : plan_(plan), device_(plan.device) {
    packed_ = build_packed(plan_json.find("packed"), [this](const Value& r) { return ref(r).constant; });
  }

  Ref ref(const Value& r) {
    const std::string& kind = r[0].as_string();
    Ref out;
    if (kind == "s") {
      out.slot = static_cast<int>(r[1].as_int());
    } else if (kind == "w") {
      out.constant = weight(r[1].as_string());
    } else if (kind == "wl") {
      c10::List<at::Tensor> list;
      for (const auto& name : r[1].items) list.push_back(weight(name.as_string()));
      out.constant = list;
    } else if (kind == "p") {
      auto it = packed_.find(r[1].as_string());
      if (it == packed_.end()) throw Error(Error::Kind::CorruptPackage, policy::message::packed_missing(repr(r[1].as_string())));
      out.constant = it->second;
    } else {
      out.constant = decode_literal(r[1], plan_.built_for_, device_);
    }
    return out;
  }

  std::vector<Ref> refs(const Value& v) {
    std::vector<Ref> out;
    for (const auto& r : v.items) out.push_back(ref(r));
    return out;
  }

  std::vector<Step> block(const Value& steps) {
    std::vector<Step> out;
    for (const auto& s : steps.items) {
      std::vector<int> outs;  // (a region's node is its first step's: its outputs are not that node's)
      if (s.at("kind").as_string() != "graph" && s.find("outs") && s.at("outs").is_array())
        for (const auto& o : s.at("outs").items) outs.push_back(static_cast<int>(o.as_int()));
      out.push_back({step(s), static_cast<int>(s.at("node").as_int()), std::move(outs)});
    }
    return out;
  }

 private:
  Plan& plan_;
  c10::Device device_;
  std::map<std::string, at::Tensor> moved_;  // weights on the run device, moved once
  std::map<std::string, IValue> packed_;      // the plan's packed constants (a quantized op's packed weights)

  const at::Tensor& weight(const std::string& name) {
    auto it = moved_.find(name);
    if (it != moved_.end()) return it->second;
    auto w = plan_.pkg_.weights.find(name);
    if (w == plan_.pkg_.weights.end())
      throw Error(Error::Kind::CorruptPackage, "the plan uses weight " + repr(name) + ", which the package lacks; " + policy::kReconvert);
    bool host = plan_.host_weights_.count(name) > 0;  // kept on the CPU (the plan's "host_weights")
    return moved_[name] = w->second.to(host ? c10::Device(c10::kCPU) : device_);
  }

  std::function<void(Env&)> step(const Value& s) {
    const std::string& kind = s.at("kind").as_string();
    if (kind == "call") return call(s);
    if (kind == "kernel") return kernel(s);
    if (kind == "if") return if_(s);
    if (kind == "loop") return loop(s);
    if (kind == "graph") return region(s);
    throw Error(Error::Kind::PackageVersion, "unknown step kind " + repr(kind) + " in the plan; the package needs a newer jit2triton");
  }

  // Sizes a call binds from its outputs into the call's dims (plan step "binds": [name, output, axis]).
  struct Binding {
    size_t dim;
    int slot;
    int64_t axis;
  };

  // The model's source line of the step's node ("file.py:12  text"), "" where the plan has none.
  std::string model_source(const Value& s) const {
    const Value* index = s.find("node");
    const Value* nodes = plan_.pkg_.manifest.find("nodes");
    if (!index || !nodes || index->kind != Value::Kind::Int || !nodes->is_array() || index->as_int() < 0 ||
        size_t(index->as_int()) >= nodes->size())
      return "";
    const Value* source = (*nodes)[index->as_int()].find("source");
    return source && source->is_string() ? source->as_string() : "";
  }

  std::vector<Binding> bindings(const Value& s, const std::vector<int>& outs) {
    std::vector<Binding> found;
    if (const Value* binds = s.find("binds"))
      for (const auto& b : binds->items)
        found.push_back({dim_index(plan_.plan_dims_, b[0].as_string()), outs.at(b[1].as_int()), b[2].as_int()});
    return found;
  }

  static void bind(Env& env, int sizes_slot, const std::vector<Binding>& binds) {
    if (binds.empty()) return;
    int64_t* dims = env[sizes_slot].toTensor().data_ptr<int64_t>();
    for (const auto& b : binds) dims[b.dim] = env[b.slot].toTensor().size(b.axis);
  }

  std::function<void(Env&)> call(const Value& s) {
    const std::string& op = s.at("op").as_string();
    std::vector<Ref> args = refs(s.at("args"));
    std::vector<int> outs = ints(&s.at("outs")), free = ints(s.find("free"));
    std::vector<Binding> binds = bindings(s, outs);
    int sizes_slot = plan_.num_slots_;
    if (auto native = host_ops::step(op, s, args, outs, model_source(s))) {
      if (free.empty() && binds.empty()) return native;
      return [native, free, binds, sizes_slot](Env& env) {
        native(env);
        bind(env, sizes_slot, binds);
        release(env, free);
      };
    }
    auto handle = find_operator(op);
    const auto& schema = handle->schema();
    // TorchScript's interpreter makes some operations per graph node, from the node's attributes (prim::ChunkSizes,
    // prim::rpc_sync): with no node they read through null. Its own prim:: ops of variadic schema are made for its
    // stack (a fusion group, a bailout) and are never a converted model's. A plan calls neither; the host ops above
    // are the prim:: ops this runtime runs that way.
    if (!handle->hasOperation() || (schema.is_vararg() && op.rfind("prim::", 0) == 0)) interpreter_only(op);
    // A stack-based operation pops exactly its schema's arguments: fewer would read past the stack (a hand-edited
    // plan with an emptied argument list freed an invalid pointer; found by tests/mutate_packages.py)
    if (!schema.is_vararg() && args.size() != schema.arguments().size())
      throw Error(Error::Kind::CorruptPackage, "the package's plan calls " + op + " with " +
                                                   std::to_string(args.size()) + " arguments where it takes " +
                                                   std::to_string(schema.arguments().size()) +
                                                   "; the package is damaged: " + policy::kReconvert);
    for (size_t i = 0; i < args.size() && i < schema.arguments().size(); ++i)
      if (args[i].slot < 0) args[i].constant = coerce(args[i].constant, schema.arguments()[i].type());
    if (outs.size() == 1)
      if (auto scalar = scalar_ops::step(op, args, outs[0])) {
        if (free.empty() && binds.empty()) return scalar;
        return [scalar, free, binds, sizes_slot](Env& env) {
          scalar(env);
          bind(env, sizes_slot, binds);
          release(env, free);
        };
      }
    bool vararg = schema.is_vararg();  // its argument count goes on the stack after them, as the interpreter's OPN
    torch::jit::Operation operation = handle->getOperation();
    std::vector<Arg> pushed = last_uses(args, outs, free);
    return [operation, pushed, outs, free, vararg, op, binds, sizes_slot](Env& env) mutable {
      torch::jit::Stack& stack = env.stack;
      stack.clear();  // (a step that threw may have left its arguments)
      for (const auto& a : pushed) {
        if (a.move) stack.push_back(std::move(env[a.ref.slot]));
        else stack.push_back(a.ref.get(env));
      }
      if (vararg) stack.emplace_back(static_cast<int64_t>(pushed.size()));
      operation(stack);
      if (stack.size() != outs.size())
        throw std::runtime_error(op + " returned " + std::to_string(stack.size()) + " values, the plan expects " +
                                 std::to_string(outs.size()));
      for (size_t i = 0; i < outs.size(); ++i) env[outs[i]] = std::move(stack[i]);
      stack.clear();
      bind(env, sizes_slot, binds);
      release(env, free);
    };
  }

  // An argument as a step pushes it: moved out of its slot where this step is the slot's last use (the step frees
  // it, reads it once and does not write it), as TorchScript's MOVE does, which saves a reference count up and
  // down per tensor; else copied. Decided at load; `free` loses the slots moved (they are empty already).
  struct Arg {
    Ref ref;
    bool move = false;
  };

  static std::vector<Arg> last_uses(const std::vector<Ref>& args, const std::vector<int>& outs,
                                    std::vector<int>& free) {
    auto count = [](const auto& list, int slot) { return std::count(list.begin(), list.end(), slot); };
    std::vector<Arg> pushed;
    for (const auto& r : args) pushed.push_back({r, false});
    for (auto& a : pushed) {
      int slot = a.ref.slot;
      if (slot < 0 || !count(free, slot) || count(outs, slot)) continue;
      size_t reads = 0;
      for (const auto& r : args) reads += r.slot == slot;
      a.move = reads == 1;
    }
    for (const auto& a : pushed)
      if (a.move) free.erase(std::find(free.begin(), free.end(), a.ref.slot));
    return pushed;
  }

  [[noreturn]] static void interpreter_only(const std::string& op) {
    throw Error(Error::Kind::CorruptPackage,
                "the package's plan calls " + op + ", which TorchScript runs only inside its interpreter (with the "
                "graph node or the interpreter's stack it needs) and no runtime can call as a plan step; a converted "
                "model never does, so the package was edited or is damaged: " + policy::kReconvert);
  }

  static std::shared_ptr<torch::jit::Operator> find_operator(const std::string& op) {
    auto dot = op.find('.', op.find("::") + 2);
    std::string name = op.substr(0, dot), overload = dot == std::string::npos ? "" : op.substr(dot + 1);
    auto found = torch::jit::findOperatorFor(c10::OperatorName(name, overload));
    if (!found && overload.empty()) {  // a node named without its overload: the only one there is
      auto all = torch::jit::getAllOperatorsFor(c10::Symbol::fromQualString(name));
      if (all.size() == 1) found = all[0];
    }
    if (!found && op.rfind("prim::", 0) == 0) interpreter_only(op);  // prim::fork, prim::CallMethod: instructions
    if (!found)
      throw Error(Error::Kind::Package, policy::unknown_op(op, repr(op), J2T_TORCH_VERSION));
    return found;
  }

  // A kernel step's outputs planned into the arena: the index of each one's view (-1: allocated per call), each
  // checked to lie inside the arena, registered with the plan. Only on the CPU, where plan_arena plans them.
  std::vector<int64_t> arena_indices(const Value& s, size_t num_outputs) {
    std::vector<int64_t> indices(num_outputs, -1);
    const Value* offsets = s.find("arena");
    if (!offsets || plan_.arena_bytes_ == 0) return indices;
    const Value& types = s.at("out_types");
    if (offsets->kind != Value::Kind::Array || offsets->size() != num_outputs || types.size() != num_outputs)
      bad_plan("its arena");
    for (size_t i = 0; i < num_outputs; ++i) {
      const Value& offset = (*offsets)[i];
      if (offset.is_null()) continue;
      if (offset.kind != Value::Kind::Int || offset.integer < 0 || offset.integer % 64) bad_plan("its arena");
      Plan::ArenaView view{offset.integer, {}, {}, parse_dtype(types[i][1].as_string())};
      for (size_t k : {0, 2})
        for (const auto& n : types[i][k].items) {
          if (n.kind != Value::Kind::Int || n.integer < 0) bad_plan("its arena");
          (k == 0 ? view.shape : view.strides).push_back(n.integer);
        }
      if (view.shape.size() != view.strides.size() || offset.integer > plan_.arena_bytes_) bad_plan("its arena");
      // the elements it spans, 1 + sum((n - 1) * stride), kept at most the arena's size so nothing overflows
      int64_t span = 1, limit = plan_.arena_bytes_;
      bool empty = false;
      for (size_t k = 0; k < view.shape.size(); ++k) {
        empty |= view.shape[k] == 0;
        if (view.shape[k] > 1 && view.strides[k] > 0) {
          if (view.shape[k] - 1 > (limit - span) / view.strides[k]) bad_plan("its arena");
          span += (view.shape[k] - 1) * view.strides[k];
        }
      }
      if (!empty && offset.integer + span * int64_t(c10::elementSize(view.dtype)) > limit) bad_plan("its arena");
      indices[i] = int64_t(plan_.arena_views_.size());
      plan_.arena_views_.push_back(std::move(view));
    }
    return indices;
  }

  std::function<void(Env&)> kernel(const Value& s) {
    const std::string& name = s.at("kernel").as_string();
    auto found = plan_.kernels_.find(name);
    if (found == plan_.kernels_.end())
      throw Error(Error::Kind::Package, "kernel " + repr(name) + " is missing from the package; " + policy::kReconvert);
    Launcher launch = found->second;
    std::vector<Ref> args = refs(s.at("args"));
    std::vector<int> outs = ints(&s.at("outs")), free = ints(s.find("free"));
    const std::vector<std::string>& dims = plan_.plan_dims_;
    struct OutSpec {
      Shape shape, strides;
      at::TensorOptions options;
    };
    std::vector<OutSpec> specs;
    bool dynamic = false;
    for (const auto& t : s.at("out_types").items) {
      OutSpec spec{parse_shape(t[0], dims), parse_shape(t[2], dims),
                   at::TensorOptions().dtype(parse_dtype(t[1].as_string())).device(device_)};
      dynamic |= spec.shape.dynamic || spec.strides.dynamic;
      specs.push_back(std::move(spec));
    }
    std::vector<size_t> size_args;  // the kernel's size arguments, as indices into the call's dims
    if (const Value* names = s.find("sizes"))
      for (const auto& n : names->items) size_args.push_back(dim_index(dims, n.as_string()));
    dynamic |= !size_args.empty();
    // Args that are host numbers the kernel takes by value: their 64 bits follow the dims in its sizes array
    std::vector<char> by_value(args.size(), 0);
    if (const Value* numbers = s.find("by_value"))
      for (const auto& n : numbers->items) {
        int64_t at = n.as_int();
        if (at < 0 || static_cast<size_t>(at) >= args.size()) bad_plan("kernel step " + repr(name) + "'s numbers");
        by_value[at] = 1;
      }
    if (std::none_of(by_value.begin(), by_value.end(), [](char c) { return c != 0; })) by_value.clear();
    // Inputs that ATen made must have the shape the kernel was generated for (a scalar input may change it: then
    // refuse) and the strides seen at convert time (the kernel indexes with them: else copy into that layout).
    struct Checked {
      size_t index;
      Shape strides, shape;
      bool has_shape;
    };
    std::vector<Checked> checked;
    const Value* shapes = s.find("in_shapes");
    if (const auto* strides = s.find("in_strides"))
      for (size_t i = 0; i < strides->items.size(); ++i)
        if (!strides->items[i].is_null()) {
          Checked c{i, parse_shape(strides->items[i], dims), {}, shapes && i < shapes->size() && !(*shapes)[i].is_null()};
          if (c.has_shape) c.shape = parse_shape((*shapes)[i], dims);
          dynamic |= c.shape.dynamic || c.strides.dynamic;
          checked.push_back(std::move(c));
        }
    int sizes_slot = plan_.num_slots_, arena_slot = plan_.num_slots_ + 1;
    std::vector<int64_t> in_arena = arena_indices(s, specs.size());  // per output: its arena view, or -1
    if (std::all_of(in_arena.begin(), in_arena.end(), [](int64_t i) { return i < 0; })) in_arena.clear();
    return [launch, args, outs, free, specs, checked, dynamic, size_args, by_value, sizes_slot, arena_slot,
            in_arena](Env& env) {
      // the call's size table (a static kernel reads none), read in place: no per-step copy
      const int64_t* d = dynamic ? env[sizes_slot].toTensor().const_data_ptr<int64_t>() : nullptr;
      // shapes over the dims are evaluated into these, which keep their capacity from step to step
      thread_local std::vector<int64_t> scratch_shape, scratch_strides;
      // the launch's tensors, in vectors that keep their capacity from step to step and are emptied when the step
      // ends, however it ends (they must not keep a tensor alive past it)
      thread_local std::vector<at::Tensor> outputs, inputs;
      struct Emptied {
        ~Emptied() {
          outputs.clear();
          inputs.clear();
        }
      } emptied;
      outputs.clear();
      inputs.clear();
      for (size_t i = 0; i < specs.size(); ++i) {
        const auto& spec = specs[i];
        if (!in_arena.empty() && in_arena[i] >= 0)
          outputs.push_back(env[arena_slot].toTensorList().get(in_arena[i]));
        else
          outputs.push_back(at::empty_strided(spec.shape.at(d, scratch_shape), spec.strides.at(d, scratch_strides), spec.options));
      }
      c10::SmallVector<int64_t, 8> sizes;
      for (size_t i : size_args) {
        if (d[i] < 0) throw std::runtime_error("a size the kernel takes was not bound before it ran");
        sizes.push_back(d[i]);
      }
      if (by_value.empty()) {
        for (const auto& a : args) inputs.push_back(a.get(env).toTensor());
      } else {
        for (size_t k = 0; k < args.size(); ++k) {
          if (!by_value[k]) {
            inputs.push_back(args[k].get(env).toTensor());
            continue;
          }
          inputs.emplace_back();  // (no tensor: the launcher passes the number's bits, after the sizes)
          sizes.push_back(number_bits(args[k].get(env)));
        }
      }
      for (const auto& c : checked) {
        at::Tensor& x = inputs[c.index];
        if (c.has_shape) {
          at::IntArrayRef shape = c.shape.at(d, scratch_shape);
          if (x.sizes() != shape)
            throw Error(Error::Kind::SizeChanged,  // SizeChangedError, with its message
                        policy::message::size_changed(std::to_string(c.index), join_dims(x.sizes()), join_dims(shape)));
        }
        at::IntArrayRef strides = c.strides.at(d, scratch_strides);
        if (x.strides() != strides) x = into_layout(x, strides);
      }
      launch(inputs, outputs, sizes.empty() ? nullptr : sizes.data());
      for (size_t i = 0; i < outs.size(); ++i) env[outs[i]] = std::move(outputs[i]);
      release(env, free);
    };
  }

  struct Sub {
    std::vector<Step> steps;
    std::vector<Ref> results;
    std::vector<int> inputs;
  };

  Sub sub(const Value& b) {
    return {block(b.at("steps")), refs(b.at("outputs")), ints(b.find("inputs"))};
  }

  std::function<void(Env&)> if_(const Value& s) {
    Ref cond = ref(s.at("args")[0]);
    auto then = std::make_shared<Sub>(sub(s.at("blocks")[0]));
    auto otherwise = std::make_shared<Sub>(sub(s.at("blocks")[1]));
    std::vector<int> outs = ints(&s.at("outs")), free = ints(s.find("free"));
    // sizes of its outputs, read whichever branch ran (a count one branch sets, another no example took)
    std::vector<Binding> binds = bindings(s, outs);
    int sizes_slot = plan_.num_slots_;
    const Plan* plan = &plan_;
    return [plan, cond, then, otherwise, outs, free, binds, sizes_slot](Env& env) {
      const Sub& branch = condition_of(cond.get(env)) ? *then : *otherwise;
      plan->run_steps(branch.steps, env);
      // all results read before any is written (a result may be read from a slot another one goes to)
      c10::SmallVector<IValue, 4> values;
      for (const auto& r : branch.results) values.push_back(r.get(env));
      for (size_t i = 0; i < outs.size(); ++i) env[outs[i]] = std::move(values[i]);
      bind(env, sizes_slot, binds);
      release(env, free);
    };
  }

  // A region that may run as a CUDA graph (deploy/packaging/graph_regions.py); else its steps, one by one.
  std::function<void(Env&)> region(const Value& s) {
    auto steps = std::make_shared<std::vector<Step>>(block(s.at("steps")));
    const Plan* plan = &plan_;
    std::shared_ptr<RegionGraphs> graphs;
    std::vector<int> ins, outs = ints(&s.at("outs")), free = ints(s.find("free"));
    for (const auto& r : s.at("args").items) ins.push_back(static_cast<int>(r[1].as_int()));
    // With dynamic dims, the call's dims follow the region's inputs as ints: a graph is specialised to them too
    // (its kernels' grids and allocations follow them), and its steps find them in their slot.
    bool dims = !plan_.dim_sources_.empty();
    if (plan_.region_graphs_) {
      int num_slots = plan_.num_slots_;
      graphs = make_region_graphs(
          [plan, steps, ins, outs, num_slots, dims](const std::vector<IValue>& inputs) {
            Env env(num_slots + 2);  // a scratch env: capture must not leave static buffers in the caller's slots
            for (size_t i = 0; i < ins.size(); ++i) env[ins[i]] = inputs[i];
            if (dims) {
              std::vector<int64_t> sizes;
              for (size_t i = ins.size(); i < inputs.size(); ++i) sizes.push_back(inputs[i].toInt());
              env[num_slots] = IValue(size_table(sizes));
            }
            plan->run_steps(*steps, env);
            std::vector<IValue> results;
            for (int slot : outs) results.push_back(env[slot]);
            return results;
          },
          static_cast<int>(s.at("launches").as_int()));
    }
    if (!graphs) return [plan, steps](Env& env) { plan->run_steps(*steps, env); };
    int sizes_slot = plan_.num_slots_;
    return [plan, steps, graphs, ins, outs, free, dims, sizes_slot](Env& env) {
      if (!region_may_replay(*graphs)) {
        plan->run_steps(*steps, env);
        return;
      }
      std::vector<IValue> inputs, results;
      inputs.reserve(ins.size());
      for (int slot : ins) inputs.push_back(env[slot]);
      if (dims) {
        const at::Tensor& table = env[sizes_slot].toTensor();
        const int64_t* d = table.const_data_ptr<int64_t>();
        for (int64_t i = 0; i < table.numel(); ++i) inputs.push_back(IValue(d[i]));
      }
      if (!replay_region(*graphs, inputs, results)) {
        plan->run_steps(*steps, env);
        return;
      }
      for (size_t i = 0; i < outs.size(); ++i) env[outs[i]] = std::move(results[i]);
      release(env, free);
    };
  }

  std::function<void(Env&)> loop(const Value& s) {
    const Value& args = s.at("args");
    Ref trips = ref(args[0]), condition = ref(args[1]);
    std::vector<Ref> initial;
    for (size_t i = 2; i < args.size(); ++i) initial.push_back(ref(args[i]));
    auto body = std::make_shared<Sub>(sub(s.at("blocks")[0]));
    std::vector<int> outs = ints(&s.at("outs")), free = ints(s.find("free"));
    const Plan* plan = &plan_;
    return [plan, trips, condition, initial, body, outs, free](Env& env) {
      int64_t n = trip_count_of(trips.get(env));
      bool go = condition_of(condition.get(env));
      std::vector<IValue> carried;
      for (const auto& r : initial) carried.push_back(r.get(env));
      int index_slot = body->inputs.at(0);
      for (int64_t i = 0; go && i < n; ++i) {
        env[index_slot] = i;
        // (moved: each is read back from the body's results before the next iteration)
        for (size_t k = 0; k < carried.size(); ++k) env[body->inputs[k + 1]] = std::move(carried[k]);
        plan->run_steps(body->steps, env);
        go = condition_of(body->results[0].get(env));
        for (size_t k = 0; k < carried.size(); ++k) carried[k] = body->results[k + 1].get(env);
      }
      for (size_t k = 0; k < outs.size(); ++k) env[outs[k]] = std::move(carried[k]);
      release(env, free);
    };
  }
};

// ---- the plan ---------------------------------------------------------------------------------------------------

namespace {

c10::Device target_device(const Value& manifest, const std::string& requested) {
  c10::Device built_for(manifest.at("device").as_string());
  c10::Device device = requested.empty() ? built_for : c10::Device(requested);
  bool has_kernels = manifest.at("kernels").size() > 0;
  std::string target = c10::DeviceTypeName(device.type(), true);
  if (device.type() != built_for.type() && has_kernels && built_for.is_cpu())
    throw Error(Error::Kind::PackageDevice, policy::message::cpu_kernels(target, repr(target)));
  if (device.is_cuda() && !at::hasCUDA())
    throw Error(Error::Kind::PackageDevice, has_kernels ? policy::message::no_cuda_for_kernels(built_for.str())
                                                        : policy::message::no_cuda(built_for.str()));
  if (device.type() != built_for.type() && has_kernels)
    throw Error(Error::Kind::PackageDevice,
                policy::message::kernels_elsewhere(c10::DeviceTypeName(built_for.type(), true), target, repr(target)));
  return device;
}

void check_compatible(const Value& manifest) {
  std::string made_with;
  if (const auto* producer = manifest.find("producer"))
    if (const auto* t = producer->find("torch")) made_with = t->as_string();
  std::string here = J2T_TORCH_VERSION;
  // "2.13" of "2.13.0+cpu": ATen op schemas change between minor versions; patch releases may differ.
  auto release = [](const std::string& v) {
    std::string base = v.substr(0, v.find('+'));
    size_t first = base.find('.');
    return first == std::string::npos ? base : base.substr(0, base.find('.', first + 1));
  };
  if (release(made_with) != release(here))
    throw Error(Error::Kind::PackageVersion, policy::message::other_torch(made_with.empty() ? "unknown" : made_with, here));
}


// The kernel backends this runtime loads, by the manifest's "backend": emitters/backends.py's records with a
// `cpp_loader` (tests/test_backends.py holds the two lists equal). "aten" generates no kernels to load.
constexpr std::pair<const char*, KernelLoader> kKernelBackends[] = {
    {"cpp", load_cpu_kernels},
    {"triton", load_cuda_kernels},
};

KernelLoader kernel_loader(const std::string& backend) {
  for (const auto& [name, loader] : kKernelBackends)
    if (backend == name) return loader;
  throw Error(Error::Kind::PackageVersion, "the package uses kernel backend " + repr(backend) +
                                               ", which this jit2triton does not know; upgrade jit2triton");
}

}  // namespace

Plan::Plan(Package pkg, const LoadOptions& options, std::shared_ptr<StateStore> state)
    : device(c10::kCPU), pkg_(std::move(pkg)) {
  const Value& manifest = pkg_.manifest;
  manifest_schema::check_all(manifest);
  check_compatible(manifest);
  device = target_device(manifest, options.device);
  built_for_ = c10::DeviceTypeName(c10::Device(manifest.at("device").as_string()).type(), true);
  if (device.is_cuda() && !device.has_index()) device = c10::Device(c10::kCUDA, 0);
  if (manifest.at("kernels").size() > 0) kernels_ = kernel_loader(manifest.at("backend").as_string())(
      pkg_, device, options.num_threads);
  const Value& plan = manifest.at("plan");
  check_plan(plan, static_cast<int64_t>(manifest.at("nodes").size()), manifest.at("kernels"));
  check_structure(manifest, pkg_.weights);
  num_slots_ = static_cast<int>(plan.at("num_slots").as_int());
  input_slots_ = ints(&plan.at("inputs"));
  {  // a slot per signature input, then per module state value
    const Value* state = manifest.optional("state");
    size_t expected = manifest.at("signature").at("inputs").size() + (state ? state->size() : 0);
    if (input_slots_.size() != expected)
      bad_plan(std::to_string(input_slots_.size()) + " input slots where its signature and module state give " +
               std::to_string(expected));
  }
  if (const Value* dims = plan.find("dims")) {
    for (const auto& d : dims->items) {
      if (!d.is_array() || d.size() != 3) bad_plan("a dynamic dim's source");  // [name, input position, axis]
      int64_t at = d[1].as_int(), axis = d[2].as_int();
      size_t position = static_cast<size_t>(at);
      const Value& inputs = manifest.at("signature").at("inputs");
      // read from a tensor input's axis
      if (at < 0 || position >= input_slots_.size() || position >= inputs.size() ||
          inputs[position].at("type").as_string() != "Tensor" || axis < 0 ||
          axis >= static_cast<int64_t>(inputs[position].at("shape").size()))
        throw Error(Error::Kind::CorruptPackage, "the package's plan is damaged (a dynamic dim read from input " +
                                                     std::to_string(at) + "); " + policy::kReconvert);
      plan_dims_.push_back(d[0].as_string());
      dim_sources_.push_back({position, d[2].as_int()});
    }
  }
  if (const Value* bound = plan.find("bound_dims")) {
    for (const auto& name : bound->items) plan_dims_.push_back(name.as_string());
    bound_dims_ = bound->size();
  }
  const Value* graph = manifest.find("cuda_graph");
  bool whole_graph = options.cuda_graphs && device.is_cuda() && graph && graph->as_bool();
  region_graphs_ = options.cuda_graphs && device.is_cuda() && !whole_graph;
  if (const Value* arena = plan.find("arena"); arena && device.is_cpu()) {
    const Value* bytes = arena->kind == Value::Kind::Object ? arena->find("bytes") : nullptr;
    if (!bytes || bytes->kind != Value::Kind::Int || bytes->integer < 0 || bytes->integer > policy::kMaxArenaBytes ||
        bytes->integer % 64)
      bad_plan("its arena");
    arena_bytes_ = bytes->integer;
  }
  if (const Value* host = plan.find("host_weights"))
    for (const auto& name : host->items) host_weights_.insert(name.as_string());
  Builder builder(*this, plan);
  steps_ = builder.block(plan.at("steps"));
  for (const auto& r : plan.at("outputs").items) {
    Ref out = builder.ref(r);
    outputs_.push_back([out](const Env& env) -> const IValue& { return out.get(env); });
  }
  build_input_checks();
  if (const Value* entries = manifest.optional("state"))
    state_ = std::make_unique<ModelState>(*entries, pkg_, built_for_, device, std::move(state));
  if (whole_graph) {
    graph_ = make_graph_runner([this](std::vector<IValue> inputs) { return run(std::move(inputs)); },
                               options.alias_outputs, !dim_names_.empty());
    uses_cuda_graph = graph_ != nullptr;
  }
}

Plan::~Plan() = default;




IValue Plan::call(std::vector<IValue> inputs) const {
  // A package is for inference: its outputs carry no autograd graph (docs/torch-jit.md). So no step records one,
  // and every ATen op skips its autograd kernels, as under torch.inference_mode(), once per call rather than a
  // dispatch per op; the tensors made stay ordinary ones (an inference tensor would refuse later in-place use).
  c10::AutoGradMode no_grad(false);
  c10::impl::ExcludeDispatchKeyGuard below_autograd(c10::autograd_dispatch_keyset);
  inputs = checked_inputs(std::move(inputs));
  auto run_plan = [this](std::vector<IValue> in) {
    return graph_ ? run_graph(*graph_, std::move(in)) : run(std::move(in));
  };
  return state_ ? state_->run(run_plan, std::move(inputs)) : run_plan(std::move(inputs));
}

std::vector<IValue> Plan::checked_inputs(std::vector<IValue> inputs) const {
  size_t n = inputs.size(), total = input_names_.size();
  if (n != total) {
    if (n < required_ || n > total) {
      std::string names;
      for (size_t i = 0; i < total; ++i) names += (i ? ", " : "") + input_names_[i];
      std::string expected = required_ == total ? std::to_string(total) : std::to_string(required_) + " to " + std::to_string(total);
      const char* noun = total == 1 ? " input (" : " inputs (";
      throw Error(Error::Kind::Input, "expected " + expected + noun + names + "), got " + std::to_string(n) +
                                          "; pass them in that order");
    }
    for (size_t i = n; i < total; ++i) inputs.push_back(defaults_[i]);
  }
  Bound bound{std::vector<int64_t>(dim_names_.size(), -1), std::vector<std::string>(dim_names_.size())};
  for (size_t i = 0; i < total; ++i) checks_[i](inputs[i], bound);
  return inputs;
}

IValue Plan::observe(std::vector<IValue> inputs, const StepObserver& seen) const {
  c10::AutoGradMode no_grad(false);
  c10::impl::ExcludeDispatchKeyGuard below_autograd(c10::autograd_dispatch_keyset);
  Bound bound{std::vector<int64_t>(dim_names_.size(), -1), std::vector<std::string>(dim_names_.size())};
  for (size_t i = 0; i < checks_.size() && i < inputs.size(); ++i) checks_[i](inputs[i], bound);  // (layouts)
  observer_ = &seen;
  struct Done {
    const Plan* plan;
    ~Done() { plan->observer_ = nullptr; }
  } done{this};
  return run(std::move(inputs));
}

c10::List<at::Tensor> Plan::take_arena() const {
  {
    std::lock_guard<std::mutex> lock(arena_mutex_);
    if (!spare_arenas_.empty()) {
      c10::List<at::Tensor> arena = std::move(spare_arenas_.back());
      spare_arenas_.pop_back();
      return arena;
    }
  }
  at::Tensor buffer = at::empty({arena_bytes_}, at::TensorOptions().dtype(at::kByte).device(device));
  std::map<at::ScalarType, at::Tensor> typed;
  c10::List<at::Tensor> views;
  views.reserve(arena_views_.size());
  for (const auto& v : arena_views_) {
    auto it = typed.find(v.dtype);
    if (it == typed.end()) it = typed.emplace(v.dtype, buffer.view(v.dtype)).first;
    views.push_back(it->second.as_strided(v.shape, v.strides, v.offset / int64_t(c10::elementSize(v.dtype))));
  }
  return views;
}

void Plan::give_back_arena(c10::List<at::Tensor> arena) const {
  std::lock_guard<std::mutex> lock(arena_mutex_);
  spare_arenas_.push_back(std::move(arena));
}

IValue Plan::run(std::vector<IValue> inputs) const {
  Env env(num_slots_ + 2);
  // this call's arena, given back when it returns or throws (its views never leave the call)
  struct Borrowed {
    const Plan* plan;
    std::optional<c10::List<at::Tensor>> arena;  // none for a plan without one: nothing allocated per call
    ~Borrowed() {
      if (arena) plan->give_back_arena(std::move(*arena));
    }
  } borrowed{this, arena_bytes_ > 0 ? std::optional<c10::List<at::Tensor>>(take_arena()) : std::nullopt};
  if (borrowed.arena) env[num_slots_ + 1] = IValue(*borrowed.arena);
  if (!plan_dims_.empty()) {  // before the inputs move into their slots
    std::vector<int64_t> dims;
    dims.reserve(plan_dims_.size());
    for (const auto& [position, axis] : dim_sources_) dims.push_back(inputs.at(position).toTensor().size(axis));
    dims.resize(plan_dims_.size(), -1);  // the bound dims, until the steps that make them run
    env[num_slots_] = IValue(size_table(dims));
  }
  for (size_t i = 0; i < input_slots_.size() && i < inputs.size(); ++i) env[input_slots_[i]] = std::move(inputs[i]);
  run_steps(steps_, env);
  if (outputs_.size() == 1) return outputs_[0](env);
  std::vector<IValue> outs;
  for (const auto& get : outputs_) outs.push_back(get(env));
  return c10::ivalue::Tuple::create(std::move(outs));
}

void Plan::run_steps(const std::vector<Step>& steps, Env& env) const {
  StepProfile* profile = profile_.get();
  for (const auto& step : steps) {
    try {
      if (profile) profile->time(step, env);
      else step.run(env);
      if (observer_ && !step.outs.empty()) {
        std::vector<IValue> outputs;
        for (int slot : step.outs) outputs.push_back(env[slot]);
        (*observer_)(step.node, outputs);
      }
    } catch (const Error&) {
      throw;
    } catch (const c10::Error& err) {
      step_failed(step.node, std::string("RuntimeError: ") + err.what_without_backtrace());
    } catch (const std::exception& err) {
      step_failed(step.node, std::string("RuntimeError: ") + err.what());
    }
  }
}

void Plan::step_failed(int node, const std::string& what) const {
  const Value& info = pkg_.manifest.at("nodes")[node];
  std::string where;
  if (const auto* source = info.find("source"))
    if (source->is_string() && !source->as_string().empty()) where = " (model source " + source->as_string() + ")";
  throw Error(Error::Kind::Step, info.at("op").as_string() + " failed" + where + ": " + what);
}

void StepProfile::time(const Step& step, Env& env) {
  synchronize();
  inner_.push_back(0.0);
  auto start = std::chrono::steady_clock::now();
  auto close = [&] {
    synchronize();
    double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    double inner = inner_.back();
    inner_.pop_back();
    if (!inner_.empty()) inner_.back() += elapsed;
    Row& row = rows_[step.node];
    row.seconds += elapsed - inner;
    row.runs += 1;
  };
  try {
    step.run(env);
  } catch (...) {
    close();
    throw;
  }
  close();
}

void StepProfile::synchronize() const {
  if (device_.is_cpu() || host_only_) return;
  const auto* impl = c10::impl::getDeviceGuardImpl(device_.type());
  impl->synchronizeDevice(device_.has_index() ? device_.index() : impl->getDevice().index());
}

void Plan::set_profiling(bool on, bool host_only) {
  profile_ = on ? std::make_unique<StepProfile>(device, host_only) : nullptr;
}

std::vector<StepTime> Plan::step_times() const {
  std::vector<StepTime> times;
  if (!profile_) return times;
  const Value& nodes = pkg_.manifest.at("nodes");
  for (const auto& [node, row] : profile_->rows()) {
    const Value& info = nodes[node];
    std::string op = info.at("op").as_string(), source;
    if (const auto* kernel = info.find("kernel"))
      if (kernel->is_string()) op = "kernel " + kernel->as_string();
    if (const auto* where = info.find("source"))
      if (where->is_string()) source = where->as_string();
    times.push_back({node, op, source, row.seconds, row.runs});
  }
  return times;
}

}  // namespace jit2triton
