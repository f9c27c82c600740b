"""Probe (GPU debugging aid): a dynamic-shape package's outputs at each size against TorchScript, with and
without CUDA graphs, and the verification the conversion recorded."""
import sys
import torch
sys.path.insert(0, "tests")
import jit2triton
from test_dynamic_shapes import Encoder, encoder_inputs, DYNAMIC

torch.manual_seed(0)
model = torch.jit.trace(Encoder().eval(), encoder_inputs(2, 6, torch.Generator().manual_seed(0)))
example = tuple(x.cuda() for x in encoder_inputs(2, 6, torch.Generator().manual_seed(0)))
c = jit2triton.convert(model, example, device="cuda", dynamic_shapes=DYNAMIC)
print(c.summary()["verification"], c.manifest.get("cuda_graph"), len(c.summary()["kernels"]))
c.save("/tmp/p.j2t")
nog = jit2triton.load("/tmp/p.j2t", cuda_graphs=False)
g = torch.Generator().manual_seed(9)
for b, s in [(1, 1), (1, 1), (1, 1), (3, 5), (2, 6), (8, 48)]:
    inputs = encoder_inputs(b, s, g)
    want = model(*inputs)
    for name, m in (("graphs", c), ("no graphs", nog)):
        got = m(*[x.cuda() for x in inputs])
        errs = [float((a.cpu() - e).abs().max()) for a, e in zip(got, want)]
        print(b, s, name, errs)
print(c.manifest["ir"])
