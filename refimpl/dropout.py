"""Seeded dropout of the attention probabilities: the contract's counter-based keep mask.

``docs/variants.md`` fixes the convention. With ``dropout_p = p`` and ``dropout_seed = s`` the
normalised probabilities ``P_ij = exp(S_ij - lse_i)`` are multiplied by ``Z_ij = M_ij / (1 - p)``
before they weight the values (``O = (P * Z) V``; lse stays the undropped softmax's), with the
keep mask ``M`` a pure function of the seed and the entry's indices:

    M[b, h, i, j] = hash(s, b, h, i, j) >= ceil(p * 2^32)

b the batch element (a varlen call's sequence index), h the query head, i the query's and j the
key's position (in its sequence, for varlen). ``P(M = 1) = 1 - ceil(p 2^32) / 2^32``, which is
``1 - p`` to within ``2^-32``; p = 0 keeps every entry.

The hash absorbs the words ``(s_lo, s_hi, b, h, i, j)`` (``s = s_hi 2^32 + s_lo``,
``0 <= s < 2^64``) into a 32-bit state started at 0, one word a round:

    state <- fmix32(((state ^ word) + 0x9E3779B9) mod 2^32)

where ``fmix32`` is MurmurHash3's 32-bit finaliser (``x ^= x >> 16; x *= 0x85EBCA6B;
x ^= x >> 13; x *= 0xC2B2AE35; x ^= x >> 16``, products mod 2^32). Every round is a bijection of
the state for a fixed word and of the word for a fixed state. A kernel author can reproduce the
mask bit for bit with uint32 arithmetic; here it is written in int64 torch ops whose products
never exceed 2^48 (the multiplier is split in 16-bit halves), so it is exact on every backend.

Only ``ref-blocked`` and the references use this mask: a kernel may draw its own random numbers
(FlashAttention's Philox); the dropout properties (``properties/test_dropout.py``) need no access
to its mask, and a kernel that returns it (``fn.dropout_mask``) is also judged against the golden
computed with that mask.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..contract.validate import check_dropout, dropout_threshold

MASK32 = 0xFFFFFFFF
#: The additive round constant (2^32 / golden ratio): the state never sticks at fmix32's fixed point 0.
ROUND = 0x9E3779B9
#: MurmurHash3 fmix32's multipliers.
FMIX1, FMIX2 = 0x85EBCA6B, 0xC2B2AE35
#: Seeds are unsigned 64-bit integers (FlashAttention's Philox seed is one too).
SEED_LIMIT = 2**64


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``x * c mod 2^32`` for ``0 <= x < 2^32``, every intermediate below 2^49."""
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & MASK32


def fmix32(x: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's 32-bit finaliser of int64 ``x`` in ``[0, 2^32)`` (a bijection)."""
    x = x ^ (x >> 16)
    x = _mul32(x, FMIX1)
    x = x ^ (x >> 13)
    x = _mul32(x, FMIX2)
    return x ^ (x >> 16)


def _absorb(state: torch.Tensor, word: torch.Tensor | int) -> torch.Tensor:
    return fmix32(((state ^ (word & MASK32)) + ROUND) & MASK32)


def dropout_hash(
    seed: int, b: torch.Tensor | int, h: torch.Tensor | int, i: torch.Tensor, j: torch.Tensor
) -> torch.Tensor:
    """``hash(seed, b, h, i, j)`` in ``[0, 2^32)`` (int64), broadcasting the int64 index tensors."""
    state = torch.zeros((), dtype=torch.int64, device=i.device)
    for word in (seed & MASK32, seed >> 32, b, h, i, j):
        state = _absorb(state, word)
    return state


@dataclass(frozen=True)
class Dropout:
    """Dropout of one call: probability ``p`` in (0, 1), ``seed``, and ``batch``, the hash's batch
    index of the call's first batch element (a varlen sequence run alone is batch element
    ``batch``: its sequence index)."""

    p: float
    seed: int
    batch: int = 0

    def keep(
        self, b: torch.Tensor | int, h: torch.Tensor | int, i: torch.Tensor, j: torch.Tensor
    ) -> torch.Tensor:
        """The keep mask ``M`` at the broadcast indices (``b`` counted from ``batch``)."""
        return dropout_hash(self.seed, b + self.batch, h, i, j) >= dropout_threshold(self.p)

    def factor(self, b, h, i, j, dtype: torch.dtype) -> torch.Tensor:
        """``Z = M / (1 - p)`` in ``dtype``: 0 where dropped, ``1 / (1 - p)`` where kept."""
        return self.keep(b, h, i, j).to(dtype) * (1.0 / (1.0 - self.p))


def dropout_mask(
    batch: int, heads: int, nq: int, nk: int, *, dropout_p: float, dropout_seed: int,
    device: torch.device | str = "cpu", batch_start: int = 0,
) -> torch.Tensor:
    """The keep mask (batch, heads, nq, nk), bool, of a call with ``dropout_p`` and
    ``dropout_seed``; batch element ``b`` is the hash's ``batch_start + b``. All True at p = 0."""
    if dropout_p == 0:
        return torch.ones((batch, heads, nq, nk), dtype=torch.bool, device=device)
    idx = [torch.arange(n, device=device, dtype=torch.int64) for n in (batch, heads, nq, nk)]
    b, h, i, j = (t.view(*(-1 if a == axis else 1 for a in range(4))) for axis, t in enumerate(idx))
    return Dropout(dropout_p, dropout_seed, batch_start).keep(b, h, i, j)


def dropout_of(dropout_p: float, dropout_seed: int | None, batch: int = 0) -> Dropout | None:
    """The :class:`Dropout` of checked keywords, ``None`` at p = 0 (exactly no dropout)."""
    if not dropout_p:
        return None
    return Dropout(float(dropout_p), int(dropout_seed), batch)


#: ``weights(b, h, q_idx, kv_idx) -> Z`` (float64) at broadcast index tensors, as a mask mod's.
WeightMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def dropout_weights(
    dropout_p: float = 0.0,
    dropout_seed: int | None = None,
    dropout_mask: torch.Tensor | None = None,
    *,
    batch_start: int = 0,
) -> WeightMod | None:
    """The references' dropout: ``Z(b, h, i, j) = M / (1 - p)`` in float64, with M the bool keep
    mask ``dropout_mask`` (B, Hq, Nq, Nk) when given (a kernel's own, ``fn.dropout_mask``), else
    the seed's (:class:`Dropout`, batch elements counted from ``batch_start``); ``None`` at p = 0."""
    p, seed = check_dropout(dropout_p, dropout_seed if dropout_mask is None else 0)  # a mask: no seed
    if not p:
        return None
    if dropout_mask is None:
        keep = Dropout(p, seed, batch_start).keep
    else:
        if not isinstance(dropout_mask, torch.Tensor) or dropout_mask.dtype != torch.bool:
            raise TypeError("dropout_mask must be a bool tensor (B, Hq, Nq, Nk): True where kept")

        def keep(b, h, i, j):
            return dropout_mask[b, h, i, j]

    def weights(b, h, i, j):
        return keep(b, h, i, j).to(torch.float64) * (1.0 / (1.0 - p))

    return weights


def sequence_dropout(kw: dict, s: int, q: torch.Tensor, k: torch.Tensor) -> dict:
    """The dropout keywords of varlen sequence ``s`` run alone as a batch of one, q (1, Hq, Nq, D),
    k (1, Hkv, Nk, D): its keep mask, the seed's at batch index ``s`` (a varlen call's mask is the
    padded dense batch's), as ``dropout_mask``. Keywords without dropout are returned as they are."""
    if not kw.get("dropout_p") or kw.get("dropout_mask") is not None:
        return kw
    mask = dropout_mask(1, q.shape[1], q.shape[2], k.shape[2], dropout_p=kw["dropout_p"],
                        dropout_seed=check_dropout(kw["dropout_p"], kw.get("dropout_seed"))[1],
                        device=q.device, batch_start=s)
    return {**kw, "dropout_mask": mask}
