"""What the runtimes know about ops: generated from transpiler/op_table.py by
`python -m jit2triton.transpiler.export_facts`; edit the op table, never this file."""

# OpInfo.syncs_host: a CUDA graph cannot hold them: the host waits for the device, or acts each call
SYNCS_HOST = frozenset({
    "aten::Bool.Tensor", "aten::Float.Tensor", "aten::Int.Tensor", "aten::ScalarImplicit", "aten::_unique2",
    "aten::allclose", "aten::equal", "aten::is_nonzero", "aten::item", "aten::masked_select", "aten::nonzero",
    "aten::unique", "aten::warn", "prim::Print", "prim::RaiseException", "prim::tolist",
})
# OpInfo.builds_container: build a list, tuple or dict from their inputs
CONTAINERS = frozenset({
    "prim::DictConstruct", "prim::ListConstruct", "prim::TupleConstruct",
})
# OpInfo.unpacks: give one output per item of a list or tuple
UNPACKS = frozenset({
    "prim::ListUnpack", "prim::TupleUnpack",
})
# OpInfo.forbidden: reach outside the model (files, global state): a plan calling one is refused
FORBIDDEN = frozenset({
    "aten::from_file", "aten::from_file.out", "aten::manual_seed", "aten::manual_seed.generator", "aten::save",
    "aten::seed", "aten::set_grad_enabled",
})
# OpInfo.packs_weights: the only ops a plan's "packed" list may run (quantized weights, at load)
PACKING_OPS = frozenset({
    "aten::_make_per_channel_quantized_tensor", "aten::_make_per_tensor_quantized_tensor",
    "mkldnn::_reorder_convolution_weight", "mkldnn::_reorder_linear_weight", "quantized::conv2d_prepack",
    "quantized::conv3d_prepack", "quantized::conv_transpose2d_prepack", "quantized::conv_transpose3d_prepack",
    "quantized::embedding_bag_prepack", "quantized::linear_prepack", "quantized::linear_prepack_fp16",
    "quantized::make_quantized_cell_params_dynamic", "quantized::make_quantized_cell_params_fp16",
})
# OpInfo.reads_node: TorchScript's operation reads their graph node: no plan step can call them
NODE_ATTRIBUTE_OPS = frozenset({
    "prim::MKLDNNClamp", "prim::MKLDNNClamp_", "prim::MKLDNNHardTanh", "prim::MKLDNNHardTanh_",
})
