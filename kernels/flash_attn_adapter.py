"""Adapter for the ``flash-attn`` package (FlashAttention-2) when installed.

flash-attn's three entry points are the model of flashprop's variant contract (docs/variants.md),
so they map one to one: ``flash_attn_func`` (dense; it takes (B, N, H, D), the adapter passes
transposed views), ``flash_attn_varlen_func`` (``attention.varlen``) and
``flash_attn_with_kvcache`` (``attention.kvcache``), with ``window_size``, ``softcap`` and
``alibi_slopes``. Causal masks are bottom-right aligned (>= 2.1); the lse comes with
``return_attn_probs=True`` (``return_softmax_lse=True`` for decode). flash-attn has no attention
sinks, and its paged cache takes page sizes that are multiples of 256.
"""

from __future__ import annotations

import torch
from flashprop.contract.capabilities import ALIBI_SHAPES, Capabilities, KVCache
from flashprop.contract.entry_points import Keywords, entry_point
from flashprop.contract.validate import check_dense

try:
    from flash_attn import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache
except ImportError:
    flash_attn_func = flash_attn_varlen_func = flash_attn_with_kvcache = None


def unavailable_reason() -> str | None:
    if flash_attn_func is None:
        return "the flash-attn package is not installed"
    if not torch.cuda.is_available():
        return "flash-attn needs a CUDA device (torch sees none)"
    return None


#: The keywords of the three entry points (``contract/entry_points.py``): flash-attn's own.
_KEYWORDS = ("causal", "scale", "window_size", "softcap", "alibi_slopes")


def _variants(kw: Keywords) -> dict:
    """The call's keywords as flash-attn takes them."""
    window = (-1, -1) if kw.window_size is None else tuple(kw.window_size)
    return dict(softmax_scale=kw.scale, causal=kw.causal, window_size=window, softcap=kw.softcap,
                alibi_slopes=kw.alibi_slopes)


@entry_point("dense", _KEYWORDS)
def attention(q, k, v, kw: Keywords):
    """flash-attn ``(o, lse)`` on (B, H, N, D) views (``contract.validate.check_dense``)."""
    check_dense(q, k, v)
    o, lse, _ = flash_attn_func(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), return_attn_probs=True, **_variants(kw)
    )
    return o.transpose(1, 2), lse


@entry_point("varlen", _KEYWORDS)
def varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, kw: Keywords):
    """``flash_attn_varlen_func``: packed (T, H, D) -> ``(o, lse (Hq, Tq))``."""
    o, lse, _ = flash_attn_varlen_func(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, return_attn_probs=True,
        **_variants(kw),
    )
    return o, lse


@entry_point("kvcache", (*_KEYWORDS, "cache_seqlens", "block_table", "num_splits"))
def kvcache(q, k_cache, v_cache, kw: Keywords):
    """``flash_attn_with_kvcache`` (no appended keys): ``(o (B, Nq, Hq, Dv), lse (B, Hq, Nq))``."""
    return flash_attn_with_kvcache(
        q, k_cache, v_cache, cache_seqlens=kw.cache_seqlens, block_table=kw.block_table,
        num_splits=kw.num_splits, return_softmax_lse=True, **_variants(kw),
    )


attention.varlen = varlen
attention.kvcache = kvcache
attention.capabilities = Capabilities(
    dtypes=frozenset({torch.float16, torch.bfloat16}),
    head_dims=range(8, 257, 8),
    dv_equals_d=True,
    deterministic_backward=False,
    devices=frozenset({"cuda"}),
    window=True,
    softcap=True,
    alibi=ALIBI_SHAPES,
    varlen=True,
    kvcache=KVCache(contiguous=True, page_sizes=(256, 512), max_splits=128, max_queries=64),
    variant_backward=frozenset({"window", "softcap", "alibi", "varlen"}),
)
