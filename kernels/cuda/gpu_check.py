"""One-call GPU check of the ``cuda`` kernel: build, correctness, opcheck, benchmark.

Run from the repository root on a CUDA (sm_90a) machine:

    PYTHONUNBUFFERED=1 python3 kernels/cuda/gpu_check.py [--out DIR] [--skip-correctness]
        [--skip-bench] [--quick-bench]

A tuning variant is checked the same way with extra nvcc flags, e.g.
``FLASHPROP_CUDA_FLAGS=-DFLASHPROP_FWD128_BLOCK_N=32`` (each process builds into a fresh directory).

1. Builds the extension into a fresh directory and reports the build time.
2. Correctness against a script-local dense float64 reference (forward o, lse and autograd dq,
   dk, dv with random dO and dlse), on many shapes: Nq != Nk both ways, N = 1, lengths that are
   not tile multiples, causal with Nq > Nk (empty rows: o = 0, lse = -inf, zero grads), GQA/MQA,
   head dims 8..256, fp16/bf16, explicit scales, and inputs given as views into NaN-filled
   buffers (strided, transposed, misaligned) so that any out-of-bounds read shows up as NaN.
   Each error is compared with a yardstick: the same dense computation in the input dtype.
3. Bitwise determinism of forward and backward, and ``torch.library.opcheck`` on both ops.
4. Benchmark against SDPA's flash and cuDNN backends (bf16, B*N = 16k tokens, H*D = 2048),
   median of ``triton.testing.do_bench``; TFLOP/s with forward 4*B*H*N^2*D (halved if causal)
   and backward 2.5x that.

Results go to stdout and to DIR (default ``$OUT`` or ``./gpu_check_out``): ``log.txt``,
``correctness.json``, ``bench.json``. Exit status 1 if any check failed.
"""

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

FAILURES: list[str] = []


def log(msg: str) -> None:
    print(msg, flush=True)
    LOG.append(msg)


LOG: list[str] = []


# ---- script-local dense float64 reference ---------------------------------------------------


def dense_attention(q, k, v, causal: bool, scale: float):
    """Dense attention in the inputs' dtype (differentiable): (o, lse) with the DESIGN.md
    semantics (bottom-right causal, empty rows o = 0 and lse = -inf with zero gradients)."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    s = (q @ k.transpose(-1, -2)) * scale
    nq, nk = q.shape[2], k.shape[2]
    empty = torch.zeros(nq, dtype=torch.bool, device=q.device)
    if causal:
        i = torch.arange(nq, device=q.device)[:, None]
        j = torch.arange(nk, device=q.device)[None, :]
        visible = j <= i + (nk - nq)
        s = s.masked_fill(~visible, float("-inf"))
        empty = ~visible.any(dim=1)
    # Empty rows get a zero row for the logsumexp (finite, no NaN gradient), then -inf.
    lse_raw = torch.logsumexp(s.masked_fill(empty[:, None], 0.0), dim=-1)
    p = torch.exp(s - lse_raw[..., None])  # exactly 0 on masked entries, so 0 on empty rows
    o = p.to(v.dtype) @ v
    lse = lse_raw.masked_fill(empty, float("-inf"))
    return o, lse.float() if lse.dtype != torch.float64 else lse


def fwd_bwd(fn, q, k, v, do, dlse, causal, scale):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    o, lse = fn(q, k, v, causal, scale)
    finite = torch.isfinite(lse)
    grads = torch.autograd.grad((o, lse), (q, k, v), (do.to(o.dtype), dlse.to(lse.dtype)))
    return [o.detach(), lse.detach(), *grads], finite


def kernel_fn(q, k, v, causal, scale):
    from flashprop.kernels.cuda_attention import attention

    return attention(q, k, v, causal=causal, scale=scale)


def reference_fn(q, k, v, causal, scale):
    return dense_attention(q, k, v, causal, scale)


# ---- inputs ---------------------------------------------------------------------------------


def make_view(shape, dtype, layout: str, gen: torch.Generator):
    """Random tensor of `shape` laid out as `layout`, inside a NaN-filled buffer."""
    b, h, n, d = shape
    values = torch.randn(shape, generator=gen, device="cuda", dtype=torch.float32).to(dtype)
    if layout == "contiguous":
        return values.contiguous()
    if layout == "strided":  # rows padded by 24 columns, sequence offset by 3 rows
        buf = torch.full((b, h, n + 5, d + 24), float("nan"), device="cuda", dtype=dtype)
        view = buf[:, :, 3 : 3 + n, 8 : 8 + d]
    elif layout == "transposed":  # (B, N, H, D) storage
        buf = torch.full((b, n + 2, h, d), float("nan"), device="cuda", dtype=dtype)
        view = buf[:, 1 : 1 + n].transpose(1, 2)
    elif layout == "misaligned":  # base offset by one element: the kernel must copy
        buf = torch.full((b * h * n * d + 7,), float("nan"), device="cuda", dtype=dtype)
        view = buf[1 : 1 + b * h * n * d].view(b, h, n, d)
    else:
        raise ValueError(layout)
    view.copy_(values)
    return view


CASES = [
    # (B, Hq, Hkv, Nq, Nk, D, causal, dtype, layout, scale)
    (1, 1, 1, 1, 1, 64, False, "bf16", "contiguous", None),
    (1, 1, 1, 1, 1, 64, True, "fp16", "contiguous", None),
    (2, 4, 4, 128, 128, 64, False, "bf16", "contiguous", None),
    (2, 4, 4, 128, 128, 64, True, "fp16", "strided", None),
    (1, 2, 2, 100, 37, 128, True, "bf16", "contiguous", None),  # Nq > Nk: empty rows
    (1, 2, 2, 100, 37, 128, False, "fp16", "transposed", None),
    (1, 2, 2, 37, 300, 128, True, "bf16", "strided", None),  # Nq < Nk
    (1, 2, 2, 1, 300, 128, True, "bf16", "contiguous", None),
    (1, 2, 2, 300, 1, 128, True, "fp16", "contiguous", None),
    (2, 8, 2, 257, 129, 64, False, "bf16", "transposed", 0.3),  # GQA 4
    (2, 8, 2, 257, 129, 64, True, "bf16", "contiguous", None),
    (1, 4, 1, 65, 200, 128, True, "fp16", "misaligned", None),  # MQA
    (1, 2, 2, 333, 333, 256, True, "bf16", "strided", None),
    (1, 2, 1, 190, 70, 256, False, "fp16", "contiguous", 0.05),
    (1, 2, 2, 77, 150, 8, True, "bf16", "contiguous", None),
    (1, 2, 2, 77, 150, 40, False, "fp16", "strided", None),
    (1, 2, 2, 150, 77, 96, True, "bf16", "transposed", None),
    (1, 2, 2, 129, 131, 136, True, "fp16", "contiguous", None),
    (1, 2, 2, 129, 131, 200, False, "bf16", "contiguous", None),
    (1, 3, 3, 513, 1000, 128, True, "bf16", "contiguous", None),
    (1, 3, 3, 1000, 513, 128, True, "bf16", "contiguous", None),
    (2, 4, 4, 1024, 1024, 64, True, "bf16", "contiguous", None),
    (2, 4, 4, 1024, 1024, 128, False, "fp16", "contiguous", None),
    (1, 2, 2, 2048, 2048, 128, True, "bf16", "strided", 1.0),
]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
NAMES = ("o", "lse", "dq", "dk", "dv")


def check_case(case, gen: torch.Generator) -> dict:
    b, hq, hkv, nq, nk, d, causal, dt, layout, scale = case
    dtype = DTYPES[dt]
    q = make_view((b, hq, nq, d), dtype, layout, gen)
    k = make_view((b, hkv, nk, d), dtype, layout, gen)
    v = make_view((b, hkv, nk, d), dtype, layout, gen)
    do = torch.randn((b, hq, nq, d), generator=gen, device="cuda").to(dtype)
    dlse = torch.randn((b, hq, nq), generator=gen, device="cuda")
    sc = 1.0 / math.sqrt(d) if scale is None else scale
    got, finite = fwd_bwd(kernel_fn, q, k, v, do, dlse, causal, scale)
    gold, _ = fwd_bwd(reference_fn, *(t.double() for t in (q, k, v)), do.double(), dlse, causal, sc)
    yard, _ = fwd_bwd(reference_fn, q, k, v, do, dlse, causal, sc)
    res = {"case": list(map(str, case)), "ok": True, "errors": {}}
    for name, x, g, y in zip(NAMES, got, gold, yard, strict=True):
        if name == "lse":  # compare finite rows; empty rows must be exactly -inf
            if not torch.equal(torch.isfinite(x), torch.isfinite(g)) or torch.isnan(x).any():
                res["ok"] = False
                res["errors"]["lse_pattern"] = "finite/-inf pattern differs"
            x, g, y = x[finite], g[finite], y[finite]
        xf, gf = x.double(), g.double()
        err = (xf - gf).abs().max().item() if xf.numel() else 0.0
        yerr = (y.double() - gf).abs().max().item() if xf.numel() else 0.0
        mag = gf.abs().max().item() if xf.numel() else 0.0
        bad = bool(torch.isnan(x).any()) or err > 3 * yerr + 2e-3 * max(1.0, mag)
        res["errors"][name] = {"err": err, "yardstick": yerr, "ratio": err / max(yerr, 1e-12)}
        if bad:
            res["ok"] = False
    if causal and nq > nk:  # empty rows: o and dq exactly zero
        rows = slice(0, nq - nk)
        if got[0][:, :, rows].abs().max() != 0 or got[2][:, :, rows].abs().max() != 0:
            res["ok"] = False
            res["errors"]["empty_rows"] = "o or dq not exactly 0 on rows that see no key"
    return res


def run_correctness(out: Path) -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    results = []
    log("\n== correctness vs float64 dense reference (err = max abs; ratio = err / yardstick)")
    for case in CASES:
        try:
            r = check_case(case, gen)
        except Exception as exc:  # report and carry on with the other cases
            r = {"case": list(map(str, case)), "ok": False, "errors": {"exception": repr(exc)}}
        results.append(r)
        e = r["errors"]
        summary = " ".join(f"{n}={e[n]['err']:.2e}(x{e[n]['ratio']:.2f})" for n in NAMES if n in e)
        extra = {key: val for key, val in e.items() if key not in NAMES}
        log(f"{'PASS' if r['ok'] else 'FAIL'} {case} {summary} {extra if extra else ''}")
        if not r["ok"]:
            FAILURES.append(f"correctness {case}")
    (out / "correctness.json").write_text(json.dumps(results, indent=1))


def run_determinism_and_opcheck() -> None:
    from flashprop.kernels.cuda_attention import attention

    log("\n== determinism and opcheck")
    gen = torch.Generator(device="cuda").manual_seed(1)
    for d, causal in ((64, True), (128, False), (256, True)):
        q, k, v = (torch.randn(2, 4, 700, d, generator=gen, device="cuda").bfloat16() for _ in "qkv")
        do = torch.randn(2, 4, 700, d, generator=gen, device="cuda").bfloat16()
        runs = []
        for _ in range(2):
            qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
            o, lse = attention(qq, kk, vv, causal=causal)
            runs.append([o, lse, *torch.autograd.grad(o, (qq, kk, vv), do)])
        same = all(torch.equal(a, b) for a, b in zip(*runs, strict=True))
        log(f"{'PASS' if same else 'FAIL'} bitwise determinism d={d} causal={causal}")
        if not same:
            FAILURES.append(f"determinism d={d}")
    for causal in (False, True):
        q = torch.randn(1, 4, 130, 64, device="cuda", dtype=torch.float16, requires_grad=True)
        k = torch.randn(1, 2, 77, 64, device="cuda", dtype=torch.float16, requires_grad=True)
        v = torch.randn(1, 2, 77, 64, device="cuda", dtype=torch.float16, requires_grad=True)
        try:
            torch.library.opcheck(torch.ops.flashprop.cuda_attn_fwd.default, (q, k, v, causal, 0.125))
            o, lse = torch.ops.flashprop.cuda_attn_fwd(q, k, v, causal, 0.125)
            args = (
                torch.randn_like(o),
                q.detach(),
                k.detach(),
                v.detach(),
                o.detach(),
                lse.detach(),
                torch.randn_like(lse),
                causal,
                0.125,
            )
            torch.library.opcheck(torch.ops.flashprop.cuda_attn_bwd.default, args)
            log(f"PASS opcheck fwd+bwd causal={causal}")
        except Exception as exc:
            log(f"FAIL opcheck causal={causal}: {exc!r}")
            FAILURES.append(f"opcheck causal={causal}")


# ---- benchmark ------------------------------------------------------------------------------


def bench_config(impls: dict, d: int, causal: bool, n: int) -> dict:
    """TFLOP/s of each implementation, forward and backward, for one configuration."""
    from triton.testing import do_bench

    b, h = 16384 // n, 2048 // d
    q, k, v = (
        torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in "qkv"
    )
    do = torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16)
    flops = 4 * b * h * n * n * d * (0.5 if causal else 1.0)
    row = {"d": d, "causal": causal, "n": n, "b": b, "h": h}
    for name, fn in impls.items():
        try:
            ms_f = do_bench(lambda fn=fn: fn(q, k, v, causal), warmup=10, rep=40, return_mode="median")
            o = fn(q, k, v, causal)
            ms_b = do_bench(
                lambda o=o: torch.autograd.grad(o, (q, k, v), do, retain_graph=True),
                warmup=10,
                rep=40,
                return_mode="median",
            )
            row[f"{name}_fwd"] = flops / ms_f / 1e9
            row[f"{name}_bwd"] = 2.5 * flops / ms_b / 1e9
        except Exception as exc:
            row[f"{name}_fwd"] = row[f"{name}_bwd"] = float("nan")
            row[f"{name}_error"] = repr(exc)[:200]
    return row


def run_bench(out: Path, quick: bool) -> None:
    import torch.nn.functional as F
    from flashprop.kernels.cuda_attention import attention
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def sdpa(backend):
        def fn(q, k, v, causal):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        return fn

    impls = {
        "cuda": lambda q, k, v, causal: attention(q, k, v, causal=causal)[0],
        "flash": sdpa(SDPBackend.FLASH_ATTENTION),
        "cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
    }
    lengths = (2048, 8192) if quick else (512, 1024, 2048, 4096, 8192, 16384)
    rows = []
    log("\n== benchmark bf16, B*N=16k, H*D=2048 (TFLOP/s, median of do_bench)")
    log(
        f"{'d':>4} {'causal':>6} {'N':>6} | {'fwd cuda':>8} {'flash':>6} {'cudnn':>6} "
        f"{'/fl':>5} {'/cd':>5} | {'bwd cuda':>8} {'flash':>6} {'cudnn':>6} {'/fl':>5} {'/cd':>5}"
    )
    for d in (64, 128):
        for causal in (False, True):
            for n in lengths:
                r = bench_config(impls, d, causal, n)
                rows.append(r)
                log(
                    f"{d:>4} {causal!s:>6} {n:>6} | {r['cuda_fwd']:8.1f} {r['flash_fwd']:6.1f} "
                    f"{r['cudnn_fwd']:6.1f} {r['cuda_fwd'] / r['flash_fwd']:5.2f} "
                    f"{r['cuda_fwd'] / r['cudnn_fwd']:5.2f} | {r['cuda_bwd']:8.1f} "
                    f"{r['flash_bwd']:6.1f} {r['cudnn_bwd']:6.1f} "
                    f"{r['cuda_bwd'] / r['flash_bwd']:5.2f} {r['cuda_bwd'] / r['cudnn_bwd']:5.2f}"
                )
                errors = {key: val for key, val in r.items() if key.endswith("_error")}
                if errors:
                    log(f"     errors: {errors}")
    (out / "bench.json").write_text(json.dumps(rows, indent=1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu_check_out"))
    parser.add_argument("--skip-correctness", action="store_true")
    parser.add_argument("--skip-bench", action="store_true")
    parser.add_argument("--quick-bench", action="store_true")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        log(f"FLASHPROP_CUDA_FLAGS={os.environ.get('FLASHPROP_CUDA_FLAGS', '')!r}")
        log(
            f"torch {torch.__version__}, cuda {torch.version.cuda}, "
            f"device {torch.cuda.get_device_name() if torch.cuda.is_available() else None}"
        )
        os.environ.setdefault("TORCH_EXTENSIONS_DIR", tempfile.mkdtemp(prefix="flashprop_ext_"))
        os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 4))
        from flashprop.kernels import cuda_attention

        t0 = time.perf_counter()
        reason = cuda_attention.unavailable_reason()
        log(
            f"build: {time.perf_counter() - t0:.1f} s into {os.environ['TORCH_EXTENSIONS_DIR']}"
            f" -> {reason or 'ok'}"
        )
        if reason is not None:
            FAILURES.append(f"unavailable: {reason}")
            return 1
        if not args.skip_correctness:
            run_correctness(out)
            run_determinism_and_opcheck()
        if not args.skip_bench:
            run_bench(out, args.quick_bench)
    finally:
        log(f"\n== {len(FAILURES)} failure(s): {FAILURES}")
        (out / "log.txt").write_text("\n".join(LOG) + "\n")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
