"""What a kernel declares it supports.

A kernel under test is any callable ``fn(q, k, v, *, causal=False, scale=None) -> o | (o, lse)``.
It may carry ``fn.capabilities`` (a :class:`Capabilities`). Undeclared means full support: the
default ``Capabilities()`` claims every dtype, head dims 1..256, both causal flags with
bottom-right alignment, Nq != Nk, GQA/MQA, lse, backward, determinism, any strides, CPU and CUDA.

The suite draws only problems a kernel declares (:meth:`Capabilities.unsupported_reason` is
``None``) and separately checks that undeclared problems are refused with ``ValueError``,
``TypeError`` or ``NotImplementedError`` ("clear error or correct answer").

Variants (``docs/variants.md``: sliding window, softcap, ALiBi, sinks, varlen, KV-cache decode,
dropout, FP8 inputs and FP8 KV caches) are opt-in: full support means the dense contract only,
and a kernel declares each variant it takes. The varlen and KV-cache entry points are the
kernel's attributes ``fn.varlen`` and ``fn.kvcache`` (FlashAttention's ``flash_attn_varlen_func``
and ``flash_attn_with_kvcache``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import torch

from .variants import BACKWARD, BY_NAME, TABLE

if TYPE_CHECKING:  # pragma: no cover
    from .problem import Problem

CausalAlignment = Literal["bottom-right", "top-left"]

ALL_DTYPES: frozenset[torch.dtype] = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})
#: Head dims a full-support kernel claims.
ALL_HEAD_DIMS: range = range(1, 257)
#: Shapes of ALiBi slopes: one per query head ``(Hq,)``, or per batch element and head ``(B, Hq)``.
ALIBI_SHAPES: frozenset[str] = frozenset({"head", "batch-head"})


@dataclass(frozen=True)
class KVCache:
    """What a kernel's KV-cache decode entry point (``fn.kvcache``) accepts.

    Attributes:
        contiguous: a contiguous cache ``(B, Ncache, Hkv, D)``.
        page_sizes: page sizes of a paged cache ``(num_pages, page_size, Hkv, D)`` with a
            ``block_table``; empty: no paged cache.
        max_splits: the largest ``num_splits`` (split-KV) it takes; 1: no split-KV.
        max_queries: the largest number of queries per sequence (Nq) it decodes at once.
    """

    contiguous: bool = True
    page_sizes: tuple[int, ...] = ()
    max_splits: int = 1
    max_queries: int = 64


@dataclass(frozen=True)
class FP8:
    """What FP8 a kernel takes (``docs/variants.md``; the formats and shapes of ``contract/fp8.py``).

    Attributes:
        formats: the FP8 formats of its FP8 inputs and caches: ``e4m3`` (``torch.float8_e4m3fn``)
            and ``e5m2`` (``torch.float8_e5m2``).
        descales: the descale shapes (``tensor`` (), ``head`` (Hkv,), ``batch-head`` (B, Hkv))
            its dense and varlen entry points take with FP8 q, k, v (``q_descale``, ``k_descale``,
            ``v_descale``; o in bfloat16); empty: no FP8 inputs there.
        cache_scales: the ``k_scale`` / ``v_scale`` shapes (``tensor``, ``head``) its decode entry
            point takes with an FP8 KV cache (q float16 or bfloat16); empty: no FP8 cache.
    """

    formats: frozenset[str] = frozenset({"e4m3"})
    descales: frozenset[str] = frozenset({"batch-head"})
    cache_scales: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Limit:
    """A known limit of a kernel: problems where ``applies(problem)`` holds are not drawn.

    ``raises=True`` (the default) means the kernel refuses such problems with a clear error, and
    the error-contract property checks that it does. ``raises=False`` records a known wrong or
    unverifiable answer (with the evidence in ``reason``); the suite then only skips it.
    ``backward=True``: a limit of the gradients alone (dO's layout, say): the forward properties
    still draw such problems, the backward ones do not (:meth:`Capabilities.backward_reason`);
    such a limit is a known wrong answer or crash (``raises=False``), since no property asks a
    backward for a clear error.
    """

    reason: str
    applies: Callable[[Problem], bool]
    raises: bool = True
    backward: bool = False

    def __post_init__(self) -> None:
        if self.backward and self.raises:
            raise ValueError(f"a backward limit must have raises=False (no property checks a backward's "
                             f"refusal): {self.reason}")


@dataclass(frozen=True)
class Capabilities:
    """The declaration a kernel makes about the problems it accepts.

    Attributes:
        dtypes: input dtypes accepted (output dtype equals input dtype).
        head_dims: accepted D (query/key head dim).
        value_head_dims: accepted Dv; ``None`` means the same set as ``head_dims``.
        dv_equals_d: the kernel requires Dv == D.
        causal: accepts ``causal=True``.
        causal_alignment: where the causal diagonal sits when Nq != Nk.
        unequal_lengths: accepts Nq != Nk.
        gqa: accepts Hq != Hkv (Hq % Hkv == 0; head h reads kv head h // (Hq // Hkv)).
        custom_scale: honours an explicit ``scale``.
        returns_lse: returns ``(o, lse)``; otherwise only ``o`` and only ``o`` is checked.
        backward: supports autograd for q, k and v.
        deterministic: forward is bitwise reproducible.
        deterministic_backward: backward is bitwise reproducible.
        any_strides: accepts arbitrary strided views (it may copy internally).
        devices: device types it runs on (``"cpu"``, ``"cuda"``).
        block_m, block_n: tile sizes it accepts as keyword arguments (empty: none).
        max_seqlen: the largest Nq/Nk it accepts, ``None`` for no limit.
        max_elements: the most elements any one of q, k, v or o may hold (B * H * N * D; packed
            T * H * D for varlen), and the most a strided view of them may span from its first
            element to its last: ``2**31 - 1`` for a kernel that computes offsets in 32 bits.
            ``None``: no limit (64-bit offsets). Beyond it the kernel must refuse the call with
            a clear error (``docs/scale.md``: the huge-tensor properties hold both sides of it).
        fp32_matmul: how float32 products are done: ``"ieee"`` or ``"tf32"``. A tf32 kernel is
            judged against a tf32 yardstick (inputs rounded to tf32).
        limits: known limits, each with its reason.
        window: takes ``window_size=(left, right)`` (sliding window).
        softcap: takes ``softcap`` (logit soft-capping).
        alibi: the ALiBi slope shapes it takes as ``alibi_slopes`` (:data:`ALIBI_SHAPES`).
        sinks: takes ``sinks`` (one learnable sink logit per query head).
        varlen: has the varlen entry point ``fn.varlen`` (packed sequences, ``cu_seqlens``).
        kvcache: what its KV-cache decode entry point ``fn.kvcache`` takes; ``None``: none.
        dropout: takes ``dropout_p`` and ``dropout_seed`` (seeded dropout of the probabilities) in
            its dense and varlen entry points; a kernel that can return the keep mask it applies
            also has ``fn.dropout_mask`` (``docs/variants.md``).
        fp8: the FP8 inputs (dense, varlen) and FP8 KV caches (decode) it takes (:class:`FP8`);
            ``None``: none. An FP8 problem's ``dtype`` is its o's: bfloat16 for FP8 q, k, v (not
            read against ``dtypes``), q's for an FP8 cache.
        variant_backward: the variants (of ``contract.variants.BACKWARD``) whose gradients it
            supports, when it declares ``backward``.
        seqlen_multiple: Nq and Nk (and every varlen sequence's lengths) must be multiples of this.
    """

    dtypes: frozenset[torch.dtype] = ALL_DTYPES
    head_dims: Collection[int] = ALL_HEAD_DIMS
    value_head_dims: Collection[int] | None = None
    dv_equals_d: bool = False
    causal: bool = True
    causal_alignment: CausalAlignment = "bottom-right"
    unequal_lengths: bool = True
    gqa: bool = True
    custom_scale: bool = True
    returns_lse: bool = True
    backward: bool = True
    deterministic: bool = True
    deterministic_backward: bool = True
    any_strides: bool = True
    devices: frozenset[str] = frozenset({"cpu", "cuda"})
    block_m: tuple[int, ...] = ()
    block_n: tuple[int, ...] = ()
    max_seqlen: int | None = None
    max_elements: int | None = None
    fp32_matmul: Literal["ieee", "tf32"] = "ieee"
    limits: tuple[Limit, ...] = field(default_factory=tuple)
    window: bool = False
    softcap: bool = False
    alibi: frozenset[str] = frozenset()
    sinks: bool = False
    varlen: bool = False
    kvcache: KVCache | None = None
    dropout: bool = False
    fp8: FP8 | None = None
    variant_backward: frozenset[str] = BACKWARD
    seqlen_multiple: int = 1

    @property
    def dv_dims(self) -> Collection[int]:
        return self.head_dims if self.value_head_dims is None else self.value_head_dims

    def unsupported_reason(self, p: Problem, *, include_limits: bool = True) -> str | None:
        """Why the kernel does not declare problem ``p``, or ``None`` when it does."""
        if p.device not in self.devices:
            return f"device {p.device} not in {sorted(self.devices)}"
        if p.dtype not in self.dtypes and not (p.fp8 is not None and p.cache is None):  # FP8 q: the fp8 row's
            return f"dtype {p.dtype} not declared"
        if p.d not in self.head_dims:
            return f"head dim D={p.d} not declared"
        if p.dv not in self.dv_dims:
            return f"value head dim Dv={p.dv} not declared"
        if self.dv_equals_d and p.dv != p.d:
            return f"Dv={p.dv} != D={p.d} not declared"
        if p.causal and not self.causal:
            return "causal=True not declared"
        if p.nq != p.nk and not self.unequal_lengths:
            return f"Nq={p.nq} != Nk={p.nk} not declared"
        if p.hq != p.hkv and not self.gqa:
            return f"GQA/MQA (Hq={p.hq}, Hkv={p.hkv}) not declared"
        if p.scale is not None and not self.custom_scale:
            return "explicit scale not declared"
        if p.layout != "contiguous" and not self.any_strides:
            return f"layout {p.layout} not declared"
        if p.do_layout != "contiguous" and not self.any_strides:
            return f"dO in layout {p.do_layout} not declared"
        if self.max_seqlen is not None and max(p.nq, p.nk) > self.max_seqlen:
            return f"sequence length {max(p.nq, p.nk)} > max_seqlen {self.max_seqlen}"
        if self.max_elements is not None and largest_tensor(p) > self.max_elements:
            return f"a tensor of {largest_tensor(p)} elements > max_elements {self.max_elements}"
        if p.block_m is not None and p.block_m not in self.block_m:
            return f"block_m={p.block_m} not declared"
        if p.block_n is not None and p.block_n not in self.block_n:
            return f"block_n={p.block_n} not declared"
        reason = self._variant_reason(p)
        if reason is not None:
            return reason
        if include_limits:
            for limit in self.limits:
                if not limit.backward and limit.applies(p):
                    return f"known limit: {limit.reason}"
        return None

    def _variant_reason(self, p: Problem) -> str | None:
        """Why the kernel does not declare ``p``'s variants (``None`` when it does)."""
        m = self.seqlen_multiple
        lengths = [n for pair in p.seqlens for n in pair] if p.seqlens is not None else [p.nq, p.nk]
        if p.cache is None and m > 1 and any(n % m for n in lengths):
            return f"sequence lengths {sorted(set(lengths))} not all multiples of {m} (seqlen_multiple)"
        return next((why for v in TABLE if v.used(p) and (why := v.refusal(self, p)) is not None), None)

    def backward_reason(self, p: Problem) -> str | None:
        """Why the kernel does not declare gradients for ``p`` (``None`` when it does)."""
        if not self.backward:
            return "backward not declared"
        if p.cache is not None:
            return "KV-cache decode is forward only"
        if p.fp8 is not None:
            return "FP8 inputs are forward only (the contract has no FP8 gradient)"
        missing = sorted(set(p.variants) - self.variant_backward)
        if missing:
            return f"backward of {', '.join(missing)} not declared"
        limit = self.backward_limit(p)
        return None if limit is None else f"known limit of the backward: {limit.reason}"

    def backward_limit(self, p: Problem) -> Limit | None:
        """The limit of the backward (``Limit.backward``) that rules out ``p``'s gradients, if any."""
        return next((lim for lim in self.limits if lim.backward and lim.applies(p)), None)

    def declares_variant(self, name: str) -> bool:
        """Whether the kernel declares variant ``name`` (a name of ``contract.variants.TABLE``)."""
        return BY_NAME[name].declared(self)

    def must_raise(self, p: Problem) -> bool:
        """Whether the error contract demands a clear error for ``p`` (undeclared, not a
        ``raises=False`` limit). Problems only outside ``raises=False`` limits are not tested."""
        forward = [lim for lim in self.limits if not lim.backward]
        if self.unsupported_reason(p, include_limits=False) is not None:
            return not any(lim.applies(p) and not lim.raises for lim in forward)
        return any(lim.raises and lim.applies(p) for lim in forward) and not any(
            lim.applies(p) and not lim.raises for lim in forward
        )


def largest_tensor(p: Problem) -> int:
    """Elements of the problem's largest tensor among q, k, v and o (their gradients have the
    same sizes): ``B * H * N * D`` per tensor, packed ``T * H * D`` for varlen, the cache's
    ``B * Ncache * Hkv * D`` for decode."""
    if p.seqlens is not None:
        tq, tk = (sum(pair[i] for pair in p.seqlens) for i in (0, 1))
        return max(tq * p.hq * max(p.d, p.dv), tk * p.hkv * max(p.d, p.dv))
    return max(p.b * p.hq * p.nq * max(p.d, p.dv), p.b * p.hkv * p.nk * max(p.d, p.dv))


FULL_SUPPORT = Capabilities()
