#pragma once

#include <functional>
#include <string>
#include <vector>

#include "json.h"
#include "plan.h"

namespace jit2triton::host_ops {

// The step running `op` when it is one of TorchScript's container or control ops the runtime runs itself (lists,
// tuples, dicts built and unpacked, prim::tolist, prim::RaiseException, ...); an empty function for any other op.
std::function<void(Env&)> step(const std::string& op, const json::Value& s, const std::vector<Ref>& args,
                               const std::vector<int>& outs);

}  // namespace jit2triton::host_ops
