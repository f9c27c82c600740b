// What the C++ runtime knows about ops: generated from transpiler/op_table.py by
// `python -m jit2triton.transpiler.export_facts`; edit the op table, never this file.
#pragma once

#include <set>
#include <string>

namespace jit2triton::op_facts {

// OpInfo.forbidden: reach outside the model (files, global state): a plan calling one is refused
inline bool forbidden(const std::string& op) {
  static const std::set<std::string> ops = {
      "aten::from_file", "aten::from_file.out", "aten::manual_seed", "aten::manual_seed.generator", "aten::save",
      "aten::seed", "aten::set_grad_enabled",
  };
  return ops.count(op) > 0;
}

// OpInfo.packs_weights: the only ops a plan's "packed" list may run (quantized weights, at load)
inline bool packs_weights(const std::string& op) {
  static const std::set<std::string> ops = {
      "aten::_make_per_channel_quantized_tensor", "aten::_make_per_tensor_quantized_tensor",
      "mkldnn::_reorder_convolution_weight", "mkldnn::_reorder_linear_weight", "quantized::conv2d_prepack",
      "quantized::conv3d_prepack", "quantized::conv_transpose2d_prepack", "quantized::conv_transpose3d_prepack",
      "quantized::embedding_bag_prepack", "quantized::linear_prepack", "quantized::linear_prepack_fp16",
      "quantized::make_quantized_cell_params_dynamic", "quantized::make_quantized_cell_params_fp16",
  };
  return ops.count(op) > 0;
}

}  // namespace jit2triton::op_facts
