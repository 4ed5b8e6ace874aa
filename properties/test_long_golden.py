"""Long sequences against the float64 golden: N from 8k to 128k on a GPU, 1k to 2k on the CPU.

Causal or not, Nq != Nk, GQA, head dims 64 and 128, the kernel's default tiles; the far end of
the range (N = 128k on a GPU, 2k on the CPU) always runs first (:func:`far_end`). The golden runs
on the device and streams over key chunks (:mod:`harness.long_references`: its chunk shrinks
so that a float64 (B, Hq, Nq, chunk) block stays within 2 GiB); on a GPU the most memory it
holds at once is measured and must stay far below the N x N score matrix it never builds
(checked where Nk is at least 32 chunks, where that matrix is 32 times a chunk block). The
yardstick is computed in blocks of query rows; o, lse and dq are judged at every N, dk and dv
where one block of the yardstick holds every row (up to B Hq Nq Nk = 2^31 scores on a GPU).

Every example is reported: N, the kernel's error and the yardstick's per tensor, their ratio,
and the golden's peak memory; on the terminal, and appended as JSON lines to the file named by
``FLASHPROP_SCALE_REPORT`` (how the kernel's error grows with N next to the yardstick's).
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from flashprop.contract.capabilities import Capabilities
from flashprop.contract.problem import DTYPE_NAMES, Problem
from flashprop.contract.registry import Kernel
from flashprop.harness.check import PropertyFailure, failure, run_kernel, run_property
from flashprop.harness.long_references import golden_chunk, golden_on_device, judge_long, yardstick_rows
from flashprop.harness.run_context import RunContext
from flashprop.harness.scale_problems import exclusive_device
from flashprop.harness.strategies import Sizes, problems
from flashprop.harness.symptoms import Symptom

PROP = "long-golden"
HEAD_DIMS = (64, 128)
#: Sequence lengths (both ends in), largest score count B*Hq*Nq*Nk*D of a problem, and scores
#: per yardstick block, per device.
LONG = {
    "cuda": dict(n=(8192, 131072), work=2**42, scores=2**31),
    "cpu": dict(n=(1024, 2048), work=2**29, scores=2**26),
}
#: The golden's peak memory is checked against the N x N matrix where Nk >= this many chunks.
CHUNKS_FOR_MEMORY_CHECK = 32
#: Rows of the growth report, appended as each example passes or fails.
GROWTH: list[dict] = []


def _report(row: dict) -> None:
    GROWTH.append(row)
    path = os.environ.get("FLASHPROP_SCALE_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")


def _growth_lines(kernel: str) -> list[str]:
    rows = [r for r in GROWTH if r["kernel"] == kernel]
    lines = [f"{PROP} {kernel}: N (Nq/Nk), dtype, causal, Hq/Hkv: per tensor kernel error / "
             "yardstick error = ratio; golden peak"]
    for r in sorted(rows, key=lambda r: r["n"]):
        errs = ", ".join(f"{t['name']} {t['error']:.2e}/{t['yardstick']:.2e}={t['ratio']}"
                         for t in r["tensors"])
        peak = "-" if r["golden_peak_gib"] is None else f"{r['golden_peak_gib']:.2f} GiB"
        lines.append(f"  N={r['n']} ({r['nq']}/{r['nk']}) {r['dtype']} causal={r['causal']} "
                     f"{r['hq']}/{r['hkv']}: {errs}; golden peak {peak} ({r['verdict']})")
    return lines


def judge_example(kernel: Kernel, p: Problem, max_scores: int) -> PropertyFailure | None:
    """Run the kernel on ``p``, judge it against the golden on the device and the yardstick by
    rows, report the example (:data:`GROWTH`); returns its failure, ``None`` when it passed (the
    tensors are gone when it returns: a failure kept by Hypothesis holds no device memory)."""
    caps = kernel.capabilities
    backward = caps.backward_reason(p) is None
    names = ("o", "lse", "dq", "dk", "dv") if backward else ("o", "lse")
    inputs = p.kernel_inputs(requires_grad=backward)
    do = p.grad_output() if backward else None
    try:
        out = run_kernel(kernel, p, PROP, backward=backward, inputs=inputs, grad_output=do)
    except PropertyFailure as err:
        return err
    q, k, v = inputs.args
    alignment = caps.causal_alignment
    chunk = golden_chunk(p.b, p.hq, p.nq)
    golden, peak = golden_on_device(q, k, v, do, causal=p.causal, scale=p.scale, alignment=alignment,
                                    chunk=chunk)
    yard = yardstick_rows(q, k, v, do, causal=p.causal, scale=p.scale, alignment=alignment,
                          tf32=caps.fp32_matmul == "tf32", max_scores=max_scores)
    results = judge_long(out, golden, yard, p.dtype, names)
    details = [r.describe() for r in results]
    if yard.dk is None and backward:
        details.append(f"dk, dv not judged: the yardstick needs {p.b * p.hq * p.nq * p.nk} scores, "
                       f"more than one block of {max_scores}")
    matrix = p.b * p.hq * p.nq * p.nk * 8
    memory_ok = peak is None or p.nk < CHUNKS_FOR_MEMORY_CHECK * chunk or peak < matrix
    if not memory_ok:
        details.append(f"the golden held {peak / 2**30:.2f} GiB at once, as much as the "
                       f"{matrix / 2**30:.2f} GiB N x N float64 score matrix it must never build "
                       f"(chunk {chunk})")
    ok = all(r.ok for r in results) and memory_ok
    _report({
        "kernel": kernel.name, "n": max(p.nq, p.nk), "nq": p.nq, "nk": p.nk,
        "dtype": DTYPE_NAMES[p.dtype], "causal": p.causal, "hq": p.hq, "hkv": p.hkv, "d": p.d,
        "tensors": [{"name": r.name, "error": r.error, "yardstick": r.yardstick_error,
                     "ratio": f"{r.error / r.yardstick_error:.3g}" if r.yardstick_error else "-"}
                    for r in results],
        "golden_peak_gib": None if peak is None else peak / 2**30, "golden_chunk": chunk,
        "verdict": "passed" if ok else "failed",
    })
    return None if ok else PropertyFailure(failure(kernel, p, PROP, details, backward=backward,
                                                   symptom=Symptom.of(results)))


#: The dtype the far-end problems take, the first one the kernel declares (float32 first on the
#: CPU: the CPU's 16-bit matmuls are slow).
FAR_END_DTYPES = {"cuda": (torch.bfloat16, torch.float16, torch.float32),
                  "cpu": (torch.float32, torch.float16, torch.bfloat16)}


def far_end(caps: Capabilities, device: str) -> list[Problem]:
    """The far end of the device's range, run before the drawn problems (which start, as every
    Hypothesis run does, at the simplest one: Nq = Nk = the shortest N): Nq = Nk = the longest
    N with a GQA group of 2, and Nq about a quarter of Nk with four query heads on one kv head
    (neither a multiple of a tile: the bottom-right diagonal lies off the tile grid); causal,
    the larger head dim whose work fits the device's budget. Where ``caps`` does not declare
    one, the first it declares of: without GQA, not causal, neither."""
    limits = LONG[device]
    hi = limits["n"][1]
    dtype = next((t for t in FAR_END_DTYPES[device] if t in caps.dtypes), None)
    ladder = []
    for nq, nk, group in ((hi, hi, 2), (hi // 4 + 1, hi - 3, 4)):
        for causal, hq in ((True, group), (True, 1), (False, group), (False, 1)):
            dims = [d for d in HEAD_DIMS if d in caps.head_dims and hq * nq * nk * d <= limits["work"]]
            if dtype is None or not dims:
                continue
            p = Problem(b=1, hq=hq, hkv=1, nq=nq, nk=nk, d=max(dims), dv=max(dims), dtype=dtype,
                        causal=causal, device=device, seed=len(ladder) + 1)
            if caps.unsupported_reason(p) is None:
                ladder.append(p)
                break
    return ladder


def test_long_sequences_golden(run: RunContext, kernel: Kernel, device: str, capsys: pytest.CaptureFixture):
    """o, lse, dq (and dk, dv where the yardstick fits whole) agree with the float64 golden
    within the tolerance model for Nq, Nk drawn from the device's long range."""
    caps = kernel.capabilities
    limits = LONG[device]
    lo, hi = limits["n"]
    if caps.max_seqlen is not None and caps.max_seqlen < lo:
        pytest.skip(f"kernel {kernel.name} declares sequences up to {caps.max_seqlen} < {lo}")
    if not any(d in caps.head_dims for d in HEAD_DIMS):
        pytest.skip(f"kernel {kernel.name} declares none of the head dims {HEAD_DIMS}")
    if device == "cpu" and os.environ.get("TRITON_INTERPRET") == "1" and "triton" in kernel.name:
        pytest.skip("the Triton interpreter runs one program at a time: N = 1025, one head, "
                    "forward and backward took 35 s on the CPU, N = 2k takes minutes (test_long "
                    "covers N up to 260 there)")
    sizes = Sizes(max_n=hi, max_batch=1, max_kv_heads=2, max_group=4, max_head_dim=128,
                  max_work=limits["work"])

    def check(kernel: Kernel, p: Problem) -> None:
        try:
            with exclusive_device(p.device):  # tens of GiB: one such example per GPU at a time
                found = judge_example(kernel, p, limits["scores"])
        except torch.cuda.OutOfMemoryError as err:
            pytest.skip(f"{PROP}: out of device memory at {p.describe()}: {str(err).splitlines()[0]}; "
                        "the examples before it ran")
        if found is not None:
            raise found

    strategy = problems(caps, device=device, sizes=sizes, min_n=lo, head_dims=HEAD_DIMS,
                        default_tiles=True, layouts=("contiguous", "transposed"))
    try:
        # few examples: each is a float64 attention at up to 128k (seconds on the H200)
        run_property(run, kernel, PROP, strategy, check, weight=0.03, explicit=far_end(caps, device))
    finally:
        if any(r["kernel"] == kernel.name for r in GROWTH):
            with capsys.disabled():
                print("\n" + "\n".join(_growth_lines(kernel.name)))
