// Reading a .j2t package: the members of torch's archive container from a file mapped into memory, each checked
// against checksums.json; the manifest parsed; the weights as CPU tensors over the mapping, in their memory order.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "json.h"

namespace jit2triton {

struct MappedFile;

struct Package {
  std::string path;
  std::shared_ptr<MappedFile> file;
  std::map<std::string, std::string_view> members;  // name -> bytes inside the mapping
  std::map<std::string, std::string> checksums;      // name -> sha256 hex
  json::Value manifest;
  std::map<std::string, at::Tensor> weights;          // on the CPU, sharing the mapping (copy-on-write)

  std::string_view member(const std::string& name) const;  // throws CorruptPackage when absent
};

// keep_mapped: weights stay views of the mapped file; otherwise they are copies the module owns. trusted_keys (with
// JIT2TRITON_TRUSTED_KEYS): the package must be signed by one of them (signing.h), checked before parsing.
Package read_package(const std::string& path, bool keep_mapped = false,
                     const std::vector<std::string>& trusted_keys = {});

// "float32" -> at::kFloat: the dtype names of the manifest (torch's, without "torch.").
at::ScalarType parse_dtype(const std::string& name);

// Python's repr of a string, for messages identical to the Python loader's: 'model.j2t'.
std::string repr(const std::string& text);

}  // namespace jit2triton
