// Generated from deploy/format.py by `python -m jit2triton.deploy.format`: edit that file, not this one.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "jit2triton/jit2triton.h"
#include "json.h"
#include "package.h"
#include "policy.h"

namespace jit2triton::manifest_schema {

enum class Type { Str, Int, Bool, List, Object, Strs, Count, Slots, Node, Refs, Tag, Sizes, Shape };

inline const char* type_words(Type type) {
  static const char* words[] = {"a string", "an integer", "true or false", "a list", "an object", "a list of strings", "an integer", "a list of slots", "a node", "a list of references", "a TorchScript type", "a list of sizes", "a list of sizes and dim names"};
  return words[static_cast<int>(type)];
}

struct Field {
  const char* name;
  Type type;
  bool required;
  const char* damaged;  // what a refusal says is damaged ("": the field and its type)
  int64_t most;         // Type::Count: the largest value
  std::set<std::string> known;  // Str, Strs: the values this jit2triton knows ...
  const char* unknown_before;   // ... and the message refusing another, around its repr
  const char* unknown_after;
};

struct Limits {
  int64_t num_slots = 0, num_nodes = 0;  // what a slot and a node index
};

[[noreturn]] inline void damaged(const std::string& section, const std::string& what) {
  throw Error(Error::Kind::CorruptPackage, "the package's " + section + " is damaged (" + what + "); " + policy::kReconvert);
}

inline bool in_range(const json::Value& v, int64_t limit) {
  return v.kind == json::Value::Kind::Int && v.integer >= 0 && v.integer < limit;
}

// A reference: [kind, what], kind one of REF_KINDS; a slot's below num_slots (negative: any integer)
inline bool is_ref(const json::Value& r, int64_t num_slots) {
  static const std::set<std::string> kinds = {"s", "c", "w", "wl", "p"};
  if (!r.is_array() || r.size() != 2 || !r[0].is_string() || !kinds.count(r[0].as_string())) return false;
  if (r[0].as_string() != "s") return true;
  return num_slots < 0 ? r[1].kind == json::Value::Kind::Int : in_range(r[1], num_slots);
}

// A TorchScript type as nested lists (format.py's _is_tag): kinds in TAG_ARITY take exactly that many item types
inline bool is_tag(const json::Value& v, int64_t depth) {
  static const std::map<std::string, size_t> arity = {{"Optional", 1}, {"List", 1}, {"Dict", 2}};
  if (!v.is_array() || v.size() == 0 || !v[0].is_string() || depth >= 32) return false;
  auto known = arity.find(v[0].as_string());
  if (known != arity.end() && v.size() != known->second + 1) return false;
  for (size_t i = 1; i < v.size(); ++i)
    if (!is_tag(v[i], depth + 1)) return false;
  return true;
}

inline bool all_of(const json::Value& v, bool (*test)(const json::Value&, int64_t), int64_t limit) {
  if (!v.is_array()) return false;
  for (const auto& item : v.items)
    if (!test(item, limit)) return false;
  return true;
}

inline bool is(const json::Value& v, const Field& f, const Limits& limits) {
  auto is_string = [](const json::Value& x, int64_t) { return x.is_string(); };
  auto is_size = [](const json::Value& x, int64_t) { return x.kind == json::Value::Kind::Int && x.integer >= 0; };
  auto is_dim = [](const json::Value& x, int64_t) {  // a size, or a dynamic dim's name
    return x.is_string() || (x.kind == json::Value::Kind::Int && x.integer >= 0);
  };
  switch (f.type) {
    case Type::Str: return v.is_string();
    case Type::Int: return v.kind == json::Value::Kind::Int;
    case Type::Bool: return v.kind == json::Value::Kind::Bool;
    case Type::List: return v.is_array();
    case Type::Object: return v.is_object();
    case Type::Strs: return all_of(v, is_string, 0);
    case Type::Count: return v.kind == json::Value::Kind::Int && v.integer >= 0 && v.integer <= f.most;
    case Type::Slots: return all_of(v, in_range, limits.num_slots);
    case Type::Node: return in_range(v, limits.num_nodes);
    case Type::Refs: return all_of(v, is_ref, limits.num_slots);
    case Type::Tag: return is_tag(v, 0);
    case Type::Sizes: return all_of(v, is_size, 0);
    case Type::Shape: return all_of(v, is_dim, 0);
  }
  return false;
}

inline void check(const char* section, const std::vector<Field>& fields, const json::Value& value, const Limits& limits) {
  if (!value.is_object()) damaged(section, "not an object");
  for (const Field& f : fields) {
    const json::Value* v = value.find(f.name);
    if (!v || v->is_null()) {
      if (f.required) damaged(section, *f.damaged ? f.damaged : "no " + repr(f.name));
      continue;
    }
    if (!is(*v, f, limits)) {
      if (*f.damaged) damaged(section, f.damaged);
      // (references that would be right with any slot: one of their slots is outside)
      if (f.type == Type::Slots || (f.type == Type::Refs && all_of(*v, is_ref, -1)))
        damaged(section, "a slot outside 0.." + std::to_string(limits.num_slots - 1));
      damaged(section, repr(f.name) + " is not " + type_words(f.type));
    }
    if (f.known.empty()) continue;
    std::vector<const json::Value*> names;  // a Str's value, or each of a Strs'
    if (f.type == Type::Strs)
      for (const auto& item : v->items) names.push_back(&item);
    else
      names.push_back(v);
    for (const json::Value* name : names)
      if (!f.known.count(name->as_string()))
        throw Error(Error::Kind::PackageVersion, f.unknown_before + repr(name->as_string()) + f.unknown_after);
  }
}

inline void check_manifest(const json::Value& value, const Limits& limits = {}) {
  static const std::vector<Field> fields = {
    {"producer", Type::Object, false, "", 0, {}, "", ""},
    {"device", Type::Str, true, "", 0, {}, "", ""},
    {"backend", Type::Str, true, "", 0, {}, "", ""},
    {"model", Type::Object, false, "", 0, {}, "", ""},
    {"signature", Type::Object, true, "", 0, {}, "", ""},
    {"plan", Type::Object, true, "", 0, {}, "", ""},
    {"nodes", Type::List, true, "", 0, {}, "", ""},
    {"kernels", Type::List, true, "", 0, {}, "", ""},
    {"weights", Type::Object, false, "", 0, {}, "", ""},
    {"report", Type::Object, false, "", 0, {}, "", ""},
    {"ir", Type::Str, false, "", 0, {}, "", ""},
    {"cuda_graph", Type::Bool, false, "", 0, {}, "", ""},
    {"state", Type::List, false, "", 0, {}, "", ""},
    {"methods", Type::Object, false, "", 0, {}, "", ""},
    {"runtime", Type::Str, false, "", 0, {}, "", ""},
    {"cpp", Type::Object, false, "", 0, {}, "", ""},
    {"triton", Type::Object, false, "", 0, {}, "", ""},
    {"requires", Type::Strs, false, "", 0, {"state", "methods", "bound_dims", "host_weights", "scalar_arguments", "zeroed_outputs"}, "the package uses ", ", a feature of the package format this jit2triton does not know, and would run wrongly without it; upgrade jit2triton (pip install -U jit2triton)"},
  };
  check("manifest", fields, value, limits);
}

inline void check_producer(const json::Value& value, const Limits& limits = {}) {
  static const std::vector<Field> fields = {
    {"torch", Type::Str, false, "", 0, {}, "", ""},
  };
  check("manifest", fields, value, limits);
}

inline void check_signature(const json::Value& value, const Limits& limits = {}) {
  static const std::vector<Field> fields = {
    {"inputs", Type::List, true, "", 0, {}, "", ""},
    {"outputs", Type::Object, true, "", 0, {}, "", ""},
    {"dims", Type::Object, false, "", 0, {}, "", ""},
  };
  check("signature", fields, value, limits);
}

inline void check_signature_input(const json::Value& value, const Limits& limits = {}) {
  static const std::vector<Field> fields = {
    {"name", Type::Str, true, "", 0, {}, "", ""},
    {"type", Type::Str, true, "", 0, {}, "", ""},
    {"shape", Type::Shape, false, "", 0, {}, "", ""},
  };
  check("signature", fields, value, limits);
}

inline void check_signature_item(const json::Value& value, const Limits& limits = {}) {
  static const std::vector<Field> fields = {
    {"type", Type::Str, true, "", 0, {}, "", ""},
    {"shape", Type::Shape, false, "", 0, {}, "", ""},
    {"items", Type::List, false, "", 0, {}, "", ""},
    {"element", Type::Object, false, "", 0, {}, "", ""},
    {"fixed", Type::Bool, false, "", 0, {}, "", ""},
  };
  check("signature", fields, value, limits);
}

inline void check_plan(const json::Value& value, const Limits& limits = {}) {
  static const std::vector<Field> fields = {
    {"num_slots", Type::Count, true, "num_slots", 16777216, {}, "", ""},
    {"inputs", Type::Slots, true, "", 0, {}, "", ""},
    {"outputs", Type::Refs, true, "", 0, {}, "", ""},
    {"steps", Type::List, true, "", 0, {}, "", ""},
    {"dims", Type::List, false, "", 0, {}, "", ""},
    {"bound_dims", Type::Strs, false, "its bound dims", 0, {}, "", ""},
    {"arena", Type::Object, false, "", 0, {}, "", ""},
    {"host_weights", Type::Strs, false, "", 0, {}, "", ""},
    {"packed", Type::List, false, "", 0, {}, "", ""},
  };
  check("plan", fields, value, limits);
}

inline void check_step(const json::Value& value, const Limits& limits = {}) {
  static const std::vector<Field> fields = {
    {"kind", Type::Str, true, "", 0, {"call", "kernel", "if", "loop", "graph"}, "the package's plan has a step of kind ", ", which this jit2triton does not know; upgrade jit2triton (pip install -U jit2triton)"},
    {"node", Type::Node, true, "a step names a node that is not in the node table", 0, {}, "", ""},
    {"outs", Type::Slots, false, "", 0, {}, "", ""},
    {"free", Type::Slots, false, "", 0, {}, "", ""},
    {"kwnames", Type::Strs, false, "", 0, {}, "", ""},
    {"args", Type::Refs, true, "", 0, {}, "", ""},
    {"type", Type::Tag, false, "", 0, {}, "", ""},
  };
  check("plan", fields, value, limits);
}

inline void check_block(const json::Value& value, const Limits& limits = {}) {
  static const std::vector<Field> fields = {
    {"inputs", Type::Slots, true, "", 0, {}, "", ""},
    {"steps", Type::List, true, "", 0, {}, "", ""},
    {"outputs", Type::Refs, true, "", 0, {}, "", ""},
  };
  check("plan", fields, value, limits);
}

inline void check_kernel(const json::Value& value, const Limits& limits = {}) {
  static const std::vector<Field> fields = {
    {"name", Type::Str, true, "", 0, {}, "", ""},
    {"num_buffers", Type::Int, true, "", 0, {}, "", ""},
    {"sizes", Type::Strs, false, "", 0, {}, "", ""},
  };
  check("manifest", fields, value, limits);
}

inline void check_cpp(const json::Value& value, const Limits& limits = {}) {
  static const std::vector<Field> fields = {
    {"isa", Type::Str, true, "", 0, {}, "", ""},
  };
  check("manifest's cpp section", fields, value, limits);
}

inline void check_weight(const json::Value& value, const Limits& limits = {}) {
  static const std::vector<Field> fields = {
    {"dtype", Type::Str, true, "", 0, {}, "", ""},
    {"shape", Type::Sizes, true, "", 0, {}, "", ""},
    {"offset", Type::Count, true, "", 4611686018427387904, {}, "", ""},
    {"nbytes", Type::Count, true, "", 4611686018427387904, {}, "", ""},
    {"memory_order", Type::Sizes, false, "", 0, {}, "", ""},
  };
  check("weights index", fields, value, limits);
}

inline void check_state(const json::Value& value, const Limits& limits = {}) {
  static const std::vector<Field> fields = {
    {"name", Type::Str, true, "", 0, {}, "", ""},
    {"written", Type::Bool, true, "", 0, {}, "", ""},
    {"compared", Type::Bool, false, "", 0, {}, "", ""},
    {"weight", Type::Str, false, "", 0, {}, "", ""},
    {"weights", Type::Strs, false, "", 0, {}, "", ""},
    {"type", Type::Tag, false, "", 0, {}, "", ""},
  };
  check("module state", fields, value, limits);
}

// The manifest, its producer, signature, plan and kernel index, as read_manifest checks them in Python.
inline void check_all(const json::Value& manifest) {
  check_manifest(manifest);
  if (const json::Value* producer = manifest.find("producer"); producer && !producer->is_null())
    check_producer(*producer);
  check_signature(manifest.at("signature"));
  for (const auto& entry : manifest.at("signature").at("inputs").items) check_signature_input(entry);
  for (const auto& kernel : manifest.at("kernels").items) check_kernel(kernel);
  if (const json::Value* cpp = manifest.find("cpp"); cpp && !cpp->is_null()) check_cpp(*cpp);
}

}  // namespace jit2triton::manifest_schema
