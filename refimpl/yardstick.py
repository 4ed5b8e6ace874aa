"""The low-precision yardstick: attention computed plainly in the input dtype.

This is FlashAttention's ``upcast=False`` reference: the error a straightforward PyTorch
implementation makes on the same problem, in the same dtype. The tolerance model measures a
kernel's error against the golden in units of the yardstick's error. It materialises the
(Nq, Nk) score matrix, so it is for test-sized problems only. Gradients come from autograd
through it, in the input dtype. Variants are applied with the golden's mods
(:mod:`refimpl.masks`); sinks are one more logit column with no value; dropout multiplies the
normalised probabilities by ``M / (1 - p)`` (:mod:`refimpl.dropout`).
"""

from __future__ import annotations

import torch

from ..contract.validate import check_dense
from .dropout import dropout_weights
from .golden import default_scale, expand_kv
from .masks import mask_mod, score_mod


def attention_yardstick(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    alignment: str = "bottom-right",
    window_size: tuple[int, int] | None = None,
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    dropout_seed: int | None = None,
    dropout_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(o, lse)`` in the input dtype; differentiable. Empty rows give o = 0, lse = -inf (or the
    sink logit)."""
    _, group = check_dense(q, k, v)
    scale = default_scale(q.shape[-1], scale)
    k, v = expand_kv(k, group), expand_kv(v, group)
    s = (q * scale) @ k.transpose(-1, -2)
    nq, nk = q.shape[2], k.shape[2]
    dev = q.device
    idx = (
        torch.arange(q.shape[0], device=dev)[:, None, None, None],
        torch.arange(q.shape[1], device=dev)[None, :, None, None],
        torch.arange(nq, device=dev)[None, None, :, None],
        torch.arange(nk, device=dev)[None, None, None, :],
    )
    modify = score_mod(nq, nk, alignment=alignment, softcap=softcap, alibi_slopes=alibi_slopes)
    if modify is not None:
        s = modify(s, *idx)
    visible = mask_mod(nq, nk, causal=causal, alignment=alignment, window=window_size)
    mask = None if visible is None else visible(*idx).expand(s.shape)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    if sinks is not None:
        z = sinks.to(s.dtype)[None, :, None, None].expand(*s.shape[:3], 1)
        s = torch.cat([s, z], dim=-1)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1)
    if sinks is not None:
        p = p[..., :nk]
    elif mask is not None:
        p = p.masked_fill(~mask.any(-1, keepdim=True), 0.0)
    weights = dropout_weights(dropout_p, dropout_seed, dropout_mask)
    if weights is not None:
        p = p * weights(*idx).to(p.dtype)
    return p @ v, lse
