"""One-call GPU check of the ``triton`` kernel (kernels/triton_attention.py): correctness on
fixed cases, fp64 gradcheck, benchmark against SDPA.

Run from the repository root on a CUDA machine:

    python ci/triton_check.py --out DIR [--skip-correctness] [--skip-bench]
        [--quick-bench] [--bench-dtypes bf16,fp16] [--workers N]

The cases (below) and their judgement, the determinism check and the benchmark are
``ci/fixed_cases.py``'s: fp16, bf16, fp32 and fp64, GQA/MQA, Nq != Nk both ways, empty rows,
D in {1, 24, 40, 64, 72, 96, 128, 160, 200, 256} with Dv != D, explicit tiles, fixed tiles and
the autotuner's, inputs in NaN-filled or sliced memory. The cases run in ``--workers`` processes
(default 8), so that Triton compiles their kernels in parallel. Then ``torch.autograd.gradcheck``
in fp64, causal and not. Results in DIR (default ``$OUT`` or ``./gpu_check_out``); exit status 1
if any check failed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fixed_cases import Log, finish, parse_args, run_benchmarks, run_checks, run_correctness
from flashprop.contract.problem import DTYPES_BY_NAME, Problem

KERNEL = "triton"
WORKERS = 8


def case(b: int, hq: int, hkv: int, nq: int, nk: int, d: int, dv: int, causal: bool, dtype: str,
         tiles: tuple[int | None, int | None] = (None, None), layout: str = "contiguous") -> Problem:
    """A case: shapes, causality, dtype (``float16`` ...), explicit tiles (None: the kernel's
    choice), the inputs' layout (``sliced``: a view with NaN neighbours)."""
    return Problem(b=b, hq=hq, hkv=hkv, nq=nq, nk=nk, d=d, dv=dv, causal=causal,
                   dtype=DTYPES_BY_NAME[dtype], block_m=tiles[0], block_n=tiles[1], layout=layout,
                   device="cuda")


CASES = [
    case(2, 4, 2, 197, 211, 72, 40, True, "bfloat16", (64, 32)),
    case(2, 4, 2, 197, 211, 72, 40, True, "float16", (64, 32), "sliced"),
    case(2, 4, 2, 197, 211, 72, 40, True, "float32", (32, 32)),
    case(2, 4, 2, 197, 211, 72, 40, True, "float64", (32, 16), "sliced"),
    case(1, 4, 1, 300, 100, 128, 128, True, "bfloat16", layout="sliced"),
    case(1, 2, 2, 1, 1, 1, 1, False, "float16", (16, 16)),
    case(1, 3, 1, 1, 300, 24, 8, True, "bfloat16", (16, 128)),
    case(2, 8, 8, 1000, 1000, 64, 64, True, "bfloat16", layout="sliced"),  # autotuned
    case(2, 8, 8, 1000, 1000, 64, 64, False, "float16"),  # autotuned
    case(1, 2, 1, 129, 257, 200, 200, False, "float16", (32, 64), "sliced"),
    case(1, 2, 1, 129, 257, 256, 256, True, "bfloat16", (128, 32)),
    case(1, 2, 1, 150, 150, 64, 64, True, "float32", layout="sliced"),  # fixed tiles
    case(1, 2, 2, 70, 90, 40, 40, True, "float64"),  # fixed tiles
    case(1, 4, 2, 333, 77, 96, 160, True, "float16", (128, 64), "sliced"),
    case(1, 2, 1, 100, 100, 256, 256, False, "float32", (32, 16)),
    case(1, 2, 1, 100, 100, 256, 256, False, "float64", (16, 16)),
    case(1, 4, 2, 600, 600, 256, 256, True, "bfloat16"),  # autotuned, D > 128
    case(1, 2, 1, 300, 300, 200, 120, True, "float64", layout="sliced"),  # fixed tiles
]


def gradcheck_fp64() -> list[tuple[str, bool]]:
    """``torch.autograd.gradcheck`` of the kernel (o and lse) in fp64, 16 x 16 tiles, GQA."""
    from flashprop.kernels.triton_attention import attention

    p = case(1, 2, 1, 5, 7, 3, 4, False, "float64")
    inputs = p.inputs(requires_grad=True)
    return [
        (f"gradcheck fp64 causal={causal}", torch.autograd.gradcheck(
            lambda q, k, v, causal=causal: attention(q, k, v, causal=causal, block_m=16, block_n=16),
            inputs, raise_exception=False,
        ))
        for causal in (False, True)
    ]


def main() -> int:
    args = parse_args(__doc__.split("\n\n")[0], bench_dtypes="bf16,fp16")
    args.out.mkdir(parents=True, exist_ok=True)
    log = Log()
    log.say(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    if not args.skip_correctness:
        run_correctness(KERNEL, CASES, log, args.out, args.workers or WORKERS)
        run_checks("gradcheck", gradcheck_fp64, log)
    if not args.skip_bench:
        run_benchmarks(KERNEL, args, log)
    return finish(log, args.out)


if __name__ == "__main__":
    sys.exit(main())
