#pragma once

#include <functional>
#include <string>
#include <vector>

#include "json.h"
#include "plan.h"

namespace jit2triton::host_ops {

// The step running `op` when it is one of TorchScript's container or control ops the runtime runs itself (lists,
// tuples, dicts built and unpacked, prim::tolist, prim::RaiseException, ...); an empty function for any other op.
// `source`: the node's line in the model ("file.py:12  text", or ""), where a warning points as TorchScript's does.
std::function<void(Env&)> step(const std::string& op, const json::Value& s, const std::vector<Ref>& args,
                               const std::vector<int>& outs, const std::string& source = "");

}  // namespace jit2triton::host_ops
