// Reading a .j2t package: the file read once, through one descriptor, into memory this process owns (or mapped, for
// keep_mapped); the members of torch's archive container in those bytes, each checked against checksums.json; the
// manifest parsed; the weights as CPU tensors over those bytes, in their memory order.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "json.h"

namespace jit2triton {

struct FileBytes;

struct Package {
  std::string path;
  std::shared_ptr<FileBytes> file;
  std::map<std::string, std::string_view> members;  // name -> its bytes, in `file` or in `copies`
  std::map<std::string, std::string> copies;          // members copied out of a mapping before their check
  std::map<std::string, std::string> checksums;      // name -> sha256 hex
  json::Value manifest;
  std::map<std::string, at::Tensor> weights;          // on the CPU, views of `file`

  std::string_view member(const std::string& name) const;  // throws CorruptPackage when absent
};

// keep_mapped: weights stay views of the mapped file; otherwise of the bytes read, which the module owns. trusted_keys (with
// JIT2TRITON_TRUSTED_KEYS's, if keys_from_environment): the package must be signed by one of them (signing.h), checked before parsing.
Package read_package(const std::string& path, bool keep_mapped = false,
                     const std::vector<std::string>& trusted_keys = {}, bool keys_from_environment = true);

// "float32" -> at::kFloat: the dtype names of the manifest (torch's, without "torch.").
at::ScalarType parse_dtype(const std::string& name);

// Python's repr of a string, for messages identical to the Python loader's: 'model.j2t'.
std::string repr(const std::string& text);

}  // namespace jit2triton
