"""References at long sequence lengths: the float64 golden on the device, the yardstick by rows.

At N = 128k the references of :mod:`harness.check` do not fit: the golden streams over key
chunks (O(B Hq Nq chunk) memory, :mod:`refimpl.golden`) but the yardstick
(:mod:`refimpl.yardstick`) materialises every score, 32 GiB a head in fp16. Each query row's
softmax depends on that row and the keys only, so the yardstick's o, lse and dQ of a block of
rows are those of the block run alone against the keys it sees (:func:`row_segments`); the
long-sequence property computes them block by block, at most ``max_scores`` scores at a time.
dK and dV sum over every row: they are the plain yardstick's only when one block holds every
row, and are compared only then.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch

from ..contract.masks import causal_offset
from ..refimpl import attention_golden, attention_golden_backward, attention_yardstick
from .check import Outputs, yardstick_precision
from .tolerance import Comparison, Conditioning, compare

#: Largest (B, Hq, Nq, chunk) float64 block the golden makes at once: 2 GiB.
GOLDEN_BLOCK_ELEMENTS = 2**28


@dataclass(frozen=True)
class Segment:
    """Rows ``r0..r1-1`` of a problem are the rows of ``(q[r0:r1], k[:keys], v[:keys])`` with
    bottom-right ``causal`` (``keys == 0``: rows that see no key: o = 0, lse = -inf)."""

    r0: int
    r1: int
    keys: int
    causal: bool


def row_segments(nq: int, nk: int, causal: bool, alignment: str, a: int, b: int) -> list[Segment]:
    """Rows ``a..b-1`` of an (Nq, Nk) problem as sub-problems of their own. Query i sees keys
    ``j <= i + c`` (``c = causal_offset``) when causal: rows with ``i + c < 0`` see none, rows
    with ``i + c >= Nk - 1`` see every key (no mask), and rows in between see the first
    ``r1 + c`` keys of the rows ``r0..r1-1`` under the bottom-right mask (whose offset is then
    ``r0 + c``)."""
    if not causal:
        return [Segment(a, b, nk, False)]
    c = causal_offset(nq, nk, alignment)
    first_seen, first_full = -c, nk - 1 - c  # the first row that sees a key, sees every key
    out = []
    for r0, r1, kind in ((a, min(b, first_seen), "none"),
                         (max(a, first_seen), min(b, first_full), "some"),
                         (max(a, first_full), b, "all")):
        if r0 < r1:
            keys = {"none": 0, "some": r1 + c, "all": nk}[kind]
            out.append(Segment(r0, r1, keys, kind == "some"))
    return out


def yardstick_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor | None, *,
                   causal: bool, scale: float | None, alignment: str, tf32: bool,
                   max_scores: int) -> Outputs:
    """The yardstick's o, lse and (with ``do``) dq, computed in blocks of query rows of at most
    ``max_scores`` scores; dk and dv too when one block holds every row (else ``None``)."""
    b, hq, nq, _ = q.shape
    nk = k.shape[2]
    block = max(1, max_scores // max(1, b * hq * nk))
    if block >= nq:
        qg, kg, vg = (t.detach().requires_grad_(do is not None) for t in (q, k, v))
        with yardstick_precision(tf32, q), torch.set_grad_enabled(do is not None):
            o, lse = attention_yardstick(qg, kg, vg, causal=causal, scale=scale, alignment=alignment)
            grads = torch.autograd.grad(o, (qg, kg, vg), do) if do is not None else (None,) * 3
        return Outputs(o.detach(), lse.detach(), *grads)
    o = torch.zeros((*q.shape[:3], v.shape[-1]), dtype=q.dtype, device=q.device)
    lse = torch.full(q.shape[:3], float("-inf"), dtype=q.dtype, device=q.device)
    dq = torch.zeros_like(q) if do is not None else None
    for a in range(0, nq, block):
        for seg in row_segments(nq, nk, causal, alignment, a, min(nq, a + block)):
            if seg.keys == 0:
                continue
            rows = slice(seg.r0, seg.r1)
            qs = q[:, :, rows].detach().requires_grad_(do is not None)
            kv = (k[:, :, : seg.keys].detach(), v[:, :, : seg.keys].detach())
            with yardstick_precision(tf32, q), torch.set_grad_enabled(do is not None):
                os_, ls = attention_yardstick(qs, *kv, causal=seg.causal, scale=scale)
                if do is not None:
                    dq[:, :, rows] = torch.autograd.grad(os_, qs, do[:, :, rows])[0]
            o[:, :, rows], lse[:, :, rows] = os_.detach(), ls.detach()
    return Outputs(o, lse, dq)


def golden_chunk(b: int, hq: int, nq: int) -> int:
    """The golden's key chunk: 1024, halved until a (B, Hq, Nq, chunk) float64 block has at most
    :data:`GOLDEN_BLOCK_ELEMENTS` elements (down to 64)."""
    chunk = 1024
    while chunk > 64 and b * hq * nq * chunk > GOLDEN_BLOCK_ELEMENTS:
        chunk //= 2
    return chunk


@contextlib.contextmanager
def peak_bytes(device: torch.device, found: list[int]):
    """Append to ``found`` the most memory allocated on a CUDA ``device`` during the block, above
    what was allocated before it (nothing on the CPU)."""
    if device.type != "cuda":
        yield
        return
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    yield
    torch.cuda.synchronize(device)
    found.append(torch.cuda.max_memory_allocated(device) - before)


def golden_on_device(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor | None, *,
                     causal: bool, scale: float | None, alignment: str,
                     chunk: int) -> tuple[Outputs, int | None]:
    """Float64 golden o, lse and (with ``do``) gradients and their bounds, on the inputs' device;
    also the most memory it held at once (bytes, ``None`` on the CPU)."""
    kw = dict(causal=causal, scale=scale, alignment=alignment, chunk=chunk)
    q, k, v = (t.detach() for t in (q, k, v))
    peaks: list[int] = []
    with peak_bytes(q.device, peaks):
        golden = Outputs(*attention_golden(q, k, v, **kw))
        effective = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
        golden.conditioning = Conditioning.of(q, k, v, effective, chunk)
    if do is not None:
        with peak_bytes(q.device, peaks):
            found = attention_golden_backward(q, k, v, do, bounds=True, forward=(golden.o, golden.lse), **kw)
        golden.dq, golden.dk, golden.dv = found[:3]
        golden.bounds = {n: float(t.abs().max()) if t.numel() else 0.0
                         for n, t in zip(("dq", "dk", "dv"), found[3:], strict=True)}
    return golden, (max(peaks) if peaks else None)


def judge_long(out: Outputs, golden: Outputs, yard: Outputs, dtype: torch.dtype,
               names: tuple[str, ...]) -> list[Comparison]:
    """The tolerance model on each named tensor the yardstick has (as
    :func:`harness.check.judge`: gradients' floors from the golden's bounds, the logit-size
    and values terms from the golden's conditioning)."""
    cond = golden.conditioning
    logit_size = cond.logit_size(golden.lse)
    results = []
    for name in names:
        actual, reference = getattr(out, name), getattr(yard, name)
        if reference is None or (name == "lse" and actual is None):
            continue
        if actual is None:
            results.append(Comparison.outright(name, "no gradient returned"))
            continue
        magnitude = golden.bounds.get(name) if golden.bounds else None
        results.append(compare(name, actual, getattr(golden, name), reference, dtype, magnitude,
                               logit_size, cond.values_for(name)))
    return results
