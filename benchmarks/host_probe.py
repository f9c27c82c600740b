"""Probe: the MLP package's host time per step (C++ and Python runtimes, step by step), by GEMM form."""
import os, sys, tempfile, time
import torch
sys.path.insert(0, os.path.dirname(__file__))
import jit2triton
from jit2triton.transpiler import gemm_forms
from workloads import WORKLOADS

torch.manual_seed(0)
model, inputs = WORKLOADS["MLP+LayerNorm 8x512x1024"].build("cuda", torch.float16)


def measure(m, label):
    for _ in range(20):
        m(*inputs)
    walls = []
    for rep in range(7):
        torch.cuda.synchronize(); t = time.perf_counter()
        for _ in range(100):
            m(*inputs)
        torch.cuda.synchronize(); walls.append((time.perf_counter() - t) / 100 * 1e6)
    hosts = []
    for rep in range(5):
        torch.cuda.synchronize(); t = time.perf_counter()
        for _ in range(8):
            m(*inputs)
        hosts.append((time.perf_counter() - t) / 8 * 1e6)
    torch.cuda.synchronize()
    print(f"{label}: wall {sorted(walls)[3]:.1f} us; enqueue {min(hosts):.1f} us", flush=True)


with torch.no_grad():
    traced = torch.jit.trace(model, inputs)
    measure(model, "eager")
    for form in ("linear", "linear_add", "kn"):
        gemm_forms.MODE = form
        conv = jit2triton.convert(traced, example_inputs=inputs, device="cuda")
        path = os.path.join(tempfile.mkdtemp(), "m.j2t")
        conv.manifest["cuda_graph"] = False
        conv.save(path)
        for runtime in ("cpp", "python"):
            measure(jit2triton.load(path, runtime=runtime), f"{form} {runtime} steps")
    gemm_forms.MODE = "linear"
    from torch.profiler import profile, ProfilerActivity
    m = jit2triton.load(path, runtime="cpp")
    for _ in range(5):
        m(*inputs)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(20):
            m(*inputs)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(20):
            model(*inputs)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
