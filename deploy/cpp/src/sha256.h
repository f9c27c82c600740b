// SHA-256 (FIPS 180-4), to check package members against checksums.json exactly as the Python loader does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace jit2triton {

std::string sha256_hex(const uint8_t* data, size_t size);

}  // namespace jit2triton
