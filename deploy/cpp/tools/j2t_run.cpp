// j2t-run: run a .j2t package on random inputs with the C++ runtime and print the outputs' shapes and the time.
//
//   j2t-run model.j2t [--device cpu|cuda] [--bench N] [--threads N] [--seed S] [--dump DIR] [--torchscript M.pt]
//
// With --torchscript, the same inputs also run through torch::jit::load(M.pt) in this process: the largest
// difference from it is printed and, with --bench, its time per call beside ours.
// The random inputs are those `jit2triton run` draws for the same seed (torch's CPU generator), and --dump writes
// each output's raw bytes to DIR/output_<i>.bin, so a test can compare them with TorchScript's.
#include <ATen/ATen.h>
#include <jit2triton/jit2triton.h>
#include <torch/csrc/jit/serialization/import.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <sstream>

#ifdef J2T_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

namespace {

const char* kUsage =
    "usage: j2t-run model.j2t [--device cpu|cuda] [--shape DIM=N[,DIM=N]] [--bench N] [--threads N] [--seed S]\n"
    "               [--dump DIR] [--torchscript M.pt]\n"
    "       j2t-run --help | --version\n"
    "Runs a jit2triton package on random inputs that fit its signature and prints the outputs' shapes and the load\n"
    "time; --shape: sizes of the package's dynamic dims (default: the example's); --bench N: the median time of N calls; --torchscript M.pt: the largest difference from that TorchScript\n"
    "model on the same inputs (and its time); --dump DIR: each output's raw bytes.\n";

int usage() {
  std::cerr << kUsage;
  return 2;
}

void sync(const std::string& device) {
#ifdef J2T_WITH_CUDA
  if (device.rfind("cuda", 0) == 0) at::cuda::getCurrentCUDAStream().synchronize();
#endif
}

// Median wall time of one call, synchronised, after a few warm-up calls (the TorchScript profiling executor
// optimises on its second call).
double median_us(const std::function<void()>& call, int runs, const std::string& device) {
  for (int i = 0; i < 3; ++i) call();
  sync(device);
  std::vector<double> times;
  for (int i = 0; i < runs; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    call();
    sync(device);
    times.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

void flatten(const c10::IValue& v, std::vector<at::Tensor>& out) {
  if (v.isTensor()) out.push_back(v.toTensor());
  else if (v.isTuple()) for (const auto& x : v.toTupleRef().elements()) flatten(x, out);
  else if (v.isList()) for (const auto& x : v.toListRef()) flatten(x, out);
  else if (v.isGenericDict()) for (const auto& kv : v.toGenericDict()) flatten(kv.value(), out);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  std::string path = argv[1];
  if (path == "--help" || path == "-h") {
    std::cout << kUsage;
    return 0;
  }
  if (path == "--version") {
    std::cout << "j2t-run (jit2triton C++ runtime): package format " << jit2triton::kPackageFormatVersion
              << ", built against torch " << TORCH_VERSION << "\n";
    return 0;
  }
  jit2triton::LoadOptions options;
  int bench = 0;
  uint64_t seed = 0;
  std::string dump, torchscript;
  std::map<std::string, int64_t> sizes;
  for (int i = 2; i < argc; ++i) {
    std::string arg = argv[i];
    if (i + 1 >= argc) return usage();
    if (arg == "--device") options.device = argv[++i];
    else if (arg == "--bench") bench = std::atoi(argv[++i]);
    else if (arg == "--threads") options.num_threads = std::atoi(argv[++i]);
    else if (arg == "--seed") seed = std::strtoull(argv[++i], nullptr, 10);
    else if (arg == "--dump") dump = argv[++i];
    else if (arg == "--torchscript") torchscript = argv[++i];
    else if (arg == "--shape") {
      std::stringstream items(argv[++i]);
      for (std::string item; std::getline(items, item, ',');) {
        size_t eq = item.find('=');
        char* end = nullptr;
        long long n = eq == std::string::npos ? 0 : std::strtoll(item.c_str() + eq + 1, &end, 10);
        if (eq == std::string::npos || eq == 0 || !end || *end || n < 0) {
          std::cerr << "j2t-run: --shape takes DIM=SIZE items separated by commas (B=4,S=128), not " << item << "\n";
          return 2;
        }
        sizes[item.substr(0, eq)] = n;
      }
    }
    else return usage();
  }
  at::AutoGradMode no_grad(false);  // inference: neither runtime records autograd history
  try {
    auto start = std::chrono::steady_clock::now();
    jit2triton::Module m = jit2triton::load(path, options);
    double load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    std::cout << "loaded " << path << " in " << load_ms << " ms on " << m.device() << "\n"
              << "signature " << m.signature() << "\n";
    std::vector<c10::IValue> inputs = m.random_inputs(seed, sizes);
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
    std::function<void()> reference;
    if (!torchscript.empty()) {
      auto ts = std::make_shared<torch::jit::Module>(torch::jit::load(torchscript, c10::Device(m.device())));
      ts->eval();
      reference = [ts, inputs] { ts->forward(inputs); };
      std::vector<at::Tensor> expected;
      flatten(ts->forward(inputs), expected);
      double worst = 0;
      for (size_t i = 0; i < expected.size() && i < outputs.size(); ++i)
        worst = std::max(worst, (outputs[i].to(at::kDouble) - expected[i].to(at::kDouble)).abs().max().item<double>());
      std::cout << "max abs difference from torch::jit::load: " << worst << "\n";
    }
    if (bench > 0) {
      double ours = median_us([&] { m.forward(inputs); }, bench, m.device());
      std::cout << "median " << ours << " us per call over " << bench << " calls\n";
      if (reference) {
        double theirs = median_us(reference, bench, m.device());
        std::cout << "torch::jit::load: median " << theirs << " us per call (" << theirs / ours << "x ours)\n";
      }
    }
  } catch (const jit2triton::Error& err) {
    std::cerr << "error: " << err.what() << "\n";
    return 2;
  } catch (const c10::Error& err) {  // torch::jit::load of --torchscript, or an ATen failure outside a plan step
    std::cerr << "error: " << err.what_without_backtrace() << "\n";
    return 2;
  }
  return 0;
}
