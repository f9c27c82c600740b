#include "state.h"

#include <ATen/ATen.h>

#include "jit2triton/jit2triton.h"
#include "literals.h"

namespace jit2triton {

namespace {

[[noreturn]] void damaged(const std::string& what) {
  throw Error(Error::Kind::CorruptPackage, "the package's module state is damaged (" + what +
                                               "); re-run `jit2triton convert`");
}

}  // namespace

ModelState::ModelState(const json::Value& entries, const Package& pkg, const std::string& built_for,
                       c10::Device device) {
  if (entries.kind != json::Value::Kind::Array) damaged("not a list");
  for (const auto& entry : entries.items) {
    if (entry.kind != json::Value::Kind::Object) damaged("an entry is not an object");
    const json::Value* name = entry.find("name");
    const json::Value* written = entry.find("written");
    if (!name || name->kind != json::Value::Kind::String || !written || written->kind != json::Value::Kind::Bool)
      damaged("an entry without its name");
    if (const json::Value* weight = entry.find("weight")) {
      if (weight->kind != json::Value::Kind::String) damaged(name->as_string());
      auto found = pkg.weights.find(weight->as_string());
      if (found == pkg.weights.end()) damaged(name->as_string() + " names a tensor the package does not hold");
      values_.push_back(found->second.to(device).clone());
    } else if (const json::Value* value = entry.find("value")) {
      values_.push_back(decode_literal(*value, built_for, device));
    } else {
      damaged(name->as_string() + " has no value");
    }
    if (written->as_bool()) written_.push_back(values_.size() - 1);
  }
}

c10::IValue ModelState::run(const std::function<c10::IValue(std::vector<c10::IValue>)>& run,
                            std::vector<c10::IValue> inputs) const {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    inputs.insert(inputs.end(), values_.begin(), values_.end());
  }
  c10::IValue result = run(std::move(inputs));
  if (written_.empty()) return result;
  if (!result.isTuple()) damaged("the plan returns no new state");
  const auto& outs = result.toTupleRef().elements();
  if (outs.size() <= written_.size()) damaged("the plan returns too few outputs");
  size_t split = outs.size() - written_.size();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < written_.size(); ++i) values_[written_[i]] = outs[split + i];
  }
  if (split == 1) return outs[0];
  return c10::ivalue::Tuple::create(std::vector<c10::IValue>(outs.begin(), outs.begin() + split));
}

}  // namespace jit2triton
