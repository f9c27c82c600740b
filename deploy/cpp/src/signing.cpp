#include "signing.h"

#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "jit2triton/jit2triton.h"
#include "package.h"
#include "policy.h"

namespace jit2triton {

namespace {

using policy::kSignatureMember;  // deploy/policy.py
using policy::kSignedPrefix;
constexpr int kEd25519 = 1087;  // NID_ED25519 (= EVP_PKEY_ED25519), fixed since OpenSSL 1.1.1

// The few libcrypto functions an Ed25519 check needs, found at run time as sha256.cpp finds SHA256: the runtime
// does not link OpenSSL, and only a load with trusted keys needs it.
struct LibCrypto {
  void* (*new_raw_public_key)(int, void*, const unsigned char*, size_t) = nullptr;
  void (*free_key)(void*) = nullptr;
  void* (*new_context)() = nullptr;
  void (*free_context)(void*) = nullptr;
  int (*verify_init)(void*, void**, const void*, void*, void*) = nullptr;
  int (*verify)(void*, const unsigned char*, size_t, const unsigned char*, size_t) = nullptr;
};

const LibCrypto* libcrypto() {
  static const LibCrypto* found = []() -> const LibCrypto* {
    for (const char* name : {"libcrypto.so.3", "libcrypto.so.1.1", "libcrypto.so"}) {
      void* lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (!lib) continue;
      static LibCrypto fns;
      fns.new_raw_public_key = reinterpret_cast<decltype(fns.new_raw_public_key)>(dlsym(lib, "EVP_PKEY_new_raw_public_key"));
      fns.free_key = reinterpret_cast<decltype(fns.free_key)>(dlsym(lib, "EVP_PKEY_free"));
      fns.new_context = reinterpret_cast<decltype(fns.new_context)>(dlsym(lib, "EVP_MD_CTX_new"));
      fns.free_context = reinterpret_cast<decltype(fns.free_context)>(dlsym(lib, "EVP_MD_CTX_free"));
      fns.verify_init = reinterpret_cast<decltype(fns.verify_init)>(dlsym(lib, "EVP_DigestVerifyInit"));
      fns.verify = reinterpret_cast<decltype(fns.verify)>(dlsym(lib, "EVP_DigestVerify"));
      if (fns.new_raw_public_key && fns.free_key && fns.new_context && fns.free_context && fns.verify_init &&
          fns.verify)
        return &fns;
    }
    return nullptr;
  }();
  return found;
}

std::string base64_decode(const std::string& text) {
  static const std::string alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  uint32_t bits = 0;
  int count = 0;
  for (char c : text) {
    if (c == '=' || std::isspace(static_cast<unsigned char>(c))) continue;
    size_t value = alphabet.find(c);
    if (value == std::string::npos) return "";
    bits = (bits << 6) | uint32_t(value);
    if ((count += 6) >= 8) {
      count -= 8;
      out.push_back(char((bits >> count) & 0xff));
    }
  }
  return out;
}

// The 32 raw bytes of an Ed25519 public key in PEM (SubjectPublicKeyInfo: a fixed 12-byte DER header, then the key).
std::string read_public_key(const std::string& path) {
  // (C stdio, not streams: streams crashed extensions built on the GPU machine, see host_ops.cpp's float_text)
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (!file)
    throw Error(Error::Kind::Signature, "cannot read the trusted key " + repr(path) + ": " + std::strerror(errno));
  std::string pem;
  char chunk[4096];
  for (size_t n; (n = std::fread(chunk, 1, sizeof chunk, file)) > 0;) pem.append(chunk, n);
  std::fclose(file);
  const std::string begin = "-----BEGIN PUBLIC KEY-----", end = "-----END PUBLIC KEY-----";
  size_t from = pem.find(begin), to = pem.find(end);
  static const unsigned char header[12] = {0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00};
  std::string der = from == std::string::npos || to == std::string::npos || to < from
                        ? ""
                        : base64_decode(pem.substr(from + begin.size(), to - from - begin.size()));
  if (der.size() != 44 || std::memcmp(der.data(), header, sizeof header) != 0)
    throw Error(Error::Kind::Signature, "the trusted key " + repr(path) + " is not an Ed25519 public key in PEM; "
                                        "use the .pub file `jit2triton keygen` wrote");
  return der.substr(12);
}

bool verifies(const LibCrypto& crypto, const std::string& key, std::string_view signature, const std::string& message) {
  void* pkey = crypto.new_raw_public_key(kEd25519, nullptr, reinterpret_cast<const unsigned char*>(key.data()), key.size());
  if (!pkey) return false;
  void* ctx = crypto.new_context();
  bool ok = ctx && crypto.verify_init(ctx, nullptr, nullptr, nullptr, pkey) == 1 &&
            crypto.verify(ctx, reinterpret_cast<const unsigned char*>(signature.data()), signature.size(),
                          reinterpret_cast<const unsigned char*>(message.data()), message.size()) == 1;
  if (ctx) crypto.free_context(ctx);
  crypto.free_key(pkey);
  return ok;
}

std::string named(const std::vector<std::string>& paths) {
  std::string out;
  for (size_t i = 0; i < paths.size() && i < 3; ++i) out += (i ? ", " : "") + repr(paths[i]);
  if (paths.size() > 3) out += " and " + std::to_string(paths.size() - 3) + " more";
  return out;
}

}  // namespace

std::vector<std::string> trusted_key_paths(const std::vector<std::string>& given) {
  std::vector<std::string> paths;
  auto add = [&](const std::string& p) {
    if (!p.empty() && std::find(paths.begin(), paths.end(), p) == paths.end()) paths.push_back(p);
  };
  for (const auto& p : given) add(p);
  if (const char* env = std::getenv("JIT2TRITON_TRUSTED_KEYS")) {
    const std::string items = env;
    for (size_t from = 0, to; from <= items.size(); from = to + 1) {
      to = items.find(':', from);
      if (to == std::string::npos) to = items.size();
      add(items.substr(from, to - from));
    }
  }
  return paths;
}

void check_signature(const std::string& path, const std::map<std::string, std::string_view>& members,
                     const std::vector<std::string>& key_paths) {
  if (key_paths.empty()) return;
  std::vector<std::string> keys;
  for (const auto& p : key_paths) keys.push_back(read_public_key(p));
  const LibCrypto* crypto = libcrypto();
  if (!crypto)
    throw Error(Error::Kind::Signature, "checking package signatures needs OpenSSL's libcrypto (libcrypto.so.3 or "
                                        "libcrypto.so.1.1), which this machine lacks; install OpenSSL");
  auto signature = members.find(kSignatureMember), checksums = members.find("checksums.json");
  if (signature == members.end() || checksums == members.end())
    throw Error(Error::Kind::Signature,
                repr(path) + " is not signed, and trusted keys are set (" + named(key_paths) +
                    "): load only packages signed with `jit2triton convert --sign KEY` (or save(path, signing_key=KEY))");
  const std::string message = kSignedPrefix + std::string(checksums->second);
  for (const auto& key : keys)
    if (verifies(*crypto, key, signature->second, message)) return;
  throw Error(Error::Kind::Signature,
              repr(path) + " is signed, but by none of the trusted keys (" + named(key_paths) +
                  "), or it was changed after signing; do not load it. Re-sign it, or trust the key it was signed with");
}

}  // namespace jit2triton
