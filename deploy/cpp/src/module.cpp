#include <ATen/ATen.h>

#include <set>

#include "jit2triton/jit2triton.h"
#include "plan.h"

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

// A container that holds itself, or nests past any model's depth, is refused before anything walks it (flatten
// above, j2t-run's printing, the conversion to Python objects), which would recurse without end. Only a damaged
// plan builds one (TorchScript's types cannot express it): a list stored into itself by an edited argument.
constexpr int kMaxOutputDepth = 100;  // MAX_OUTPUT_DEPTH in deploy/plan_check.py

void check_finite_nesting(const c10::IValue& v, std::set<const void*>& open, std::set<const void*>& done, int depth) {
  if (!v.isTuple() && !v.isList() && !v.isGenericDict()) return;
  const void* key = v.internalToPointer();
  if (done.count(key)) return;
  if (open.count(key) || depth > kMaxOutputDepth)
    throw Error(Error::Kind::CorruptPackage, "the model's output holds a list, tuple or dict inside itself, which no "
                                             "TorchScript model can return: the package's plan is damaged; re-run `jit2triton convert`");
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

c10::IValue checked(c10::IValue out) {
  std::set<const void*> open, done;
  check_finite_nesting(out, open, done, 0);
  return out;
}

}  // namespace

Module load(const std::string& path, const LoadOptions& options) {
  try {
    return Module(std::make_shared<Plan>(read_package(path, options.mmap, options.trusted_keys), options));
  } catch (const Error&) {
    throw;
  } catch (const std::exception& err) {
    // A manifest field of the wrong type, a number out of range, a device name torch does not know: checks that
    // name their own problem throw Error; only a damaged or hand-edited package gets here (the mutation fuzz,
    // tests/mutate_packages.py, found these reaching Python as raw RuntimeErrors)
    throw Error(Error::Kind::CorruptPackage, std::string("the package's manifest is damaged (") + err.what() +
                                                 "); re-run `jit2triton convert`");
  }
}

Module load(const std::string& path, const std::string& device) {
  LoadOptions options;
  options.device = device;
  return load(path, options);
}

c10::IValue Module::call(const std::vector<c10::IValue>& inputs) const { return checked(plan_->call(inputs)); }

std::vector<at::Tensor> Module::forward(const std::vector<c10::IValue>& inputs) const {
  std::vector<at::Tensor> out;
  flatten(checked(plan_->call(inputs)), out);
  return out;
}

std::string Module::device() const { return plan_->device.str(); }

std::string Module::signature() const { return plan_->signature(); }

bool Module::uses_cuda_graph() const { return plan_->uses_cuda_graph; }

std::map<std::string, std::string_view> Module::members() const { return plan_->package().members; }

std::map<std::string, at::Tensor> Module::weights() const { return plan_->package().weights; }

std::vector<c10::IValue> Module::random_inputs(uint64_t seed, const std::map<std::string, int64_t>& sizes) const {
  return plan_->random_inputs(seed, sizes);
}

}  // namespace jit2triton
