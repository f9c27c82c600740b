// What a plan's kernels rely on, checked once at load: a kernel step
// passes the buffers its kernel was built for, allocates its outputs dense, checks its inputs against the kernel's
// layouts and reads weights of the kernel's dtype, shape and layout; control flow gives as many values as its
// outputs; the arena is no larger than what is planned into it; each dynamic dim's range is one a call can meet.
// A damaged manifest is refused with Error(CorruptPackage), never read or written out of bounds during a call.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>

#include "json.h"

namespace jit2triton {

// Refuses a damaged plan: "the package's plan is damaged (<what>); <re-convert advice>", a CorruptPackage error.
[[noreturn]] void bad_plan(const std::string& what);

// The plan's steps against the schema and the kernel index: each step's fields, the ops a plan may call, the buffers,
// sizes, numbers and outputs a kernel step passes its kernel.
void check_plan(const json::Value& plan, int64_t num_nodes, const json::Value& kernels);

void check_structure(const json::Value& manifest, const std::map<std::string, at::Tensor>& weights);

}  // namespace jit2triton
