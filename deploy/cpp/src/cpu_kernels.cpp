// The package's C++ kernels: the shared library, checked against this CPU, opened with dlopen from exactly the bytes
// its checksum (and the package's signature) was checked on; one launcher per kernel.
#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <map>
#include <mutex>
#include <stdexcept>

#include "plan.h"
#include "sha256.h"

namespace jit2triton {

namespace {

using KernelFn = int (*)(void**, const int64_t*, int);

// The library exactly as checked, opened with dlopen: its bytes go into an anonymous file (memfd) sealed against any
// later write and opened through /proc/self/fd, never a cache file something could change between the check and the
// dlopen (deploy/verified_library.py does the same in Python). The descriptor stays open while the process lives,
// as the library does: dlopen knows a library by its path, which must never come to name another file. Where
// memfd is missing or may not hold code, a file created in a fresh folder only this user can write (mkdtemp) is
// opened and removed. One dlopen per library content (`sha`) in the process.
void* open_verified(std::string_view library, const std::string& sha) {
  static std::mutex mutex;
  static std::map<std::string, void*> opened;
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = opened.find(sha); it != opened.end()) return it->second;
  auto write_all = [&](int fd) {
    for (size_t done = 0; done < library.size();) {
      ssize_t n = ::write(fd, library.data() + done, library.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      done += size_t(n);
    }
    return true;
  };
  void* handle = nullptr;
  int fd = static_cast<int>(::syscall(SYS_memfd_create, "jit2triton-kernels", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (fd >= 0 && write_all(fd) &&
      ::fcntl(fd, F_ADD_SEALS, F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE) == 0)
    handle = dlopen(("/proc/self/fd/" + std::to_string(fd)).c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle && fd >= 0) ::close(fd);
  if (!handle) {
    const char* tmp = std::getenv("TMPDIR");
    std::string folder = std::string(tmp && *tmp ? tmp : "/tmp") + "/jit2triton-XXXXXX";
    if (::mkdtemp(folder.data())) {  // 0700, a fresh name: no one else can have put anything in it
      std::string path = folder + "/kernels.so";
      int out = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0700);
      bool written = out >= 0 && write_all(out);
      if (out >= 0) ::close(out);
      if (written) handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      ::unlink(path.c_str());
      ::rmdir(folder.c_str());
    }
  }
  if (!handle) {
    const char* why = dlerror();
    throw Error(Error::Kind::PackageDevice, std::string("the package's C++ kernel library cannot be opened here (") +
                                                (why ? why : "it cannot be written to memory or a private file") +
                                                "); convert the model again on this machine");
  }
  return opened[sha] = handle;
}

// Why the library cannot run on this CPU (built for another architecture, or for an instruction set it lacks), or
// "" where it can.
std::string foreign_to_this_cpu(std::string_view library, const std::string& isa) {
  if (library.size() < 20 || library.substr(0, 4) != "\x7f" "ELF")
    throw Error(Error::Kind::CorruptPackage, std::string("the package's kernel library is not a shared library (ELF); ") + policy::kReconvert);
  unsigned machine = static_cast<unsigned char>(library[18]) | (static_cast<unsigned char>(library[19]) << 8);
#if defined(__x86_64__)
  bool foreign = machine != 62;
  bool missing_isa = isa == "x86-64-v3" && !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                                              __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("f16c"));
#elif defined(__aarch64__)
  bool foreign = machine != 183;
  bool missing_isa = false;
#else
  bool foreign = false, missing_isa = false;
#endif
  if (!foreign && !missing_isa) return "";
  return foreign ? "another CPU architecture" : "the " + isa + " instruction set, which this CPU lacks";
}

// What a kernel reads must be what it was built for (the kernel index's inputs: dtype, shape, strides on every dim
// longer than 1), or it reads past the buffer: the plan's checks at load and its relayout at call keep a valid
// package so; this holds it for every other (an argument edited to another value, an ATen op whose dtype an input
// changed), as _input_check in deploy/cpp_kernels.py. Sizes over dynamic dims are evaluated at the call's.
struct InputSpec {
  at::ScalarType dtype;
  std::vector<Size> shape, strides;
};

std::vector<InputSpec> input_specs(const json::Value& meta) {
  std::vector<std::string> dims;  // the kernel's size arguments, in the order a launch receives them
  if (const auto* names = meta.find("sizes"))
    for (const auto& n : names->items) dims.push_back(n.as_string());
  std::vector<InputSpec> specs;
  if (const auto* inputs = meta.find("inputs"))
    for (const auto& buffer : inputs->items) {
      InputSpec spec{parse_dtype(buffer[0].as_string()), {}, {}};
      if (buffer[1].size() != buffer[2].size())
        throw Error(Error::Kind::CorruptPackage, std::string("the package's kernel index is damaged (an input's strides); ") + policy::kReconvert);
      for (const auto& n : buffer[1].items) spec.shape.push_back(parse_size(n, dims));
      for (const auto& n : buffer[2].items) spec.strides.push_back(parse_size(n, dims));
      specs.push_back(std::move(spec));
    }
  return specs;
}

void check_inputs(const std::string& name, const std::vector<InputSpec>& specs, const std::vector<at::Tensor>& inputs,
                  const int64_t* sizes) {
  if (!specs.empty() && specs.size() != inputs.size())
    throw std::invalid_argument("kernel " + name + " reads " + std::to_string(specs.size()) + " inputs, the plan passes " +
                                std::to_string(inputs.size()) + ": the package is damaged; " + policy::kReconvert);
  for (size_t i = 0; i < specs.size(); ++i) {
    const at::Tensor& x = inputs[i];
    const InputSpec& spec = specs[i];
    bool fits = x.scalar_type() == spec.dtype && x.dim() == int64_t(spec.shape.size());
    for (int64_t d = 0; fits && d < x.dim(); ++d) {
      int64_t n = spec.shape[d](sizes);
      fits = x.size(d) == n && (n <= 1 || x.stride(d) == spec.strides[d](sizes));
    }
    if (!fits)
      throw std::invalid_argument("kernel " + name + " input " + std::to_string(i) + " is " +
                                  std::string(c10::toString(x.scalar_type())) + "[" + join_dims(x.sizes()) +
                                  "], not the dtype, shape and layout the kernel was built for: the package is "
                                  "damaged; " + policy::kReconvert);
  }
}

}  // namespace

namespace {
LibraryRebuilder rebuilder = nullptr;
}  // namespace

void set_library_rebuilder(LibraryRebuilder r) { rebuilder = r; }

Launchers load_cpu_kernels(const Package& pkg, c10::Device, int num_threads) {
  std::string_view library = pkg.member("binaries/kernels.so");
  std::string_view source = pkg.member("kernels/kernels.cpp");
  const std::string& isa = pkg.manifest.at("cpp").at("isa").as_string();
  std::string sha = pkg.checksums.at("binaries/kernels.so"), rebuilt;
  if (std::string why = foreign_to_this_cpu(library, isa); !why.empty()) {
    if (rebuilder == nullptr)
      throw Error(Error::Kind::PackageDevice,
                  "the package's C++ kernels were built for " + why + "; the C++ runtime does not compile: convert "
                  "the model again on this machine, or load it once from Python, which rebuilds them");
    rebuilt = rebuilder(library, source, isa);  // (from the bundled source, with the Python loader's warning)
    library = rebuilt;
    sha = sha256_hex(reinterpret_cast<const uint8_t*>(rebuilt.data()), rebuilt.size());
  }
  // Kept open for the life of the process: kernels of other loads may share it.
  void* handle = open_verified(library, sha);
  int threads = num_threads > 0 ? num_threads : at::get_num_threads();
  Launchers launchers;
  for (const auto& meta : pkg.manifest.at("kernels").items) {
    const std::string& name = meta.at("name").as_string();
    auto fn = reinterpret_cast<KernelFn>(dlsym(handle, name.c_str()));
    if (!fn)
      throw Error(Error::Kind::CorruptPackage, "the package's kernel library has no kernel " + repr(name) +
                                                   ": it is not the library this package was built with; " + policy::kReconvert);
    size_t num_buffers = static_cast<size_t>(meta.at("num_buffers").as_int());
    if (const json::Value* numbers = meta.find("by_value"); numbers && numbers->size())  // (the C++ backend's
      // kernels read every input through a pointer: a number there would be read as an address)
      throw Error(Error::Kind::CorruptPackage, "C++ kernel " + repr(name) + " is listed as taking numbers by value, which C++ kernels never do; " + policy::kReconvert);
    std::vector<InputSpec> specs = input_specs(meta);
    launchers[name] = [fn, num_buffers, threads, name, specs](std::vector<at::Tensor>& inputs,
                                                              std::vector<at::Tensor>& outputs, const int64_t* sizes) {
      check_inputs(name, specs, inputs, sizes);
      void* stack_buffers[16];
      std::vector<void*> heap;
      void** buffers = stack_buffers;
      if (num_buffers > 16) {
        heap.resize(num_buffers);
        buffers = heap.data();
      }
      if (inputs.size() + outputs.size() != num_buffers)
        throw std::runtime_error("kernel " + name + " takes " + std::to_string(num_buffers) + " buffers, the plan passes " +
                                 std::to_string(inputs.size() + outputs.size()) + ": the package is damaged");
      size_t i = 0;
      for (auto& t : inputs) buffers[i++] = t.data_ptr();
      for (auto& t : outputs) buffers[i++] = t.data_ptr();
      // (named as TorchScript's error is: "ZeroDivisionError: integer division by zero")
      if (fn(buffers, sizes, threads))
        throw std::domain_error("ZeroDivisionError: integer division by zero in kernel " + name);
    };
  }
  return launchers;
}

}  // namespace jit2triton
