"""GPU check of kernels/triton_attention.py: correctness, autotuning, benchmark vs SDPA.

Run from the repository root on a CUDA machine:

    OUT=/tmp/out python3 kernels/triton_notes/gpu_check.py [--skip-correctness] [--skip-bench]

Correctness: forward (o, lse) and backward (dq, dk, dv, with a gradient on lse too) against a
dense float64 reference, with the error of the same dense computation in the input dtype (the
yardstick) printed beside it. Kernels are compiled in parallel worker processes first (Triton's
disk cache is shared), then everything is measured in one process. Benchmark: B*N = 16k tokens,
H*D = 2048, FLOPs fwd = 4*B*H*N*N*D (halved when causal), bwd = 2.5 x fwd, median of
triton.testing.do_bench. Results go to $OUT.
"""

import json
import math
import multiprocessing as mp
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

OUT = os.environ.get("OUT", "/tmp/out")
DTYPES = {
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp32": torch.float32,
    "fp64": torch.float64,
}

# (B, Hq, Hkv, Nq, Nk, D, Dv, causal, dtype, block_m, block_n, strided)
CASES = [
    (2, 4, 2, 197, 211, 72, 40, True, "bf16", 64, 32, False),
    (2, 4, 2, 197, 211, 72, 40, True, "fp16", 64, 32, True),
    (2, 4, 2, 197, 211, 72, 40, True, "fp32", 32, 32, False),
    (2, 4, 2, 197, 211, 72, 40, True, "fp64", 32, 16, True),
    (1, 4, 1, 300, 100, 128, 128, True, "bf16", None, None, True),
    (1, 2, 2, 1, 1, 1, 1, False, "fp16", 16, 16, False),
    (1, 3, 1, 1, 300, 24, 8, True, "bf16", 16, 128, False),
    (2, 8, 8, 1000, 1000, 64, 64, True, "bf16", None, None, True),
    (2, 8, 8, 1000, 1000, 64, 64, False, "fp16", None, None, False),
    (1, 2, 1, 129, 257, 200, 200, False, "fp16", 32, 64, True),
    (1, 2, 1, 129, 257, 256, 256, True, "bf16", 128, 32, False),
    (1, 2, 1, 150, 150, 64, 64, True, "fp32", None, None, True),
    (1, 2, 2, 70, 90, 40, 40, True, "fp64", None, None, False),
    (1, 4, 2, 333, 77, 96, 160, True, "fp16", 128, 64, True),
    (1, 2, 1, 100, 100, 256, 256, False, "fp32", 32, 16, False),
    (1, 2, 1, 100, 100, 256, 256, False, "fp64", 16, 16, False),
    (1, 4, 2, 600, 600, 256, 256, True, "bf16", None, None, False),  # autotuned, D > 128
    (1, 2, 1, 300, 300, 200, 120, True, "fp64", None, None, True),  # fixed tiles
]
BENCH_KEYS = [(dt, d, c) for dt in ("bf16", "fp16") for d in (64, 128) for c in (False, True)]
BENCH_NS = (4096, 512, 1024, 2048, 8192, 16384)  # the first N is the one autotuning sees


def make(shape, dtype, strided, gen):
    """A random tensor; when ``strided``, a permuted view into a NaN-filled buffer."""
    x = torch.randn(shape, generator=gen, device="cuda", dtype=torch.float32).to(dtype)
    if not strided:
        return x
    b, h, n, d = shape
    buf = torch.full((b, n + 3, h, d + 5), float("nan"), device="cuda", dtype=dtype)
    view = buf[:, 2 : n + 2, :, 1 : d + 1].permute(0, 2, 1, 3)
    view.copy_(x)
    return view


def dense(q, k, v, causal, scale, dtype):
    """Dense attention in ``dtype`` (float64: the reference; input dtype: the yardstick)."""
    q, k, v = (t.to(dtype) for t in (q, k, v))
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = (
        (q @ k.transpose(-1, -2)).float() * scale
        if dtype != torch.float64
        else (q @ k.transpose(-1, -2)) * scale
    )
    if causal:
        nq, nk = q.shape[2], k.shape[2]
        i = torch.arange(nq, device=q.device)[:, None]
        j = torch.arange(nk, device=q.device)[None, :]
        s = s.masked_fill(j > i + (nk - nq), float("-inf"))
    lse = torch.logsumexp(s, -1)
    empty = torch.isinf(lse)
    p = torch.where(empty[..., None], 0.0, torch.exp(s - torch.where(empty, 0.0, lse)[..., None]))
    return (p.to(dtype) @ v).to(dtype), lse


def run_case(case, seed=0):
    from flashprop.kernels.triton_attention import attention

    b, hq, hkv, nq, nk, d, dv, causal, dt, bm, bn, strided = case
    dtype = DTYPES[dt]
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = make((b, hq, nq, d), dtype, strided, gen).requires_grad_()
    k = make((b, hkv, nk, d), dtype, strided, gen).requires_grad_()
    v = make((b, hkv, nk, dv), dtype, strided, gen).requires_grad_()
    scale = 1.0 / math.sqrt(d)
    o, lse = attention(q, k, v, causal=causal, block_m=bm, block_n=bn)
    do = torch.randn(o.shape, generator=gen, device="cuda").to(dtype)
    dlse = torch.randn(lse.shape, generator=gen, device="cuda").to(lse.dtype) * 0.1
    dlse = torch.where(torch.isinf(lse), 0.0, dlse)
    grads = torch.autograd.grad((o, lse), (q, k, v), (do, dlse))
    # bitwise determinism of a second run
    o2, lse2 = attention(q, k, v, causal=causal, block_m=bm, block_n=bn)
    grads2 = torch.autograd.grad((o2, lse2), (q, k, v), (do, dlse))
    deterministic = torch.equal(o, o2) and all(torch.equal(x, y) for x, y in zip(grads, grads2))

    out = {
        "case": case,
        "deterministic": deterministic,
        "nan": any(torch.isnan(t).any().item() for t in (o, *grads)),
    }
    results = {}
    for name, ref_dtype in (("ref", torch.float64), ("yard", dtype)):
        qr, kr, vr = (t.detach().clone().requires_grad_() for t in (q, k, v))
        orf, lser = dense(qr, kr, vr, causal, scale, ref_dtype)
        g = torch.autograd.grad((orf, lser), (qr, kr, vr), (do.to(orf.dtype), dlse.to(lser.dtype)))
        results[name] = (orf, lser, g)
    ref_o, ref_lse, ref_g = results["ref"]
    y_o, y_lse, y_g = results["yard"]
    fin = torch.isfinite(ref_lse)
    out["lse_inf_pattern_ok"] = torch.equal(torch.isinf(lse), ~fin)

    def err(a, r):
        return (a.double() - r.double()).nan_to_num(nan=float("inf")).abs().max().item()

    out["err"] = {
        "o": err(o, ref_o),
        "lse": err(lse[fin], ref_lse[fin]),
        "dq": err(grads[0], ref_g[0]),
        "dk": err(grads[1], ref_g[1]),
        "dv": err(grads[2], ref_g[2]),
    }
    out["yard"] = {
        "o": err(y_o, ref_o),
        "lse": err(y_lse[fin], ref_lse[fin]),
        "dq": err(y_g[0], ref_g[0]),
        "dk": err(y_g[1], ref_g[1]),
        "dv": err(y_g[2], ref_g[2]),
    }
    return out


def gradcheck_fp64():
    from flashprop.kernels.triton_attention import attention

    torch.manual_seed(0)
    q = torch.randn(1, 2, 5, 3, device="cuda", dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 1, 7, 3, device="cuda", dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 1, 7, 4, device="cuda", dtype=torch.float64, requires_grad=True)

    def causal_fn(q, k, v):
        return attention(q, k, v, causal=True, block_m=16, block_n=16)

    def full_fn(q, k, v):
        return attention(q, k, v, causal=False, block_m=16, block_n=16)

    return {
        "causal": torch.autograd.gradcheck(causal_fn, (q, k, v)),
        "non-causal": torch.autograd.gradcheck(full_fn, (q, k, v)),
    }


def worker_correctness(idx_cases):
    torch.cuda.set_device(0)
    return [(i, run_case(c)) for i, c in idx_cases]


def worker_compile_bench(key):
    """Compile (and roughly tune) the autotuned kernels of one benchmark key at N=4096."""
    from flashprop.kernels.triton_attention import attention

    dt, d, causal = key
    n = BENCH_NS[0]
    b, h = 16384 // n, 2048 // d
    q, k, v = (
        torch.randn(b, h, n, d, device="cuda", dtype=DTYPES[dt], requires_grad=True)
        for _ in range(3)
    )
    o, _ = attention(q, k, v, causal=causal)
    o.backward(torch.randn_like(o))
    torch.cuda.synchronize()
    return key


def bench_one(dt, d, causal, n):
    """TFLOP/s of triton, SDPA flash and SDPA cuDNN on one benchmark problem."""
    import flashprop.kernels.triton_attention as ta
    import triton
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b, h = 16384 // n, 2048 // d
    q, k, v = (
        torch.randn(b, h, n, d, device="cuda", dtype=DTYPES[dt], requires_grad=True)
        for _ in range(3)
    )
    do = torch.randn_like(q)
    flops = 4 * b * h * n * n * d / (2 if causal else 1)
    row = {"dtype": dt, "d": d, "causal": causal, "n": n, "b": b, "h": h}

    def ours():
        return ta.attention(q, k, v, causal=causal)[0]

    def sdpa(backend):
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    backends = {
        "triton": ours,
        "flash": lambda: sdpa(SDPBackend.FLASH_ATTENTION),
        "cudnn": lambda: sdpa(SDPBackend.CUDNN_ATTENTION),
    }
    for name, fn in backends.items():
        try:
            fwd_ms = triton.testing.do_bench(fn, return_mode="median")
            o = fn()
            bwd_ms = triton.testing.do_bench(
                lambda o=o: o.backward(do, retain_graph=True),
                grad_to_none=[q, k, v],
                return_mode="median",
            )
            row[name] = {
                "fwd_tflops": flops / fwd_ms * 1e-9,
                "bwd_tflops": 2.5 * flops / bwd_ms * 1e-9,
                "fwd_ms": fwd_ms,
                "bwd_ms": bwd_ms,
            }
        except Exception as e:  # a backend may refuse a config
            row[name] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
    return row


def bench():
    import flashprop.kernels.triton_attention as ta

    rows = []
    for dt, d, causal in BENCH_KEYS:
        for n in BENCH_NS:
            rows.append(bench_one(dt, d, causal, n))
            print(json.dumps(rows[-1]), flush=True)
        best = {
            "fwd": str(ta._attn_fwd_tuned.best_config),
            "dkdv": str(ta._attn_bwd_dkdv_tuned.best_config),
            "dq": str(ta._attn_bwd_dq_tuned.best_config),
        }
        print("best configs", dt, d, causal, best, flush=True)
        rows.append({"best_configs": [dt, d, causal, best]})
    return rows


def table(rows):
    lines = [
        "| dtype | d | causal | N | B | H | triton fwd | flash fwd | cudnn fwd | fwd/flash |"
        " fwd/cudnn | triton bwd | flash bwd | cudnn bwd | bwd/flash | bwd/cudnn |",
        "|" + "---|" * 16,
    ]
    for r in rows:
        if "n" not in r:
            continue
        t, f, c = r["triton"], r["flash"], r["cudnn"]

        def g(x, key):
            return x.get(key, float("nan"))

        lines.append(
            f"| {r['dtype']} | {r['d']} | {r['causal']} | {r['n']} | {r['b']} | {r['h']} | "
            f"{g(t, 'fwd_tflops'):.0f} | {g(f, 'fwd_tflops'):.0f} | {g(c, 'fwd_tflops'):.0f} | "
            f"{g(t, 'fwd_tflops') / g(f, 'fwd_tflops'):.2f} | "
            f"{g(t, 'fwd_tflops') / g(c, 'fwd_tflops'):.2f} | "
            f"{g(t, 'bwd_tflops'):.0f} | {g(f, 'bwd_tflops'):.0f} | {g(c, 'bwd_tflops'):.0f} | "
            f"{g(t, 'bwd_tflops') / g(f, 'bwd_tflops'):.2f} | "
            f"{g(t, 'bwd_tflops') / g(c, 'bwd_tflops'):.2f} |"
        )
    return "\n".join(lines)


def main():
    os.makedirs(OUT, exist_ok=True)
    t0 = time.time()
    print(torch.__version__, torch.cuda.get_device_name(), flush=True)
    ctx = mp.get_context("spawn")
    workers = 12
    with ctx.Pool(workers) as pool:
        jobs = []
        if "--skip-bench" not in sys.argv:
            jobs.append(pool.map_async(worker_compile_bench, BENCH_KEYS))
        if "--skip-correctness" not in sys.argv:
            chunks = [list(enumerate(CASES))[i :: workers - 4] for i in range(workers - 4)]
            jobs.append(pool.map_async(worker_correctness, chunks))
        results = [j.get() for j in jobs]
    print(f"parallel phase done in {time.time() - t0:.0f}s", flush=True)

    report = {}
    if "--skip-correctness" not in sys.argv:
        corr = sorted((x for chunk in results[-1] for x in chunk), key=lambda x: x[0])
        lines = []
        for _, r in corr:
            e, y = r["err"], r["yard"]
            lines.append(
                f"{r['case']} det={r['deterministic']} nan={r['nan']} "
                f"inf_ok={r['lse_inf_pattern_ok']} | "
                + " ".join(f"{n}={e[n]:.2e}/{y[n]:.2e}" for n in e)
            )
        lines.append(f"gradcheck fp64 (non-causal, causal): {gradcheck_fp64()}")
        print("\n".join(lines), flush=True)
        with open(os.path.join(OUT, "correctness.txt"), "w") as f:
            f.write("kernel error / yardstick error vs float64\n" + "\n".join(lines) + "\n")
        report["correctness"] = [r for _, r in corr]
    print(f"correctness done at {time.time() - t0:.0f}s", flush=True)

    if "--skip-bench" not in sys.argv:
        rows = bench()
        md = table(rows)
        print(md, flush=True)
        with open(os.path.join(OUT, "bench.md"), "w") as f:
            f.write(md + "\n")
        report["bench"] = rows
    with open(os.path.join(OUT, "report.json"), "w") as f:
        json.dump(report, f, indent=1, default=str)
    print(f"total {time.time() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    main()
