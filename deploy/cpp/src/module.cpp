#include <ATen/ATen.h>

#include <algorithm>
#include <set>

#include "jit2triton/jit2triton.h"
#include "plan.h"
#include "policy.h"

namespace jit2triton {

namespace {

void flatten(const c10::IValue& v, std::vector<at::Tensor>& out) {
  if (v.isTensor()) {
    out.push_back(v.toTensor());
  } else if (v.isTuple()) {
    for (const auto& x : v.toTupleRef().elements()) flatten(x, out);
  } else if (v.isList()) {
    for (const auto& x : v.toListRef()) flatten(x, out);
  } else if (v.isGenericDict()) {
    for (const auto& kv : v.toGenericDict()) flatten(kv.value(), out);
  }
}

// Method `name` of the package as a package of its own (deploy/packaging/build_manifest.py's add_method): its weights, members and checksums are
// those under methods/<name>/, and its manifest is the package's shared fields and the method's own.
Package method_package(const Package& pkg, const std::string& name, const json::Value& own) {
  if (!own.is_object())
    throw Error(Error::Kind::CorruptPackage,
                "the package's method " + repr(name) + " is damaged; " + policy::kReconvert);
  Package sub;
  sub.path = pkg.path;
  sub.file = pkg.file;
  const std::string prefix = std::string(policy::kMethodPrefix) + name + "/";
  auto under = [&prefix](const std::string& key) { return key.compare(0, prefix.size(), prefix) == 0; };
  for (const auto& [key, bytes] : pkg.members) {
    if (!under(key)) continue;
    std::string name = key.substr(prefix.size());
    auto copied = pkg.copies.find(key);  // the checked copy: the method's own, so it outlives forward's plan
    if (copied == pkg.copies.end()) {
      sub.members.emplace(name, bytes);
    } else {
      const std::string& own = sub.copies[name] = copied->second;
      sub.members.emplace(name, std::string_view(own));
    }
  }
  for (const auto& [key, sum] : pkg.checksums)
    if (under(key)) sub.checksums.emplace(key.substr(prefix.size()), sum);
  for (const auto& [key, weight] : pkg.weights)
    if (under(key)) sub.weights.emplace(key.substr(prefix.size()), weight);
  sub.manifest.kind = json::Value::Kind::Object;
  for (const char* field : policy::kMethodSharedFields)
    if (const json::Value* value = pkg.manifest.find(field)) sub.manifest.members.emplace_back(field, *value);
  for (const auto& member : own.members) sub.manifest.members.push_back(member);
  return sub;
}

Module load_module(const std::string& path, const LoadOptions& options) {
  Package pkg = read_package(path, options.mmap, options.trusted_keys, options.keys_from_environment);
  // An older jit2triton verified this package in its Python runtime, retired since, and found this one to differ
  // from TorchScript (deploy/format.py's "runtime"): refused, never run wrong
  if (const json::Value* only = pkg.manifest.find("runtime"); only && only->is_string() && only->as_string() == "python")
    throw Error(Error::Kind::PackageVersion,
                "this package was verified, by an older jit2triton, to run only in its Python runtime, which is "
                "retired: convert the model again (conversion now verifies it in this runtime)");
  auto state = std::make_shared<StateStore>();  // the module's attributes, shared by its methods
  auto methods = std::make_shared<Module::Methods>();
  if (const json::Value* listed = pkg.manifest.optional("methods")) {
    if (!listed->is_object())
      throw Error(Error::Kind::CorruptPackage, std::string("the package's methods are damaged; ") + policy::kReconvert);
    for (const auto& [name, own] : listed->members)
      (*methods)[name] = std::make_shared<Plan>(method_package(pkg, name, own), options, state);
  }
  return Module(std::make_shared<Plan>(std::move(pkg), options, state), methods, state);
}

// A container that holds itself, or nests past any model's depth, is refused before anything walks it (flatten
// above, j2t-run's printing, the conversion to Python objects), which would recurse without end. Only a damaged
// plan builds one (TorchScript's types cannot express it): a list stored into itself by an edited argument.
constexpr int kMaxOutputDepth = 100;  // how deep a model's nested outputs may be

void check_finite_nesting(const c10::IValue& v, std::set<const void*>& open, std::set<const void*>& done, int depth) {
  if (!v.isTuple() && !v.isList() && !v.isGenericDict()) return;
  const void* key = v.internalToPointer();
  if (done.count(key)) return;
  if (open.count(key) || depth > kMaxOutputDepth)
    throw Error(Error::Kind::CorruptPackage, std::string("the model's output holds a list, tuple or dict inside itself, "
                                                         "which no TorchScript model can return: the package's plan "
                                                         "is damaged; ") + policy::kReconvert);
  open.insert(key);
  if (v.isTuple())
    for (const auto& x : v.toTupleRef().elements()) check_finite_nesting(x, open, done, depth + 1);
  else if (v.isList())
    for (const auto& x : v.toListRef()) check_finite_nesting(x, open, done, depth + 1);
  else
    for (const auto& kv : v.toGenericDict()) check_finite_nesting(kv.value(), open, done, depth + 1);
  open.erase(key);
  done.insert(key);
}

bool is_container(const c10::IValue& v) { return v.isTuple() || v.isList() || v.isGenericDict(); }

c10::IValue checked(c10::IValue out) {
  // a tensor, or a tuple of tensors and numbers (most models' outputs), holds nothing that could hold itself
  if (!is_container(out)) return out;
  if (out.isTuple()) {
    const auto& items = out.toTupleRef().elements();
    if (std::none_of(items.begin(), items.end(), is_container)) return out;
  }
  std::set<const void*> open, done;
  check_finite_nesting(out, open, done, 0);
  return out;
}

}  // namespace

Module load(const std::string& path, const LoadOptions& options) {
  try {
    return load_module(path, options);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& err) {
    // A manifest field of the wrong type, a number out of range, a device name torch does not know: checks that
    // name their own problem throw Error; only a damaged or hand-edited package gets here (the mutation fuzz,
    // tests/mutate_packages.py, found these reaching Python as raw RuntimeErrors)
    throw Error(Error::Kind::CorruptPackage, std::string("the package's manifest is damaged (") + err.what() +
                                                 "); " + policy::kReconvert);
  }
}

Module load(const std::string& path, const std::string& device) {
  LoadOptions options;
  options.device = device;
  return load(path, options);
}

c10::IValue Module::call(const std::vector<c10::IValue>& inputs) const { return checked(plan_->call(inputs)); }

std::vector<c10::IValue> Module::check_inputs(const std::vector<c10::IValue>& inputs) const {
  return plan_->checked_inputs(inputs);
}

std::vector<at::Tensor> Module::forward(const std::vector<c10::IValue>& inputs) const {
  std::vector<at::Tensor> out;
  flatten(checked(plan_->call(inputs)), out);
  return out;
}

std::string Module::device() const { return plan_->device.str(); }

void Module::set_profiling(bool on, bool host_only) const { plan_->set_profiling(on, host_only); }

std::vector<StepTime> Module::step_times() const { return plan_->step_times(); }

std::vector<StepOutputs> Module::observe(const std::vector<c10::IValue>& inputs, int per_node) const {
  std::vector<StepOutputs> seen;
  std::map<int, int> times;
  StepObserver keep = [&](int node, const std::vector<c10::IValue>& outputs) {
    if (times[node]++ >= per_node) return;
    StepOutputs made{node, {}};
    for (const auto& v : outputs)  // (an arena's view is written again by later steps: a copy)
      made.outputs.push_back(v.isTensor() ? c10::IValue(v.toTensor().clone()) : c10::IValue());
    seen.push_back(std::move(made));
  };
  try {
    plan_->observe(inputs, keep);
  } catch (const std::exception&) {  // what came before the failure is what there is to compare
  }
  return seen;
}

std::vector<std::string> Module::method_names() const {
  std::vector<std::string> names;
  if (methods_)
    for (const auto& [name, _] : *methods_) names.push_back(name);
  return names;
}

Module Module::method(const std::string& name) const {
  if (methods_) {
    auto found = methods_->find(name);
    if (found != methods_->end()) return Module(found->second, methods_, state_);
  }
  std::string names = "forward";
  for (const auto& other : method_names()) names += ", " + other;
  throw Error(Error::Kind::Input, "the converted model has no method " + repr(name) + "; its methods are " + names);
}

std::vector<std::string> Module::attribute_names() const {
  std::vector<std::string> names;
  if (!state_) return names;
  std::lock_guard<std::mutex> lock(state_->mutex);
  for (const auto& [name, _] : state_->values) names.push_back(name);
  return names;
}

c10::IValue Module::attribute(const std::string& name) const {
  if (state_) {
    std::lock_guard<std::mutex> lock(state_->mutex);
    auto found = state_->values.find(name);
    if (found != state_->values.end()) return found->second.deepcopy();
  }
  throw Error(Error::Kind::Input, "the converted model has no attribute " + repr(name) + " it writes");
}

std::string Module::signature() const { return plan_->signature(); }

bool Module::uses_cuda_graph() const { return plan_->uses_cuda_graph; }

std::map<std::string, std::string_view> Module::members() const { return plan_->package().members; }

std::map<std::string, at::Tensor> Module::weights() const { return plan_->package().weights; }

std::vector<c10::IValue> Module::random_inputs(uint64_t seed, const std::map<std::string, int64_t>& sizes) const {
  return plan_->random_inputs(seed, sizes);
}

}  // namespace jit2triton
