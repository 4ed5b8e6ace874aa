"""The low-precision yardstick: attention computed plainly in the input dtype.

This is FlashAttention's ``upcast=False`` reference: the error a straightforward PyTorch
implementation makes on the same problem, in the same dtype. The tolerance model measures a
kernel's error against the golden in units of the yardstick's error. It materialises the
(Nq, Nk) score matrix, so it is for test-sized problems only. Gradients come from autograd
through it, in the input dtype. Variants are applied with the golden's mods
(:mod:`contract.masks`); sinks are one more logit column with no value; dropout multiplies the
normalised probabilities by ``M / (1 - p)`` (:mod:`refimpl.dropout`).

The score mods (softcap, ALiBi) of 16-bit logits run in float32 and their result is rounded
once to the input dtype, as a fused kernel caps its float32 scores (the contract requires it:
``properties/test_precision.py``). In fp16 itself a softcap's ``s / cap`` falls below fp16's
smallest normal, 6.1e-5, for |s| < 6.1e-5 cap, and loses its digits: at a cap of 1e8 the capped
logits were off by units, so the budget ``r x yardstick error`` passed a kernel whose tanh
loses small arguments (mutant ``triton_softcap_tanh_cancels``: softcap-huge passed it in fp16).

FP8 (``docs/variants.md``) is computed as an FP8 kernel computes it, plainly:

- FP8 q, k, v (FlashAttention-3): ``S = (q8 k8^T) * (scale * q_descale * k_descale)`` in float32
  (the products of FP8 values are exact there), the softmax in float32, and the probabilities
  ``P = exp(S - m)`` (m the row's largest logit, so P <= 1) rounded to nearest in V's FP8 format,
  unscaled, for the PV product, while ``l`` sums them unrounded:
  ``o = (fp8(P) v8) * v_descale / l``, returned in bfloat16;
- an FP8 KV cache with 16-bit q (FlashInfer): the cache upcast to q's dtype (exact), k's scale
  folded into the softmax scale and v's applied to o, the rest the plain 16-bit computation.
"""

from __future__ import annotations

import torch

from ..contract.entry_points import Keywords, entry_point
from ..contract.fp8 import OUTPUT_DTYPE, is_fp8, per_query_head
from ..contract.masks import mask_mod, score_mod
from ..contract.validate import check_dense
from .dropout import dropout_weights
from .golden import DESCALE_KEYWORDS, DROPOUT_KEYWORDS, MODIFIER_KEYWORDS, default_scale, expand_kv


@entry_point("dense", (*MODIFIER_KEYWORDS, *DROPOUT_KEYWORDS, *DESCALE_KEYWORDS),
             extra={"alignment": "bottom-right", "dropout_mask": None})
def attention_yardstick(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kw: Keywords, *,
                        alignment: str, dropout_mask: torch.Tensor | None,
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(o, lse)`` in the input dtype (FP8: as the module docstring says); differentiable.
    Empty rows give o = 0, lse = -inf (or the sink logit)."""
    fp8_q, fp8, v_format = is_fp8(q), is_fp8(q) or is_fp8(k), getattr(v, "dtype", None)
    if fp8:  # FP8 values are exact in float32 (FP8 q) or q's 16-bit dtype (an FP8 cache)
        compute = torch.float32 if fp8_q else q.dtype
        q, k, v = q.to(compute), k.to(compute), v.to(compute)
    _, group = check_dense(q, k, v)
    scale = default_scale(q.shape[-1], kw.scale)
    v_scale = None
    if fp8:
        b, hq, hkv = q.shape[0], q.shape[1], k.shape[1]

        def descale(d: torch.Tensor | None) -> torch.Tensor:
            d = torch.ones((), dtype=torch.float32, device=q.device) if d is None else d
            return per_query_head(d, b, hq, hkv, torch.float32).to(q.device)

        qk = descale(kw.k_descale) * (descale(kw.q_descale) if fp8_q else 1.0)
        scale, v_scale = (scale * qk).to(compute), descale(kw.v_descale).to(compute)
    k, v = expand_kv(k, group), expand_kv(v, group)
    s = (q @ k.transpose(-1, -2)) * scale if fp8_q else (q * scale) @ k.transpose(-1, -2)
    nq, nk = q.shape[2], k.shape[2]
    dev = q.device
    idx = (
        torch.arange(q.shape[0], device=dev)[:, None, None, None],
        torch.arange(q.shape[1], device=dev)[None, :, None, None],
        torch.arange(nq, device=dev)[None, None, :, None],
        torch.arange(nk, device=dev)[None, None, None, :],
    )
    modify = score_mod(nq, nk, alignment=alignment, softcap=kw.softcap, alibi_slopes=kw.alibi_slopes)
    if modify is not None:  # 16-bit logits modified in float32, the result rounded once
        s = modify(s.float() if s.dtype in (torch.float16, torch.bfloat16) else s, *idx).to(s.dtype)
    visible = mask_mod(nq, nk, causal=kw.causal, alignment=alignment, window=kw.window_size)
    mask = None if visible is None else visible(*idx).expand(s.shape)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    if kw.sinks is not None:
        z = kw.sinks.to(s.dtype)[None, :, None, None].expand(*s.shape[:3], 1)
        s = torch.cat([s, z], dim=-1)
    lse = torch.logsumexp(s, dim=-1)
    weights = dropout_weights(kw.dropout_p, kw.dropout_seed, dropout_mask)
    if fp8_q:
        if weights is not None:
            raise NotImplementedError("dropout of FP8 inputs is not in the contract")
        return _fp8_probabilities_times_values(s, v, v_format, v_scale, nk), lse
    p = torch.softmax(s, dim=-1)
    if kw.sinks is not None:
        p = p[..., :nk]
    elif mask is not None:
        p = p.masked_fill(~mask.any(-1, keepdim=True), 0.0)
    if weights is not None:
        p = p * weights(*idx).to(p.dtype)
    o = p @ v
    return (o if v_scale is None else o * v_scale), lse


def _fp8_probabilities_times_values(s: torch.Tensor, v: torch.Tensor, fmt: torch.dtype,
                                    v_scale: torch.Tensor, nk: int) -> torch.Tensor:
    """FlashAttention-3's PV product of float32 logits ``s`` (..., Nq, Nk [+ the sink column]):
    ``P = exp(s - m)`` rounded to nearest in ``fmt`` (V's format), ``l`` summed unrounded,
    ``o = (fp8(P) v) * v_scale / l`` in bfloat16 (0 on rows that see no key)."""
    m = s.amax(-1, keepdim=True) if s.shape[-1] else s.new_full((*s.shape[:-1], 1), float("-inf"))
    e = torch.exp(s - torch.where(m == float("-inf"), 0.0, m))
    l = e.sum(-1, keepdim=True)  # noqa: E741
    p = e[..., :nk].to(fmt).to(s.dtype)
    o = torch.where(l == 0, 0.0, (p @ v) * v_scale / torch.where(l == 0, 1.0, l))
    return o.to(OUTPUT_DTYPE)
