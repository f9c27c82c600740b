"""Dynamic shapes on the GPU, lean (issue #31): BERT-base fp32 (transformers, random weights) converted once with
dynamic dims B in 1..64 and S in 8..512 at (1, 16), against a static package of each size and TorchScript, wall
microseconds per call back to back after warm-up (the issue's measure); and a conv net with a dynamic image size,
whose sizes after the first strided conv are bound at run time: its fallback ops and its speed vs TorchScript.
JSON to $OUT/dyn_lean.json when $OUT is set.

    python benchmarks/dynamic_lean.py
"""
import json
import os
import time

import torch

import jit2triton
OUT = os.environ.get("OUT", ".")
res = {}
def wall_us(f, n=100):
    for _ in range(10): f()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n): f()
    torch.cuda.synchronize(); return (time.perf_counter() - t) / n * 1e6
try:
    from transformers import BertConfig, BertModel
    class T(torch.nn.Module):
        def __init__(s, m): super().__init__(); s.m = m
        def forward(s, ids, mask): return s.m(ids, attention_mask=mask, return_dict=False)
    torch.manual_seed(0)
    m = T(BertModel(BertConfig(attn_implementation="eager"))).cuda().eval()
    def inputs(b, s):
        ids = torch.randint(0, 30522, (b, s), device="cuda"); mask = torch.ones(b, s, dtype=torch.int64, device="cuda")
        mask[:, s - s // 4:] = 0
        return ids, mask
    with torch.no_grad():
        ts = torch.jit.trace(m, inputs(1, 16), strict=False)
    B = jit2triton.Dim("b", min=1, max=64); S = jit2triton.Dim("s", min=8, max=512)
    t = time.time(); dyn = jit2triton.convert(ts, inputs(1, 16), device="cuda", dynamic_shapes=[{0: B, 1: S}, {0: B, 1: S}])
    res["bert_dyn_convert_s"] = round(time.time() - t, 1); dyn.save("/tmp/dyn.j2t")
    dl = jit2triton.load("/tmp/dyn.j2t")
    rows = {}
    with torch.no_grad():
        for size in [(1, 16), (8, 128), (4, 77)]:
            x = inputs(*size)
            st = jit2triton.convert(ts, x, device="cuda"); st.save("/tmp/st.j2t"); sl = jit2triton.load("/tmp/st.j2t")
            err = max((a - b).abs().max().item() for a, b in zip(dl(*x), ts(*x)))
            rows[str(size)] = {"dynamic_us": round(wall_us(lambda: dl(*x)), 1), "static_us": round(wall_us(lambda: sl(*x)), 1),
                               "torchscript_us": round(wall_us(lambda: ts(*x)), 1), "dyn_max_err": err}
            print(size, rows[str(size)], flush=True)
    res["bert"] = rows
except Exception as e:
    res["bert_error"] = repr(e)[:500]
try:
    class Net(torch.nn.Module):
        def __init__(s):
            super().__init__()
            s.a = torch.nn.Conv2d(3, 32, 3, stride=2, padding=1); s.b = torch.nn.Conv2d(32, 32, 3, stride=2, padding=1, groups=32)
            s.c = torch.nn.Conv2d(32, 64, 1)
        def forward(s, x):
            y = torch.nn.functional.silu(s.a(x)); z = torch.nn.functional.silu(s.b(y))
            z = z * torch.sigmoid(z.mean((2, 3), keepdim=True)); return s.c(z).relu().mean((2, 3))
    net = Net().cuda().eval(); x0 = torch.randn(2, 3, 96, 96, device="cuda")
    tn = torch.jit.trace(net, x0)
    H = jit2triton.Dim("H", 64, 256); W = jit2triton.Dim("W", 64, 256)
    cn = jit2triton.convert(tn, (x0,), device="cuda", dynamic_shapes=[{2: H, 3: W}])
    s = cn.summary(); res["convnet_fallbacks"] = s["fallback_ops"]; res["convnet_bound"] = cn._contents.manifest["plan"].get("bound_dims")
    cn.save("/tmp/cn.j2t"); cl = jit2triton.load("/tmp/cn.j2t")
    with torch.no_grad():
        for hw in [(96, 96), (131, 200), (256, 255)]:
            x = torch.randn(2, 3, *hw, device="cuda")
            res[f"convnet {hw}"] = {"err": (cl(x) - tn(x)).abs().max().item(), "pkg_us": round(wall_us(lambda: cl(x)), 1),
                                     "torchscript_us": round(wall_us(lambda: tn(x)), 1)}
except Exception as e:
    res["convnet_error"] = repr(e)[:500]
print(json.dumps(res, indent=1, default=str))
json.dump(res, open(os.path.join(OUT, "dyn_lean.json"), "w"), indent=1, default=str)
