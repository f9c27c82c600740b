#include "state.h"

#include <ATen/ATen.h>

#include "jit2triton/jit2triton.h"
#include "literals.h"
#include "manifest_schema.h"
#include "policy.h"

namespace jit2triton {

namespace {

[[noreturn]] void damaged(const std::string& what) {
  throw Error(Error::Kind::CorruptPackage, "the package's module state is damaged (" + what +
                                               "); " + policy::kReconvert);
}

at::Tensor weight(const json::Value& ref, const std::string& name, const Package& pkg, c10::Device device) {
  if (ref.kind != json::Value::Kind::String) damaged(name);
  auto found = pkg.weights.find(ref.as_string());
  if (found == pkg.weights.end()) damaged(name + " names a tensor the package does not hold");
  return found->second.to(device).clone();
}

c10::IValue initial_value(const json::Value& entry, const std::string& name, const Package& pkg,
                          const std::string& built_for, c10::Device device) {
  if (const json::Value* ref = entry.optional("weight")) return weight(*ref, name, pkg, device);
  if (const json::Value* refs = entry.optional("weights")) {  // a list of tensors (names: the schema checked them)
    c10::List<at::Tensor> tensors;
    for (const auto& ref : refs->items) tensors.push_back(weight(ref, name, pkg, device));
    return tensors;
  }
  if (const json::Value* value = entry.find("value")) return decode_literal(*value, built_for, device);
  damaged(name + " has no value");
}

c10::TypePtr declared_type(const json::Value& entry) {
  const json::Value* type = entry.optional("type");
  if (!type) return nullptr;
  c10::TypePtr parsed = parse_type(*type);  // (its form: the schema checked it)
  if (parsed->kind() != c10::TypeKind::ListType && parsed->kind() != c10::TypeKind::DictType) return nullptr;
  return parsed;
}

// `value` as a container of the declared type, where its own items are untyped (Any); else `value` itself
c10::IValue typed(const c10::IValue& value, const c10::TypePtr& declared) {
  if (declared->kind() == c10::TypeKind::ListType && value.isList()) {
    auto list = value.toList();
    if (list.elementType()->kind() != c10::TypeKind::AnyType) return value;
    c10::impl::GenericList out(declared->expectRef<c10::ListType>().getElementType());
    for (const auto& item : list) out.push_back(item);
    return out;
  }
  if (declared->kind() == c10::TypeKind::DictType && value.isGenericDict()) {
    auto dict = value.toGenericDict();
    if (dict.keyType()->kind() != c10::TypeKind::AnyType && dict.valueType()->kind() != c10::TypeKind::AnyType)
      return value;
    const auto& type = declared->expectRef<c10::DictType>();
    c10::impl::GenericDict out(type.getKeyType(), type.getValueType());
    for (const auto& kv : dict) out.insert_or_assign(kv.key(), kv.value());
    return out;
  }
  return value;
}

}  // namespace

ModelState::ModelState(const json::Value& entries, const Package& pkg, const std::string& built_for,
                       c10::Device device, std::shared_ptr<StateStore> store)
    : store_(store ? std::move(store) : std::make_shared<StateStore>()) {
  if (entries.kind != json::Value::Kind::Array) damaged("not a list");
  for (const auto& entry : entries.items) {
    manifest_schema::check_state(entry);  // its name, whether it is written, its weights' names, its type's form
    const std::string& key = entry.at("name").as_string();
    c10::IValue initial = initial_value(entry, key, pkg, built_for, device);
    if (c10::TypePtr declared = declared_type(entry)) {
      containers_[key] = declared;
      initial = typed(initial, declared);
    }
    {
      std::lock_guard<std::mutex> lock(store_->mutex);
      store_->values.emplace(key, std::move(initial));
    }
    names_.push_back(key);
    if (entry.at("written").as_bool()) written_.push_back(key);
    if (entry.optional("weights")) tensor_lists_.insert(key);
  }
  if (!written_.empty()) {
    std::lock_guard<std::mutex> lock(store_->mutex);
    store_->written = true;
  }
}

c10::IValue ModelState::as_declared(const std::string& name, const c10::IValue& value) const {
  // A list of tensors stays one: a plan may return a constant empty list (`self.cache = []` in a reset method),
  // which a literal decodes as a list of no declared type, and aten::stack then refuses it on the next call.
  if (auto found = containers_.find(name); found != containers_.end()) return typed(value, found->second);
  if (!value.isList() || value.isTensorList() || !tensor_lists_.count(name)) return value;
  c10::List<at::Tensor> tensors;
  for (const auto& item : value.toListRef()) tensors.push_back(item.toTensor());
  return tensors;
}

c10::IValue ModelState::run(const std::function<c10::IValue(std::vector<c10::IValue>)>& run,
                            std::vector<c10::IValue> inputs) const {
  std::unique_lock<std::mutex> serial(store_->writing_calls, std::defer_lock);
  if (!written_.empty()) serial.lock();
  {
    std::unique_lock<std::mutex> lock(store_->mutex, std::defer_lock);
    if (store_->written) lock.lock();
    for (const auto& name : names_) inputs.push_back(store_->values.at(name));
  }
  c10::IValue result = run(std::move(inputs));
  if (written_.empty()) return result;
  if (!result.isTuple()) damaged("the plan returns no new state");
  const auto& outs = result.toTupleRef().elements();
  if (outs.size() <= written_.size()) damaged("the plan returns too few outputs");
  size_t split = outs.size() - written_.size();
  {
    std::lock_guard<std::mutex> lock(store_->mutex);
    for (size_t i = 0; i < written_.size(); ++i) store_->values[written_[i]] = as_declared(written_[i], outs[split + i]);
  }
  if (split == 1) return outs[0];
  return c10::ivalue::Tuple::create(std::vector<c10::IValue>(outs.begin(), outs.begin() + split));
}

}  // namespace jit2triton
