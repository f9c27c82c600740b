#include "package.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <caffe2/serialize/inline_container.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <set>

#include "jit2triton/jit2triton.h"
#include "manifest_schema.h"
#include "policy.h"
#include "sha256.h"
#include "signing.h"

namespace jit2triton {

namespace {

using policy::kFormat;
using policy::kFormatVersion;
namespace message = policy::message;
static_assert(kFormatVersion == kPackageFormatVersion, "jit2triton.h and deploy/policy.py disagree on the format");

}  // namespace

// The package file's bytes, read once through one descriptor: into memory this process owns (then nothing anyone
// writes to the file afterwards reaches what is checked and used), or mapped copy-on-write (keep_mapped: the weights
// stay views of the file, which must then not change; every other member is copied out before it is checked).
struct FileBytes {
  uint8_t* data = nullptr;
  size_t size = 0;
  bool mapped = false;
  ~FileBytes() {
    if (mapped && data) munmap(data, size);
    if (!mapped) std::free(data);
  }
};

at::ScalarType parse_dtype(const std::string& name) {
  auto it = policy::dtypes().find(name);
  if (it == policy::dtypes().end()) throw Error(Error::Kind::PackageVersion, policy::message::new_dtype(repr(name)));
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

struct Descriptor {
  int fd;
  ~Descriptor() { ::close(fd); }
};

std::shared_ptr<FileBytes> read_file(const std::string& path, bool keep_mapped) {
  Descriptor file{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (file.fd < 0) {
    if (errno == ENOENT) throw Error(Error::Kind::Package, message::not_found(repr(path)));
    throw Error(Error::Kind::Package, "cannot open " + repr(path) + ": " + std::strerror(errno));
  }
  struct stat st;
  if (::fstat(file.fd, &st) != 0 || !S_ISREG(st.st_mode))
    throw Error(Error::Kind::CorruptPackage, message::unreadable(repr(path), "not a regular file"));
  auto bytes = std::make_shared<FileBytes>();
  size_t size = static_cast<size_t>(st.st_size);
  if (size == 0) return bytes;
  if (keep_mapped) {
    // Private and writable: tensors over the weights may be written to without touching the file (copy-on-write).
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, file.fd, 0);
    if (p == MAP_FAILED) throw Error(Error::Kind::Package, "cannot map " + repr(path) + ": " + std::strerror(errno));
    bytes->data = static_cast<uint8_t*>(p);
    bytes->size = size;
    bytes->mapped = true;
    return bytes;
  }
  // 64-byte aligned, as the archive's records are: weights are used in place
  bytes->data = static_cast<uint8_t*>(std::aligned_alloc(64, (size + 63) / 64 * 64));
  if (!bytes->data) throw std::bad_alloc();
  while (bytes->size < size) {
    ssize_t n = ::pread(file.fd, bytes->data + bytes->size, size - bytes->size, off_t(bytes->size));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw Error(Error::Kind::CorruptPackage, message::unreadable(repr(path), std::strerror(errno)));
    if (n == 0) break;  // shorter than it was a moment ago: what was read is the file
    bytes->size += size_t(n);
  }
  return bytes;
}

// torch's archive reader over the bytes read: the package is parsed from them, never from its path again.
class MemoryReader : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit MemoryReader(std::shared_ptr<FileBytes> bytes) : bytes_(std::move(bytes)) {}
  size_t size() const override { return bytes_->size; }
  size_t read(uint64_t pos, void* buf, size_t n, const char*) const override {
    if (pos >= bytes_->size) return 0;
    n = std::min<size_t>(n, bytes_->size - pos);
    std::memcpy(buf, bytes_->data + pos, n);
    return n;
  }

 private:
  std::shared_ptr<FileBytes> bytes_;
};

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
bool is_format_1(const FileBytes& f) {
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
// (caffe2::serialize::PyTorchStreamReader) in the bytes read: every record is stored uncompressed and 64-byte
// aligned, so each is a view of them; from a mapping, every member but the weights is copied out (into `copies`)
// first. Their bytes are checked against checksums.json afterwards.
std::map<std::string, std::string_view> archive_members(const std::string& path, const std::shared_ptr<FileBytes>& file,
                                                        std::map<std::string, std::string>& copies) {
  const FileBytes& f = *file;
  std::map<std::string, std::string_view> members;
  try {
    caffe2::serialize::PyTorchStreamReader reader(std::make_shared<MemoryReader>(file));
    std::vector<std::string> names;
    for (const std::string& name : reader.getAllRecords())
      if (!kTorchRecords.count(name)) names.push_back(name);
    if (is_torchscript(names))
      throw Error(Error::Kind::Package, message::torchscript_file(repr(path)));
    for (const std::string& name : names) {
      size_t offset = reader.getRecordOffset(name), size = reader.getRecordSize(name);
      if (offset > f.size || size > f.size - offset)
        throw ArchiveError("member " + repr(name) + " runs past the end of the file");
      std::string_view bytes(reinterpret_cast<const char*>(f.data + offset), size);
      if (f.mapped && name != "weights.bin") bytes = copies[name] = std::string(bytes);
      members[name] = bytes;
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
  for (const char* required : policy::kRequiredMembers)
    if (!pkg.members.count(required))
      throw Error(Error::Kind::CorruptPackage, message::incomplete(repr(pkg.path), required));
  for (const auto& [name, data] : pkg.members) {
    if (name == "checksums.json" || name == policy::kSignatureMember) continue;  // it signs checksums.json
    auto expected = pkg.checksums.find(name);
    if (expected == pkg.checksums.end() ||
        sha256_hex(reinterpret_cast<const uint8_t*>(data.data()), data.size()) != expected->second)
      throw Error(Error::Kind::CorruptPackage, message::checksum_fails(repr(pkg.path), repr(name)));
  }
  for (const auto& [name, _] : pkg.checksums)
    if (!pkg.members.count(name))
      throw Error(Error::Kind::CorruptPackage, message::member_missing(repr(pkg.path), repr(name)));
}

std::map<std::string, at::Tensor> unpack_weights(const Package& pkg) {
  std::string_view blob = pkg.member("weights.bin");
  std::map<std::string, at::Tensor> weights;
  auto keep = pkg.file;  // every weight holds the mapping alive
  const json::Value* index = pkg.manifest.find("weights");
  if (!index || !index->is_object())  // (a package file holds one, {} where it has no weights)
    throw Error(Error::Kind::CorruptPackage, message::no_weights_index());
  for (const auto& [name, entry] : index->members) {
    manifest_schema::check_weight(entry);
    const std::string& dtype_name = entry.at("dtype").as_string();
    if (!policy::dtypes().count(dtype_name))
      throw Error(Error::Kind::CorruptPackage, message::unknown_dtype(repr(name), repr(dtype_name)));
    at::ScalarType dtype = parse_dtype(dtype_name);
    std::vector<int64_t> shape;
    for (const auto& d : entry.at("shape").items) shape.push_back(d.as_int());
    int64_t offset = entry.at("offset").as_int(), nbytes = entry.at("nbytes").as_int();
    if (offset < 0 || nbytes < 0 || size_t(offset) > blob.size() || size_t(nbytes) > blob.size() - size_t(offset))
      throw Error(Error::Kind::CorruptPackage, message::weight_outside(repr(name)));
    // its shape must describe exactly its bytes (no overflow on the way), or a tensor would reach past them
    uint64_t numel = 1;
    bool fits = true;
    for (int64_t d : shape) {
      fits = fits && d >= 0 && (d == 0 || numel <= (uint64_t(1) << 62) / uint64_t(d));
      numel = fits ? numel * uint64_t(d) : 0;
    }
    if (!fits || numel * at::elementSize(dtype) != uint64_t(nbytes))
      throw Error(Error::Kind::CorruptPackage, message::weight_shape(repr(name)));
    std::vector<int64_t> order(shape.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
    if (const auto* o = entry.find("memory_order")) {
      std::vector<bool> seen(order.size(), false);
      if (o->size() != order.size())
        throw Error(Error::Kind::CorruptPackage, message::weight_order(repr(name)));
      for (size_t i = 0; i < order.size(); ++i) {
        int64_t d = (*o)[i].as_int();
        if (d < 0 || d >= int64_t(order.size()) || seen[d])
          throw Error(Error::Kind::CorruptPackage, message::weight_order(repr(name)));
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
    } else {  // the bytes read (owned: the file may change or shrink under a loaded module), or the mapping
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
    throw Error(Error::Kind::CorruptPackage, message::member_missing("the package", repr(name)));
  return it->second;
}

Package read_package(const std::string& path, bool keep_mapped, const std::vector<std::string>& trusted_keys,
                     bool keys_from_environment) {
  Package pkg;
  pkg.path = path;
  pkg.file = read_file(path, keep_mapped);
  try {
    pkg.members = archive_members(path, pkg.file, pkg.copies);
  } catch (const ArchiveError& err) {
    if (is_format_1(*pkg.file))
      throw Error(Error::Kind::PackageVersion, message::format_1(repr(path), std::to_string(kFormatVersion)));
    throw Error(Error::Kind::CorruptPackage, message::unreadable(repr(path), err.what()));
  }

  // before anything in the package is parsed (deploy/signing.py)
  check_signature(path, pkg.members, keys_from_environment ? trusted_key_paths(trusted_keys) : trusted_keys);
  if (pkg.members.count("checksums.json")) {
    try {
      json::Value sums = json::parse(pkg.members["checksums.json"]);
      for (const auto& [name, v] : sums.members) pkg.checksums[name] = v.as_string();
    } catch (const std::runtime_error&) {
      throw Error(Error::Kind::CorruptPackage, message::checksums_damaged(repr(path)));
    }
  }
  verify(pkg);
  pkg.manifest = json::parse(pkg.members["manifest.json"]);
  const json::Value* format = pkg.manifest.find("format");
  if (!format || !format->is_string() || format->as_string() != kFormat)
    throw Error(Error::Kind::CorruptPackage, message::not_a_package(repr(path)));
  const json::Value* version = pkg.manifest.find("format_version");
  bool integer = version && version->kind == json::Value::Kind::Int;
  if (integer && version->integer > kFormatVersion)
    throw Error(Error::Kind::PackageVersion,
                message::newer_format(repr(path), std::to_string(version->integer), std::to_string(kFormatVersion)));
  if (!integer || version->integer != kFormatVersion)
    throw Error(Error::Kind::CorruptPackage, message::unknown_format(repr(path), std::to_string(kFormatVersion)));
  pkg.weights = unpack_weights(pkg);
  return pkg;
}

}  // namespace jit2triton
