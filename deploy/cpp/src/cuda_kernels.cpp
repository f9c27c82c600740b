// The package's Triton kernels on CUDA: each cubin loaded with the driver API (cuModuleLoadData) and launched with
// cuLaunchKernel on torch's current stream, with the grid, warps and shared memory recorded at convert time; a cubin
// that waits first for the kernel before it, with cuLaunchKernelEx and programmatic dependent launch.
// libcuda is opened with dlopen, so the runtime links no CUDA driver library and runs on CPU-only machines.
#include "plan.h"

namespace jit2triton {

namespace {
Launchers load_cubins(const Package& pkg, c10::Device device);
KernelLoader interpreted = nullptr;
CubinRebuilder cubin_rebuilder = nullptr;
}  // namespace

void set_interpreted_kernels(KernelLoader loader) { interpreted = loader; }
void set_cubin_rebuilder(CubinRebuilder rebuilder) { cubin_rebuilder = rebuilder; }

Launchers load_cuda_kernels(const Package& pkg, c10::Device device, int num_threads) {
  if (!device.is_cuda()) {
    if (interpreted != nullptr) return interpreted(pkg, device, num_threads);
    throw Error(Error::Kind::PackageDevice, "the package's Triton kernels run on the CPU only under Triton's "
                                            "interpreter, which the C++ runtime has only from Python; load it from "
                                            "Python, or convert with backend='cpp'");
  }
  return load_cubins(pkg, device);
}

}  // namespace jit2triton

#ifdef J2T_WITH_CUDA

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/SmallVector.h>
#include <cuda.h>  // (the driver API's types only: libcuda is opened with dlopen)
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <optional>

namespace jit2triton {

namespace {

constexpr int kMaxDynamicSharedAttribute = 8;  // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
constexpr int64_t kStaticSharedLimit = 48 * 1024;
constexpr uintptr_t kAlignment = 16;  // the cubins assume 16-byte aligned pointers (emitters/compile_triton.py)
constexpr size_t kScratchPointers = 2;  // Triton kernels end with global and profile scratch pointers

struct Driver {
  using LoadData = int (*)(void**, const void*);
  using GetFunction = int (*)(void**, void*, const char*);
  using SetAttribute = int (*)(void*, int, int);
  using Launch = int (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*, void**,
                         void**);
  using ErrorString = int (*)(int, const char**);
  using LaunchEx = int (*)(const CUlaunchConfig*, void*, void**, void**);

  LoadData load_data;
  GetFunction get_function;
  SetAttribute set_attribute;
  Launch launch;
  ErrorString error_string;
  LaunchEx launch_ex;  // (CUDA 11.8 and later: null before, and kernels are launched plainly)

  Driver() {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
      throw Error(Error::Kind::PackageDevice,
                  std::string("the CUDA driver library (libcuda.so.1) cannot be opened (") + dlerror() + "); install the NVIDIA driver");
    load_data = reinterpret_cast<LoadData>(dlsym(lib, "cuModuleLoadData"));
    get_function = reinterpret_cast<GetFunction>(dlsym(lib, "cuModuleGetFunction"));
    set_attribute = reinterpret_cast<SetAttribute>(dlsym(lib, "cuFuncSetAttribute"));
    launch = reinterpret_cast<Launch>(dlsym(lib, "cuLaunchKernel"));
    error_string = reinterpret_cast<ErrorString>(dlsym(lib, "cuGetErrorString"));
    launch_ex = reinterpret_cast<LaunchEx>(dlsym(lib, "cuLaunchKernelEx"));
    if (!load_data || !get_function || !set_attribute || !launch || !error_string)
      throw Error(Error::Kind::PackageDevice, "the CUDA driver library lacks the module and launch API; update the NVIDIA driver");
  }

  std::string describe(int result) const {
    const char* text = nullptr;
    error_string(result, &text);
    return std::string(text ? text : "unknown") + " (error " + std::to_string(result) + ")";
  }

  void check(int result, const std::string& what) const {
    if (result != 0) throw Error(Error::Kind::PackageDevice, "CUDA " + what + " failed: " + describe(result));
  }
};

const Driver& driver() {
  static Driver d;
  return d;
}

// The same values at the same strides in fresh (aligned) memory: the kernel indexes with the input's strides, so
// the whole span they reach is copied.
at::Tensor aligned_copy(const at::Tensor& t) {
  int64_t span = 1;
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.size(d) > 0) span += (t.size(d) - 1) * t.stride(d);
  return t.as_strided({span}, {1}).clone().as_strided(t.sizes(), t.strides());
}

Launchers load_cubins(const Package& pkg, c10::Device device) {
  const json::Value* section = pkg.manifest.find("triton");
  if (!section || !section->find("kernels"))
    throw Error(Error::Kind::CorruptPackage, std::string("the package lists Triton kernels but has no 'triton' manifest section; ") + policy::kReconvert);
  c10::cuda::CUDAGuard guard(device.index());
  cudaFree(nullptr);  // makes the device's primary context current on this thread
  const cudaDeviceProp* props = at::cuda::getDeviceProperties(device.index());
  int64_t arch = props->major * 10 + props->minor;
  RebuiltCubins rebuilt;  // (where the kernels were built for another GPU and this process can rebuild them)
  bool foreign = false;
  for (const auto& meta : pkg.manifest.at("kernels").items) {
    const json::Value* entry = section->at("kernels").find(meta.at("name").as_string());
    const json::Value* built = entry ? entry->find("arch") : nullptr;
    foreign |= entry && (!built || built->is_null() || built->as_int() != arch);
  }
  if (foreign && cubin_rebuilder != nullptr) {
    rebuilt = cubin_rebuilder(pkg, arch, device);
    section = &rebuilt.section;
  }
  const Driver& cu = driver();
  Launchers launchers;
  for (const auto& meta : pkg.manifest.at("kernels").items) {
    const std::string& name = meta.at("name").as_string();
    const json::Value* entry = section->at("kernels").find(name);
    if (!entry) throw Error(Error::Kind::CorruptPackage, "the package has no Triton kernel " + repr(name) + "; " + policy::kReconvert);
    const json::Value* built = entry->find("arch");
    if (!built || built->is_null() || built->as_int() != arch)
      throw Error(Error::Kind::PackageDevice,
                  "the package's GPU kernels were built for " +
                      (built && !built->is_null() ? "sm_" + std::to_string(built->as_int()) : std::string("an unknown GPU")) +
                      " and this GPU is sm_" + std::to_string(arch) +
                      "; this runtime does not compile them alone: convert the model again on this GPU, or load it with "
                      "jit2triton.load from Python, which rebuilds them from the package's sources");
    if (entry->find("num_ctas") && entry->at("num_ctas").as_int() != 1)
      throw Error(Error::Kind::PackageDevice, "the package's kernels use thread-block clusters, which this runtime does not launch; convert again with this jit2triton");
    auto fresh = rebuilt.cubins.find(name);
    std::string_view cubin = fresh != rebuilt.cubins.end() ? std::string_view(fresh->second)
                                                           : pkg.member(entry->at("binary").as_string());
    std::string image(cubin);  // the driver wants a buffer it may read after this call returns
    void* module = nullptr;
    void* function = nullptr;
    const std::string& symbol = entry->at("function").as_string();
    cu.check(cu.load_data(&module, image.data()), "loading kernel " + symbol);
    cu.check(cu.get_function(&function, module, symbol.c_str()), "finding kernel " + symbol);
    int64_t shared = entry->at("shared").as_int();
    if (shared > kStaticSharedLimit)
      cu.check(cu.set_attribute(function, kMaxDynamicSharedAttribute, static_cast<int>(shared)),
               "granting kernel " + symbol + " " + std::to_string(shared) + " bytes of shared memory");
    const json::Value& grid = entry->at("grid");
    unsigned gx = grid[0].as_int(), gy = grid[1].as_int(), gz = grid[2].as_int();
    unsigned threads = 32 * entry->at("num_warps").as_int();
    int64_t scratch_per_program = entry->find("global_scratch_size") ? entry->at("global_scratch_size").as_int() : 0;
    size_t num_args = entry->at("arg_types").size();
    // A kernel over dynamic dims takes their sizes after its buffers (in its "size_args" order, which is the
    // order of the sizes the plan hands it); when its grid depends on them, "grid_items" says how many items it
    // covers, XBLOCK per program.
    std::vector<std::string> size_args;
    if (const json::Value* names = entry->find("size_args"))
      for (const auto& n : names->items) size_args.push_back(n.as_string());
    std::vector<std::string> listed;
    if (const json::Value* names = meta.find("sizes"))
      for (const auto& n : names->items) listed.push_back(n.as_string());
    if (size_args != listed || size_args.size() > num_args)
      throw Error(Error::Kind::CorruptPackage, policy::message::kernel_sizes(repr(symbol)));
    size_t first_size = num_args - size_args.size();
    // Inputs that are host numbers (the kernel index's "by_value", typed i64 or fp64 here): their bits come after
    // the dims in the sizes array, in order
    std::vector<size_t> numbers;
    if (const json::Value* by_value = meta.find("by_value"))
      for (const auto& i : by_value->items) {
        int64_t at = i.as_int();
        if (at < 0 || static_cast<size_t>(at) >= first_size || (!numbers.empty() && numbers.back() >= size_t(at)))
          throw Error(Error::Kind::CorruptPackage, policy::message::kernel_numbers(repr(symbol)));
        numbers.push_back(static_cast<size_t>(at));
      }
    for (size_t k = 0; k < first_size; ++k) {
      bool number = std::find(numbers.begin(), numbers.end(), k) != numbers.end();
      const std::string& type = entry->at("arg_types")[k].as_string();
      if (number != (type == "i64" || type == "fp64") || (!number && type.rfind("*", 0) != 0))
        throw Error(Error::Kind::CorruptPackage, policy::message::kernel_numbers(repr(symbol)));
    }
    // the inputs compiled for any address (a view that starts elsewhere each call) are passed as they are
    std::vector<uintptr_t> alignment(first_size, kAlignment);
    if (const json::Value* unaligned = entry->find("unaligned"))
      for (const auto& i : unaligned->items) {
        int64_t at = i.as_int();
        if (at < 0 || static_cast<size_t>(at) >= first_size)
          throw Error(Error::Kind::CorruptPackage, policy::message::kernel_unaligned(repr(symbol)));
        alignment[at] = 1;
      }
    // the outputs the kernel adds into atomically (an update-parallel scatter): zeroed before each launch
    std::vector<size_t> zeroed;
    if (const json::Value* outputs_zeroed = entry->find("zeroed")) {
      const json::Value* outputs = meta.find("outputs");
      size_t num_outputs = outputs && outputs->is_array() ? outputs->size() : 0;
      for (const auto& i : outputs_zeroed->items) {
        int64_t at = i.as_int();
        if (at < 0 || static_cast<size_t>(at) >= num_outputs)
          throw Error(Error::Kind::CorruptPackage, policy::message::kernel_zeroed(repr(symbol)));
        zeroed.push_back(static_cast<size_t>(at));
      }
    }
    std::optional<Size> grid_items;
    int64_t block = 1;
    if (const json::Value* items = entry->find("grid_items")) {
      grid_items = parse_size(*items, size_args);
      block = entry->at("constants").at("XBLOCK").as_int();
      if (block <= 0) throw Error(Error::Kind::CorruptPackage, "kernel " + repr(symbol) + " has a block size below 1; " + policy::kReconvert);
    }
    // A cubin that waits first for the kernel before it (emitters/dependent_launch.py) is launched with programmatic
    // dependent launch: scheduled while that kernel still runs, so its launch hides behind that kernel's tail
    const json::Value* pdl_entry = entry->find("pdl");
    bool pdl = pdl_entry && pdl_entry->kind == json::Value::Kind::Bool && pdl_entry->as_bool() && cu.launch_ex;
    c10::DeviceIndex index = device.index();
    launchers[name] = [=, &cu](std::vector<at::Tensor>& inputs, std::vector<at::Tensor>& outputs, const int64_t* sizes) {
      for (size_t k : zeroed) outputs[k].zero_();  // (on the current stream, as the launch: ordered before it)
      unsigned programs = grid_items ? static_cast<unsigned>(((*grid_items)(sizes) + block - 1) / block) : gx;
      if (!programs) return;
      int64_t scratch = scratch_per_program * programs * gy * gz;
      // (on the stack for any kernel of up to 16 arguments: a launch allocates nothing of its own)
      c10::SmallVector<uint64_t, 16> values(num_args + kScratchPointers, 0);
      c10::SmallVector<void*, 16> params(values.size());
      c10::SmallVector<at::Tensor, 2> keep;  // aligned copies and scratch, alive until the launch is queued
      size_t i = 0, number = 0;
      for (auto& t : inputs) {
        if (number < numbers.size() && numbers[number] == i) {  // a host number's bits, after the sizes
          values[i++] = static_cast<uint64_t>(sizes[size_args.size() + number++]);
          continue;
        }
        auto pointer = reinterpret_cast<uintptr_t>(t.data_ptr());
        if (pointer % alignment[i]) {
          keep.push_back(aligned_copy(t));
          pointer = reinterpret_cast<uintptr_t>(keep.back().data_ptr());
        }
        values[i++] = pointer;
      }
      for (auto& t : outputs) values[i++] = reinterpret_cast<uintptr_t>(t.data_ptr());
      // a size goes in a 64-bit slot; an i32 one is read as its low half (the value, on little-endian hosts)
      for (size_t k = 0; k < size_args.size(); ++k) values[first_size + k] = static_cast<uint64_t>(sizes[k]);
      if (scratch) {
        keep.push_back(at::empty({scratch}, at::TensorOptions().dtype(at::kByte).device(c10::kCUDA, index)));
        values[num_args] = reinterpret_cast<uintptr_t>(keep.back().data_ptr());
      }
      for (size_t k = 0; k < values.size(); ++k) params[k] = &values[k];
      c10::cuda::CUDAGuard on(index);
      cudaStream_t stream = at::cuda::getCurrentCUDAStream(index).stream();
      int result;
      if (pdl) {
        CUlaunchAttribute attribute;
        std::memset(&attribute, 0, sizeof attribute);
        attribute.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attribute.value.programmaticStreamSerializationAllowed = 1;
        CUlaunchConfig config;
        std::memset(&config, 0, sizeof config);
        config.gridDimX = programs, config.gridDimY = gy, config.gridDimZ = gz;
        config.blockDimX = threads, config.blockDimY = 1, config.blockDimZ = 1;
        config.sharedMemBytes = static_cast<unsigned>(shared);
        config.hStream = reinterpret_cast<CUstream>(stream);
        config.attrs = &attribute, config.numAttrs = 1;
        result = cu.launch_ex(&config, function, params.data(), nullptr);
      } else {
        result = cu.launch(function, programs, gy, gz, threads, 1, 1, static_cast<unsigned>(shared), stream,
                           params.data(), nullptr);
      }
      if (result) cu.check(result, "launching kernel " + symbol);
    };
  }
  return launchers;
}

}  // namespace

}  // namespace jit2triton

#else

namespace jit2triton {

namespace {

Launchers load_cubins(const Package&, c10::Device) {
  throw Error(Error::Kind::PackageDevice,
              "this jit2triton C++ runtime was built without CUDA, so it cannot run the package's GPU kernels; build "
              "it against a CUDA build of libtorch");
}

}  // namespace

}  // namespace jit2triton

#endif
