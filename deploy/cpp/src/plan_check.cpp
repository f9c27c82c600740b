#include "plan_check.h"

#include <algorithm>
#include <vector>

#include "jit2triton/jit2triton.h"
#include "manifest_schema.h"
#include "op_facts.h"
#include "package.h"
#include "plan.h"
#include "policy.h"

namespace jit2triton {

namespace {

using json::Value;

constexpr int64_t kArenaAlign = 64;
constexpr int64_t kSampleDims[] = {2, 3};  // sizes a dynamic layout is checked dense at (SAMPLE_DIMS in Python)

// Whether `shape` laid out with `strides` covers exactly its elements: what a kernel writing every element assumes.
bool dense_at(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of each dim longer than 1
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0 || strides[i] < 0) return false;
    if (shape[i] > 1) dims.push_back({strides[i], shape[i]});
  }
  std::sort(dims.begin(), dims.end());
  int64_t expected = 1;
  for (const auto& [stride, size] : dims) {
    if (stride != expected || expected > (int64_t(1) << 62) / size) return false;
    expected *= size;
  }
  return true;
}

bool dense(const Value& shape, const Value& strides, const std::vector<std::string>& dims) {
  if (!shape.is_array() || !strides.is_array() || shape.size() != strides.size()) return false;
  std::vector<Size> sizes, steps;
  bool dynamic = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    sizes.push_back(parse_size(shape[i], dims));
    steps.push_back(parse_size(strides[i], dims));
    dynamic |= sizes.back().dynamic() || steps.back().dynamic();
  }
  for (int64_t n : kSampleDims) {
    std::vector<int64_t> at(dims.size(), n), s, t;
    for (size_t i = 0; i < sizes.size(); ++i) {
      s.push_back(sizes[i](at.data()));
      t.push_back(steps[i](at.data()));
    }
    if (!dense_at(s, t)) return false;
    if (!dynamic) break;
  }
  return true;
}

// A weight is what a kernel reads: its dtype and shape, and its strides on every dim longer than 1.
bool fits(const at::Tensor* weight, const Value& buffer) {
  if (!weight || buffer.size() != 3 || !weight->defined() ||
      parse_dtype(buffer[0].as_string()) != weight->scalar_type() || buffer[1].size() != size_t(weight->dim()) ||
      buffer[2].size() != size_t(weight->dim()))
    return false;
  for (int64_t d = 0; d < weight->dim(); ++d) {
    if (buffer[1][d].as_int() != weight->size(d)) return false;
    if (weight->size(d) > 1 && buffer[2][d].as_int() != weight->stride(d)) return false;
  }
  return true;
}

struct Context {
  std::map<std::string, const Value*> kernels;  // name -> its entry in the kernel index
  const std::map<std::string, at::Tensor>* weights;
  std::vector<std::string> dims;
  int64_t arena_end = 0;  // bytes the outputs planned into the arena reach
};

void kernel_step(const Value& s, Context& c) {
  const std::string name = repr(s.at("kernel").as_string());
  auto it = c.kernels.find(s.at("kernel").as_string());
  if (it == c.kernels.end()) bad_plan("kernel step " + name + " runs a kernel the package does not list");
  const Value& kernel = *it->second;
  const Value &args = s.at("args"), &types = s.at("out_types");
  for (const auto& t : types.items)
    if (t.size() != 3 || !dense(t[0], t[2], c.dims))
      bad_plan("kernel step " + name + " allocates other outputs than its kernel writes");
  if (const Value* offsets = s.find("arena"))
    for (size_t i = 0; i < offsets->size() && i < types.size(); ++i) {
      const Value &offset = (*offsets)[i], &shape = types[i][0], &strides = types[i][2];
      bool fixed = offset.kind == Value::Kind::Int && std::all_of(shape.items.begin(), shape.items.end(), [](const Value& n) {
        return n.kind == Value::Kind::Int && n.integer > 0;
      }) && std::all_of(strides.items.begin(), strides.items.end(), [](const Value& n) { return n.kind == Value::Kind::Int; });
      if (!fixed) continue;
      int64_t span = 1;  // dense (checked above), so its elements are its numel: no overflow past 2**62
      for (const auto& n : shape.items) span *= n.integer;
      int64_t bytes = int64_t(c10::elementSize(parse_dtype(types[i][1].as_string())));
      if (offset.integer < 0 || offset.integer > policy::kMaxArenaBytes || span > policy::kMaxArenaBytes / bytes)
        bad_plan("its arena");
      c.arena_end = std::max(c.arena_end, offset.integer + span * bytes);
    }
  const Value* inputs = kernel.find("inputs");
  if (!inputs) return;
  if (inputs->size() != args.size()) bad_plan("kernel step " + name + " passes other inputs than its kernel reads");
  for (const char* key : {"in_strides", "in_shapes"}) {
    const Value* expected = s.find(key);
    if (!expected || expected->is_null()) continue;
    size_t part = std::string(key) == "in_strides" ? 2 : 1;
    bool agree = expected->is_array() && expected->size() == args.size();
    for (size_t i = 0; agree && i < args.size(); ++i)
      agree = (*expected)[i].is_null() || ((*inputs)[i].size() == 3 && json::equal((*expected)[i], (*inputs)[i][part]));
    if (!agree)
      bad_plan("kernel step " + name + " checks its inputs against other layouts than its kernel reads (" + key + ")");
  }
  for (size_t i = 0; i < args.size(); ++i) {
    const Value& r = args[i];
    if (r.size() != 2 || !r[0].is_string() || r[0].as_string() != "w") continue;
    auto w = c.weights->find(r[1].as_string());
    if (!fits(w == c.weights->end() ? nullptr : &w->second, (*inputs)[i]))
      bad_plan("kernel step " + name + " reads weight " + repr(r[1].as_string()) +
          ", which is not the dtype, shape and layout its kernel was built for");
  }
}

void control_flow(const Value& s) {
  const Value &blocks = s.at("blocks"), &outs = s.at("outs"), &args = s.at("args");
  if (s.at("kind").as_string() == "if") {
    bool agree = blocks.size() == 2 && args.size() == 1;
    for (size_t b = 0; agree && b < blocks.size(); ++b) agree = blocks[b].at("outputs").size() == outs.size();
    if (!agree) bad_plan("an if step gives another number of values than its branches");
    return;
  }
  size_t carried = args.size() >= 2 ? args.size() - 2 : 0;
  if (blocks.size() != 1 || args.size() < 2 || outs.size() != carried ||
      blocks[0].at("inputs").size() != carried + 1 || blocks[0].at("outputs").size() != carried + 1)
    bad_plan("a loop step carries another number of values than its body");
}

void steps(const Value& list, Context& c) {
  for (const auto& s : list.items) {
    const std::string& kind = s.at("kind").as_string();
    if (kind == "kernel") kernel_step(s, c);
    if (kind == "if" || kind == "loop") control_flow(s);
    if (const Value* binds = s.find("binds"))  // sizes a call or an if binds from its outputs
      for (const auto& b : binds->items) {
        bool good = (kind == "call" || kind == "if") && b.size() == 3 && b[0].is_string() &&
                    std::find(c.dims.begin(), c.dims.end(), b[0].as_string()) != c.dims.end() &&
                    b[1].kind == Value::Kind::Int && b[1].integer >= 0 &&
                    b[1].integer < static_cast<int64_t>(s.at("outs").size()) && b[2].kind == Value::Kind::Int &&
                    b[2].integer >= 0;
        if (!good) bad_plan("a step binds a size it cannot");
      }
    if (kind == "graph")
      for (const auto& r : s.at("args").items)
        if (r.size() != 2 || !r[0].is_string() || r[0].as_string() != "s" || r[1].kind != Value::Kind::Int)
          bad_plan("a graph region reads a value that is not a slot");
    if (const Value* inner = s.find("steps")) steps(*inner, c);
    if (const Value* blocks = s.find("blocks"))
      for (const auto& b : blocks->items) steps(b.at("steps"), c);
  }
}

void check_dims(const Value& signature) {
  const Value* dims = signature.find("dims");
  if (!dims || dims->is_null()) return;
  if (!dims->is_object()) throw Error(Error::Kind::CorruptPackage, std::string("the package's signature is damaged (its dims); ") + policy::kReconvert);
  for (const auto& [name, limits] : dims->members) {
    const Value *low = limits.is_object() ? limits.find("min") : nullptr, *high = limits.is_object() ? limits.find("max") : nullptr;
    bool good = low && low->kind == Value::Kind::Int && low->integer >= 0 &&
                (!high || high->is_null() || (high->kind == Value::Kind::Int && high->integer >= low->integer));
    if (!good)
      throw Error(Error::Kind::CorruptPackage,
                  "the package's signature is damaged (dim " + repr(name) + "'s range); " + policy::kReconvert);
  }
}

// Every index the plan holds, checked once at load against what it indexes (the same checks as the Python
// runtime's check_plan): a hand-edited manifest is refused here, never read out of bounds later.
// What a kernel step must pass: the kernel's number of buffers and the dynamic dims it takes (manifest "sizes").
struct KernelArity {
  int64_t buffers;
  std::vector<std::string> sizes;
  const Value* by_value = nullptr;  // the inputs that are host numbers passed by value, from the kernel index
  const Value* outputs = nullptr;  // [dtype, shape] per output, from the kernel index
};

using BufferCounts = std::map<std::string, KernelArity>;

void check_steps(const Value& steps, int64_t num_slots, int64_t num_nodes, const BufferCounts& buffers) {
  for (const auto& s : steps.items) {
    manifest_schema::check_step(s, {num_slots, num_nodes});
    const std::string& kind = s.at("kind").as_string();
    if (kind == "call")
      if (const Value* op = s.find("op"); op && op->is_string() && op_facts::forbidden(op->as_string()))
        throw Error(Error::Kind::CorruptPackage,
                    "the package's plan calls " + op->as_string() + ", which reaches outside the model (files, global "
                    "state); a converted model never does, so the package was edited: " + policy::kReconvert);
    if (kind == "kernel") {
      auto it = buffers.find(s.at("kernel").as_string());
      if (it == buffers.end() || it->second.buffers != int64_t(s.at("args").size() + s.at("outs").size()))
        bad_plan("kernel step " + repr(s.at("kernel").as_string()) +
                 " passes another number of buffers than its kernel takes");
      std::vector<std::string> sizes;
      if (const Value* names = s.find("sizes"))
        for (const auto& n : names->items) sizes.push_back(n.as_string());
      if (sizes != it->second.sizes)
        bad_plan("kernel step " + repr(s.at("kernel").as_string()) + " passes other sizes than its kernel takes");
      // (a number where a kernel reads a pointer, or the reverse, would send it through memory it does not own)
      const Value* by_value = s.find("by_value");
      const Value* takes = it->second.by_value;
      bool none = !by_value || by_value->size() == 0, takes_none = !takes || takes->size() == 0;
      if (none != takes_none || (!none && !json::equal(*by_value, *takes)))
        bad_plan("kernel step " + repr(s.at("kernel").as_string()) + " passes other arguments by value than its kernel takes");
      // the outputs the step allocates are the ones its kernel writes (an emptied list made a kernel write
      // through a pointer never passed; found by tests/mutate_packages.py)
      const Value& types = s.at("out_types");
      const Value* written = it->second.outputs;
      bool agree = written && types.size() == s.at("outs").size() && types.size() == written->size();
      for (size_t i = 0; agree && i < types.size(); ++i)
        agree = types[i].size() == 3 && (*written)[i].size() == 2 && json::equal(types[i][1], (*written)[i][0]) &&
                json::equal(types[i][0], (*written)[i][1]);
      if (!agree)
        bad_plan("kernel step " + repr(s.at("kernel").as_string()) + " allocates other outputs than its kernel writes");
    }
    if (const Value* inner = s.find("steps")) check_steps(*inner, num_slots, num_nodes, buffers);
    if (const Value* blocks = s.find("blocks"))
      for (const auto& b : blocks->items) {
        manifest_schema::check_block(b, {num_slots, num_nodes});  // its inputs' slots, its outputs' references
        check_steps(b.at("steps"), num_slots, num_nodes, buffers);
      }
  }
}


}  // namespace

[[noreturn]] void bad_plan(const std::string& what) {
  throw Error(Error::Kind::CorruptPackage, "the package's plan is damaged (" + what + "); " + policy::kReconvert);
}

void check_plan(const Value& plan, int64_t num_nodes, const Value& kernels) {
  BufferCounts buffers;
  for (const auto& k : kernels.items) {
    if (buffers.count(k.at("name").as_string()))  // (one runtime read the first of two entries, the other the last)
      bad_plan("the kernel index names a kernel twice");
    KernelArity& arity = buffers[k.at("name").as_string()];
    arity.buffers = k.at("num_buffers").as_int();
    arity.outputs = k.find("outputs");
    arity.by_value = k.find("by_value");
    if (const Value* names = k.find("sizes"))
      for (const auto& n : names->items) arity.sizes.push_back(n.as_string());
  }
  const Value* slots = plan.is_object() ? plan.find("num_slots") : nullptr;
  int64_t num_slots = slots && slots->kind == Value::Kind::Int ? slots->integer : 0;
  manifest_schema::check_plan(plan, {num_slots, num_nodes});  // its outputs' references too
  check_steps(plan.at("steps"), num_slots, num_nodes, buffers);
}

void check_structure(const Value& manifest, const std::map<std::string, at::Tensor>& weights) {
  Context c;
  c.weights = &weights;
  for (const auto& k : manifest.at("kernels").items) c.kernels[k.at("name").as_string()] = &k;
  const Value& plan = manifest.at("plan");
  if (const Value* dims = plan.find("dims"))
    for (const auto& d : dims->items) c.dims.push_back(d[0].as_string());
  if (const Value* bound = plan.find("bound_dims"))  // strings (manifest_schema::check_plan)
    for (const auto& name : bound->items) c.dims.push_back(name.as_string());
  steps(plan.at("steps"), c);
  if (const Value* arena = plan.find("arena")) {
    const Value* bytes = arena->is_object() ? arena->find("bytes") : nullptr;
    if (!bytes || bytes->kind != Value::Kind::Int) bad_plan("its arena");
    if (bytes->integer > (c.arena_end + kArenaAlign - 1) / kArenaAlign * kArenaAlign)
      bad_plan("its arena is larger than the outputs planned into it");
  }
  check_dims(manifest.at("signature"));
}

}  // namespace jit2triton
