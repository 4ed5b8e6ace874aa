"""Which keys a query row sees: the one place the causal convention is spelled out.

Bottom-right alignment (FlashAttention >= 2.1, cuDNN): query i sees key j iff
``j <= i + (Nk - Nq)``. Top-left alignment (PyTorch SDPA ``is_causal``): iff ``j <= i``.
With bottom-right alignment and Nq > Nk the first ``Nq - Nk`` rows see no key (empty rows).
"""

from __future__ import annotations

import torch


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
) -> torch.Tensor | None:
    """Boolean mask (rows q_start:q_stop, cols k_start:k_stop), True where the key is visible.

    Returns ``None`` when every key is visible (non-causal), so callers skip the masking.
    """
    if not causal:
        return None
    q_stop = nq if q_stop is None else q_stop
    k_stop = nk if k_stop is None else k_stop
    rows = torch.arange(q_start, q_stop, device=device)[:, None]
    cols = torch.arange(k_start, k_stop, device=device)[None, :]
    return cols <= rows + causal_offset(nq, nk, alignment)
