"""Blocked FlashAttention-2, forward and backward, in plain PyTorch: a readable reference kernel.

The loops are the fused kernels' loops, written out. Matmul operands are rounded to the input
dtype (as tensor cores read them) and accumulated in float32 (float64 for float64 inputs).

Forward, for each query tile Q_i (block_m rows), over key tiles K_j, V_j (block_n rows):

    S = scale * Q_i K_j^T            (masked: -inf where not visible; tail keys don't exist)
    m_new = max(m, rowmax(S));  P = exp(S - m_new);  alpha = exp(m - m_new)
    l = alpha * l + rowsum(P);  acc = alpha * acc + P V_j;  m = m_new
    O_i = acc / l,  lse_i = m + log(l)       (empty rows: O = 0, lse = -inf)

Key tiles that are entirely above the causal diagonal are skipped.

Backward (FA2): Delta = rowsum(dO * O); for each key tile, over the query tiles that see it:

    P = exp(S - lse);  dV_j += P^T dO_i;  dP = dO_i V_j^T;  dS = P * (dP - Delta_i)
    dK_j += scale * dS^T Q_i;  dQ_i += scale * dS K_j

GQA: query head h reads kv head h // group; dK and dV are summed over the group.
"""

from __future__ import annotations

import torch

from kernels.capabilities import Capabilities
from refimpl.golden import check_shapes, default_scale
from refimpl.masks import causal_offset

NEG_INF = float("-inf")
TILES = (3, 16, 32, 64, 128)


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _kv_head(h: int, group: int) -> int:
    return h // group


def _key_stop(q_stop: int, nk: int, causal: bool, offset: int) -> int:
    """One past the last key any of the rows ``< q_stop`` sees (tiles beyond are skipped)."""
    return min(nk, q_stop + offset) if causal else nk


def _scores(qi, kj, scale, rows, cols, causal, offset, nk):
    """Masked logits of one tile: -inf above the causal diagonal and beyond the key tail."""
    s = scale * (qi @ kj.transpose(-1, -2))
    visible = cols[None, :] < nk
    if causal:
        visible = visible & (cols[None, :] <= rows[:, None] + offset)
    return s.masked_fill(~visible, NEG_INF)


def _forward(q, k, v, causal, scale, block_m, block_n):
    b, hq, nq, _ = q.shape
    group = hq // k.shape[1]
    nk, dv = k.shape[2], v.shape[3]
    acc_t = _acc_dtype(q.dtype)
    offset = causal_offset(nq, nk)
    o = torch.empty((b, hq, nq, dv), dtype=q.dtype, device=q.device)
    lse = torch.empty((b, hq, nq), dtype=acc_t, device=q.device)
    for h in range(hq):
        kh, vh = k[:, _kv_head(h, group)], v[:, _kv_head(h, group)]
        for q0 in range(0, nq, block_m):
            q1 = min(q0 + block_m, nq)
            rows = torch.arange(q0, q1, device=q.device)
            qi = q[:, h, q0:q1].to(acc_t)
            m = torch.full((b, q1 - q0), NEG_INF, dtype=acc_t, device=q.device)
            l = torch.zeros((b, q1 - q0), dtype=acc_t, device=q.device)  # noqa: E741
            acc = torch.zeros((b, q1 - q0, dv), dtype=acc_t, device=q.device)
            for k0 in range(0, _key_stop(q1, nk, causal, offset), block_n):
                cols = torch.arange(k0, k0 + block_n, device=q.device)
                kj = kh[:, k0 : k0 + block_n].to(acc_t)
                vj = vh[:, k0 : k0 + block_n].to(acc_t)
                s = _scores(qi, kj, scale, rows, cols[: kj.shape[1]], causal, offset, nk)
                m_new = torch.maximum(m, s.amax(-1))
                m_safe = torch.where(m_new == NEG_INF, 0.0, m_new)
                p = torch.exp(s - m_safe[..., None])
                alpha = torch.exp(m - m_safe)
                l = alpha * l + p.sum(-1)  # noqa: E741
                acc = alpha[..., None] * acc + p.to(q.dtype).to(acc_t) @ vj
                m = m_new
            empty = l == 0
            l_safe = torch.where(empty, 1.0, l)
            o[:, h, q0:q1] = torch.where(empty[..., None], 0.0, acc / l_safe[..., None]).to(q.dtype)
            lse[:, h, q0:q1] = torch.where(empty, NEG_INF, m + torch.log(l_safe))
    return o, lse


def _backward(q, k, v, o, lse, do, causal, scale, block_m, block_n):
    _, hq, nq, _ = q.shape
    group = hq // k.shape[1]
    nk = k.shape[2]
    acc_t = _acc_dtype(q.dtype)
    offset = causal_offset(nq, nk)
    delta = (do.to(acc_t) * o.to(acc_t)).sum(-1)
    lse_safe = torch.where(lse == NEG_INF, 0.0, lse)
    dq = torch.zeros(q.shape, dtype=acc_t, device=q.device)
    dk = torch.zeros(k.shape, dtype=acc_t, device=q.device)
    dv = torch.zeros(v.shape, dtype=acc_t, device=q.device)
    for h in range(hq):
        hk = _kv_head(h, group)
        for k0 in range(0, nk, block_n):
            k1 = min(k0 + block_n, nk)
            cols = torch.arange(k0, k1, device=q.device)
            kj, vj = k[:, hk, k0:k1].to(acc_t), v[:, hk, k0:k1].to(acc_t)
            first_q = max(0, k0 - offset) if causal else 0
            for q0 in range((first_q // block_m) * block_m, nq, block_m):
                q1 = min(q0 + block_m, nq)
                rows = torch.arange(q0, q1, device=q.device)
                qi, doi = q[:, h, q0:q1].to(acc_t), do[:, h, q0:q1].to(acc_t)
                s = _scores(qi, kj, scale, rows, cols, causal, offset, nk)
                p = torch.exp(s - lse_safe[:, h, q0:q1, None])
                dv[:, hk, k0:k1] += p.to(q.dtype).to(acc_t).transpose(-1, -2) @ doi
                dp = doi @ vj.transpose(-1, -2)
                ds = p * (dp - delta[:, h, q0:q1, None])
                ds_lp = ds.to(q.dtype).to(acc_t)
                dk[:, hk, k0:k1] += scale * (ds_lp.transpose(-1, -2) @ qi)
                dq[:, h, q0:q1] += scale * (ds_lp @ kj)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class _BlockedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale, block_m, block_n):
        o, lse = _forward(q, k, v, causal, scale, block_m, block_n)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.args = (causal, scale, block_m, block_n)
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do, _dlse):
        q, k, v, o, lse = ctx.saved_tensors
        causal, scale, block_m, block_n = ctx.args
        dq, dk, dv = _backward(q, k, v, o, lse, do, causal, scale, block_m, block_n)
        return dq, dk, dv, None, None, None, None


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Blocked FlashAttention-2 ``(o, lse)`` with bottom-right causal alignment; any tile sizes."""
    check_shapes(q, k, v)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if q.dtype not in attention.capabilities.dtypes:
        raise TypeError(f"dtype {q.dtype} is not supported")
    if not (q.device == k.device == v.device):
        raise ValueError("q, k, v are on different devices")
    block_m = 64 if block_m is None else block_m
    block_n = 64 if block_n is None else block_n
    if block_m < 1 or block_n < 1:
        raise ValueError(f"tile sizes must be positive, got block_m={block_m}, block_n={block_n}")
    scale = default_scale(q.shape[-1], scale)
    return _BlockedAttention.apply(q, k, v, causal, scale, block_m, block_n)


attention.capabilities = Capabilities(block_m=TILES, block_n=TILES)
