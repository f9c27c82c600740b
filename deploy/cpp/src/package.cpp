#include "package.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "jit2triton/jit2triton.h"
#include "sha256.h"

namespace jit2triton {

namespace {

constexpr const char* kFormat = "jit2triton-package";
constexpr int64_t kFormatVersion = 1;
constexpr const char* kReconvert = "re-run `jit2triton convert`";

}  // namespace

struct MappedFile {
  uint8_t* data = nullptr;
  size_t size = 0;
  ~MappedFile() {
    if (data) munmap(data, size);
  }
};

at::ScalarType parse_dtype(const std::string& name) {
  static const std::map<std::string, at::ScalarType> dtypes = {
      {"float32", at::kFloat}, {"float64", at::kDouble}, {"float16", at::kHalf}, {"bfloat16", at::kBFloat16},
      {"int64", at::kLong},    {"int32", at::kInt},      {"int16", at::kShort}, {"int8", at::kChar},
      {"uint8", at::kByte},    {"bool", at::kBool},      {"complex64", at::kComplexFloat},
      {"complex128", at::kComplexDouble}};
  auto it = dtypes.find(name);
  if (it == dtypes.end()) throw Error(Error::Kind::PackageVersion, "unknown dtype " + repr(name) + " in the package");
  return it->second;
}

std::string repr(const std::string& text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\'' || c == '\\') out += '\\';
    out += c;
  }
  return out + "'";
}

namespace {

uint32_t u16(const uint8_t* p) { return p[0] | (p[1] << 8); }
uint32_t u32(const uint8_t* p) { return p[0] | (p[1] << 8) | (p[2] << 16) | (uint32_t(p[3]) << 24); }
uint64_t u64(const uint8_t* p) { return u32(p) | (uint64_t(u32(p + 4)) << 32); }

struct ZipError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::shared_ptr<MappedFile> map_file(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    throw Error(Error::Kind::Package, "package not found: " + repr(path) + "; check the path or convert the model first");
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw Error(Error::Kind::Package, "cannot open " + repr(path) + ": " + std::strerror(errno));
  auto file = std::make_shared<MappedFile>();
  file->size = static_cast<size_t>(st.st_size);
  if (file->size > 0) {
    // Private and writable: tensors over the weights may be written to without touching the file (copy-on-write).
    void* p = mmap(nullptr, file->size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      throw Error(Error::Kind::Package, "cannot map " + repr(path) + ": " + std::strerror(errno));
    }
    file->data = static_cast<uint8_t*>(p);
  }
  ::close(fd);
  return file;
}

// The central directory: every member's name and where its bytes lie. Only stored (uncompressed) members are read;
// the Python writer stores every member that way so this reader needs no inflate.
std::map<std::string, std::string_view> zip_members(const MappedFile& f) {
  const uint8_t* d = f.data;
  size_t n = f.size;
  if (n < 22) throw ZipError("file too short to be a zip");
  size_t eocd = std::string::npos;
  for (size_t i = n - 22 + 1; i-- > (n > 22 + 65535 ? n - 22 - 65535 : 0);)
    if (u32(d + i) == 0x06054b50) { eocd = i; break; }
  if (eocd == std::string::npos) throw ZipError("no end of central directory");
  uint64_t count = u16(d + eocd + 10), dir_offset = u32(d + eocd + 16);
  if (dir_offset == 0xFFFFFFFF || count == 0xFFFF) {  // zip64: the real values live in the zip64 record
    if (eocd < 20 || u32(d + eocd - 20) != 0x07064b50) throw ZipError("bad zip64 locator");
    uint64_t record = u64(d + eocd - 20 + 8);
    if (record + 56 > n || u32(d + record) != 0x06064b50) throw ZipError("bad zip64 end record");
    count = u64(d + record + 32);
    dir_offset = u64(d + record + 48);
  }
  std::map<std::string, std::string_view> members;
  size_t p = dir_offset;
  for (uint64_t i = 0; i < count; ++i) {
    if (p + 46 > n || u32(d + p) != 0x02014b50) throw ZipError("bad central directory entry");
    uint32_t method = u16(d + p + 10);
    uint64_t compressed = u32(d + p + 20), size = u32(d + p + 24), offset = u32(d + p + 42);
    uint32_t name_len = u16(d + p + 28), extra_len = u16(d + p + 30), comment_len = u16(d + p + 32);
    if (p + 46 + name_len + extra_len > n) throw ZipError("central directory runs past the end");
    std::string name(reinterpret_cast<const char*>(d + p + 46), name_len);
    for (size_t e = p + 46 + name_len; e + 4 <= p + 46 + name_len + extra_len;) {  // zip64 sizes and offset
      uint32_t id = u16(d + e), len = u16(d + e + 2);
      size_t q = e + 4;
      if (id == 0x0001) {
        if (size == 0xFFFFFFFF) { size = u64(d + q); q += 8; }
        if (compressed == 0xFFFFFFFF) { compressed = u64(d + q); q += 8; }
        if (offset == 0xFFFFFFFF) { offset = u64(d + q); }
      }
      e += 4 + len;
    }
    if (offset + 30 > n || u32(d + offset) != 0x04034b50) throw ZipError("bad local header for " + name);
    uint64_t start = offset + 30 + u16(d + offset + 26) + u16(d + offset + 28);
    if (start + compressed > n) throw ZipError(name + " runs past the end of the file");
    if (method != 0)
      throw Error(Error::Kind::PackageVersion,
                  "member " + repr(name) + " is compressed; the C++ runtime reads packages written by jit2triton "
                  "0.1 or newer, which store every member uncompressed: " + kReconvert);
    members[name] = std::string_view(reinterpret_cast<const char*>(d + start), size);
    p += 46 + name_len + extra_len + comment_len;
  }
  return members;
}


void verify(const Package& pkg) {
  for (const char* required : {"manifest.json", "weights.bin", "checksums.json"})
    if (!pkg.members.count(required))
      throw Error(Error::Kind::CorruptPackage, repr(pkg.path) + " has no " + required +
                                                   ": it is not a complete jit2triton package; " + kReconvert);
  for (const auto& [name, data] : pkg.members) {
    if (name == "checksums.json") continue;
    auto expected = pkg.checksums.find(name);
    if (expected == pkg.checksums.end() ||
        sha256_hex(reinterpret_cast<const uint8_t*>(data.data()), data.size()) != expected->second)
      throw Error(Error::Kind::CorruptPackage,
                  repr(pkg.path) + ": member " + repr(name) +
                      " fails its checksum, so the package was modified or corrupted; copy it again or " + kReconvert);
  }
  for (const auto& [name, _] : pkg.checksums)
    if (!pkg.members.count(name))
      throw Error(Error::Kind::CorruptPackage, repr(pkg.path) + " lacks member " + repr(name) + "; " + kReconvert);
}

std::map<std::string, at::Tensor> unpack_weights(const Package& pkg) {
  std::string_view blob = pkg.member("weights.bin");
  std::map<std::string, at::Tensor> weights;
  auto keep = pkg.file;  // every weight holds the mapping alive
  for (const auto& [name, entry] : pkg.manifest.at("weights").members) {
    at::ScalarType dtype = parse_dtype(entry.at("dtype").as_string());
    std::vector<int64_t> shape;
    for (const auto& d : entry.at("shape").items) shape.push_back(d.as_int());
    int64_t offset = entry.at("offset").as_int(), nbytes = entry.at("nbytes").as_int();
    if (offset < 0 || nbytes < 0 || size_t(offset + nbytes) > blob.size())
      throw Error(Error::Kind::CorruptPackage, "weight " + repr(name) + " lies outside weights.bin; the package is corrupted");
    std::vector<int64_t> order(shape.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
    if (const auto* o = entry.find("memory_order")) {
      for (size_t i = 0; i < order.size(); ++i) order[i] = (*o)[i].as_int();
    }
    std::vector<int64_t> stored_shape, inverse(order.size());
    for (size_t i = 0; i < order.size(); ++i) {
      stored_shape.push_back(shape[order[i]]);
      inverse[order[i]] = static_cast<int64_t>(i);
    }
    auto options = at::TensorOptions().dtype(dtype);
    if (nbytes == 0) {
      weights[name] = at::empty(shape, options);
      continue;
    }
    void* data = const_cast<char*>(blob.data() + offset);
    at::Tensor stored;
    if (reinterpret_cast<uintptr_t>(data) % 64 != 0) {  // an unaligned member (a hand-made zip): copy it
      stored = at::empty(stored_shape, options);
      std::memcpy(stored.data_ptr(), data, nbytes);
    } else {
      stored = at::from_blob(data, stored_shape, [keep](void*) {}, options);
    }
    weights[name] = stored.permute(inverse);
  }
  return weights;
}

}  // namespace

std::string_view Package::member(const std::string& name) const {
  auto it = members.find(name);
  if (it == members.end())
    throw Error(Error::Kind::CorruptPackage, "the package has no member " + repr(name) + "; " + kReconvert);
  return it->second;
}

Package read_package(const std::string& path) {
  Package pkg;
  pkg.path = path;
  pkg.file = map_file(path);
  try {
    pkg.members = zip_members(*pkg.file);
  } catch (const ZipError& err) {
    throw Error(Error::Kind::CorruptPackage,
                repr(path) + " is not a readable jit2triton package (" + err.what() +
                    "); it may be truncated or corrupted. Copy it again or " + kReconvert);
  }
  if (pkg.members.count("checksums.json")) {
    try {
      json::Value sums = json::parse(pkg.members["checksums.json"]);
      for (const auto& [name, v] : sums.members) pkg.checksums[name] = v.as_string();
    } catch (const std::runtime_error&) {
      throw Error(Error::Kind::CorruptPackage, repr(path) + ": checksums.json is damaged; " + kReconvert);
    }
  }
  verify(pkg);
  pkg.manifest = json::parse(pkg.members["manifest.json"]);
  const json::Value* format = pkg.manifest.find("format");
  if (!format || !format->is_string() || format->as_string() != kFormat)
    throw Error(Error::Kind::CorruptPackage, repr(path) + " is a zip file but not a jit2triton package");
  const json::Value* version = pkg.manifest.find("format_version");
  if (!version || version->kind != json::Value::Kind::Int || version->integer > kFormatVersion)
    throw Error(Error::Kind::PackageVersion,
                repr(path) + " uses package format " + (version && version->is_number() ? std::to_string(version->as_int()) : "None") +
                    ", newer than this jit2triton reads (" + std::to_string(kFormatVersion) +
                    "); upgrade jit2triton (pip install -U jit2triton)");
  pkg.weights = unpack_weights(pkg);
  return pkg;
}

}  // namespace jit2triton
