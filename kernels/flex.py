"""Adapter for FlexAttention (``torch.nn.attention.flex_attention``), compiled, on CUDA.

Causal masking is a ``mask_mod`` with DESIGN.md's bottom-right alignment
(``kv_idx <= q_idx + Nk - Nq``), so Flex is judged by the same convention as the fused kernels.
It returns the lse (``return_lse=True``; natural log).
"""

from __future__ import annotations

import functools

import torch

from kernels.capabilities import Capabilities, Limit

try:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
except ImportError:  # pragma: no cover - very old torch
    flex_attention = None


def unavailable_reason() -> str | None:
    if flex_attention is None:
        return "torch.nn.attention.flex_attention is not in this torch"
    if not torch.cuda.is_available():
        return "needs a CUDA device for compiled FlexAttention (torch sees none)"
    return None


#: Recompilations allowed per process. The suite draws many shapes, dtypes and head dims; past
#: Dynamo's default limit (8) it would silently run flex_attention *eagerly* (an unfused dense
#: path), so the limit is raised and hitting it raises instead of falling back.
RECOMPILE_LIMIT = 256


@functools.cache
def _compiled():
    import torch._dynamo

    torch._dynamo.config.recompile_limit = RECOMPILE_LIMIT
    torch._dynamo.config.accumulated_recompile_limit = max(
        torch._dynamo.config.accumulated_recompile_limit, RECOMPILE_LIMIT
    )
    torch._dynamo.config.fail_on_recompile_limit_hit = True
    # dynamic=None: automatic dynamic shapes, so a new sequence length does not recompile each time
    return torch.compile(flex_attention, dynamic=None)


@functools.lru_cache(maxsize=64)
def _causal_block_mask(nq: int, nk: int, device: str):
    offset = nk - nq

    def bottom_right(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + offset

    return create_block_mask(bottom_right, None, None, nq, nk, device=device)


def attention(q, k, v, *, causal: bool = False, scale: float | None = None):
    """FlexAttention ``(o, lse)`` with bottom-right causal masking."""
    if q.device.type != "cuda":
        raise NotImplementedError("the flex adapter runs compiled FlexAttention on CUDA only")
    caps = attention.capabilities
    if q.dtype not in caps.dtypes:
        raise TypeError(f"flex adapter does not take {q.dtype}")
    # Inductor's own refusal of other head dims is an InductorError (LoweringException
    # "NYI: embedding dimension ... must be at least 16"), not a clear error: check first.
    if q.shape[-1] not in caps.head_dims or v.shape[-1] not in caps.head_dims:
        raise NotImplementedError(
            f"flex adapter: head dims D={q.shape[-1]}, Dv={v.shape[-1]} not in {sorted(caps.head_dims)}"
        )
    block_mask = _causal_block_mask(q.shape[2], k.shape[2], str(q.device)) if causal else None
    o, lse = _compiled()(
        q, k, v, block_mask=block_mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1], return_lse=True
    )
    return o, lse


#: Found by flashprop on the H200 (torch 2.11.0+cu130): for GQA with a causal block mask under
#: dynamic shapes, Inductor finds no kernel for flex_attention and raises InductorError
#: ("LoweringException: NoValidChoicesError: No choices to select"), e.g.
#: Problem(b=1, hq=8, hkv=2, nq=127, nk=127, d=16, dtype=float16, causal=True) and
#: Problem(b=1, hq=4, hkv=1, nq=127, nk=127, d=64, dtype=float16, causal=True).
GQA_CAUSAL_NO_CHOICES = Limit(
    reason="Inductor has no flex_attention kernel choice for GQA with a causal block mask under "
    "dynamic shapes (InductorError NoValidChoicesError; torch 2.11, H200)",
    applies=lambda p: p.causal and p.hq != p.hkv,
    raises=False,
)

attention.capabilities = Capabilities(
    dtypes=frozenset({torch.float16, torch.bfloat16, torch.float32}),
    head_dims=frozenset({16, 32, 64, 128, 256}),
    devices=frozenset({"cuda"}),
    fp32_matmul="tf32",
    limits=(GQA_CAUSAL_NO_CHOICES,),
)
