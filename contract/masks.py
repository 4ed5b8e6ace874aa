"""Which keys a query row sees: the one place the causal convention is spelled out.

Bottom-right alignment (FlashAttention >= 2.1, cuDNN): query i sees key j iff
``j <= i + (Nk - Nq)``. Top-left alignment (PyTorch SDPA ``is_causal``): iff ``j <= i``.
With bottom-right alignment and Nq > Nk the first ``Nq - Nk`` rows see no key (empty rows).

The variants are written in FlexAttention's vocabulary: a *mask mod* says whether query
``q_idx`` sees key ``kv_idx``, a *score mod* rewrites a scaled logit. Index arguments are
broadcastable integer tensors ``b (B,1,1,1)``, ``h (1,H,1,1)``, ``q_idx (1,1,Nq,1)``,
``kv_idx (1,1,1,K)``; with ``c`` the causal offset (``Nk - Nq`` bottom-right, 0 top-left):

    causal            kv_idx <= q_idx + c
    window (l, r)     q_idx + c - l <= kv_idx <= q_idx + c + r      (-1: that side unbounded)
    softcap t         s -> t * tanh(s / t)                           (after scaling, before masking)
    alibi slopes m    s -> s - m[b, h] * |q_idx + c - kv_idx|         (after the softcap)

(``docs/variants.md``; FlashAttention's ``window_size``, ``softcap`` and ``alibi_slopes``.)
"""

from __future__ import annotations

from collections.abc import Callable

import torch

#: ``mask_mod(b, h, q_idx, kv_idx) -> bool tensor`` (True: visible).
MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
#: ``score_mod(score, b, h, q_idx, kv_idx) -> score``.
ScoreMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def causal_offset(nq: int, nk: int, alignment: str = "bottom-right") -> int:
    """The offset ``c`` such that query ``i`` sees key ``j`` iff ``j <= i + c``."""
    if alignment == "bottom-right":
        return nk - nq
    if alignment == "top-left":
        return 0
    raise ValueError(f"unknown causal alignment {alignment!r}")


def visible_mask(
    nq: int,
    nk: int,
    *,
    causal: bool,
    alignment: str = "bottom-right",
    q_start: int = 0,
    q_stop: int | None = None,
    k_start: int = 0,
    k_stop: int | None = None,
    device: torch.device | str = "cpu",
    window: tuple[int, int] | None = None,
) -> torch.Tensor | None:
    """Boolean mask (rows q_start:q_stop, cols k_start:k_stop), True where the key is visible.

    Returns ``None`` when every key is visible (non-causal, no window), so callers skip the masking.
    """
    mod = mask_mod(nq, nk, causal=causal, alignment=alignment, window=window)
    if mod is None:
        return None
    q_stop = nq if q_stop is None else q_stop
    k_stop = nk if k_stop is None else k_stop
    rows = torch.arange(q_start, q_stop, device=device)[:, None]
    cols = torch.arange(k_start, k_stop, device=device)[None, :]
    return mod(None, None, rows, cols)


def mask_mod(
    nq: int, nk: int, *, causal: bool, alignment: str = "bottom-right", window: tuple[int, int] | None = None
) -> MaskMod | None:
    """The visibility predicate of causal masking and a sliding window; ``None``: all visible."""
    c = causal_offset(nq, nk, alignment)
    left, right = (-1, -1) if window is None else window
    if causal:  # causal caps the right edge at the diagonal: (-1, 0) is causal
        right = 0
    if left < 0 and right < 0:
        return None

    def visible(b, h, q_idx, kv_idx):
        diag = q_idx + c
        ok = kv_idx <= diag + right if right >= 0 else torch.ones_like(kv_idx - diag, dtype=torch.bool)
        return ok & (kv_idx >= diag - left) if left >= 0 else ok

    return visible


def score_mod(
    nq: int,
    nk: int,
    *,
    alignment: str = "bottom-right",
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
) -> ScoreMod | None:
    """The logit rewrite of a softcap then ALiBi (FlashAttention's order); ``None``: identity.

    ``alibi_slopes`` is ``(H,)`` or ``(B, H)``; it is read as ``slopes[b, h]`` by broadcasting."""
    if not softcap and alibi_slopes is None:
        return None
    c = causal_offset(nq, nk, alignment)
    slopes = None
    if alibi_slopes is not None:
        slopes = alibi_slopes.reshape(*alibi_slopes.shape[:-1] or (1,), alibi_slopes.shape[-1], 1, 1)

    def modified(score, b, h, q_idx, kv_idx):
        if softcap:
            score = softcap * torch.tanh(score / softcap)
        if slopes is not None:
            score = score - slopes.to(score.dtype) * (q_idx + c - kv_idx).abs().to(score.dtype)
        return score

    return modified
