"""Adapter for the ``flash-attn`` package (``flash_attn.flash_attn_func``) when installed.

flash-attn takes (B, N, H, D) tensors and aligns causal masks bottom-right (>= 2.1). With
``return_attn_probs=True`` it also returns the softmax lse.
"""

from __future__ import annotations

import torch

from kernels.capabilities import Capabilities

try:
    from flash_attn import flash_attn_func
except ImportError:
    flash_attn_func = None


def unavailable_reason() -> str | None:
    if flash_attn_func is None:
        return "the flash-attn package is not installed"
    if not torch.cuda.is_available():
        return "flash-attn needs a CUDA device (torch sees none)"
    return None


def attention(q, k, v, *, causal: bool = False, scale: float | None = None):
    """flash-attn ``(o, lse)`` on (B, H, N, D) views."""
    o, lse, _ = flash_attn_func(
        q.transpose(1, 2),
        k.transpose(1, 2),
        v.transpose(1, 2),
        softmax_scale=scale,
        causal=causal,
        return_attn_probs=True,
    )
    return o.transpose(1, 2), lse


attention.capabilities = Capabilities(
    dtypes=frozenset({torch.float16, torch.bfloat16}),
    head_dims=range(8, 257, 8),
    dv_equals_d=True,
    deterministic_backward=False,
    devices=frozenset({"cuda"}),
)
