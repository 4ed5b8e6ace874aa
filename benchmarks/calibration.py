"""The CPU calibration anchors: plain dense float64 attention on fixed problems.

The textbook formula (materialise S, softmax, multiply), written here on purpose without any of
the suite's code, so that it measures the machine and not the suite. Two fixed workloads:

- ``dense-f64 large``: one (1, 2, 1024, 64) problem, bound by BLAS and memory bandwidth, the
  anchor of the float64 golden;
- ``dense-f64 tiny``: 480 calls on (1, 1, 16, 16) problems, bound by Python and torch's
  per-op dispatch, the anchor of the blocked kernel, the interpreter and Hypothesis.

Each CPU benchmark reports ``anchor seconds / benchmark seconds``: a change in the suite's code
moves that ratio, a faster, slower or busier machine moves both sides alike (as long as the
anchor is bound by the same thing as the benchmark, hence two of them).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

#: The large calibration problem: (B, H, N, D), float64, non-causal.
CALIBRATION_SHAPE = (1, 2, 1024, 64)
TINY_SHAPE, TINY_PROBLEMS, TINY_PASSES = (1, 1, 16, 16), 8, 60


def plain_dense_attention_f64(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense float64 ``(o, lse)`` with bottom-right causal masking."""
    q, k, v = q.double(), k.double(), v.double()
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        nq, nk = s.shape[-2:]
        visible = torch.ones(nq, nk, dtype=torch.bool).tril(nk - nq)
        s = s.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    return torch.exp(s - lse[..., None]) @ v, lse


def calibration_inputs(
    shape: tuple[int, int, int, int] = CALIBRATION_SHAPE, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fixed float64 ``q, k, v`` (of :data:`CALIBRATION_SHAPE` unless given)."""
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(3))


def large_anchor() -> Callable[[], object]:
    """``dense-f64 large``: one call on the large calibration problem."""
    q, k, v = calibration_inputs()
    return lambda: plain_dense_attention_f64(q, k, v)


def tiny_anchor() -> Callable[[], object]:
    """``dense-f64 tiny``: many calls on tiny problems (per-op overhead bound)."""
    problems = [calibration_inputs(TINY_SHAPE, seed) for seed in range(TINY_PROBLEMS)]

    def run() -> None:
        for _ in range(TINY_PASSES):
            for q, k, v in problems:
                plain_dense_attention_f64(q, k, v)

    return run


ANCHORS: dict[str, Callable[[], Callable[[], object]]] = {
    "dense-f64 large": large_anchor,
    "dense-f64 tiny": tiny_anchor,
}
