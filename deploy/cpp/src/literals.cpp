// Plan literals: the JSON of the manifest to IValues, and the types containers and schema arguments want.
#include "literals.h"

#include <ATen/ATen.h>
#include <ATen/ScalarOps.h>
#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <torch/custom_class_detail.h>
#include <torch/csrc/jit/runtime/operator.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <mutex>

#include "jit2triton/jit2triton.h"
#include "op_facts.h"
#include "package.h"
#include "policy.h"

namespace jit2triton {

using c10::IValue;
using json::Value;

namespace {

c10::TypePtr type_of_items(const std::vector<IValue>& items) {
  if (items.empty()) return c10::AnyType::get();
  c10::TypePtr t = items[0].type();
  for (const auto& x : items)
    if (*x.type() != *t) return c10::AnyType::get();
  return t;
}

IValue make_list(std::vector<IValue> items, c10::TypePtr elem) {
  c10::impl::GenericList list(std::move(elem));
  list.reserve(items.size());
  for (auto& x : items) list.push_back(std::move(x));
  return list;
}

double parse_special_float(const std::string& text) {
  if (text == "inf") return INFINITY;
  if (text == "-inf") return -INFINITY;
  if (text == "nan") return NAN;
  return std::stod(text);
}


}  // namespace

std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kLong: return "int64";
    case at::kInt: return "int32";
    case at::kShort: return "int16";
    case at::kChar: return "int8";
    case at::kByte: return "uint8";
    case at::kBool: return "bool";
    case at::kComplexFloat: return "complex64";
    case at::kComplexDouble: return "complex128";
    case at::kQInt8: return "qint8";
    case at::kQUInt8: return "quint8";
    case at::kQInt32: return "qint32";
    default: return c10::toString(t);
  }
}

IValue decode_literal(const Value& v, const std::string& built_for, c10::Device device) {
  switch (v.kind) {
    case Value::Kind::Null: return IValue();
    case Value::Kind::Bool: return v.boolean;
    case Value::Kind::Int: return v.integer;
    case Value::Kind::Float: return v.number;
    case Value::Kind::String: return v.text;
    case Value::Kind::Array: {
      std::vector<IValue> items;
      for (const auto& x : v.items) items.push_back(decode_literal(x, built_for, device));
      auto elem = type_of_items(items);
      return make_list(std::move(items), elem);
    }
    case Value::Kind::Object: break;
  }
  if (v.members.size() != 1) throw Error(Error::Kind::CorruptPackage, "the plan holds a malformed literal");
  const auto& [tag, body] = v.members[0];
  if (tag == "$tuple") {
    std::vector<IValue> items;
    for (const auto& x : body.items) items.push_back(decode_literal(x, built_for, device));
    return c10::ivalue::Tuple::create(std::move(items));
  }
  if (tag == "$device") {
    c10::Device d(body.as_string());
    return (c10::DeviceTypeName(d.type(), true) == built_for) ? device : d;
  }
  if (tag == "$dtype") return parse_dtype(body.as_string());
  if (tag == "$float") return parse_special_float(body.as_string());
  if (tag == "$complex")
    return c10::complex<double>(decode_literal(body[0], built_for, device).toDouble(),
                                decode_literal(body[1], built_for, device).toDouble());
  if (tag == "$dict") {
    std::vector<IValue> keys, values;
    for (const auto& kv : body.items) {
      keys.push_back(decode_literal(kv[0], built_for, device));
      values.push_back(decode_literal(kv[1], built_for, device));
    }
    c10::impl::GenericDict dict(type_of_items(keys), type_of_items(values));
    for (size_t i = 0; i < keys.size(); ++i) dict.insert_or_assign(keys[i], values[i]);
    return dict;
  }
  throw Error(Error::Kind::PackageVersion, "unknown literal tag " + repr(tag) + "; the package needs a newer jit2triton");
}

// A literal shaped for the schema argument it feeds: an empty or untyped JSON list gets the list type the op
// declares, tensors given to a `Tensor?[]` become optional tensors, an int given to a float becomes a float.
IValue coerce(IValue v, const c10::TypePtr& t) {
  if (auto opt = t->cast<c10::OptionalType>()) return v.isNone() ? v : coerce(std::move(v), opt->getElementType());
  if (auto lt = t->cast<c10::ListType>()) {
    if (!v.isList()) return v;
    auto list = v.toList();
    c10::TypePtr elem = lt->getElementType();
    if (elem->kind() == c10::SymIntType::Kind) elem = c10::IntType::get();
    bool untyped = list.elementType()->kind() == c10::AnyType::Kind || list.empty();
    if (!untyped && !elem->cast<c10::OptionalType>()) return v;
    if (*list.elementType() == *elem) return v;
    std::vector<IValue> items;
    for (const auto& x : list) items.push_back(coerce(x, elem));
    return make_list(std::move(items), elem);
  }
  if (t->kind() == c10::FloatType::Kind && v.isInt()) return static_cast<double>(v.toInt());
  if (t->kind() == c10::TensorType::Kind && (v.isDouble() || v.isInt() || v.isBool() || v.isComplexDouble())) {
    // A number where the schema wants a tensor: a wrapped number, as Python's torch.ops passes it, so that it
    // promotes like a scalar (float32 * 2.5 stays float32).
    at::Tensor wrapped = c10::scalar_to_tensor(v.toScalar());
    wrapped.unsafeGetTensorImpl()->set_wrapped_number(true);
    return wrapped;
  }
  return v;
}

// The type a `prim::ListConstruct` / `prim::DictConstruct` step records: ["List", ["Optional", ["Tensor"]]].
c10::TypePtr parse_type(const Value& tag) {
  const std::string& kind = tag[0].as_string();
  if (kind == "Tensor") return c10::TensorType::get();
  if (kind == "int") return c10::IntType::get();
  if (kind == "float") return c10::FloatType::get();
  if (kind == "bool") return c10::BoolType::get();
  if (kind == "str") return c10::StringType::get();
  if (kind == "complex") return c10::ComplexType::get();
  if (kind == "Device") return c10::DeviceObjType::get();
  if (kind == "Scalar") return c10::NumberType::get();
  if (kind == "None") return c10::NoneType::get();
  if (kind == "Optional") return c10::OptionalType::create(parse_type(tag[1]));
  if (kind == "List") return c10::ListType::create(parse_type(tag[1]));
  if (kind == "Dict") return c10::DictType::create(parse_type(tag[1]), parse_type(tag[2]));
  if (kind.rfind("__torch__.torch.classes.", 0) == 0) {  // a packed-parameters class (CellParamsBase[] lists)
    if (auto cls = torch::getCustomClass(kind)) return cls;
  }
  if (kind == "Tuple") {
    std::vector<c10::TypePtr> elems;
    for (size_t i = 1; i < tag.size(); ++i) elems.push_back(parse_type(tag[i]));
    return c10::TupleType::create(std::move(elems));
  }
  return c10::AnyType::get();
}

namespace {

// The quantized engine a packing op names, checked against this torch's; QEngine values are policy's table.
at::QEngine engine_named(const std::string& name) {
  const auto& engines = policy::quantized_engines();
  auto it = engines.find(name);
  const auto& supported = at::globalContext().supportedQEngines();
  if (it == engines.end() ||
      std::find(supported.begin(), supported.end(), static_cast<at::QEngine>(it->second)) == supported.end()) {
    std::string have;
    for (const auto& [engine_name, value] : engines)
      if (std::find(supported.begin(), supported.end(), static_cast<at::QEngine>(value)) != supported.end())
        have += (have.empty() ? "" : ", ") + engine_name;
    throw Error(Error::Kind::QuantizedEngine, policy::message::missing_engine(name, have.empty() ? "none" : have));
  }
  return static_cast<at::QEngine>(it->second);
}

std::mutex engine_switch;  // torch's quantized engine is process-wide: one load switches it at a time

// Runs `pack` with torch's quantized engine set to `engine` (as it is when it already is).
c10::IValue under_engine(at::QEngine engine, const std::function<c10::IValue()>& pack) {
  auto& context = at::globalContext();
  if (context.qEngine() == engine) return pack();
  std::lock_guard<std::mutex> lock(engine_switch);
  at::QEngine previous = context.qEngine();
  context.setQEngine(engine);
  try {
    c10::IValue made = pack();
    context.setQEngine(previous);
    return made;
  } catch (...) {
    context.setQEngine(previous);
    throw;
  }
}

c10::IValue run_packing_op(const std::string& op, std::vector<c10::IValue> args) {
  if (!op_facts::packs_weights(op))
    throw Error(Error::Kind::CorruptPackage, policy::message::packing_op(repr(op)));
  auto dot = op.find('.', op.find("::") + 2);
  std::string name = op.substr(0, dot), overload = dot == std::string::npos ? "" : op.substr(dot + 1);
  auto found = torch::jit::findOperatorFor(c10::OperatorName(name, overload));
  if (!found)
    throw Error(Error::Kind::Package, policy::unknown_op(op, repr(op), J2T_TORCH_VERSION));
  const auto& schema = found->schema();
  if (args.size() != schema.arguments().size())
    throw Error(Error::Kind::CorruptPackage, "the package's plan packs a constant with " + op + " and " +
                                                 std::to_string(args.size()) + " arguments where it takes " +
                                                 std::to_string(schema.arguments().size()) + "; " + policy::kReconvert);
  torch::jit::Stack stack;
  for (size_t i = 0; i < args.size(); ++i) stack.push_back(coerce(std::move(args[i]), schema.arguments()[i].type()));
  found->getOperation()(stack);
  return stack.at(0);
}

}  // namespace

std::map<std::string, c10::IValue> build_packed(const Value* entries,
                                                const std::function<c10::IValue(const Value&)>& ref) {
  std::map<std::string, c10::IValue> built;
  if (!entries) return built;
  for (const auto& entry : entries->items) {
    std::vector<c10::IValue> args;
    for (const auto& r : entry.at("args").items) {
      if (r[0].as_string() != "p") {
        args.push_back(ref(r));
        continue;
      }
      auto it = built.find(r[1].as_string());
      if (it == built.end()) throw Error(Error::Kind::CorruptPackage, policy::message::packed_missing(repr(r[1].as_string())));
      args.push_back(it->second);
    }
    const std::string& op = entry.at("op").as_string();
    auto pack = [&] { return run_packing_op(op, std::move(args)); };
    const Value* engine = entry.find("engine");
    built[entry.at("name").as_string()] = engine ? under_engine(engine_named(engine->as_string()), pack) : pack();
  }
  return built;
}

}  // namespace jit2triton
