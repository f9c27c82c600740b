// Module state: the attributes a scripted model writes (a warned-once
// flag, a call counter, a cached tensor), held by the loaded module between calls. Each method's plan is a pure
// function: it takes the state after the method's inputs and returns the written attributes' new values after its
// outputs. The store is the loaded module's, shared by its methods, as TorchScript's module attributes are. Calls
// to methods that write state run one at a time per loaded module (the store's `writing_calls`), so each sees the
// state every earlier call left, as TorchScript's calls one after another do; a method that writes none reads the
// state whole when it starts and runs alongside them, and a module whose plans write none takes no lock per call.
#pragma once

#include <ATen/core/ivalue.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "package.h"

namespace jit2triton {

struct StateStore {
  std::map<std::string, c10::IValue> values;  // by attribute name ("roi_heads._has_warned")
  std::mutex mutex;          // over `values`: held to read or write them, never across a call
  std::mutex writing_calls;  // held across a whole call of a method that writes state
  bool written = false;      // whether any of the module's plans writes state (else `values` never change)
};

class ModelState {
 public:
  // From a plan's manifest "state" entries: literals decoded, tensors taken from the package's weights (copied to
  // `device`: the model may write them in place); an attribute the store already holds (another method's) is kept.
  ModelState(const json::Value& entries, const Package& pkg, const std::string& built_for, c10::Device device,
             std::shared_ptr<StateStore> store);

  // `run` on the inputs and the current state; keeps the new state and returns the model's own output (a tensor,
  // or a tuple of the model's outputs). A plan that writes state runs under the store's `writing_calls`.
  c10::IValue run(const std::function<c10::IValue(std::vector<c10::IValue>)>& run,
                  std::vector<c10::IValue> inputs) const;

 private:
  c10::IValue as_declared(const std::string& name, const c10::IValue& value) const;

  std::vector<std::string> names_, written_;
  std::set<std::string> tensor_lists_;  // attributes of type List[Tensor] (stored as "weights")
  // lists and dicts by their declared TorchScript type ("Dict[str, Tensor]"): an empty one decodes, and a reset
  // returns one, with items of no type, which ops such as aten::stack over its values refuse
  std::map<std::string, c10::TypePtr> containers_;
  std::shared_ptr<StateStore> store_;
};

}  // namespace jit2triton
