"""One-call GPU check of the ``cuda`` kernel: build, correctness on fixed cases, opcheck,
benchmark against SDPA.

Run from the repository root on a CUDA (sm_90a) machine:

    PYTHONUNBUFFERED=1 python ci/cuda_check.py --out DIR [--skip-correctness]
        [--skip-bench] [--quick-bench] [--bench-dtypes bf16]

A tuning variant is checked the same way with extra nvcc flags, e.g.
``FLASHPROP_CUDA_FLAGS=-DFLASHPROP_FWD128_BLOCK_N=32`` (each process builds into a fresh directory).

1. Builds the extension into a fresh directory and reports the build time.
2. The cases (below) as ``ci/fixed_cases.py`` judges them, with its determinism check: Nq != Nk
   both ways, N = 1, lengths that are not tile multiples, causal with Nq > Nk (empty rows),
   GQA/MQA, head dims 8..256, fp16/bf16, explicit scales, inputs in NaN-filled memory, sliced
   (NaN neighbours, a base not 16-byte aligned), transposed or with a head-dim stride of 2 (the
   kernel copies those).
3. ``torch.library.opcheck`` on both custom ops.
4. The benchmark of ``ci/fixed_cases.py`` (bf16 unless ``--bench-dtypes`` says otherwise).

Results in DIR (default ``$OUT`` or ``./gpu_check_out``); exit status 1 if any check failed.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fixed_cases import Log, finish, parse_args, run_benchmarks, run_checks, run_correctness
from flashprop.contract.problem import DTYPES_BY_NAME, Problem
from flashprop.harness.campaign import usable_cores

KERNEL = "cuda"


def case(b: int, hq: int, hkv: int, nq: int, nk: int, d: int, causal: bool, dtype: str,
         layout: str = "contiguous", scale: float | None = None) -> Problem:
    """A case (D = Dv): shapes, causality, dtype (``float16`` ...), the inputs' layout, the scale
    (None: 1/sqrt(D))."""
    return Problem(b=b, hq=hq, hkv=hkv, nq=nq, nk=nk, d=d, dv=d, causal=causal,
                   dtype=DTYPES_BY_NAME[dtype], layout=layout, scale=scale, device="cuda")


CASES = [
    case(1, 1, 1, 1, 1, 64, False, "bfloat16"),
    case(1, 1, 1, 1, 1, 64, True, "float16"),
    case(2, 4, 4, 128, 128, 64, False, "bfloat16"),
    case(2, 4, 4, 128, 128, 64, True, "float16", "sliced"),
    case(1, 2, 2, 100, 37, 128, True, "bfloat16"),  # Nq > Nk: empty rows
    case(1, 2, 2, 100, 37, 128, False, "float16", "transposed"),
    case(1, 2, 2, 37, 300, 128, True, "bfloat16", "sliced"),  # Nq < Nk
    case(1, 2, 2, 1, 300, 128, True, "bfloat16"),
    case(1, 2, 2, 300, 1, 128, True, "float16"),
    case(2, 8, 2, 257, 129, 64, False, "bfloat16", "transposed", 0.3),  # GQA 4
    case(2, 8, 2, 257, 129, 64, True, "bfloat16"),
    case(1, 4, 1, 65, 200, 128, True, "float16", "strided"),  # MQA
    case(1, 2, 2, 333, 333, 256, True, "bfloat16", "sliced"),
    case(1, 2, 1, 190, 70, 256, False, "float16", scale=0.05),
    case(1, 2, 2, 77, 150, 8, True, "bfloat16"),
    case(1, 2, 2, 77, 150, 40, False, "float16", "sliced"),
    case(1, 2, 2, 150, 77, 96, True, "bfloat16", "transposed"),
    case(1, 2, 2, 129, 131, 136, True, "float16"),
    case(1, 2, 2, 129, 131, 200, False, "bfloat16"),
    case(1, 3, 3, 513, 1000, 128, True, "bfloat16"),
    case(1, 3, 3, 1000, 513, 128, True, "bfloat16"),
    case(2, 4, 4, 1024, 1024, 64, True, "bfloat16"),
    case(2, 4, 4, 1024, 1024, 128, False, "float16"),
    case(1, 2, 2, 2048, 2048, 128, True, "bfloat16", "sliced", 1.0),
]


def build(log: Log) -> bool:
    """Build the extension into a fresh directory (unless TORCH_EXTENSIONS_DIR names one)."""
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", tempfile.mkdtemp(prefix="flashprop_ext_"))
    os.environ.setdefault("MAX_JOBS", str(usable_cores()))  # affinity capped by the cgroup quota
    from flashprop.kernels import cuda_attention

    start = time.perf_counter()
    reason = cuda_attention.unavailable_reason()
    where = os.environ["TORCH_EXTENSIONS_DIR"]
    log.verdict(f"build: {time.perf_counter() - start:.1f} s into {where}", reason is None, reason or "")
    return reason is None


def opcheck() -> list[tuple[str, bool]]:
    """``torch.library.opcheck`` of the forward and backward ops, causal and not (GQA, fp16)."""
    results = []
    for causal in (False, True):
        p = Problem(b=1, hq=4, hkv=2, nq=130, nk=77, d=64, dv=64, causal=causal, dtype=torch.float16,
                    device="cuda")
        q, k, v = p.inputs(requires_grad=True)
        torch.library.opcheck(torch.ops.flashprop.cuda_attn_fwd.default, (q, k, v, causal, 0.125))
        o, lse = torch.ops.flashprop.cuda_attn_fwd(q, k, v, causal, 0.125)
        args = (torch.randn_like(o), q.detach(), k.detach(), v.detach(), o.detach(), lse.detach(),
                torch.randn_like(lse), causal, 0.125)
        torch.library.opcheck(torch.ops.flashprop.cuda_attn_bwd.default, args)
        results.append((f"opcheck fwd+bwd causal={causal}", True))
    return results


def main() -> int:
    args = parse_args(__doc__.split("\n\n")[0], bench_dtypes="bf16")
    args.out.mkdir(parents=True, exist_ok=True)
    log = Log()
    log.say(f"FLASHPROP_CUDA_FLAGS={os.environ.get('FLASHPROP_CUDA_FLAGS', '')!r}")
    log.say(f"torch {torch.__version__}, cuda {torch.version.cuda}, "
            f"device {torch.cuda.get_device_name() if torch.cuda.is_available() else None}")
    if build(log):
        if not args.skip_correctness:
            run_correctness(KERNEL, CASES, log, args.out, args.workers or 1)
            run_checks("opcheck", opcheck, log)
        if not args.skip_bench:
            run_benchmarks(KERNEL, args, log)
    return finish(log, args.out)


if __name__ == "__main__":
    sys.exit(main())
