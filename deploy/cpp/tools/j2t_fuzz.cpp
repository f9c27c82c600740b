// j2t-fuzz: load and run many (damaged) packages in one process, for the mutation fuzz under AddressSanitizer and
// UBSan (tests/test_sanitized_fuzz.py builds it with -DJIT2TRITON_SANITIZE=ON; tests/mutate_packages.py
// --write-dir makes the packages).
//
//   j2t-fuzz DIR [--trusted-key KEY.pub]
//
// Each DIR/*.j2t, in name order, is loaded and run on random inputs that fit its signature. A package must be
// refused with a jit2triton::Error, or load and run: any other exception is printed as "FAIL <file>: ..." and
// makes the exit status 1; a memory error is the sanitizer's report and its exit status. Before each package its
// name is printed and flushed, so the last name on stdout is the one that crashed.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <jit2triton/jit2triton.h>

#include <algorithm>
#include <dirent.h>
#include <iostream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: j2t-fuzz DIR [--trusted-key KEY.pub]\n";
    return 2;
  }
  std::string folder = argv[1];
  jit2triton::LoadOptions options;
  for (int i = 2; i + 1 < argc; i += 2)
    if (std::string(argv[i]) == "--trusted-key") options.trusted_keys.push_back(argv[i + 1]);
  std::vector<std::string> files;
  if (DIR* dir = opendir(folder.c_str())) {
    while (dirent* entry = readdir(dir)) {
      std::string name = entry->d_name;
      if (name.size() > 4 && name.compare(name.size() - 4, 4, ".j2t") == 0) files.push_back(name);
    }
    closedir(dir);
  }
  std::sort(files.begin(), files.end());
  at::AutoGradMode no_grad(false);
  int failures = 0, refused = 0, ran = 0;
  for (const auto& name : files) {
    std::cout << "package " << name << std::endl;
    try {
      jit2triton::Module m = jit2triton::load(folder + "/" + name, options);
      std::vector<c10::IValue> inputs = m.random_inputs(0);
      for (auto& x : inputs)  // a damaged example value (2**62) would make a loop's trip count endless: the
        if (x.isInt() && (x.toInt() > 64 || x.toInt() < -64)) x = int64_t(3);  // harness's input, not the runtime
      m.forward(inputs);
      ++ran;
    } catch (const jit2triton::Error&) {
      ++refused;
    } catch (const std::exception& err) {  // anything else reaching a user is a defect
      ++failures;
      std::cout << "FAIL " << name << ": " << std::string(err.what()).substr(0, 300) << std::endl;
    }
  }
  std::cout << files.size() << " packages: " << refused << " refused, " << ran << " ran, " << failures
            << " failing" << std::endl;
  return failures ? 1 : 0;
}
