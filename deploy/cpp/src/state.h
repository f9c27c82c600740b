// Module state (deploy/state.py is the Python runtime's): the attributes a scripted model writes (a warned-once
// flag, a call counter, a cached tensor), held by the loaded module between calls. The plan is a pure function: it
// takes the state after the model's inputs and returns the written attributes' new values after its outputs.
#pragma once

#include <ATen/core/ivalue.h>

#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "package.h"

namespace jit2triton {

class ModelState {
 public:
  // From the manifest's "state" entries: literals decoded, tensors taken from the package's weights (copied to
  // `device`: the model may write them in place).
  ModelState(const json::Value& entries, const Package& pkg, const std::string& built_for, c10::Device device);

  // `run` on the inputs and the current state; keeps the new state and returns the model's own output (a tensor,
  // or a tuple of the model's outputs). Concurrent calls share the state, each reading it whole when it starts and
  // writing it whole when it ends, under one lock: TorchScript's attribute writes are not synchronised at all.
  c10::IValue run(const std::function<c10::IValue(std::vector<c10::IValue>)>& run,
                  std::vector<c10::IValue> inputs) const;

 private:
  mutable std::vector<c10::IValue> values_;
  std::vector<size_t> written_;
  mutable std::mutex mutex_;
};

}  // namespace jit2triton
