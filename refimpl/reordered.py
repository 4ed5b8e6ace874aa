"""``ref-reordered``: the blocked FlashAttention-2 reference (:mod:`refimpl.blocked`) summing in
another order, in float64: the kernel that keeps the float64 tolerance floor honest.

The same tile loops and the same math as ``ref-blocked``, in :data:`REORDERED` order: every loop
visits its tiles last to first (the forward's key tiles, so the online softmax rescales in the
other direction; the backward's key tiles and query tiles, so dQ, dK and dV accumulate the other
way round), and the products over the head dim (``Q K^T``, ``dO V^T``) are summed in tiles of
:data:`D_TILE` columns, last tile first, as kernels that loop over D do.

``ref-blocked`` rounds much as the float64 golden does (one matmul over D, keys in order); in
float64 the yardstick rounds as the golden too, so the tolerance model's ``r x yardstick error``
is about 0 there and only the floor (:mod:`harness.tolerance`) separates a correct float64 kernel
from a wrong one. A kernel that sums in another order has errors of the golden's own size
against it: this one must pass, and a floor too tight for it fails.

It declares float64 only (its purpose; fp16, bf16, float32 and FP8 problems are refused with a
TypeError): in the other dtypes the yardstick rounds in the input dtype and order differences are
what ``r`` already measures, on ``ref-blocked``, ``sdpa-math`` and ``triton``.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ..contract.entry_points import KEYWORDS, entry_point
from . import blocked

#: Columns of the head dim per tile of the D-tiled products: 3 divides none of the drawn powers
#: of two, so most problems have a ragged last D tile.
D_TILE = 3
REORDERED = blocked.Order(reverse=True, d_tile=D_TILE)
DTYPES = frozenset({torch.float64})

Pair = tuple[torch.Tensor, torch.Tensor]


def _check_dtype(q: torch.Tensor) -> None:
    if q.dtype not in DTYPES:
        raise TypeError(f"ref-reordered is float64 only; got {q.dtype}")


# The entry points take ``ref-blocked``'s keywords (every keyword of the contract) and run its
# bodies (``__wrapped__``: the bound positional arguments and keywords) in REORDERED order.
@entry_point("dense", KEYWORDS["dense"])
def attention(q: torch.Tensor, *args: object) -> Pair:
    """:func:`refimpl.blocked.attention` (same arguments, same ``(o, lse)``) in :data:`REORDERED`
    order; float64 only."""
    _check_dtype(q)
    return blocked.attention.__wrapped__(q, *args, REORDERED)


@entry_point("varlen", KEYWORDS["varlen"])
def varlen(q: torch.Tensor, *args: object) -> Pair:
    """:func:`refimpl.blocked.varlen` in :data:`REORDERED` order; float64 only."""
    _check_dtype(q)
    return blocked.varlen.__wrapped__(q, *args, REORDERED)


@entry_point("kvcache", KEYWORDS["kvcache"])
def kvcache(q: torch.Tensor, *args: object) -> Pair:
    """:func:`refimpl.blocked.kvcache` in :data:`REORDERED` order; float64 only."""
    _check_dtype(q)
    return blocked.kvcache.__wrapped__(q, *args, REORDERED)


attention.varlen = varlen
attention.kvcache = kvcache
attention.dropout_mask = blocked.dropout_mask  # the same mask: the order changes only the rounding
attention.capabilities = replace(blocked.attention.capabilities, dtypes=DTYPES, fp8=None)  # float64 only
