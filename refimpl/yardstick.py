"""The low-precision yardstick: attention computed plainly in the input dtype.

This is FlashAttention's ``upcast=False`` reference: the error a straightforward PyTorch
implementation makes on the same problem, in the same dtype. The tolerance model measures a
kernel's error against the golden in units of the yardstick's error. It materialises the
(Nq, Nk) score matrix, so it is for test-sized problems only. Gradients come from autograd
through it, in the input dtype.
"""

from __future__ import annotations

import torch

from refimpl.golden import _expand_kv, check_shapes, default_scale
from refimpl.masks import visible_mask


def attention_yardstick(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    alignment: str = "bottom-right",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(o, lse)`` in the input dtype; differentiable. Empty rows give o = 0, lse = -inf."""
    _, group = check_shapes(q, k, v)
    scale = default_scale(q.shape[-1], scale)
    k, v = _expand_kv(k, group), _expand_kv(v, group)
    s = (q * scale) @ k.transpose(-1, -2)
    mask = visible_mask(q.shape[2], k.shape[2], causal=causal, alignment=alignment, device=q.device)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1)
    if mask is not None:
        p = p.masked_fill(~mask.any(-1, keepdim=True), 0.0)
    return p @ v, lse
