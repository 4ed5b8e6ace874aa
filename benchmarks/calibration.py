"""The CPU calibration anchor: plain dense float64 attention on one fixed problem.

It is the textbook formula (materialise S, softmax, multiply), written here on purpose without
any of the suite's code, so that it measures the machine and not the suite. Every CPU benchmark
reports its speed as ``anchor seconds / benchmark seconds``; a change in the suite's code moves
that ratio, a faster or slower CI machine moves both sides alike.
"""

from __future__ import annotations

import math

import torch

#: The fixed calibration problem: (B, H, N, D), float64, non-causal.
CALIBRATION_SHAPE = (1, 2, 2048, 64)


def plain_dense_attention_f64(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense float64 ``(o, lse)`` with bottom-right causal masking (Nq == Nk here)."""
    q, k, v = q.double(), k.double(), v.double()
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        nq, nk = s.shape[-2:]
        visible = torch.ones(nq, nk, dtype=torch.bool).tril(nk - nq)
        s = s.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    return torch.exp(s - lse[..., None]) @ v, lse


def calibration_inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The fixed float64 ``q, k, v`` of :data:`CALIBRATION_SHAPE`."""
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(CALIBRATION_SHAPE, generator=g, dtype=torch.float64) for _ in range(3))
