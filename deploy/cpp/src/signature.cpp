// A package's signature: the per-input checks built at load (the Python runtime's messages, word for word), the
// printed signature, and random inputs that fit it.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "plan.h"

namespace jit2triton {

using c10::IValue;
using json::Value;

namespace {

// torch's name of a layout, as the Python runtime prints it (no iostreams in the extension: see cuda_graph.cpp).
std::string layout_name(at::Layout layout) {
  switch (layout) {
    case at::kSparse: return "torch.sparse_coo";
    case at::kSparseCsr: return "torch.sparse_csr";
    case at::kSparseCsc: return "torch.sparse_csc";
    case at::kSparseBsr: return "torch.sparse_bsr";
    case at::kSparseBsc: return "torch.sparse_bsc";
    case at::kMkldnn: return "torch._mkldnn";
    default: return "non-strided";
  }
}


std::string python_type_name(const IValue& v) {
  if (v.isTensor()) return "Tensor";
  if (v.isBool()) return "bool";
  if (v.isInt()) return "int";
  if (v.isDouble()) return "float";
  if (v.isString()) return "str";
  if (v.isNone()) return "NoneType";
  if (v.isList()) return "list";
  if (v.isTuple()) return "tuple";
  if (v.isGenericDict()) return "dict";
  return v.tagKind();
}

std::string format_type(const Value& d) {
  const std::string& kind = d.at("type").as_string();
  if (kind == "Tensor") {
    std::string dims;
    for (size_t i = 0; i < d.at("shape").size(); ++i) dims += (i ? ", " : "") + std::to_string(d.at("shape")[i].as_int());
    return d.at("dtype").as_string() + "[" + dims + "]";
  }
  if (kind == "Tuple" || kind == "List") {
    std::string items;
    for (size_t i = 0; i < d.at("items").size(); ++i) items += (i ? ", " : "") + format_type(d.at("items")[i]);
    return kind + "[" + items + "]";
  }
  if (kind == "Dict") {
    std::string items;
    for (const auto& [k, v] : d.at("items").members) items += (items.empty() ? "" : ", ") + k + ": " + format_type(v);
    return "Dict{" + items + "}";
  }
  return kind;
}

}  // namespace

std::string join_dims(at::IntArrayRef dims) {
  std::string out;
  for (size_t i = 0; i < dims.size(); ++i) out += (i ? ", " : "") + std::to_string(dims[i]);
  return out;
}

void Plan::build_input_checks() {
  const Value& inputs = pkg_.manifest.at("signature").at("inputs");
  bool contiguous = !kernels_.empty();  // generated kernels index inputs as dense row-major tensors
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Value& d = inputs[i];
    std::string name = d.at("name").as_string();
    input_names_.push_back(name);
    const Value* def = d.find("default");
    has_default_.push_back(def != nullptr);
    defaults_.push_back(def ? decode_literal(*def, built_for_, device) : IValue());
    if (!def) ++required_;
    std::string label = "input " + std::to_string(i) + " (" + repr(name) + ")";
    const std::string& kind = d.at("type").as_string();
    if (kind == "Tensor") {
      at::ScalarType dtype = parse_dtype(d.at("dtype").as_string());
      std::vector<int64_t> shape;
      for (const auto& x : d.at("shape").items) shape.push_back(x.as_int());
      c10::DeviceType type = device.type();
      std::string expected = d.at("dtype").as_string() + "[" + join_dims(shape) + "] on " + c10::DeviceTypeName(type, true);
      checks_.push_back([=](IValue& v) {
        if (!v.isTensor()) throw Error(Error::Kind::Input, label + ": expected a tensor " + expected + ", got " + python_type_name(v));
        const at::Tensor& x = v.toTensor();
        if (x.layout() != at::kStrided)
          throw Error(Error::Kind::Input, label + ": expected a dense tensor " + expected + ", got a " +
                                              layout_name(x.layout()) + " tensor; pass x.to_dense()");
        if (x.scalar_type() != dtype || x.sizes() != at::IntArrayRef(shape) || x.device().type() != type)
          throw Error(Error::Kind::Input,
                      label + ": expected " + expected + ", got " + dtype_name(x.scalar_type()) + "[" + join_dims(x.sizes()) +
                          "] on " + x.device().str() +
                          ". The package was converted for that signature; convert again with example inputs of the shape and dtype you need");
        if (contiguous && !x.is_contiguous()) v = x.contiguous();
      });
    } else if (kind == "int" || kind == "float" || kind == "bool" || kind == "str") {
      checks_.push_back([=](IValue& v) {
        bool ok = kind == "int" ? v.isInt() : kind == "float" ? (v.isDouble() || v.isInt())
                : kind == "bool" ? v.isBool() : v.isString();
        if (!ok) throw Error(Error::Kind::Input, label + ": expected " + kind + ", got " + python_type_name(v));
        if (kind == "float" && v.isInt()) v = static_cast<double>(v.toInt());
      });
    } else {
      checks_.push_back([](IValue&) {});
    }
  }
}

std::string Plan::signature() const {
  const Value& sig = pkg_.manifest.at("signature");
  std::string args;
  for (size_t i = 0; i < sig.at("inputs").size(); ++i)
    args += (i ? ", " : "") + sig.at("inputs")[i].at("name").as_string() + ": " + format_type(sig.at("inputs")[i]);
  return "(" + args + ") -> " + format_type(sig.at("outputs"));
}

std::vector<IValue> Plan::random_inputs(uint64_t seed) const {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::vector<IValue> values;
  for (const auto& entry : pkg_.manifest.at("signature").at("inputs").items) {
    if (entry.at("type").as_string() == "Tensor") {
      at::ScalarType dtype = parse_dtype(entry.at("dtype").as_string());
      std::vector<int64_t> shape;
      for (const auto& d : entry.at("shape").items) shape.push_back(d.as_int());
      int64_t low = 0, high = 2;
      if (const auto* range = entry.find("range")) {
        low = (*range)[0].as_int();
        high = (*range)[1].as_int();
      }
      at::Tensor t;
      if (dtype == at::kBool) t = at::rand(shape, generator) < 0.5;
      else if (at::isFloatingType(dtype) || at::isComplexType(dtype)) t = at::randn(shape, generator).to(dtype);
      else t = at::randint(low, std::max(high, low + 1), shape, generator, at::TensorOptions().dtype(dtype));
      values.push_back(t.to(device));
    } else if (const auto* example = entry.find("example")) {
      values.push_back(decode_literal(*example, built_for_, device));
    } else {
      throw Error(Error::Kind::Input, "cannot make a random value for input " + repr(entry.at("name").as_string()) +
                                          " of type " + entry.at("type").as_string());
    }
  }
  return values;
}

}  // namespace jit2triton
