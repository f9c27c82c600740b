import sys, time, torch, jit2triton, warnings
warnings.simplefilter("ignore")
sys.path.insert(0, "benchmarks")
from dynamic_bench import bert_inputs, TupleOutputs
from transformers import BertConfig, BertModel
import jit2triton.verify as V
orig = V.Verifier.check
def check(self, run):
    found = orig(self, run)
    for m in found[:3]:
        print("MISMATCH", m, flush=True)
    return found
V.Verifier.check = check
torch.manual_seed(0)
model = TupleOutputs(BertModel(BertConfig(attn_implementation="eager", num_hidden_layers=2))).eval().cuda()
for smax in (64, 512):
    B, S = jit2triton.Dim("B", min=1, max=32), jit2triton.Dim("S", min=8, max=smax)
    with torch.no_grad():
        ex = bert_inputs((4, 64 if smax > 64 else 16), "cuda")
        tr = torch.jit.trace(model, ex)
        t = time.perf_counter()
        m = jit2triton.convert(tr, ex, dynamic_shapes=[{0: B, 1: S}, {0: B, 1: S}], device="cuda")
        print(smax, time.perf_counter() - t, m.summary()["verification"], len(m.summary()["kernels"]), flush=True)
