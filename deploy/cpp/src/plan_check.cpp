#include "plan_check.h"

#include <algorithm>
#include <vector>

#include "jit2triton/jit2triton.h"
#include "package.h"
#include "plan.h"
#include "policy.h"

namespace jit2triton {

namespace {

using json::Value;

constexpr int64_t kArenaAlign = 64;
constexpr int64_t kSampleDims[] = {2, 3};  // sizes a dynamic layout is checked dense at (SAMPLE_DIMS in Python)

[[noreturn]] void bad(const std::string& what) {
  throw Error(Error::Kind::CorruptPackage, "the package's plan is damaged (" + what + "); " + policy::kReconvert);
}

bool equal(const Value& a, const Value& b) {
  if (a.kind != b.kind || a.boolean != b.boolean || a.integer != b.integer || a.text != b.text ||
      a.items.size() != b.items.size() || a.members.size() != b.members.size())
    return false;
  if (a.kind == Value::Kind::Float && !(a.number == b.number)) return false;
  for (size_t i = 0; i < a.items.size(); ++i)
    if (!equal(a.items[i], b.items[i])) return false;
  for (size_t i = 0; i < a.members.size(); ++i)
    if (a.members[i].first != b.members[i].first || !equal(a.members[i].second, b.members[i].second)) return false;
  return true;
}

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
  if (it == c.kernels.end()) bad("kernel step " + name + " runs a kernel the package does not list");
  const Value& kernel = *it->second;
  const Value &args = s.at("args"), &types = s.at("out_types");
  for (const auto& t : types.items)
    if (t.size() != 3 || !dense(t[0], t[2], c.dims))
      bad("kernel step " + name + " allocates other outputs than its kernel writes");
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
        bad("its arena");
      c.arena_end = std::max(c.arena_end, offset.integer + span * bytes);
    }
  const Value* inputs = kernel.find("inputs");
  if (!inputs) return;
  if (inputs->size() != args.size()) bad("kernel step " + name + " passes other inputs than its kernel reads");
  for (const char* key : {"in_strides", "in_shapes"}) {
    const Value* expected = s.find(key);
    if (!expected || expected->is_null()) continue;
    size_t part = std::string(key) == "in_strides" ? 2 : 1;
    bool agree = expected->is_array() && expected->size() == args.size();
    for (size_t i = 0; agree && i < args.size(); ++i)
      agree = (*expected)[i].is_null() || ((*inputs)[i].size() == 3 && equal((*expected)[i], (*inputs)[i][part]));
    if (!agree)
      bad("kernel step " + name + " checks its inputs against other layouts than its kernel reads (" + key + ")");
  }
  for (size_t i = 0; i < args.size(); ++i) {
    const Value& r = args[i];
    if (r.size() != 2 || !r[0].is_string() || r[0].as_string() != "w") continue;
    auto w = c.weights->find(r[1].as_string());
    if (!fits(w == c.weights->end() ? nullptr : &w->second, (*inputs)[i]))
      bad("kernel step " + name + " reads weight " + repr(r[1].as_string()) +
          ", which is not the dtype, shape and layout its kernel was built for");
  }
}

void control_flow(const Value& s) {
  const Value &blocks = s.at("blocks"), &outs = s.at("outs"), &args = s.at("args");
  if (s.at("kind").as_string() == "if") {
    bool agree = blocks.size() == 2 && args.size() == 1;
    for (size_t b = 0; agree && b < blocks.size(); ++b) agree = blocks[b].at("outputs").size() == outs.size();
    if (!agree) bad("an if step gives another number of values than its branches");
    return;
  }
  size_t carried = args.size() >= 2 ? args.size() - 2 : 0;
  if (blocks.size() != 1 || args.size() < 2 || outs.size() != carried ||
      blocks[0].at("inputs").size() != carried + 1 || blocks[0].at("outputs").size() != carried + 1)
    bad("a loop step carries another number of values than its body");
}

void steps(const Value& list, Context& c) {
  for (const auto& s : list.items) {
    const std::string& kind = s.at("kind").as_string();
    if (kind == "kernel") kernel_step(s, c);
    if (kind == "if" || kind == "loop") control_flow(s);
    if (const Value* binds = s.find("binds"))  // sizes a call binds from its outputs (plan_check.py alike)
      for (const auto& b : binds->items) {
        bool good = kind == "call" && b.size() == 3 && b[0].is_string() &&
                    std::find(c.dims.begin(), c.dims.end(), b[0].as_string()) != c.dims.end() &&
                    b[1].kind == Value::Kind::Int && b[1].integer >= 0 &&
                    b[1].integer < static_cast<int64_t>(s.at("outs").size()) && b[2].kind == Value::Kind::Int &&
                    b[2].integer >= 0;
        if (!good) bad("a step binds a size it cannot");
      }
    if (kind == "graph")
      for (const auto& r : s.at("args").items)
        if (r.size() != 2 || !r[0].is_string() || r[0].as_string() != "s" || r[1].kind != Value::Kind::Int)
          bad("a graph region reads a value that is not a slot");
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

}  // namespace

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
    if (!bytes || bytes->kind != Value::Kind::Int) bad("its arena");
    if (bytes->integer > (c.arena_end + kArenaAlign - 1) / kArenaAlign * kArenaAlign)
      bad("its arena is larger than the outputs planned into it");
  }
  check_dims(manifest.at("signature"));
}

}  // namespace jit2triton
