// What a plan's kernels rely on, checked once at load (deploy/plan_check.py does the same in Python): a kernel step
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

void check_structure(const json::Value& manifest, const std::map<std::string, at::Tensor>& weights);

}  // namespace jit2triton
