"""Varlen and KV-cache layouts on top of the dense references: each sequence alone, densely.

Varlen (``flash_attn_varlen_func``): packed token-major q (Tq, Hq, D), k (Tk, Hkv, D),
v (Tk, Hkv, Dv); sequence s holds tokens ``cu_seqlens[s]:cu_seqlens[s+1]``, and every convention
(causal and window alignment, ALiBi distance, empty rows) applies to it alone. Outputs are packed:
o (Tq, Hq, Dv), lse (Hq, Tq) (FlashAttention's varlen lse layout).

KV-cache decode (``flash_attn_with_kvcache``): q (B, Nq, Hq, D); the cache is (B, Ncache, Hkv, D),
or paged (num_pages, page_size, Hkv, D) with logical page p of batch element b at physical page
``block_table[b, p]``. Batch element b attends to its first ``cache_seqlens[b]`` keys (the dense
convention with Nk = cache_seqlens[b]). o (B, Nq, Hq, Dv), lse (B, Hq, Nq).

``alibi_slopes`` of shape (B, Hq) give each sequence its row; ``(Hq,)`` slopes and ``sinks`` are
shared; dropout gives varlen sequence s the keep mask of batch element s (:mod:`refimpl.dropout`).
FP8 descales of shape (B, Hkv) give sequence s row s (``()`` and ``(Hkv,)`` are shared); an FP8
cache's ``k_scale``, ``v_scale`` are the descales of the gathered keys and values.
Any dense reference ``fn(q, k, v, **kw)`` with (B, H, N, D) tensors can be lifted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from .dropout import sequence_dropout
from .golden import attention_golden, attention_golden_backward, attention_rounding_bound
from .yardstick import attention_yardstick

Dense = Callable[..., tuple[torch.Tensor, ...]]


def sequence_slices(cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor) -> Iterator[tuple[slice, slice]]:
    """The token ranges ``(q, k)`` of each packed sequence."""
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for s in range(len(cq) - 1):
        yield slice(cq[s], cq[s + 1]), slice(ck[s], ck[s + 1])


def _bhnd(t: torch.Tensor) -> torch.Tensor:
    """Token-major (N, H, D) -> (1, H, N, D)."""
    return t.transpose(0, 1)[None]


#: The keywords whose (B, ...) form gives each sequence (batch element) its own row.
PER_SEQUENCE = ("alibi_slopes", "q_descale", "k_descale", "v_descale")


def sequence_kwargs(kw: dict, s: int) -> dict:
    """The variant keywords of sequence (or batch element) ``s`` alone: its row of (B, Hq) slopes
    and of (B, Hkv) descales."""
    out = dict(kw)
    for name in PER_SEQUENCE:
        t = kw.get(name)
        if t is not None and t.dim() == 2:
            out[name] = t[s]
    return out


def varlen_apply(fn: Dense, q, k, v, cu_seqlens_q, cu_seqlens_k, **kw) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense ``fn`` -> ``(o, lse)`` on each sequence, packed: o (Tq, Hq, Dv), lse (Hq, Tq)."""
    outs, lses = [], []
    for s, (sq, sk) in enumerate(sequence_slices(cu_seqlens_q, cu_seqlens_k)):
        qs, ks = _bhnd(q[sq]), _bhnd(k[sk])
        o, lse = fn(qs, ks, _bhnd(v[sk]), **sequence_dropout(sequence_kwargs(kw, s), s, qs, ks))
        outs.append(o[0].transpose(0, 1))
        lses.append(lse[0])
    if not outs:
        raise ValueError("cu_seqlens describe no sequence")
    return torch.cat(outs, dim=0), torch.cat(lses, dim=1)


def varlen_golden(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None, **kw):
    """Float64 varlen ``(o, lse)``: :func:`refimpl.attention_golden` per sequence."""
    return varlen_apply(attention_golden, q, k, v, cu_seqlens_q, cu_seqlens_k, **kw)


def varlen_yardstick(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None, **kw):
    """Varlen ``(o, lse)`` in the input dtype (differentiable): the yardstick per sequence."""
    return varlen_apply(attention_yardstick, q, k, v, cu_seqlens_q, cu_seqlens_k, **kw)


def varlen_rounding_bound(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None, **kw):
    """Packed :func:`refimpl.golden.attention_rounding_bound` per sequence: (Tq, Hq, Dv), lse."""
    return varlen_apply(attention_rounding_bound, q, k, v, cu_seqlens_q, cu_seqlens_k, **kw)


def varlen_golden_backward(
    q, k, v, do, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None, *, bounds=False,
    forward=None, **kw
) -> tuple[torch.Tensor, ...]:
    """Float64 packed ``(dq, dk, dv)`` (and ``dsinks`` summed over sequences), then with
    ``bounds`` their absolute-value bounds, as :func:`refimpl.attention_golden_backward`.
    ``forward``: the packed golden ``(o, lse)`` of the same call (:func:`varlen_golden`), handed
    to each sequence's backward so that it is not computed again."""
    parts: list[tuple[torch.Tensor, ...]] = []
    for s, (sq, sk) in enumerate(sequence_slices(cu_seqlens_q, cu_seqlens_k)):
        qs, ks = _bhnd(q[sq]), _bhnd(k[sk])
        own = {} if forward is None else {"forward": (_bhnd(forward[0][sq]), forward[1][None, :, sq])}
        g = attention_golden_backward(
            qs, ks, _bhnd(v[sk]), _bhnd(do[sq]), bounds=bounds,
            **sequence_dropout(sequence_kwargs(kw, s), s, qs, ks), **own,
        )
        parts.append(g)
    n = len(parts[0]) // (2 if bounds else 1)
    sinks = kw.get("sinks") is not None
    out = []
    for i in range(len(parts[0])):
        if sinks and i % n == 3:  # dsinks (or its bound): summed over sequences
            out.append(sum(p[i] for p in parts))
        else:
            out.append(torch.cat([p[i][0].transpose(0, 1) for p in parts], dim=0))
    return tuple(out)


def gather_cache(
    cache: torch.Tensor, cache_seqlens: torch.Tensor, block_table: torch.Tensor | None = None
) -> list[torch.Tensor]:
    """Each batch element's keys (or values) as (1, Hkv, L_b, D): its first ``cache_seqlens[b]``
    cache positions, read through ``block_table`` when the cache is paged."""
    out = []
    for b, length in enumerate(cache_seqlens.tolist()):
        if block_table is None:
            seq = cache[b]
        else:
            seq = cache[block_table[b].long()].reshape(-1, *cache.shape[2:])
        out.append(_bhnd(seq[:length]))
    return out


def kvcache_apply(
    fn: Dense, q, k_cache, v_cache, *, cache_seqlens, block_table=None, num_splits=None, **kw
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense ``fn`` -> decode ``(o, lse)``: o (B, Nq, Hq, Dv), lse (B, Hq, Nq). ``num_splits`` is
    how a kernel schedules the work, not what it computes: the references ignore it. An FP8
    cache's ``k_scale``, ``v_scale`` reach ``fn`` as ``k_descale``, ``v_descale``."""
    for name in ("k", "v"):
        if kw.get(f"{name}_scale") is not None:
            kw[f"{name}_descale"] = kw.pop(f"{name}_scale")
        kw.pop(f"{name}_scale", None)
    ks, vs = (
        gather_cache(k_cache, cache_seqlens, block_table),
        gather_cache(v_cache, cache_seqlens, block_table),
    )
    outs, lses = [], []
    for b in range(q.shape[0]):
        o, lse = fn(_bhnd(q[b]), ks[b], vs[b], **sequence_kwargs(kw, b))
        outs.append(o[0].transpose(0, 1))
        lses.append(lse[0])
    return torch.stack(outs), torch.stack(lses)


def kvcache_golden(q, k_cache, v_cache, **kw):
    """Float64 decode ``(o, lse)``: :func:`refimpl.attention_golden` on the gathered cache."""
    return kvcache_apply(attention_golden, q, k_cache, v_cache, **kw)


def kvcache_rounding_bound(q, k_cache, v_cache, **kw):
    """Decode :func:`refimpl.golden.attention_rounding_bound` on the gathered cache: (B, Nq, Hq, Dv), lse."""
    return kvcache_apply(attention_rounding_bound, q, k_cache, v_cache, **kw)


def kvcache_yardstick(q, k_cache, v_cache, **kw):
    """Decode ``(o, lse)`` in the input dtype: the yardstick on the gathered cache."""
    return kvcache_apply(attention_yardstick, q, k_cache, v_cache, **kw)
