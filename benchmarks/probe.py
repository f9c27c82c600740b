"""Where the time of a call goes, on a GPU: sin2+cos2 16M's bandwidth (per call, back to back, kernel alone, and a
sweep of launch configurations with `sweep`) and sin+cos 0-d's host cost per piece of the call path.

    python benchmarks/probe.py [overhead] [sincos [sweep]] [gap] [launchbench]     # writes $OUT/probe.json
"""
from __future__ import annotations

import json, os, statistics, sys, tempfile, time
import torch

sys.path.insert(0, os.path.dirname(__file__))
import jit2triton  # noqa: E402
from gpu_bench import events_us  # noqa: E402
from workloads import WORKLOADS  # noqa: E402

OUT = os.environ.get("OUT", "/tmp")
results = {}


def per_call_events(fn, runs=300):
    return events_us(fn, (), runs=runs, warmup=20)


def batch_events(fn, calls=50, reps=21):
    return events_us(fn, (), calls=calls, runs=reps)


def wall(fn, runs=2000, reps=7):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(runs):
            fn()
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t0) / runs * 1e6)
    return statistics.median(ts)


def load(name):
    model, inputs = WORKLOADS[name].build("cuda", torch.float32)
    folder = tempfile.mkdtemp()
    pt = os.path.join(folder, "m.pt")
    torch.jit.save(torch.jit.trace(model, inputs), pt)
    traced = torch.jit.freeze(torch.jit.load(pt).eval())
    m = jit2triton.convert(pt, example_inputs=inputs, device="cuda")
    m.save(os.path.join(folder, "m.j2t"))
    ours = jit2triton.load(os.path.join(folder, "m.j2t"))
    return model, traced, ours, inputs


def sincos():
    model, traced, ours, (x,) = load("sin2+cos2 16M")
    nbytes = 2 * x.numel() * 4
    print(ours.code)
    print(json.dumps(ours.manifest["triton"]["kernels"]))
    rt = ours._runtime
    launch = next(iter(rt.executor.kernels.values()))
    out = torch.empty_like(x)
    r = {}
    with torch.no_grad():
        for label, fn in [("ours", lambda: ours(x)), ("kernel only", lambda: launch([x], [out])),
                          ("eager", lambda: model(x)), ("torch.jit", lambda: traced(x)), ("copy", lambda: out.copy_(x))]:
            pc, be = per_call_events(fn), batch_events(fn)
            r[label] = {"per-call us": pc, "batch us": be, "per-call GB/s": nbytes / pc / 1e3, "batch GB/s": nbytes / be / 1e3}
    for k, v in r.items():
        print(f"{k:12s} per-call {v['per-call us']:7.1f} us {v['per-call GB/s']:6.0f} GB/s | batch {v['batch us']:7.1f} us {v['batch GB/s']:6.0f} GB/s")
    results["sin2cos2"] = r
    if "sweep" not in sys.argv:
        return
    # raw kernel sweep
    from jit2triton.emitters.compile_triton import kernel_function
    from triton.testing import do_bench
    src = next(d.decode() for n, d in ours._contents.files.items() if n.startswith("kernels/"))
    name = next(iter(ours.manifest["triton"]["kernels"].values()))["function"]
    variants = {"generated": src,
                "nomask": src.replace(", mask=xmask, other=0)", ")").replace(", mask=xmask)", ")"),
                "evict": src.replace("other=0)", "other=0, eviction_policy='evict_first')")}
    sweep = {}
    copy_ms = do_bench(lambda: out.copy_(x), warmup=25, rep=200, return_mode="median")
    print(f"do_bench copy {copy_ms*1e3:.1f} us {nbytes/copy_ms/1e6:.0f} GB/s")
    sweep["copy"] = copy_ms * 1e3
    for vname, vsrc in variants.items():
        fn = kernel_function(vsrc, name)
        for xb in (512, 1024, 2048, 4096, 8192):
            for w in (2, 4, 8, 16):
                if xb // (32 * w) < 1 or xb // (32 * w) > 32:
                    continue
                try:
                    ms = do_bench(lambda: fn[(x.numel() // xb,)](x, out, XBLOCK=xb, num_warps=w), warmup=25, rep=100,
                                  return_mode="median")
                except Exception as err:
                    print(vname, xb, w, "failed", err); continue
                sweep[f"{vname} {xb} {w}"] = ms * 1e3
                print(f"{vname:10s} XBLOCK {xb:5d} warps {w:2d}: {ms*1e3:6.1f} us {nbytes/ms/1e6:6.0f} GB/s ({copy_ms/ms*100:.0f}% of copy)")
    results["sweep"] = sweep


def overhead():
    model, traced, ours, (x,) = load("sin+cos 0-d")
    rt = ours._runtime
    ex = rt.executor
    launch = next(iter(ex.kernels.values()))
    out = torch.empty((), device="cuda")
    r = {}
    with torch.no_grad():
        paths = [("ours", lambda: ours(x)), ("torch.jit", lambda: traced(x)), ("eager", lambda: model(x)),
                 ("runtime", lambda: rt(x)), ("check_inputs", lambda: rt.check_inputs((x,))),
                 ("executor", lambda: ex([x])), ("launch", lambda: launch([x], [out])),
                 ("empty_strided", lambda: torch.empty_strided((), (), dtype=torch.float32, device="cuda")),
                 ("ours", lambda: ours(x)), ("torch.jit", lambda: traced(x))]
        for label, fn in paths:
            w_ = wall(fn)
            r.setdefault(label, []).append(w_)
            print(f"{label:14s} wall {w_:6.2f} us")
        for label, fn in [("ours", lambda: ours(x)), ("torch.jit", lambda: traced(x))]:
            ev = per_call_events(fn, 2000)
            r[label + " events"] = ev
            print(f"{label:14s} events {ev:6.2f} us")
    import cProfile, pstats
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(20000):
        ours(x)
    pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(15)
    results["overhead"] = r


def gap():
    """sin2+cos2 16M, per call: host time until fn returns (no sync) next to the CUDA-event time, per path."""
    model, traced, ours, (x,) = load("sin2+cos2 16M")
    rt = ours._runtime
    ex = rt.executor
    launch = next(iter(ex.kernels.values()))
    out = torch.empty_like(x)
    r = {}
    paths = [("copy", lambda: out.copy_(x)), ("kernel only", lambda: launch([x], [out])),
             ("alloc+kernel", lambda: launch([x], [torch.empty_like(x)])),
             ("executor", lambda: ex([x])), ("runtime", lambda: rt(x)), ("ours", lambda: ours(x)),
             ("copy", lambda: out.copy_(x)), ("ours", lambda: ours(x))]
    with torch.no_grad():
        for label, fn in paths:
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
            ev, host = [], []
            for _ in range(300):
                s_, e_ = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s_.record()
                t0 = time.perf_counter_ns()
                fn()
                t1 = time.perf_counter_ns()
                e_.record(); e_.synchronize()
                ev.append(s_.elapsed_time(e_) * 1e3)
                host.append((t1 - t0) / 1e3)
            r.setdefault(label, []).append((statistics.median(ev), statistics.median(host)))
            print(f"{label:14s} events {statistics.median(ev):6.1f} us  host {statistics.median(host):5.1f} us")
    results["gap"] = r


def launchbench():
    """Host cost of the pieces of a call: output allocation variants and launch variants, same kernel."""
    import ctypes
    from jit2triton.deploy.triton_kernels import _get_driver, _LaunchConfig
    model, traced, ours, (x,) = load("sin+cos 0-d")
    entry = next(iter(ours.manifest["triton"]["kernels"].values()))
    drv = _get_driver()
    f = drv.function(ours._contents.files[entry["binary"]], entry["function"], entry["shared"])
    out = torch.empty((), device="cuda")
    dev, dev0 = torch.device("cuda"), torch.device("cuda", 0)
    values = (ctypes.c_uint64 * 4)()
    params = (ctypes.c_void_p * 4)(*[ctypes.addressof(values) + 8 * i for i in range(4)])
    old = ctypes.PyDLL("libcuda.so.1").cuLaunchKernel
    p, u = ctypes.c_void_p, ctypes.c_uint
    old.argtypes = (p, u, u, u, u, u, u, u, p, p, p)
    old.restype = ctypes.c_int
    config = _LaunchConfig(1, 1, 1, 32, 1, 1, 0, None, None, 0)
    cp = ctypes.pointer(config)
    stream = torch._C._cuda_getCurrentRawStream
    r = {}
    tests = [
        ("empty_strided dev", lambda: torch.empty_strided((), (), dtype=torch.float32, device=dev)),
        ("empty dev", lambda: torch.empty((), dtype=torch.float32, device=dev)),
        ("empty dev0", lambda: torch.empty((), dtype=torch.float32, device=dev0)),
        ("x.new_empty", lambda: x.new_empty(())),
        ("empty_like", lambda: torch.empty_like(x)),
        ("contiguous", lambda: x.contiguous()),
        ("empty_strided 64MB", lambda: torch.empty_strided((1 << 24,), (1,), dtype=torch.float32, device=dev)),
        ("empty_strided 64MB", lambda: torch.empty_strided((1 << 24,), (1,), dtype=torch.float32, device=dev)),
        ("empty_strided dev", lambda: torch.empty_strided((), (), dtype=torch.float32, device=dev)),
        ("data_ptr", lambda: x.data_ptr()),
        ("raw stream", lambda: stream(0)),
        ("old cuLaunchKernel", lambda: old(f, 1, 1, 1, 32, 1, 1, 0, stream(0), params, None)),
        ("cuLaunchKernelEx", lambda: drv.launch(cp, f, params, None)),
        ("package launch", lambda: next(iter(ours._runtime.executor.kernels.values()))([x], [out])),
        ("check_inputs", lambda: ours._runtime.check_inputs((x,))),
        ("executor", lambda: ours._runtime.executor([x])),
        ("ours", lambda: ours(x)),
        ("torch.jit", lambda: traced(x)),
    ]
    values[0], values[1] = x.data_ptr(), out.data_ptr()
    with torch.no_grad():
        for label, fn in tests:
            r[label] = wall(fn)
            print(f"{label:20s} wall {r[label]:6.2f} us")
    results["launchbench"] = r


if __name__ == "__main__":
    what = [w for w in sys.argv[1:] if w != "sweep"] or ["overhead", "sincos"]
    for w in what:
        globals()[w]()
    torch.cuda.synchronize()
    with open(os.path.join(OUT, "probe.json"), "w") as f:
        json.dump(results, f, indent=1)
