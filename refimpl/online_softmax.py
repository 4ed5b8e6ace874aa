"""The online-softmax algebra behind every FlashAttention kernel.

For one query row and a set of keys J with logits ``s_j`` and values ``v_j`` the state is

    m = max_j s_j,   l = sum_j exp(s_j - m),   acc = sum_j exp(s_j - m) v_j

and the attention output is ``o = acc / l`` with ``lse = m + log(l)``. States over disjoint key
sets merge by rescaling to the common maximum:

    m = max(m1, m2),   l = e^(m1 - m) l1 + e^(m2 - m) l2,   acc = e^(m1 - m) acc1 + e^(m2 - m) acc2

Merge is associative and commutative with identity ``(-inf, 0, 0)``: the state of the empty key
set. Finalising the identity gives ``o = 0`` and ``lse = -inf`` (an empty row).

Finalised partials ``(o_i, lse_i)`` over disjoint key sets (split-KV) merge by lse:

    lse = logaddexp(lse1, lse2),   o = e^(lse1 - lse) o1 + e^(lse2 - lse) o2
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

NEG_INF = float("-inf")


def _rescale(m_old: torch.Tensor, m_new: torch.Tensor) -> torch.Tensor:
    """``exp(m_old - m_new)``, defined as 0 where ``m_old`` is -inf (the empty state)."""
    finite = m_old != NEG_INF
    return torch.where(finite, torch.exp(torch.where(finite, m_old - m_new, 0.0)), 0.0)


@dataclass
class SoftmaxState:
    """Running state of the online softmax: ``m`` (..., N), ``l`` (..., N), ``acc`` (..., N, Dv)."""

    m: torch.Tensor
    l: torch.Tensor  # noqa: E741 - the conventional name
    acc: torch.Tensor

    @classmethod
    def identity(cls, shape: tuple[int, ...], dv: int, *, dtype: torch.dtype, device) -> SoftmaxState:
        """The state of the empty key set: ``(-inf, 0, 0)``."""
        return cls(
            m=torch.full(shape, NEG_INF, dtype=dtype, device=device),
            l=torch.zeros(shape, dtype=dtype, device=device),
            acc=torch.zeros((*shape, dv), dtype=dtype, device=device),
        )

    @classmethod
    def from_scores(
        cls, s: torch.Tensor, v: torch.Tensor, weights: torch.Tensor | None = None
    ) -> SoftmaxState:
        """State of one key block: logits ``s`` (..., N, K) with -inf where masked, values (..., K, Dv).
        ``weights`` (..., N, K) multiply the probabilities that weight the values (dropout's
        ``M / (1 - p)``): ``acc = (p * weights) @ v``, while ``m`` and ``l`` stay the softmax's."""
        m = s.amax(dim=-1)
        p = torch.exp(s - torch.where(m == NEG_INF, 0.0, m)[..., None])
        return cls(m=m, l=p.sum(dim=-1), acc=(p if weights is None else p * weights) @ v)

    def merge(self, other: SoftmaxState) -> SoftmaxState:
        """Combine the states of two disjoint key sets."""
        m = torch.maximum(self.m, other.m)
        a, b = _rescale(self.m, m), _rescale(other.m, m)
        return SoftmaxState(
            m=m, l=a * self.l + b * other.l, acc=a[..., None] * self.acc + b[..., None] * other.acc
        )

    def finalize(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(o, lse)``; rows with no visible key give ``o = 0`` and ``lse = -inf``."""
        empty = self.l == 0
        safe_l = torch.where(empty, 1.0, self.l)
        o = torch.where(empty[..., None], 0.0, self.acc / safe_l[..., None])
        lse = torch.where(empty, NEG_INF, self.m + torch.log(safe_l))
        return o, lse


def merge_partials(
    o1: torch.Tensor, lse1: torch.Tensor, o2: torch.Tensor, lse2: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge finalised split-KV partials ``(o, lse)`` of two disjoint key sets by their lse."""
    lse = torch.logaddexp(lse1, lse2)
    w1, w2 = _rescale(lse1, lse), _rescale(lse2, lse)
    o = w1[..., None] * o1.to(w1.dtype) + w2[..., None] * o2.to(w2.dtype)
    return o, lse
