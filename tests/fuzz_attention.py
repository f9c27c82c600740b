"""A differential fuzzer for the generated short-sequence attention (emitters/triton_attention.py) and the layout
copies it stores through (transpiler/store_through_copies.py): random `scaled_dot_product_attention` call sites
(rank 3 or 4, queries 1-40, keys 1-64, head dims 8-64, value dims 8-32; additive masks of every broadcast, boolean,
causal, none with a scale; q, k, v as transposed views or dense; the output returned, copied transposed, or copied
heads-major), the template forced (`attention_kernels.MODE = "generated"`), each converted and called twice on fresh
inputs beside the TorchScript model. A mismatch, a failed conversion or a call site the template did not take is a
failure.

    TRITON_INTERPRET=1 python tests/fuzz_attention.py --seeds 40 [--first 0] [--device cpu|cuda]
"""
from __future__ import annotations

import argparse
import random

import torch
import torch.nn.functional as F

import jit2triton
from jit2triton.transpiler import attention_kernels


class CallSite(torch.nn.Module):
    def __init__(self, kind: str, transposed: bool, tail: str) -> None:
        super().__init__()
        self.kind, self.transposed, self.tail = kind, transposed, tail

    def forward(self, q, k, v, m):
        if self.transposed:
            q, k, v = q.transpose(-2, -3), k.transpose(-2, -3), v.transpose(-2, -3)
        if self.kind == "additive":
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
        elif self.kind == "boolean":
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=m > 0)
        elif self.kind == "causal":
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True) + m.sum()
        else:
            out = F.scaled_dot_product_attention(q, k, v, scale=0.7) + m.mean()
        if self.tail == "copy":
            return out.transpose(-1, -2).contiguous()
        if self.tail == "heads" and out.dim() == 4:
            return out.transpose(1, 2).contiguous()
        return out


def case(seed: int, device: str):
    """(the module, a maker of fresh inputs, a description) for one seed."""
    r = random.Random(seed)
    rank, b, h = r.choice([3, 4]), r.randint(1, 3), r.randint(1, 3)
    queries, keys = r.randint(1, 40), r.randint(1, 64)
    d, e = r.choice([8, 16, 24, 64]), r.choice([8, 16, 32])
    kind, transposed, tail = r.choice(["additive", "boolean", "causal", "none"]), r.random() < 0.5, \
        r.choice(["", "copy", "heads"])
    batch = (b, h) if rank == 4 else (b,)

    def shape(n: int, width: int) -> tuple:
        if transposed:
            return (b, n, h, width) if rank == 4 else (n, b, width)
        return batch + (n, width)
    masks = [(queries, keys), (1, keys)] + ([batch + (queries, keys)] if kind == "additive" else [])
    mask = r.choice(masks)

    def make():
        return (torch.randn(*shape(queries, d), device=device), torch.randn(*shape(keys, d), device=device),
                torch.randn(*shape(keys, e), device=device), torch.randn(*mask, device=device))
    what = f"rank {rank}, {queries} queries, {keys} keys, d {d}, e {e}, {kind}, transposed {transposed}, {tail}"
    return CallSite(kind, transposed, tail).eval(), make, what


def run(seed: int, device: str) -> str:
    """"" where the package matches TorchScript, else what went wrong."""
    model, make, what = case(seed, device)
    traced = torch.jit.trace(model, make(), check_trace=False)
    try:
        converted = jit2triton.convert(traced, make(), backend="triton", device=device)
    except Exception as error:  # noqa: BLE001 - a fuzzer reports every failure
        return f"{what}: conversion failed: {type(error).__name__}: {error}"
    if not any(k["name"].endswith("_attention") for k in converted.summary()["kernels"]):
        return f"{what}: no attention kernel\n{converted.report()}"
    for call in range(2):
        inputs = make()
        got, expected = converted(*inputs), traced(*inputs)
        if not torch.allclose(got, expected, rtol=2e-4, atol=2e-5, equal_nan=True):
            return f"{what}: call {call} differs by {(got - expected).abs().max().item():.3g}"
    return ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=40)
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    attention_kernels.MODE = "generated"
    failures = 0
    for seed in range(args.first, args.first + args.seeds):
        problem = run(seed, args.device)
        failures += bool(problem)
        print(f"seed {seed}: {problem or 'ok'}")
    print(f"{failures} failures in {args.seeds} seeds")
    raise SystemExit(1 if failures else 0)


if __name__ == "__main__":
    main()
