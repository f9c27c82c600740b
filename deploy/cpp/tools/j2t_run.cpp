// j2t-run: run a .j2t package on random inputs with the C++ runtime and print the outputs' shapes and the time.
//
//   j2t-run model.j2t [--device cpu|cuda] [--bench N] [--threads N] [--seed S] [--dump DIR]
//
// The random inputs are those `jit2triton run` draws for the same seed (torch's CPU generator), and --dump writes
// each output's raw bytes to DIR/output_<i>.bin, so a test can compare them with TorchScript's.
#include <ATen/ATen.h>
#include <jit2triton/jit2triton.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>

#ifdef J2T_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

namespace {

int usage() {
  std::cerr << "usage: j2t-run model.j2t [--device cpu|cuda] [--bench N] [--threads N] [--seed S] [--dump DIR]\n";
  return 2;
}

void sync(const std::string& device) {
#ifdef J2T_WITH_CUDA
  if (device.rfind("cuda", 0) == 0) at::cuda::getCurrentCUDAStream().synchronize();
#endif
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  std::string path = argv[1];
  jit2triton::LoadOptions options;
  int bench = 0;
  uint64_t seed = 0;
  std::string dump;
  for (int i = 2; i < argc; ++i) {
    std::string arg = argv[i];
    if (i + 1 >= argc) return usage();
    if (arg == "--device") options.device = argv[++i];
    else if (arg == "--bench") bench = std::atoi(argv[++i]);
    else if (arg == "--threads") options.num_threads = std::atoi(argv[++i]);
    else if (arg == "--seed") seed = std::strtoull(argv[++i], nullptr, 10);
    else if (arg == "--dump") dump = argv[++i];
    else return usage();
  }
  try {
    auto start = std::chrono::steady_clock::now();
    jit2triton::Module m = jit2triton::load(path, options);
    double load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    std::cout << "loaded " << path << " in " << load_ms << " ms on " << m.device() << "\n"
              << "signature " << m.signature() << "\n";
    std::vector<c10::IValue> inputs = m.random_inputs(seed);
    auto outputs = m.forward(inputs);
    sync(m.device());
    for (size_t i = 0; i < outputs.size(); ++i) {
      std::cout << "output " << i << ": " << outputs[i].scalar_type() << outputs[i].sizes() << "\n";
      if (!dump.empty()) {
        at::Tensor host = outputs[i].to(at::kCPU).contiguous();
        std::ofstream out(dump + "/output_" + std::to_string(i) + ".bin", std::ios::binary);
        out.write(static_cast<const char*>(host.data_ptr()), static_cast<std::streamsize>(host.nbytes()));
      }
    }
    if (bench > 0) {
      std::vector<double> times;
      for (int i = 0; i < bench; ++i) {
        auto t0 = std::chrono::steady_clock::now();
        m.forward(inputs);
        sync(m.device());
        times.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      }
      std::sort(times.begin(), times.end());
      std::cout << "median " << times[times.size() / 2] << " us per call over " << bench << " calls\n";
    }
  } catch (const jit2triton::Error& err) {
    std::cerr << "error: " << err.what() << "\n";
    return 2;
  }
  return 0;
}
