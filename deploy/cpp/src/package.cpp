#include "package.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <caffe2/serialize/inline_container.h>

#include <cstring>
#include <set>

#include "jit2triton/jit2triton.h"
#include "sha256.h"
#include "signing.h"

namespace jit2triton {

namespace {

constexpr const char* kFormat = "jit2triton-package";
constexpr int64_t kFormatVersion = kPackageFormatVersion;
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

struct ArchiveError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// torch's own bookkeeping records in its archive container: not package members.
const std::set<std::string> kTorchRecords = {"version", ".data/version", "byteorder", ".data/serialization_id"};

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

// torch's reader error without its boilerplate: "failed finding central directory".
std::string reason(const std::string& what) {
  std::string text = what.substr(0, what.find('\n'));
  const std::string prefix = "failed reading zip archive: ";
  if (auto at = text.find(prefix); at != std::string::npos) text = text.substr(at + prefix.size());
  if (auto at = text.find(". This is an internal"); at != std::string::npos) text = text.substr(0, at);
  return text.substr(0, 200);
}

// A format-1 package (a hand-written zip with manifest.json at its root, which torch's reader refuses): found by the
// name in the first local header, so it can be told apart from a corrupt file.
bool is_format_1(const MappedFile& f) {
  static const std::string name = "manifest.json";
  if (f.size < 30 + name.size() || std::memcmp(f.data, "PK\x03\x04", 4) != 0) return false;
  size_t name_len = f.data[26] | (f.data[27] << 8);
  return name_len == name.size() && std::memcmp(f.data + 30, name.data(), name.size()) == 0;
}

bool is_torchscript(const std::vector<std::string>& names) {
  bool torchscript = false;
  for (const auto& name : names) {
    if (name == "manifest.json") return false;
    torchscript |= name == "constants.pkl" || name == "data.pkl" || name.rfind("code/", 0) == 0;
  }
  return torchscript;
}

// The members of torch's archive container (what torch.save and torch.jit.save write), found by torch's own reader
// (caffe2::serialize::PyTorchStreamReader): every record is stored uncompressed and 64-byte aligned, so each is a
// view of the mapped file. Their bytes are checked against checksums.json afterwards.
std::map<std::string, std::string_view> archive_members(const std::string& path, const MappedFile& f) {
  std::map<std::string, std::string_view> members;
  try {
    caffe2::serialize::PyTorchStreamReader reader(path);
    std::vector<std::string> names;
    for (const std::string& name : reader.getAllRecords())
      if (!kTorchRecords.count(name)) names.push_back(name);
    if (is_torchscript(names))
      throw Error(Error::Kind::Package, repr(path) + " is a TorchScript archive (or a torch.save file), not a "
                                        "jit2triton package; convert it with `jit2triton convert`");
    for (const std::string& name : names) {
      size_t offset = reader.getRecordOffset(name), size = reader.getRecordSize(name);
      if (offset > f.size || size > f.size - offset)
        throw ArchiveError("member " + repr(name) + " runs past the end of the file");
      members[name] = std::string_view(reinterpret_cast<const char*>(f.data + offset), size);
    }
  } catch (const ArchiveError&) {
    throw;
  } catch (const Error&) {
    throw;
  } catch (const std::exception& err) {
    throw ArchiveError(reason(err.what()));
  }
  return members;
}


void verify(const Package& pkg) {
  for (const char* required : {"manifest.json", "weights.bin", "checksums.json"})
    if (!pkg.members.count(required))
      throw Error(Error::Kind::CorruptPackage, repr(pkg.path) + " has no " + required +
                                                   ": it is not a complete jit2triton package; " + kReconvert);
  for (const auto& [name, data] : pkg.members) {
    if (name == "checksums.json" || name == "signature.ed25519") continue;  // the signature signs checksums.json
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

std::map<std::string, at::Tensor> unpack_weights(const Package& pkg, bool keep_mapped) {
  std::string_view blob = pkg.member("weights.bin");
  std::map<std::string, at::Tensor> weights;
  auto keep = pkg.file;  // every weight holds the mapping alive
  for (const auto& [name, entry] : pkg.manifest.at("weights").members) {
    at::ScalarType dtype = parse_dtype(entry.at("dtype").as_string());
    std::vector<int64_t> shape;
    for (const auto& d : entry.at("shape").items) shape.push_back(d.as_int());
    int64_t offset = entry.at("offset").as_int(), nbytes = entry.at("nbytes").as_int();
    if (offset < 0 || nbytes < 0 || size_t(offset) > blob.size() || size_t(nbytes) > blob.size() - size_t(offset))
      throw Error(Error::Kind::CorruptPackage, "weight " + repr(name) + " lies outside weights.bin; the package is corrupted");
    // its shape must describe exactly its bytes (no overflow on the way), or a tensor would reach past them
    uint64_t numel = 1;
    bool fits = true;
    for (int64_t d : shape) {
      fits = fits && d >= 0 && (d == 0 || numel <= (uint64_t(1) << 62) / uint64_t(d));
      numel = fits ? numel * uint64_t(d) : 0;
    }
    if (!fits || numel * at::elementSize(dtype) != uint64_t(nbytes))
      throw Error(Error::Kind::CorruptPackage, "weight " + repr(name) + "'s shape does not match its bytes; the package is corrupted");
    std::vector<int64_t> order(shape.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
    if (const auto* o = entry.find("memory_order")) {
      std::vector<bool> seen(order.size(), false);
      if (o->size() != order.size())
        throw Error(Error::Kind::CorruptPackage, "weight " + repr(name) + "'s memory order is not a permutation of its dims; the package is corrupted");
      for (size_t i = 0; i < order.size(); ++i) {
        int64_t d = (*o)[i].as_int();
        if (d < 0 || d >= int64_t(order.size()) || seen[d])
          throw Error(Error::Kind::CorruptPackage, "weight " + repr(name) + "'s memory order is not a permutation of its dims; the package is corrupted");
        seen[d] = true;
        order[i] = d;
      }
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
      if (!keep_mapped) stored = stored.clone();  // owned: the file may change or shrink under a loaded module
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

Package read_package(const std::string& path, bool keep_mapped, const std::vector<std::string>& trusted_keys) {
  Package pkg;
  pkg.path = path;
  pkg.file = map_file(path);
  try {
    pkg.members = archive_members(path, *pkg.file);
  } catch (const ArchiveError& err) {
    if (is_format_1(*pkg.file))
      throw Error(Error::Kind::PackageVersion,
                  repr(path) + " is a package of format 1 (written by an earlier jit2triton 0.1); this jit2triton "
                  "reads format " + std::to_string(kFormatVersion) + ": convert the model again");
    throw Error(Error::Kind::CorruptPackage,
                repr(path) + " is not a readable jit2triton package (" + err.what() +
                    "); it may be truncated or corrupted. Copy it again or " + kReconvert);
  }

  // before anything in the package is parsed (deploy/signing.py)
  check_signature(path, pkg.members, trusted_key_paths(trusted_keys));
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
    throw Error(Error::Kind::CorruptPackage, repr(path) + " is a torch archive but not a jit2triton package");
  const json::Value* version = pkg.manifest.find("format_version");
  bool integer = version && version->kind == json::Value::Kind::Int;
  if (integer && version->integer > kFormatVersion)
    throw Error(Error::Kind::PackageVersion,
                repr(path) + " uses package format " + std::to_string(version->integer) +
                    ", newer than this jit2triton reads (" + std::to_string(kFormatVersion) +
                    "); upgrade jit2triton (pip install -U jit2triton)");
  if (!integer || version->integer != kFormatVersion)
    throw Error(Error::Kind::CorruptPackage,
                repr(path) + " names a package format no jit2triton wrote (this one reads format " +
                    std::to_string(kFormatVersion) + "); the package is corrupted: re-run `jit2triton convert`");
  pkg.weights = unpack_weights(pkg, keep_mapped);
  return pkg;
}

}  // namespace jit2triton
