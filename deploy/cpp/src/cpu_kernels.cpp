// The package's C++ kernels: the shared library, checked against this CPU, written once to the same
// content-addressed cache file the Python runtime uses, opened with dlopen; one launcher per kernel.
#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>

#include "plan.h"
#include "sha256.h"

namespace jit2triton {

namespace {

using KernelFn = int (*)(void**, const int64_t*, int);

std::string cache_root() {
  if (const char* env = std::getenv("JIT2TRITON_CACHE"); env && *env) return env;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "/tmp") + "/.cache/jit2triton";
}

void make_dirs(const std::string& path) {
  for (size_t pos = 1; pos != std::string::npos;) {
    pos = path.find('/', pos + 1);
    ::mkdir(path.substr(0, pos).c_str(), 0700);  // private: other users must not plant libraries here
  }
}

// Whether the file at `path` holds exactly the library whose sha256 is `sha` (a name is no proof of content).
bool holds(const std::string& path, const std::string& sha) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return sha256_hex(reinterpret_cast<const uint8_t*>(data.data()), data.size()) == sha;
}

// Written through a temporary file and a rename, so a concurrent loader never opens half a library; a file already
// there is opened only if its bytes hash to the package's library (a planted or damaged one is replaced).
std::string materialize(std::string_view library, const std::string& sha) {
  std::string dir = cache_root() + "/cpp";
  make_dirs(dir);
  std::string path = dir + "/lib-" + sha + ".so";
  if (holds(path, sha)) return path;
  std::string tmp = path + "." + std::to_string(::getpid()) + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    out.write(library.data(), static_cast<std::streamsize>(library.size()));
    if (!out) throw Error(Error::Kind::Package, "cannot write the kernel library to " + repr(tmp) + "; set JIT2TRITON_CACHE to a writable folder");
  }
  std::rename(tmp.c_str(), path.c_str());
  return path;
}

void check_cpu(std::string_view library, const std::string& isa) {
  if (library.size() < 20 || library.substr(0, 4) != "\x7f" "ELF")
    throw Error(Error::Kind::CorruptPackage, "the package's kernel library is not a shared library (ELF); re-run convert");
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
  if (foreign || missing_isa) {
    std::string why = foreign ? "another CPU architecture" : "the " + isa + " instruction set, which this CPU lacks";
    throw Error(Error::Kind::PackageDevice,
                "the package's C++ kernels were built for " + why + "; the C++ runtime does not compile: convert the "
                "model again on this machine, or load it once with the Python runtime, which rebuilds them");
  }
}

}  // namespace

Launchers load_cpu_kernels(const Package& pkg, int num_threads) {
  std::string_view library = pkg.member("binaries/kernels.so");
  pkg.member("kernels/kernels.cpp");
  check_cpu(library, pkg.manifest.at("cpp").at("isa").as_string());
  std::string path = materialize(library, pkg.checksums.at("binaries/kernels.so"));
  // Kept open for the life of the process, as the Python runtime does: kernels of other loads may share it.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle)
    throw Error(Error::Kind::PackageDevice, std::string("the package's C++ kernel library cannot be opened here (") +
                                                dlerror() + "); convert the model again on this machine");
  int threads = num_threads > 0 ? num_threads : at::get_num_threads();
  Launchers launchers;
  for (const auto& meta : pkg.manifest.at("kernels").items) {
    const std::string& name = meta.at("name").as_string();
    auto fn = reinterpret_cast<KernelFn>(dlsym(handle, name.c_str()));
    if (!fn)
      throw Error(Error::Kind::CorruptPackage, "the package's kernel library has no kernel " + repr(name) +
                                                   ": it is not the library this package was built with; re-run `jit2triton convert`");
    size_t num_buffers = static_cast<size_t>(meta.at("num_buffers").as_int());
    launchers[name] = [fn, num_buffers, threads, name](std::vector<at::Tensor>& inputs, std::vector<at::Tensor>& outputs,
                                                       const int64_t* sizes) {
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
      if (fn(buffers, sizes, threads)) throw std::domain_error("integer division by zero in kernel " + name);
    };
  }
  return launchers;
}

}  // namespace jit2triton
