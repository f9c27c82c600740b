// Plan literals: the manifest's JSON (with tags for tuples, devices, dtypes, non-finite floats) as IValues.
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>

#include <functional>
#include <map>
#include <string>

#include "json.h"

namespace jit2triton {

// Device literals naming the device type the package was built for name `device` instead (torch.jit.load's
// map_location).
c10::IValue decode_literal(const json::Value& v, const std::string& built_for, c10::Device device);

// A literal shaped for the schema argument it feeds (an empty JSON list gets the list type the op declares, a number
// where a tensor is wanted becomes a wrapped number, ...).
c10::IValue coerce(c10::IValue v, const c10::TypePtr& t);

// The type a `prim::ListConstruct` / `prim::DictConstruct` step records: ["List", ["Optional", ["Tensor"]]].
c10::TypePtr parse_type(const json::Value& tag);

std::string dtype_name(at::ScalarType t);

// The plan's packed constants (a quantized op's packed weights: deploy/packaging/packed.py), built once at load in their order
// by the ops op_facts::packs_weights allows, each under the quantized engine it names; `ref` resolves a weight or
// literal reference. `entries` may be null (a plan with none).
std::map<std::string, c10::IValue> build_packed(const json::Value* entries,
                                                const std::function<c10::IValue(const json::Value&)>& ref);  // at::kFloat -> "float32", as the manifest and Python name it

}  // namespace jit2triton
