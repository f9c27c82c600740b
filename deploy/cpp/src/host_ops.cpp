// TorchScript's container and control ops that carry their types on the node, not in a schema: the plan steps the
// C++ runtime runs itself rather than through an ATen operator (deploy/host_ops.py is the reference interpreter's table).
#include "host_ops.h"

#include <cstdio>
#include <memory>
#include <string>

#include <ATen/core/Dict.h>
#include <ATen/core/List.h>

#include "jit2triton/jit2triton.h"
#include "literals.h"
#include "plan_check.h"
#include "policy.h"

namespace jit2triton::host_ops {

using c10::IValue;
using json::Value;

namespace {

// A float as TorchScript's print writes it (IValue's operator<<): a whole number in int64's range as its digits and
// a point ("2."; -0.0 too prints "0."), anything else in 17 significant digits ("0.10000000000000001", "1e+20").
// snprintf, not a string stream: streams crashed extensions built on the GPU machine (docs/benchmarks.md, 2026-11-29).
std::string float_text(double d) {
  if (d > -9223372036854775808.0 && d < 9223372036854775808.0 && static_cast<double>(static_cast<int64_t>(d)) == d)
    return std::to_string(static_cast<int64_t>(d)) + ".";
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", d);
  return text;
}

// A value as TorchScript's print writes it: strings bare (in containers too), containers spelled out; a tensor, or
// any other object, through c10's own printing.
std::string print_text(const IValue& v) {
  if (v.isString()) return v.toStringRef();
  if (v.isInt()) return std::to_string(v.toInt());
  if (v.isDouble()) return float_text(v.toDouble());
  if (v.isBool()) return v.toBool() ? "True" : "False";
  if (v.isNone()) return "None";
  if (v.isList() || v.isTuple()) {
    bool list = v.isList();
    c10::ArrayRef<IValue> items = list ? v.toListRef() : c10::ArrayRef<IValue>(v.toTupleRef().elements());
    std::string text = list ? "[" : "(";
    for (size_t i = 0; i < items.size(); ++i) text += (i ? ", " : "") + print_text(items[i]);
    return text + (list ? "]" : items.size() == 1 ? ",)" : ")");
  }
  if (v.isGenericDict()) {
    std::string text = "{";
    bool first = true;
    for (const auto& item : v.toGenericDict()) {
      text += (first ? "" : ", ") + print_text(item.key()) + ": " + print_text(item.value());
      first = false;
    }
    return text + "}";
  }
  return c10::str(v);
}

// tensor.tolist() as TorchScript's prim::tolist gives it: `dim` nested lists of the `elem` type the model annotated
// (0: int, 1: float, 2: bool), checked against the tensor as TorchScript checks it.
IValue tensor_to_list(const at::Tensor& tensor, int64_t dim, int64_t elem) {
  if (elem < 0 || elem > 2) throw std::invalid_argument("tolist() gives lists of int, float or bool only");
  if (tensor.dim() != dim)
    throw std::invalid_argument(
        "Output annotation list dimension and runtime tensor dimension must match for tolist()");
  at::ScalarType as = elem == 0 ? at::kLong : elem == 1 ? at::kDouble : at::kBool;
  if (elem == 1 ? !tensor.is_floating_point() : tensor.scalar_type() != as)
    throw std::invalid_argument(
        "Output annotation element type and runtime tensor element type must match for tolist()");
  at::Tensor t = tensor.to(at::kCPU, as).contiguous();
  const c10::TypePtr kinds[] = {c10::IntType::get(), c10::FloatType::get(), c10::BoolType::get()};
  std::function<IValue(int64_t, int64_t)> build = [&](int64_t depth, int64_t offset) -> IValue {
    if (depth == dim) {
      if (elem == 0) return t.const_data_ptr<int64_t>()[offset];
      if (elem == 1) return t.const_data_ptr<double>()[offset];
      return t.const_data_ptr<bool>()[offset];
    }
    c10::TypePtr type = kinds[elem];
    for (int64_t d = depth + 1; d < dim; ++d) type = c10::ListType::create(type);
    c10::impl::GenericList list(type);
    list.reserve(t.size(depth));
    for (int64_t i = 0; i < t.size(depth); ++i) list.push_back(build(depth + 1, offset + i * t.stride(depth)));
    return list;
  };
  return build(0, 0);
}

// The type of the container a ListConstruct / DictConstruct step builds ("List" / "Dict": `kind`), or null where the
// step records none (the schema checked the type's form; plan_check.py checks its kind alike).
c10::TypePtr container_type(const Value& s, const std::string& kind) {
  const Value* t = s.find("type");
  if (!t || t->is_null()) return nullptr;
  if ((*t)[0].as_string() != kind)
    throw Error(Error::Kind::CorruptPackage, "the package's plan is damaged (a step building a " + kind +
                                                 " records the type " + (*t)[0].as_string() + "); " +
                                                 policy::kReconvert);
  return parse_type(*t);
}

}  // namespace

std::function<void(Env&)> step(const std::string& op, const Value& s, const std::vector<Ref>& args,
                               const std::vector<int>& outs, const std::string& source) {
  if (op == "prim::ListConstruct") {
    c10::TypePtr elem = c10::AnyType::get();
    if (auto type = container_type(s, "List")) elem = type->containedTypes().at(0);
    int out = outs.at(0);
    return [args, elem, out](Env& env) {
      c10::impl::GenericList list(elem);
      list.reserve(args.size());
      for (const auto& a : args) list.push_back(a.get(env));
      env[out] = std::move(list);
    };
  }
  if (op == "prim::TupleConstruct") {
    int out = outs.at(0);
    return [args, out](Env& env) {
      std::vector<IValue> items;
      items.reserve(args.size());
      for (const auto& a : args) items.push_back(a.get(env));
      env[out] = c10::ivalue::Tuple::create(std::move(items));
    };
  }
  if (op == "prim::DictConstruct") {
    c10::TypePtr key = c10::AnyType::get(), value = c10::AnyType::get();
    if (auto dict = container_type(s, "Dict")) {
      key = dict->containedTypes().at(0);
      value = dict->containedTypes().at(1);
    }
    int out = outs.at(0);
    return [args, key, value, out](Env& env) {
      c10::impl::GenericDict dict(key, value);
      for (size_t i = 0; i + 1 < args.size(); i += 2) dict.insert_or_assign(args[i].get(env), args[i + 1].get(env));
      env[out] = std::move(dict);
    };
  }
  if (op == "prim::ListUnpack" || op == "prim::TupleUnpack") {
    Ref from = args.at(0);
    return [from, outs](Env& env) {
      const IValue& v = from.get(env);
      auto n = v.isTuple() ? v.toTupleRef().elements().size() : v.toListRef().size();
      if (n != outs.size())
        throw std::runtime_error("cannot unpack " + std::to_string(n) + " values into " + std::to_string(outs.size()));
      IValue keep = v;  // the slot may be one of the outputs
      for (size_t i = 0; i < outs.size(); ++i)
        env[outs[i]] = keep.isTuple() ? keep.toTupleRef().elements()[i] : keep.toListRef()[i];
    };
  }
  if (op == "prim::TupleIndex") {
    Ref from = args.at(0), index = args.at(1);
    int out = outs.at(0);
    return [from, index, out](Env& env) {
      const auto& items = from.get(env).toTupleRef().elements();
      int64_t i = index.get(env).toInt();
      if (i < 0) i += static_cast<int64_t>(items.size());
      if (i < 0 || i >= static_cast<int64_t>(items.size())) throw std::out_of_range("tuple index out of range");
      env[out] = items[i];
    };
  }
  if (op == "prim::unchecked_cast" || op == "prim::data") {
    Ref from = args.at(0);
    int out = outs.at(0);
    return [from, out](Env& env) { env[out] = from.get(env); };
  }
  if (op == "prim::tolist") {  // tensor.tolist(): TorchScript makes its operation per node, so it is run here
    if (args.size() != 3) bad_plan("prim::tolist takes a tensor, its dim and its element type");
    Ref from = args[0], dim = args[1], elem = args[2];
    int out = outs.at(0);
    return [from, dim, elem, out](Env& env) {
      env[out] = tensor_to_list(from.get(env).toTensor(), dim.get(env).toInt(), elem.get(env).toInt());
    };
  }
  if (op == "prim::Uninitialized") {
    int out = outs.at(0);
    return [out](Env& env) { env[out] = IValue(); };
  }
  if (op == "aten::warn") {  // warnings.warn: torch's warning handler (Python's warnings, when Python loaded it)
    Ref message = args.empty() ? Ref{} : args[0];
    // As TorchScript warns: the message verbatim, at the model's file and line (not this file's, which TORCH_WARN
    // would append to the message); Python's warning then names the model's line. The file outlives the warning.
    auto file = std::make_shared<const std::string>(source.substr(0, source.find("  ")));
    uint32_t line = 0;
    size_t colon = file->rfind(':');
    if (colon != std::string::npos && colon + 1 < file->size() && file->size() - colon <= 10 &&
        file->find_first_not_of("0123456789", colon + 1) == std::string::npos) {  // (up to 9 digits: no overflow)
      for (size_t i = colon + 1; i < file->size(); ++i) line = line * 10 + static_cast<uint32_t>((*file)[i] - '0');
      file = std::make_shared<const std::string>(file->substr(0, colon));
    }
    return [message, file, line](Env& env) {
      const IValue& m = message.get(env);
      std::string text = m.isString() ? m.toStringRef() : std::string("a warning from the model");
      c10::SourceLocation where{"", file->empty() ? nullptr : file->c_str(), line};
      c10::warn(c10::Warning(c10::UserWarning(), where, std::move(text), /*verbatim=*/true));
    };
  }
  if (op == "prim::Print") {  // print(...): the arguments' text, separated by spaces, on stdout
    return [args](Env& env) {
      std::string line;
      for (size_t i = 0; i < args.size(); ++i) {
        const IValue& v = args[i].get(env);
        if (i) line += ' ';
        line += print_text(v);
      }
      std::fwrite(line.data(), 1, line.size(), stdout);
      std::fputc('\n', stdout);
      std::fflush(stdout);
    };
  }
  if (op == "prim::RaiseException") {
    Ref message = args.empty() ? Ref{} : args[0];
    return [message](Env& env) {
      const IValue& m = message.get(env);
      // (TorchScript raises with a message string; no iostreams here, see graph_key in cuda_graph.cpp)
      std::string text = m.isString() ? m.toStringRef() : m.isNone() ? "" : "a " + m.tagKind();
      throw Error(Error::Kind::ModelRaised, "the model raised an exception: " + text);
    };
  }
  return nullptr;
}

}  // namespace jit2triton::host_ops
