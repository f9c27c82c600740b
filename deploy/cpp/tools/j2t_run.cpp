// j2t-run: run a .j2t package on random inputs with the C++ runtime and print the outputs' shapes and the time.
//
//   j2t-run model.j2t [--device cpu|cuda] [--bench N] [--warmup-ms MS] [--threads N] [--seed S] [--dump DIR]
//                     [--torchscript M.pt [--rtol R] [--atol A]] [--profile]
//
// With --torchscript, the same inputs also run through torch::jit::load(M.pt) in this process: each output's largest
// difference from it is printed, held to the tolerance `jit2triton run --check` holds it to (policy.h's, the same as
// convert-time verification's), and the exit code is policy::kOutputsDiffer (3) when one is beyond it; with --bench,
// its latency statistics beside ours, the two taking turns.
// Both run under torch::InferenceMode, as a deployment does (and as `jit2triton bench` times them), and the
// statistics are in milliseconds, printed as `jit2triton bench` prints them.
// The random inputs are those `jit2triton run` draws for the same seed (torch's CPU generator), and --dump writes
// each output's raw bytes to DIR/output_<i>.bin, so a test can compare them with TorchScript's. --profile times
// each plan step (Module::set_profiling) over the --bench calls (or 20) and prints the steps as `jit2triton bench
// --profile` does: share, ms per call, step, source.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <jit2triton/jit2triton.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/jit/serialization/import.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>

#include "../src/policy.h"

#ifdef J2T_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

namespace {

const char* kUsage =
    "usage: j2t-run model.j2t [--device cpu|cuda] [--shape DIM=N[,DIM=N]] [--bench N] [--warmup-ms MS] [--threads N]\n"
    "               [--seed S] [--trusted-key KEY.pub]...\n"
    "               [--dump DIR] [--torchscript M.pt [--rtol R] [--atol A]] [--profile]\n"
    "       j2t-run --help | --version\n"
    "Runs a jit2triton package on random inputs that fit its signature and prints the outputs' shapes and the load\n"
    "time; --shape: sizes of the package's dynamic dims (default: the example's); --bench N: latency statistics (min,\n"
    "mean, median, p90, p99, max, in ms) of N calls after --warmup-ms (default 200, at least 3 calls) of warm-up,\n"
    "taking turns with --torchscript when given, both under torch::InferenceMode; --threads N: torch's threads (ATen's\n"
    "ops, TorchScript) and the generated kernels', as `jit2triton bench --threads`; --torchscript M.pt: each output's\n"
    "largest difference from that TorchScript model on the same inputs (and its time), within --rtol of the output's\n"
    "largest magnitude plus --atol (default per dtype, as `jit2triton run --check`: float32 1e-3 and 1e-5, float16\n"
    "3e-2 and 1e-3, bfloat16 6e-2 and 1e-2); --dump DIR: each output's raw bytes, in DIR/output_<i>.bin (DIR must\n"
    "exist); --trusted-key: refuse the package unless this Ed25519 public key (or another given, or one in\n"
    "JIT2TRITON_TRUSTED_KEYS) signed it; --profile: each plan step's share and ms per call over the --bench calls\n"
    "(or 20), CUDA synchronised around each step.\n"
    "Exit codes: 0 done; 2 a mistake in the command, or a package or input refused; 3 --torchscript: the outputs\n"
    "differ from TorchScript's beyond the tolerance.\n";

int usage() {
  std::cerr << kUsage;
  return 2;
}

// One line on stderr and exit code 2, as every error of the jit2triton command.
int fail(const std::string& message) {
  std::cerr << "j2t-run: " << message << " (j2t-run --help lists the options)\n";
  return 2;
}

bool ends_with(const std::string& text, const std::string& tail) {
  return text.size() >= tail.size() && text.compare(text.size() - tail.size(), tail.size(), tail) == 0;
}

// The line of an error that says what went wrong: c10's messages can run to a backtrace.
std::string first_line(const std::string& message) { return message.substr(0, message.find('\n')); }

// The TorchScript model --torchscript names, or an error that says what the file is instead.
std::shared_ptr<torch::jit::Module> load_torchscript(const std::string& path, const std::string& device) {
  if (ends_with(path, ".j2t"))
    throw jit2triton::Error(jit2triton::Error::Kind::Input,
                            "--torchscript " + path + " is a jit2triton package; give the TorchScript .pt it was "
                            "converted from (the package itself is the first argument)");
  try {
    auto ts = std::make_shared<torch::jit::Module>(torch::jit::load(path, c10::Device(device)));
    ts->eval();
    return ts;
  } catch (const c10::Error& err) {
    throw jit2triton::Error(jit2triton::Error::Kind::Input,
                            "--torchscript " + path + " is not a TorchScript archive torch::jit::load can read (" +
                            first_line(err.what_without_backtrace()) + "); give the .pt torch.jit.save wrote");
  }
}

void sync(const std::string& device) {
#ifdef J2T_WITH_CUDA
  if (device.rfind("cuda", 0) == 0) at::cuda::getCurrentCUDAStream().synchronize();
#endif
}

// One call's wall time in microseconds, synchronised (the latency a caller sees).
double time_us(const std::function<void()>& call, const std::string& device) {
  auto t0 = std::chrono::steady_clock::now();
  call();
  sync(device);
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

// The q-th percentile (0..100) of sorted times, interpolating between the closest ranks (as `jit2triton bench`).
double percentile(const std::vector<double>& sorted, double q) {
  double rank = (sorted.size() - 1) * q / 100;
  size_t low = static_cast<size_t>(rank), high = std::min(low + 1, sorted.size() - 1);
  return sorted[low] + (sorted[high] - sorted[low]) * (rank - low);
}

// min / mean / median / p90 / p99 / max in ms and throughput, as `jit2triton bench` prints them; -> the median.
double report(const std::string& label, std::vector<double> times_us) {
  std::sort(times_us.begin(), times_us.end());
  double mean = 0;
  for (double t : times_us) mean += t / times_us.size();
  double median = percentile(times_us, 50);
  char line[320];
  std::snprintf(line, sizeof line,
                "%-12s min %.3f  mean %.3f  median %.3f  p90 %.3f  p99 %.3f  max %.3f ms  (%zu calls, %.1f calls/s)",
                label.c_str(), times_us.front() / 1e3, mean / 1e3, median / 1e3, percentile(times_us, 90) / 1e3,
                percentile(times_us, 99) / 1e3, times_us.back() / 1e3, times_us.size(), 1e6 / mean);
  std::cout << line << "\n";
  return median;
}

// Per-step times of `calls` calls (CUDA graphs off, so a GPU plan's steps run one by one), as `jit2triton bench
// --profile` prints them: the largest first, steps of one op from one source line as one row ("x12").
void profile(const std::string& path, jit2triton::LoadOptions options, const std::vector<c10::IValue>& inputs,
             int calls) {
  options.cuda_graphs = false;
  jit2triton::Module m = jit2triton::load(path, options);
  m.forward(inputs);  // a warm call outside the profile
  sync(m.device());
  m.set_profiling(true);
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) m.forward(inputs);
  double call_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / calls;
  struct Row {
    double seconds = 0;
    int steps = 0;
  };
  std::map<std::pair<std::string, std::string>, Row> rows;
  double total = 0;
  for (const auto& t : m.step_times()) {
    std::istringstream words(t.source);  // the source line's whitespace collapsed, as bench prints it
    std::string source, word;
    while (words >> word) source += (source.empty() ? "" : " ") + word;
    Row& row = rows[{t.op, source}];
    row.seconds += t.seconds;
    row.steps += 1;
    total += t.seconds;
  }
  std::vector<std::pair<std::pair<std::string, std::string>, Row>> ordered(rows.begin(), rows.end());
  std::sort(ordered.begin(), ordered.end(), [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  char line[400];
  std::snprintf(line, sizeof line, "profile: the C++ runtime, %d calls, each step synchronised, %.3f ms a call (times "
                "add up to more than an unprofiled call's):", calls, call_ms);
  std::cout << line << "\n" << " share   ms/call  step                                     source\n";
  for (size_t i = 0; i < ordered.size() && i < 30; ++i) {
    const auto& [key, row] = ordered[i];
    std::string what = key.first + (row.steps > 1 ? " x" + std::to_string(row.steps) : "");
    std::snprintf(line, sizeof line, "%5.1f%% %9.4f  %-40.40s %.60s", 100 * row.seconds / (total > 0 ? total : 1),
                  row.seconds * 1e3 / calls, what.c_str(), key.second.c_str());
    std::cout << line << "\n";
  }
  if (ordered.size() > 30) {
    double rest = 0;
    int steps = 0;
    for (size_t i = 30; i < ordered.size(); ++i) rest += ordered[i].second.seconds, steps += ordered[i].second.steps;
    std::snprintf(line, sizeof line, "%5.1f%% in %d more steps (%zu rows)", 100 * rest / (total > 0 ? total : 1), steps,
                  ordered.size() - 30);
    std::cout << line << "\n";
  }
}

// A whole number at least `least` spelled in all of `text` ("abc", "3x" and "" are refused, not read as 0).
std::optional<long long> whole_number(const std::string& text, long long least) {
  char* end = nullptr;
  errno = 0;
  long long n = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end || errno || n < least) return std::nullopt;
  return n;
}

// A finite number at least 0 spelled in all of `text`.
std::optional<double> non_negative(const std::string& text) {
  char* end = nullptr;
  double x = std::strtod(text.c_str(), &end);
  if (text.empty() || *end || !std::isfinite(x) || x < 0) return std::nullopt;
  return x;
}

std::string dtype_name(at::ScalarType type) {
  for (const auto& [name, aten] : jit2triton::policy::dtypes())
    if (aten == type) return name;
  return c10::toString(type);
}

std::string describe(const at::Tensor& t) {
  std::ostringstream text;
  text << dtype_name(t.scalar_type()) << t.sizes();
  return text.str();
}

// Each output against TorchScript's, held as `jit2triton run --check` holds it (jit2triton/verify.py's rule):
// floats' largest error within rtol of the largest magnitude plus atol, NaN and infinities where TorchScript has
// them; integers and bools with at most policy::kCheckExactFraction of the elements flipped. Prints a line per output;
// -> the outputs that differ ("output 0, output 2"), empty when all agree. rtol, atol < 0: the dtype's defaults.
std::string check_outputs(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& expected,
                          double rtol, double atol) {
  std::string differ;
  auto differs = [&](size_t i) { differ += (differ.empty() ? "output " : ", output ") + std::to_string(i); };
  if (outputs.size() != expected.size()) {
    std::cout << "  the package gives " << outputs.size() << " output tensors, TorchScript " << expected.size()
              << ": DIFFERS\n";
    return "the number of outputs";
  }
  double worst = 0;
  std::ostringstream lines;
  for (size_t i = 0; i < outputs.size(); ++i) {
    at::Tensor a = outputs[i].to(expected[i].device()), e = expected[i];
    lines << "  output " << i << " " << describe(e) << ": ";
    if (a.sizes() != e.sizes() || a.scalar_type() != e.scalar_type()) {
      lines << "the package gives " << describe(a) << ": DIFFERS\n";
      worst = INFINITY;
      differs(i);
      continue;
    }
    if (e.is_complex()) a = at::view_as_real(a), e = at::view_as_real(e);
    double largest = 0;
    bool ok = true;
    std::ostringstream held;
    if (e.numel() == 0) {
      held << "empty";
    } else if (!e.is_floating_point()) {
      double flipped = a.ne(e).to(at::kDouble).mean().item<double>();
      largest = (a.to(at::kDouble) - e.to(at::kDouble)).abs().max().item<double>();
      ok = flipped <= jit2triton::policy::kCheckExactFraction;
      held << flipped * 100 << "% of the elements differ, at most " << jit2triton::policy::kCheckExactFraction * 100
           << "% may";
    } else {
      at::Tensor ad = a.to(at::kDouble), ed = e.to(at::kDouble);
      bool same_specials = at::equal(ad.isnan(), ed.isnan()) && at::equal(ad.isposinf(), ed.isposinf()) &&
                           at::equal(ad.isneginf(), ed.isneginf());
      at::Tensor finite = ed.isfinite();
      double scale = finite.any().item<bool>() ? ed.masked_select(finite).abs().max().item<double>() : 0;
      largest = finite.any().item<bool>() ? (ad - ed).masked_select(finite).abs().max().item<double>() : 0;
      auto defaults = jit2triton::policy::check_tolerances().count(dtype_name(e.scalar_type()))
                          ? jit2triton::policy::check_tolerances().at(dtype_name(e.scalar_type()))
                          : jit2triton::policy::check_tolerances().at("float32");
      double r = rtol >= 0 ? rtol : defaults.first, t = atol >= 0 ? atol : defaults.second;
      ok = same_specials && largest <= r * scale + t;
      held << "rtol " << r << " of the largest magnitude " << scale << ", atol " << t;
      if (!same_specials) held << "; NaN or infinity at other positions";
    }
    char error[32];
    std::snprintf(error, sizeof error, "%.3e", largest);
    lines << "max abs error " << error << " (" << held.str() << "): " << (ok ? "ok" : "DIFFERS") << "\n";
    worst = std::max(worst, largest);
    if (!ok) differs(i);
  }
  std::cout << "max abs difference from torch::jit::load: " << worst << "\n" << lines.str();
  return differ;
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
  if (path.rfind("-", 0) == 0 && path != "--version") return fail("unknown option " + path + " (the package comes first)");
  if (path == "--version") {
    std::cout << "j2t-run (jit2triton C++ runtime): package format " << jit2triton::kPackageFormatVersion
              << ", built against torch " << TORCH_VERSION << "\n";
    return 0;
  }
  jit2triton::LoadOptions options;
  int bench = 0;
  bool profiling = false;
  double warmup_ms = 200, rtol = -1, atol = -1;
  uint64_t seed = 0;
  std::string dump, torchscript;
  std::map<std::string, int64_t> sizes;
  const char* options_taking_a_value[] = {"--device", "--bench", "--warmup-ms", "--threads", "--seed", "--dump",
                                         "--trusted-key", "--torchscript", "--shape", "--rtol", "--atol"};
  for (int i = 2; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--profile") {
      profiling = true;
      continue;
    }
    if (std::find(std::begin(options_taking_a_value), std::end(options_taking_a_value), arg) ==
        std::end(options_taking_a_value))
      return fail("unknown option " + arg);
    if (i + 1 >= argc) return fail(arg + " needs a value");
    std::string value = argv[i + 1];
    if (arg == "--bench" || arg == "--threads" || arg == "--seed") {
      auto n = whole_number(value, arg == "--seed" ? 0 : 1);
      if (!n || *n > (arg == "--seed" ? LLONG_MAX : INT32_MAX))
        return fail(arg + " takes a whole number" + (arg == "--seed" ? " 0 or more" : ", 1 or more") + ", not '" +
                    value + "'");
      if (arg == "--bench") bench = static_cast<int>(*n);
      else if (arg == "--threads") options.num_threads = static_cast<int>(*n);
      else seed = static_cast<uint64_t>(*n);
      ++i;
      continue;
    }
    if (arg == "--warmup-ms" || arg == "--rtol" || arg == "--atol") {
      auto x = non_negative(value);
      if (!x) return fail(arg + " takes a number, 0 or more, not '" + value + "'");
      (arg == "--warmup-ms" ? warmup_ms : arg == "--rtol" ? rtol : atol) = *x;
      ++i;
      continue;
    }
    if (arg == "--device") options.device = argv[++i];
    else if (arg == "--dump") dump = argv[++i];
    else if (arg == "--trusted-key") options.trusted_keys.push_back(argv[++i]);
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
  }
  if ((rtol >= 0 || atol >= 0) && torchscript.empty())
    return fail("--rtol and --atol are the tolerance of --torchscript: give --torchscript M.pt too");
  std::error_code no_throw;
  if (!dump.empty() && !std::filesystem::is_directory(dump, no_throw))
    return fail("--dump " + dump + " is not an existing folder (create it first)");
  c10::InferenceMode inference;  // neither runtime records autograd history or version counters
  // --threads is torch's threads too, as `jit2triton bench --threads` sets them: ATen's ops in the plan and the
  // TorchScript model use that many, not only the generated kernels
  if (options.num_threads > 0) at::set_num_threads(options.num_threads);
  try {
    auto start = std::chrono::steady_clock::now();
    jit2triton::Module m = jit2triton::load(path, options);
    double load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    std::cout << "loaded " << path << " in " << load_ms << " ms on " << m.device() << ", " << at::get_num_threads()
              << " threads\n"
              << "signature " << m.signature() << "\n";
    std::vector<c10::IValue> inputs = m.random_inputs(seed, sizes);
    auto outputs = m.forward(inputs);
    sync(m.device());
    for (size_t i = 0; i < outputs.size(); ++i) {
      std::cout << "output " << i << ": " << outputs[i].scalar_type() << outputs[i].sizes() << "\n";
      if (!dump.empty()) {
        at::Tensor host = outputs[i].to(at::kCPU).contiguous();
        std::string file = dump + "/output_" + std::to_string(i) + ".bin";
        std::ofstream out(file, std::ios::binary);
        out.write(static_cast<const char*>(host.data_ptr()), static_cast<std::streamsize>(host.nbytes()));
        out.close();
        if (!out) return fail("--dump: cannot write " + file + " (" + std::strerror(errno) + ")");
      }
    }
    std::function<void()> reference;
    std::string differ;  // the outputs beyond the tolerance: the exit code says so after any timing asked for
    if (!torchscript.empty()) {
      auto ts = load_torchscript(torchscript, m.device());
      reference = [ts, inputs] { ts->forward(inputs); };
      std::vector<at::Tensor> expected;
      flatten(ts->forward(inputs), expected);
      differ = check_outputs(outputs, expected, rtol, atol);
      if (differ.empty()) std::cout << "outputs match " << torchscript << " within the tolerance\n";
    }
    if (bench > 0) {
      // Warm up for --warmup-ms and at least 3 calls each (the TorchScript profiling executor optimises on its
      // second call), then the package and TorchScript take turns call by call, so a burst of load hits both.
      auto ours_call = [&] { m.forward(inputs); };
      auto start = std::chrono::steady_clock::now();
      for (int round = 0;; ++round) {
        time_us(ours_call, m.device());
        if (reference) time_us(reference, m.device());
        double spent = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
        if (round >= 2 && spent >= warmup_ms) break;
      }
      std::vector<double> ours_times, theirs_times;
      for (int i = 0; i < bench; ++i) {
        ours_times.push_back(time_us(ours_call, m.device()));
        if (reference) theirs_times.push_back(time_us(reference, m.device()));
      }
      double ours = report("j2t-run", ours_times);
      if (reference) {
        double theirs = report("torch.jit", theirs_times);
        char line[96];
        std::snprintf(line, sizeof line, "median speed-up over torch.jit: %.2fx", theirs / ours);
        std::cout << line << "\n";
      }
    }
    if (profiling) profile(path, options, inputs, bench > 0 ? bench : 20);
    if (!differ.empty()) {
      std::cerr << "j2t-run: " << path << " differs from " << torchscript << " beyond the tolerance at " << differ
                << "; is it the model the package was converted from?\n";
      return jit2triton::policy::kOutputsDiffer;
    }
  } catch (const jit2triton::Error& err) {
    std::cerr << "error: " << err.what() << "\n";
    return 2;
  } catch (const c10::Error& err) {  // an ATen failure outside a plan step
    std::cerr << "error: " << first_line(err.what_without_backtrace()) << "\n";
    return 2;
  }
  return 0;
}
