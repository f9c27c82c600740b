// A package's signature: the per-input checks built at load (their messages the ones users read), the
// printed signature, and random inputs that fit it.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <optional>

#include "manifest_schema.h"
#include "plan.h"

namespace jit2triton {

using c10::IValue;
using json::Value;

namespace {

// torch's name of a layout, as torch prints it (no iostreams in the extension: see cuda_graph.cpp).
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
    // a dynamic size is a dim's name (inputs) or expression (an output's "dims"); the rest are ints
    const Value& shape = d.find("dims") ? d.at("dims") : d.at("shape");
    std::string dims;
    for (size_t i = 0; i < shape.size(); ++i)
      dims += (i ? ", " : "") + (shape[i].is_string() ? shape[i].as_string() : std::to_string(shape[i].as_int()));
    return d.at("dtype").as_string() + "[" + dims + "]";
  }
  if (const Value* fields = d.find("fields")) {  // a NamedTuple: Det(boxes: float32[3, 4], scores: float32[3])
    std::string items;
    for (size_t i = 0; i < fields->size() && i < d.at("items").size(); ++i)
      items += (i ? ", " : "") + (*fields)[i].as_string() + ": " + format_type(d.at("items")[i]);
    return d.at("name").as_string() + "(" + items + ")";
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
  std::vector<DimRange> ranges;
  if (const Value* dims = pkg_.manifest.at("signature").find("dims")) {
    for (const auto& [name, d] : dims->members) {
      dim_names_.push_back(name);
      ranges.push_back({d.at("min").as_int(), d.at("max").is_null() ? -1 : d.at("max").as_int()});
    }
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Value& d = inputs[i];
    std::string name = d.at("name").as_string();
    input_names_.push_back(name);
    const Value* def = d.find("default");
    has_default_.push_back(def != nullptr);
    defaults_.push_back(def ? decode_literal(*def, built_for_, device) : IValue());
    if (!def) ++required_;
    checks_.push_back(input_check(d, "input " + std::to_string(i) + " (" + repr(name) + ")", ranges, contiguous));
  }
}

// The check of one input, or of a container input's item or element.
Plan::InputCheck Plan::input_check(const Value& d, const std::string& label, const std::vector<DimRange>& ranges,
                                   bool contiguous) const {
  const std::string& kind = d.at("type").as_string();
  if (kind == "List" || kind == "Tuple" || kind == "Dict") return container_check(d, label, ranges, contiguous);
  if (kind == "Tensor") {
    const Value* given = d.find("shape");
    if (given == nullptr || !given->is_array())
      throw Error(Error::Kind::CorruptPackage, policy::message::unshaped_tensor(label));
    at::ScalarType dtype = parse_dtype(d.at("dtype").as_string());
    // the dense layout generated kernels read inputs in: row-major, or channels-last where the example was
    at::MemoryFormat layout = at::MemoryFormat::Contiguous;
    if (const Value* declared = d.find("layout")) {
      size_t rank = d.at("shape").size();
      if (declared->as_string() != "channels_last" || (rank != 4 && rank != 5))
        throw Error(Error::Kind::CorruptPackage, label + " declares layout " + repr(declared->as_string()) + " for a " +
                                                     std::to_string(rank) + "-d tensor, which this runtime does not know; " + policy::kReconvert);
      layout = rank == 4 ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::ChannelsLast3d;
    }
    c10::DeviceType type = device.type();
    std::string expected = format_type(d) + " on " + c10::DeviceTypeName(type, true);
    std::vector<int64_t> shape;  // -1 at a dynamic dim
    struct Dynamic {
      size_t axis, dim;
      DimRange range;
    };
    std::vector<Dynamic> dynamic;
    for (const auto& x : d.at("shape").items) {
      if (x.is_string()) {
        auto it = std::find(dim_names_.begin(), dim_names_.end(), x.as_string());
        if (it == dim_names_.end())
          throw Error(Error::Kind::CorruptPackage, label + " names dim " + repr(x.as_string()) + ", which the signature does not declare; " + policy::kReconvert);
        size_t dim = static_cast<size_t>(it - dim_names_.begin());
        dynamic.push_back({shape.size(), dim, ranges[dim]});
        shape.push_back(-1);
      } else {
        shape.push_back(x.as_int());
      }
    }
    std::vector<std::string> names = dim_names_;
    const Value* optional = d.find("optional");  // an Optional[Tensor] the model tests for None
    bool takes_none = optional && optional->kind == Value::Kind::Bool && optional->as_bool();
    return [=](IValue& v, Bound& bound) {
      if (takes_none && v.isNone()) return;
      if (!v.isTensor()) throw Error(Error::Kind::Input, label + ": expected a tensor " + expected + (takes_none ? " or None" : "") + ", got " + python_type_name(v));
      const at::Tensor& x = v.toTensor();
      if (x.layout() != at::kStrided)
        throw Error(Error::Kind::Input, label + ": expected a dense tensor " + expected + ", got a " +
                                            layout_name(x.layout()) + " tensor; pass x.to_dense()");
      bool same = x.scalar_type() == dtype && x.dim() == static_cast<int64_t>(shape.size()) && x.device().type() == type;
      for (size_t a = 0; same && a < shape.size(); ++a) same = shape[a] < 0 || x.size(a) == shape[a];
      if (!same)
        throw Error(Error::Kind::Input,
                    label + ": expected " + expected + ", got " + dtype_name(x.scalar_type()) + "[" + join_dims(x.sizes()) +
                        "] on " + x.device().str() +
                        ". The package was converted for that signature; convert again with example inputs of the shape and dtype you need");
      for (const auto& dyn : dynamic) {
        int64_t n = x.size(dyn.axis);
        if (n < dyn.range.min || (dyn.range.max >= 0 && n > dyn.range.max))
          throw Error(Error::Kind::Input, label + ": axis " + std::to_string(dyn.axis) + " is dim " + names[dyn.dim] +
                                              ", whose range is " + std::to_string(dyn.range.min) + ".." +
                                              (dyn.range.max >= 0 ? std::to_string(dyn.range.max) : "inf") + "; got " +
                                              std::to_string(n) + ". Convert again with a wider Dim to serve that size");
        if (bound.size[dyn.dim] < 0) {
          bound.size[dyn.dim] = n;
          bound.where[dyn.dim] = label + " axis " + std::to_string(dyn.axis);
        } else if (bound.size[dyn.dim] != n) {
          throw Error(Error::Kind::Input, label + ": axis " + std::to_string(dyn.axis) + " is dim " + names[dyn.dim] +
                                              ", which is " + std::to_string(bound.size[dyn.dim]) + " in " + bound.where[dyn.dim] +
                                              "; got " + std::to_string(n) + ". The model needs those sizes equal");
        }
      }
      if (contiguous && !x.is_contiguous(layout)) v = x.contiguous(layout);
    };
  }
  if (kind == "int" || kind == "float" || kind == "bool" || kind == "str") {
    // an int the package serves at the example's value only
    const Value* fixed = d.find("fixed");
    const Value* example = d.find("example");
    bool one_value = kind == "int" && fixed && fixed->kind == Value::Kind::Bool && fixed->boolean && example &&
                     example->kind == Value::Kind::Int;
    int64_t only = one_value ? example->integer : 0;
    bool is_int = kind == "int", is_float = kind == "float", is_bool = kind == "bool";  // (decided once, here)
    return [=](IValue& v, Bound&) {
      bool ok = is_int ? v.isInt() : is_float ? (v.isDouble() || v.isInt()) : is_bool ? v.isBool() : v.isString();
      if (!ok) throw Error(Error::Kind::Input, label + ": expected " + kind + ", got " + python_type_name(v));
      if (one_value && v.toInt() != only)
        throw Error(Error::Kind::Input, label + ": the package serves only the value " + std::to_string(only) +
                                            " it was converted with (the model ran at no other value during "
                                            "conversion, so a size it sets is fixed); got " +
                                            std::to_string(v.toInt()) + ". Convert again with that value in the "
                                            "example inputs");
      if (is_float && v.isInt()) v = static_cast<double>(v.toInt());
    };
  }
  return [](IValue&, Bound&) {};
}

// A tuple is checked item by item (its arity is its TorchScript type's), and so is a list marked "fixed" (the
// example's tensors differed in shape, and conversion saw the model at no others: jit2triton/conversion.py); a
// list's or dict's elements by their "element" type, where the signature has one. An element a check replaces (a
// tensor made dense) goes into a copy: the caller's container is not changed.
Plan::InputCheck Plan::container_check(const Value& d, const std::string& label, const std::vector<DimRange>& ranges,
                                       bool contiguous) const {
  const std::string& kind = d.at("type").as_string();
  bool is_list = kind == "List", is_tuple = kind == "Tuple";
  const Value* fixed = d.find("fixed");
  bool by_item = is_tuple || (is_list && fixed && fixed->kind == Value::Kind::Bool && fixed->boolean);
  std::string noun = is_list ? "a list" : is_tuple ? "a tuple" : "a dict";
  std::vector<InputCheck> items;  // a tuple's or fixed list's, one per item
  InputCheck element;             // a list's or dict's, where the signature has one
  std::string expected = noun, fixed_note;
  if (by_item) {
    const Value* declared = d.find("items");
    if (!declared || !declared->is_array())
      throw Error(Error::Kind::CorruptPackage, label + " is " + noun + " without its item types; " + policy::kReconvert);
    for (size_t i = 0; i < declared->size(); ++i) {
      manifest_schema::check_signature_item((*declared)[i]);
      items.push_back(input_check((*declared)[i], label + " item " + std::to_string(i), ranges, contiguous));
    }
    std::string types;
    for (size_t i = 0; i < declared->size(); ++i) types += (i ? ", " : "") + format_type((*declared)[i]);
    expected += " of " + std::to_string(items.size()) + " items (" + types + ")";
    if (!is_tuple)  // (a fixed list: its tensors' shapes differed, and each may set sizes the package fixed)
      fixed_note = ", as in the example inputs, whose tensors differed in shape: the package serves those shapes in "
                   "that order only. Convert again with example inputs of the shapes you will pass";
  } else if (const Value* declared = d.find("element"); declared && !declared->is_null()) {
    manifest_schema::check_signature_item(*declared);
    element = input_check(*declared, label + " element", ranges, contiguous);
    expected += " of " + format_type(*declared);
  }
  std::string element_label = label + " element";
  // an element's check, its message naming the element's position (known only in the call)
  auto check_element = [element, element_label](IValue& value, Bound& bound, const std::string& position) {
    try {
      element(value, bound);
    } catch (const Error& err) {
      if (err.kind() != Error::Kind::Input) throw;
      std::string message = err.what();
      throw Error(Error::Kind::Input, element_label + " " + position + message.substr(element_label.size()));
    }
  };
  return [=](IValue& v, Bound& bound) {
    if (!(is_list ? v.isList() : is_tuple ? v.isTuple() : v.isGenericDict()))
      throw Error(Error::Kind::Input, label + ": expected " + expected + ", got " + python_type_name(v));
    if (by_item) {
      std::vector<IValue> given;
      if (is_tuple) {
        const auto& elements = v.toTupleRef().elements();
        given.assign(elements.begin(), elements.end());
      } else {
        for (const IValue& item : v.toList()) given.push_back(item);
      }
      if (given.size() != items.size())
        throw Error(Error::Kind::Input, label + ": expected " + expected + ", got " + std::to_string(given.size()) +
                                            " items" + fixed_note);
      std::vector<IValue> out(given.begin(), given.end());
      bool changed = false;
      for (size_t i = 0; i < items.size(); ++i) {
        items[i](out[i], bound);
        changed = changed || !out[i].isSameIdentity(given[i]);
      }
      if (!changed) return;
      if (is_tuple) {
        v = c10::ivalue::Tuple::create(std::move(out));
      } else {
        c10::List<IValue> copy = v.toList().copy();
        for (size_t i = 0; i < out.size(); ++i) copy.set(i, std::move(out[i]));
        v = std::move(copy);
      }
      return;
    }
    if (!element) return;
    if (is_list) {
      c10::List<IValue> list = v.toList();
      std::optional<c10::List<IValue>> copy;
      for (size_t i = 0; i < list.size(); ++i) {
        IValue value = list.get(i);
        check_element(value, bound, std::to_string(i));
        if (value.isSameIdentity(list.get(i))) continue;
        if (!copy) copy = list.copy();
        copy->set(i, std::move(value));
      }
      if (copy) v = std::move(*copy);
      return;
    }
    c10::Dict<IValue, IValue> dict = v.toGenericDict();
    std::optional<c10::Dict<IValue, IValue>> copy;
    for (const auto& entry : dict) {
      IValue value = entry.value();
      const IValue& key = entry.key();
      check_element(value, bound, key.isString() ? repr(key.toStringRef()) : key.isInt() ? std::to_string(key.toInt())
                                                                                      : python_type_name(key));
      if (value.isSameIdentity(entry.value())) continue;
      if (!copy) copy = dict.copy();
      copy->insert_or_assign(key, std::move(value));
    }
    if (copy) v = std::move(*copy);
  };
}

std::string Plan::signature() const {
  const Value& sig = pkg_.manifest.at("signature");
  std::string args;
  for (size_t i = 0; i < sig.at("inputs").size(); ++i) {
    const Value& d = sig.at("inputs")[i];
    const Value* optional = d.find("optional");  // (deploy/signature.py's format_input)
    bool takes_none = optional && optional->kind == Value::Kind::Bool && optional->as_bool();
    args += (i ? ", " : "") + d.at("name").as_string() + ": " +
            (takes_none ? "Optional[" + format_type(d) + "]" : format_type(d));
  }
  return "(" + args + ") -> " + format_type(sig.at("outputs"));
}

std::vector<IValue> Plan::random_inputs(uint64_t seed, const std::map<std::string, int64_t>& sizes) const {
  const Value* dims = pkg_.manifest.at("signature").find("dims");
  for (const auto& [name, n] : sizes) {
    const Value* dim = dims ? dims->find(name) : nullptr;
    if (!dim)
      throw Error(Error::Kind::Input, "the package has no dynamic dim " + repr(name) + (dim_names_.empty() ? "; its shapes are static" : ""));
    const Value *low = dim->find("min"), *high = dim->find("max");
    if (low && high && low->kind == Value::Kind::Int && high->kind == Value::Kind::Int &&
        (n < low->integer || n > high->integer))
      throw Error(Error::Kind::Input, "dim " + repr(name) + " takes sizes " + std::to_string(low->integer) + ".." +
                                          std::to_string(high->integer) + ", not " + std::to_string(n));
  }
  try {
    return draw_inputs(seed, sizes);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& err) {
    // the sizes asked for were checked above: only a damaged signature (an example size of -1, 2**62, a field
    // of the wrong type) gets here; found by the sanitized mutation fuzz (tests/test_sanitized_fuzz.py)
    const auto* torch_error = dynamic_cast<const c10::Error*>(&err);
    throw Error(Error::Kind::CorruptPackage,
                std::string("cannot draw inputs from the package's signature (") +
                    (torch_error ? torch_error->what_without_backtrace() : err.what()) +
                    "); the package is damaged: " + policy::kReconvert);
  }
}

std::vector<IValue> Plan::draw_inputs(uint64_t seed, const std::map<std::string, int64_t>& sizes) const {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  const Value* dims = pkg_.manifest.at("signature").find("dims");
  std::vector<IValue> values;
  for (const auto& entry : pkg_.manifest.at("signature").at("inputs").items) {
    if (entry.at("type").as_string() == "Tensor") {
      at::ScalarType dtype = parse_dtype(entry.at("dtype").as_string());
      std::vector<int64_t> shape;
      for (const auto& d : entry.at("shape").items) {
        if (!d.is_string()) {
          shape.push_back(d.as_int());
          continue;
        }
        auto it = sizes.find(d.as_string());
        shape.push_back(it != sizes.end() ? it->second : dims->at(d.as_string()).at("example").as_int());
      }
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
