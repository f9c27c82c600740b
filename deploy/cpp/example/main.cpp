// Run a model converted by `jit2triton convert`, with no Python in the process.
#include <ATen/ATen.h>
#include <jit2triton/jit2triton.h>

#include <iostream>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: run_model model.j2t [cpu|cuda]\n";
    return 2;
  }
  try {
    jit2triton::Module m = jit2triton::load(argv[1], argc > 2 ? argv[2] : "");  // "": the device it was built for
    std::cout << "signature " << m.signature() << "\n";
    at::manual_seed(0);
    at::Tensor x = at::randn({2, 4}).to(m.device());  // the shape the model was converted for
    std::vector<at::Tensor> out = m.forward({x});
    std::cout << out[0] << "\n";
  } catch (const jit2triton::Error& err) {  // a bad package or input: the message says what to do
    std::cerr << err.what() << "\n";
    return 1;
  }
  return 0;
}
