// A small JSON reader for the package manifest: a DOM of null, bool, number, string, array and object.
// Numbers keep whether they were written as integers, so plan literals keep TorchScript's int/float split.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace jit2triton::json {

class Value {
 public:
  enum class Kind { Null, Bool, Int, Float, String, Array, Object };

  Kind kind = Kind::Null;
  bool boolean = false;
  int64_t integer = 0;
  double number = 0.0;
  std::string text;
  std::vector<Value> items;                              // Array
  std::vector<std::pair<std::string, Value>> members;   // Object, in file order

  bool is_null() const { return kind == Kind::Null; }
  bool is_object() const { return kind == Kind::Object; }
  bool is_array() const { return kind == Kind::Array; }
  bool is_string() const { return kind == Kind::String; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float; }

  // Object access: `find` returns null when absent; `optional` also when null (an optional field, as the schema
  // and the Python reader take one); `at` throws naming the missing key.
  const Value* find(std::string_view key) const;
  const Value* optional(std::string_view key) const;
  const Value& at(std::string_view key) const;
  const Value& operator[](size_t i) const;
  size_t size() const { return kind == Kind::Object ? members.size() : items.size(); }

  int64_t as_int() const;
  double as_double() const;
  bool as_bool() const;
  const std::string& as_string() const;
};

// Throws std::runtime_error with the byte offset of the first problem.
Value parse(std::string_view text);

// Whether two values are the same JSON (objects' members in the same order, as Python and C++ write them).
bool equal(const Value& a, const Value& b);

}  // namespace jit2triton::json
