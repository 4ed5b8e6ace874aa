"""Float64 golden attention: the exact semantics every kernel is judged by.

    S = scale * Q K^T,  masked S_ij = -inf where key j is not visible to query i
    lse_i = log sum_j exp(S_ij),  O_i = sum_j exp(S_ij - lse_i) V_j

with GQA (query head h reads kv head h // (Hq // Hkv)), empty rows giving ``O = 0`` and
``lse = -inf``. The forward streams over key chunks with the online-softmax merge, and the
backward streams over key chunks with the saved lse, so memory is O(N * chunk), never O(N^2):

    P = exp(S - lse),  dV = P^T dO,  dP = dO V^T,  Delta_i = sum_d dO_id O_id,
    dS = P * (dP - Delta),  dQ = scale * dS K,  dK = scale * dS^T Q

dK and dV of a kv head are summed over the query heads of its group.

With ``bounds=True`` the backward also returns the same sums taken over absolute values
(``|dO|``, ``|V|``, ``|Q|``, ``|K|``, ``|P (dP - Delta)| <= P (|dO||V|^T + |dO|.|O|)``): the
magnitude that rounding errors scale with, even where the gradient itself cancels to ~0.
"""

from __future__ import annotations

import math

import torch

from refimpl.masks import visible_mask
from refimpl.online_softmax import NEG_INF, SoftmaxState

DEFAULT_CHUNK = 1024


def check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[int, int]:
    """Validate the layout convention; returns (Hq, group size Hq // Hkv)."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"expected 4-d q, k, v (B, H, N, D); got {q.dim()}, {k.dim()}, {v.dim()} dims")
    b, hq, _, d = q.shape
    bk, hkv, nk, dk = k.shape
    if (bk, hkv, nk) != tuple(v.shape[:3]) or b != bk:
        raise ValueError(f"incompatible shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if d != dk:
        raise ValueError(f"q head dim {d} != k head dim {dk}")
    if hkv == 0 or hq % hkv != 0:
        raise ValueError(f"Hq={hq} is not a multiple of Hkv={hkv}")
    return hq, hq // hkv


def _expand_kv(t: torch.Tensor, group: int) -> torch.Tensor:
    return t if group == 1 else t.repeat_interleave(group, dim=1)


def default_scale(d: int, scale: float | None) -> float:
    """The softmax scale: ``1/sqrt(D)`` unless given."""
    return 1.0 / math.sqrt(d) if scale is None else float(scale)


@torch.no_grad()
def attention_golden(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    alignment: str = "bottom-right",
    chunk: int = DEFAULT_CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 ``(o, lse)``: o (B, Hq, Nq, Dv), lse (B, Hq, Nq). Streams over key chunks."""
    _, group = check_shapes(q, k, v)
    scale = default_scale(q.shape[-1], scale)
    state = SoftmaxState.identity(q.shape[:3], v.shape[-1], dtype=torch.float64, device=q.device)
    for _, vc, s in _key_chunks(q.to(torch.float64), k, v, group, scale, causal, alignment, chunk):
        state = state.merge(SoftmaxState.from_scores(s, vc))
    return state.finalize()


def _key_chunks(q64, k, v, group, scale, causal, alignment, chunk):
    """Per key chunk: float64 keys and values (expanded to the query heads) and the masked
    logits ``scale * q k^T`` (-inf where the key is not visible). Memory O(Nq * chunk)."""
    k64, v64 = _expand_kv(k.to(torch.float64), group), _expand_kv(v.to(torch.float64), group)
    nq, nk = q64.shape[2], k.shape[2]
    for start in range(0, nk, chunk):
        stop = min(start + chunk, nk)
        kc, vc = k64[:, :, start:stop], v64[:, :, start:stop]
        s = scale * (q64 @ kc.transpose(-1, -2))
        mask = visible_mask(
            nq, nk, causal=causal, alignment=alignment, k_start=start, k_stop=stop, device=q64.device
        )
        if mask is not None:
            s = s.masked_fill(~mask, NEG_INF)
        yield kc, vc, s


@torch.no_grad()
def attention_golden_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    do: torch.Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    alignment: str = "bottom-right",
    chunk: int = DEFAULT_CHUNK,
    bounds: bool = False,
) -> tuple[torch.Tensor, ...]:
    """Float64 ``(dq, dk, dv)`` for upstream gradient ``do`` of the output ``o``; with
    ``bounds`` also ``(|dq|, |dk|, |dv|)`` bounds computed from absolute values."""
    hq, group = check_shapes(q, k, v)
    scale = default_scale(q.shape[-1], scale)
    o, lse = attention_golden(q, k, v, causal=causal, scale=scale, alignment=alignment, chunk=chunk)
    q64, do64 = q.to(torch.float64), do.to(torch.float64)
    nk = k.shape[2]
    delta = (do64 * o).sum(-1, keepdim=True)
    lse_safe = torch.where(lse == NEG_INF, 0.0, lse)[..., None]
    dq = torch.zeros_like(q64)
    dk_parts, dv_parts = [], []
    abs_do, abs_q = do64.abs(), q64.abs()
    abs_delta = (abs_do * o.abs()).sum(-1, keepdim=True)
    dq_abs = torch.zeros_like(q64)
    dk_abs_parts, dv_abs_parts = [], []
    for kc, vc, s in _key_chunks(q64, k, v, group, scale, causal, alignment, chunk):
        p = torch.exp(s - lse_safe)
        dv_parts.append(p.transpose(-1, -2) @ do64)
        ds = p * (do64 @ vc.transpose(-1, -2) - delta)
        dq += scale * (ds @ kc)
        dk_parts.append(scale * (ds.transpose(-1, -2) @ q64))
        if bounds:
            dv_abs_parts.append(p.transpose(-1, -2) @ abs_do)
            ds_abs = p * (abs_do @ vc.abs().transpose(-1, -2) + abs_delta)
            dq_abs += scale * (ds_abs @ kc.abs())
            dk_abs_parts.append(scale * (ds_abs.transpose(-1, -2) @ abs_q))
    grads = [dq, torch.cat(dk_parts, dim=2), torch.cat(dv_parts, dim=2)]
    if bounds:
        grads += [dq_abs, torch.cat(dk_abs_parts, dim=2), torch.cat(dv_abs_parts, dim=2)]
    if group > 1:  # sum dK, dV (and their bounds) over the query heads of each group
        for i in (1, 2, 4, 5) if bounds else (1, 2):
            grads[i] = grads[i].view(q.shape[0], hq // group, group, nk, -1).sum(2)
    return tuple(grads)
