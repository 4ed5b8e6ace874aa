"""A fused kernel's one-call GPU check on fixed cases: forward and backward against refimpl,
bitwise determinism, kernel-specific checks, then the benchmark grid against SDPA.

The kernels' own scripts run it (``ci/triton_check.py``, ``ci/cuda_check.py``), each with its
cases and its extra checks. Each case is a
:class:`contract.problem.Problem` on the GPU: its ``layout`` puts the inputs in NaN-filled
memory (``contiguous``, ``sliced``) or in other strides (``transposed``, ``strided``), so that a
read out of bounds shows up as NaN. Judged, per case:

* o, lse and the gradients of ``<dO, o> + <dlse, lse>`` for q, k, v (the lse gradient, drawn
  with the problem's seed, is part of both kernels' contract) against refimpl's dense attention
  (:func:`refimpl.attention_yardstick`, differentiable) run in float64, the reference, within
  the suite's tolerance model (:func:`harness.tolerance.compare`) whose scale is the same
  computation in the input dtype, the yardstick. (The golden's backward,
  :func:`refimpl.attention_golden_backward`, takes no lse gradient; in float64 the yardstick is
  a float64 computation like the golden.)
* rows that see no key (causal, Nq > Nk) give o = 0 and dq = 0 exactly;
* a second call gives bitwise the same outputs and gradients.

The benchmark is the benchmark suite's (``benchmarks/bench_attention.py``: B*N = 16k tokens,
H*D = 2048, CUDA events after an L2 flush) of the kernel and the CUDA anchors
(``contract.registry.BENCH_ANCHORS``), in a pytest process of its own: ``DIR/bench.json`` and
``DIR/bench.md`` (TFLOP/s, ratios to the anchors, forward and backward apart).

Results go to stdout and DIR (``--out``, default ``$OUT`` or ``./gpu_check_out``): ``log.txt``,
``correctness.json``, ``bench.json``, ``bench.md``. Exit status 1 if any check failed.
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import os
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from flashprop.contract.masks import visible_mask
from flashprop.contract.problem import Problem
from flashprop.contract.registry import BENCH_ANCHORS, Kernel, load_kernel
from flashprop.harness.tolerance import Conditioning, compare
from flashprop.refimpl import attention_yardstick

ROOT = Path(__file__).resolve().parent.parent  # the checkout (the benchmarks run from it)
NAMES = ("o", "lse", "dq", "dk", "dv")
#: The lse gradient is drawn N(0, DLSE_SCALE^2), from the problem's seed + 3.
DLSE_SCALE = 0.1
#: ``--quick-bench``: two sequence lengths instead of the grid's six.
QUICK_SEQLENS = "2k,8k"

#: A named extra check: returns (label, passed) pairs.
Check = Callable[[], list[tuple[str, bool]]]


@dataclass
class Log:
    """The run's printed lines and failures."""

    lines: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def say(self, message: str) -> None:
        print(message, flush=True)
        self.lines.append(message)

    def verdict(self, label: str, ok: bool, detail: str = "") -> None:
        self.say(f"{'PASS' if ok else 'FAIL'} {label}{' ' + detail if detail else ''}")
        if not ok:
            self.failures.append(label)


def parse_args(description: str, bench_dtypes: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu_check_out")))
    parser.add_argument("--skip-correctness", action="store_true")
    parser.add_argument("--skip-bench", action="store_true")
    parser.add_argument("--quick-bench", action="store_true", help=f"N = {QUICK_SEQLENS} only")
    parser.add_argument("--bench-dtypes", default=bench_dtypes, help=f"default {bench_dtypes}")
    parser.add_argument("--workers", type=int, default=None,
                        help="processes for the correctness cases (compilation in parallel)")
    return parser.parse_args()


def _grads(o, lse, inputs, do, dlse) -> list[torch.Tensor]:
    return list(torch.autograd.grad((o, lse), inputs, (do.to(o.dtype), dlse.to(lse.dtype))))


def _run_kernel(kernel: Kernel, p: Problem, q, k, v, do, dlse) -> dict[str, torch.Tensor]:
    o, lse = kernel(q, k, v, causal=p.causal, scale=p.scale, block_m=p.block_m, block_n=p.block_n)
    return dict(zip(NAMES, [o, lse, *_grads(o, lse, (q, k, v), do, dlse)], strict=True))


def _dense(p: Problem, q, k, v, do, dlse, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """refimpl's dense attention on the kernel's inputs in ``dtype``, with its gradients."""
    q, k, v = (t.detach().to(dtype).requires_grad_() for t in (q, k, v))
    o, lse = attention_yardstick(q, k, v, causal=p.causal, scale=p.scale)
    return dict(zip(NAMES, [o, lse, *_grads(o, lse, (q, k, v), do, dlse)], strict=True))


@functools.cache
def _kernel(name: str) -> Kernel:
    return load_kernel(name)


def check_case(name: str, p: Problem) -> dict:
    """One case of kernel ``name``: errors against the reference, empty rows, determinism."""
    kernel = _kernel(name)
    q, k, v = p.inputs(requires_grad=True)
    do = p.grad_output()
    g = torch.Generator().manual_seed(p.seed + 3)
    lse_shape = (p.b, p.hq, p.nq)
    dlse = (DLSE_SCALE * torch.randn(lse_shape, generator=g, dtype=p.gen_dtype)).to(p.device)
    got = _run_kernel(kernel, p, q, k, v, do, dlse)
    again = _run_kernel(kernel, p, q, k, v, do, dlse)
    visible = visible_mask(p.nq, p.nk, causal=p.causal, device=p.device)
    empty = torch.zeros(p.nq, dtype=torch.bool, device=p.device) if visible is None else ~visible.any(-1)
    # a row that sees no key has lse = -inf and P = 0: its dlse adds nothing to the gradients, and
    # the reference is given 0 there (a logsumexp over no key has no gradient)
    dlse_ref = dlse.masked_fill(empty, 0.0)
    gold = _dense(p, q, k, v, do, dlse_ref, torch.float64)
    yard = _dense(p, q, k, v, do, dlse_ref, p.dtype)
    cond = Conditioning.of(q, k, v, p.effective_scale)
    logit_size = cond.logit_size(gold["lse"].detach())
    result = {"case": p.describe(), "ok": True, "errors": {}, "problems": []}
    for n in NAMES:
        c = compare(n, got[n], gold[n], yard[n], p.dtype, logit_size=logit_size, values=cond.values_for(n))
        result["errors"][n] = {"err": c.error, "yardstick": c.yardstick_error, "budget": c.budget}
        if not c.ok:
            result["ok"] = False
            result["problems"].append(c.describe())
    if bool(got["o"][:, :, empty].any()) or bool(got["dq"][:, :, empty].any()):
        result["ok"] = False
        result["problems"].append("o or dq not exactly 0 on rows that see no key")
    if not all(torch.equal(got[n], again[n]) for n in NAMES):
        result["ok"] = False
        result["problems"].append("a second call differs (not bitwise deterministic)")
    return result


def _check_safely(args: tuple[str, Problem]) -> dict:
    try:
        return check_case(*args)
    except Exception as err:  # a case that raises is a failure of that case; the others run
        return {"case": args[1].describe(), "ok": False, "errors": {}, "problems": [repr(err)]}


def run_correctness(name: str, cases: Iterable[Problem], log: Log, out: Path, workers: int) -> None:
    """Every case of kernel ``name``, in ``workers`` processes (compiling in parallel; ``1``: in
    this one); a line per case and ``correctness.json``."""
    jobs = [(name, p) for p in cases]
    log.say(f"\n== correctness vs refimpl in float64 ({len(jobs)} cases; max|err| [share of the budget])")
    if workers > 1:
        with multiprocessing.get_context("spawn").Pool(workers) as pool:
            results = pool.map(_check_safely, jobs, chunksize=1)
    else:
        results = [_check_safely(job) for job in jobs]
    for r in results:
        e = r["errors"]
        summary = " ".join(f"{n}={e[n]['err']:.2e}[{e[n]['err'] / e[n]['budget']:.2f}]" for n in e)
        log.verdict(r["case"], r["ok"], " ".join([summary, *r["problems"]]))
    (out / "correctness.json").write_text(json.dumps(results, indent=1))


def run_checks(title: str, check: Check, log: Log) -> None:
    """A kernel-specific check (gradcheck, opcheck, ...): a verdict per (label, passed) pair."""
    log.say(f"\n== {title}")
    try:
        for label, ok in check():
            log.verdict(label, ok)
    except Exception as err:  # report it as a failure and go on with the rest of the run
        log.verdict(title, False, repr(err))


def run_benchmarks(name: str, args: argparse.Namespace, log: Log) -> None:
    """The benchmark suite on kernel ``name`` and the CUDA anchors, in its own pytest process."""
    cmd = [
        sys.executable, "-m", "pytest", "benchmarks/bench_attention.py", "-p", "no:cacheprovider",
        "-q", "-rs", "--device", "cuda", "--bench-kernels", name,
        "--bench-anchors", ",".join(BENCH_ANCHORS["cuda"]), "--bench-dtypes", args.bench_dtypes,
        f"--benchmark-json={args.out / 'bench.json'}", "--bench-report", str(args.out),
    ]
    if args.quick_bench:
        cmd += ["--bench-seqlens", QUICK_SEQLENS]
    log.say(f"\n== benchmark: {' '.join(cmd[1:])}")
    rc = subprocess.run(cmd, cwd=ROOT).returncode
    log.verdict(f"benchmark run (exit {rc}; table in {args.out / 'bench.md'})", rc == 0)


def finish(log: Log, out: Path) -> int:
    """Print the failures, write ``log.txt``; the exit status (1 if anything failed)."""
    log.say(f"\n== {len(log.failures)} failure(s): {log.failures}")
    (out / "log.txt").write_text("\n".join(log.lines) + "\n")
    return 1 if log.failures else 0
