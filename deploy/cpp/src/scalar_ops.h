// Host steps on ints, floats, bools and lists that TorchScript's interpreter runs through its operand stack (push
// the arguments, the operator pops them and pushes its result): here each reads its argument slots and writes its
// output slot, with the operator's own arithmetic, and no stack or operator call in between. Which ops, and whether
// an argument is a constant, is decided at load; every other op goes through its TorchScript operator.
// tests/test_scalar_steps.py holds each against TorchScript's, on the values where they could differ.
#pragma once

#include <ATen/core/List.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "plan.h"

namespace jit2triton {
namespace scalar_ops {

using Step = std::function<void(Env&)>;

template <typename T>
T read(const c10::IValue& v);
template <>
inline int64_t read<int64_t>(const c10::IValue& v) { return v.toInt(); }
template <>
inline double read<double>(const c10::IValue& v) { return v.toDouble(); }
template <>
inline bool read<bool>(const c10::IValue& v) { return v.toBool(); }

// f(a, b) into `out`; a constant b (most are: `i * 7`, `v > 6`) is read once, at load
template <typename T, typename F>
Step binary(const std::vector<Ref>& args, int out, F f) {
  Ref a = args[0], b = args[1];
  if (b.slot < 0) {
    T constant = read<T>(b.constant);
    return [a, constant, out, f](Env& env) { env[out] = c10::IValue(f(read<T>(a.get(env)), constant)); };
  }
  return [a, b, out, f](Env& env) { env[out] = c10::IValue(f(read<T>(a.get(env)), read<T>(b.get(env)))); };
}

// int64 arithmetic wraps as TorchScript's does on every platform it runs on (there, signed overflow in C++)
inline int64_t wrap(uint64_t v) { return static_cast<int64_t>(v); }

template <typename T>
Step compare(const std::string& name, const std::vector<Ref>& args, int out) {
  if (name == "eq") return binary<T>(args, out, [](T a, T b) { return a == b; });
  if (name == "ne") return binary<T>(args, out, [](T a, T b) { return a != b; });
  if (name == "lt") return binary<T>(args, out, [](T a, T b) { return a < b; });
  if (name == "le") return binary<T>(args, out, [](T a, T b) { return a <= b; });
  if (name == "gt") return binary<T>(args, out, [](T a, T b) { return a > b; });
  if (name == "ge") return binary<T>(args, out, [](T a, T b) { return a >= b; });
  return nullptr;
}

// The step for `op` (a plan's "op": name and overload) with these arguments, or null: not one of these, or
// arguments of another count than its schema's (the operator path refuses those with its message).
inline Step step(const std::string& op, const std::vector<Ref>& args, int out) {
  auto dot = op.rfind('.');
  std::string name = op.substr(0, dot), overload = dot == std::string::npos ? "" : op.substr(dot + 1);
  if (name.rfind("aten::", 0) != 0) return nullptr;
  name = name.substr(6);
  if (args.size() == 1) {
    Ref a = args[0];
    if (op == "aten::__not__") return [a, out](Env& env) { env[out] = c10::IValue(!a.get(env).toBool()); };
    if (op == "aten::neg.int")
      return [a, out](Env& env) { env[out] = c10::IValue(wrap(0 - static_cast<uint64_t>(a.get(env).toInt()))); };
    if (op == "aten::len.t")
      return [a, out](Env& env) { env[out] = c10::IValue(static_cast<int64_t>(a.get(env).toListRef().size())); };
    return nullptr;
  }
  if (args.size() != 2) return nullptr;
  if (op == "aten::append.t") {  // the list, with the item appended (TorchScript's listAppend)
    Ref list = args[0], item = args[1];
    return [list, item, out](Env& env) {
      c10::List<c10::IValue> items = list.get(env).toList();
      items.push_back(item.get(env));
      env[out] = c10::IValue(std::move(items));
    };
  }
  if (op == "aten::__is__" || op == "aten::__isnot__") {  // `x is None`: identity, as IValue::is has it
    Ref a = args[0], b = args[1];
    bool is = op == "aten::__is__";
    return [a, b, is, out](Env& env) { env[out] = c10::IValue(a.get(env).is(b.get(env)) == is); };
  }
  if (op == "aten::__getitem__.t") {  // TorchScript's getItem: a negative index counts from the end
    Ref list = args[0], index = args[1];
    return [list, index, out](Env& env) {
      const auto& items = list.get(env).toListRef();
      int64_t size = static_cast<int64_t>(items.size()), i = index.get(env).toInt();
      if (i < 0) i += size;
      if (i < 0 || i >= size) throw std::out_of_range("list index out of range");
      env[out] = items[i];
    };
  }
  if (overload == "int") {
    if (name == "add") return binary<int64_t>(args, out, [](int64_t a, int64_t b) { return wrap(uint64_t(a) + uint64_t(b)); });
    if (name == "sub") return binary<int64_t>(args, out, [](int64_t a, int64_t b) { return wrap(uint64_t(a) - uint64_t(b)); });
    if (name == "mul") return binary<int64_t>(args, out, [](int64_t a, int64_t b) { return wrap(uint64_t(a) * uint64_t(b)); });
    // Python's modulo and floor division, as TorchScript computes them; only by a constant that cannot trap (0, and -1 with the least
    // int, which TorchScript's operator does not survive either: those go through it)
    if ((name == "remainder" || name == "floordiv") && args[1].slot < 0 && args[1].constant.isInt()) {
      int64_t b = args[1].constant.toInt();
      if (b == 0 || b == -1) return nullptr;
      if (name == "floordiv")  // rounding down, where C++ rounds toward zero
        return binary<int64_t>(args, out, [](int64_t a, int64_t b) { return a / b - (a % b != 0 && (a < 0) != (b < 0)); });
      return binary<int64_t>(args, out, [](int64_t a, int64_t b) { return wrap(uint64_t(b) + uint64_t(a % b)) % b; });
    }
    return compare<int64_t>(name, args, out);
  }
  if (overload == "float") {
    if (name == "add") return binary<double>(args, out, [](double a, double b) { return a + b; });
    if (name == "sub") return binary<double>(args, out, [](double a, double b) { return a - b; });
    if (name == "mul") return binary<double>(args, out, [](double a, double b) { return a * b; });
    return compare<double>(name, args, out);
  }
  if (overload == "bool" && (name == "__and__" || name == "__or__" || name == "eq" || name == "ne")) {
    if (name == "__and__") return binary<bool>(args, out, [](bool a, bool b) { return a && b; });
    if (name == "__or__") return binary<bool>(args, out, [](bool a, bool b) { return a || b; });
    return compare<bool>(name, args, out);
  }
  return nullptr;
}

}  // namespace scalar_ops
}  // namespace jit2triton
