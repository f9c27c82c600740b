// Signed packages (deploy/signing.py): an Ed25519 signature over "jit2triton package signature v1\n" followed by
// checksums.json, in the member signature.ed25519, checked with OpenSSL's libcrypto before anything in the
// package is parsed.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace jit2triton {

// The keys given and those in the JIT2TRITON_TRUSTED_KEYS environment variable (':'-separated): a program can add
// keys to what the operator requires, not remove them.
std::vector<std::string> trusted_key_paths(const std::vector<std::string>& given);

// Throws Error(Signature) unless one of the keys signed the package; nothing to check without keys.
void check_signature(const std::string& path, const std::map<std::string, std::string_view>& members,
                     const std::vector<std::string>& key_paths);

}  // namespace jit2triton
