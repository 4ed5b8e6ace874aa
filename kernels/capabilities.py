"""What a kernel declares it supports.

A kernel under test is any callable ``fn(q, k, v, *, causal=False, scale=None) -> o | (o, lse)``.
It may carry ``fn.capabilities`` (a :class:`Capabilities`). Undeclared means full support: the
default ``Capabilities()`` claims every dtype, head dims 1..256, both causal flags with
bottom-right alignment, Nq != Nk, GQA/MQA, lse, backward, determinism, any strides, CPU and CUDA.

The suite draws only problems a kernel declares (:meth:`Capabilities.unsupported_reason` is
``None``) and separately checks that undeclared problems are refused with ``ValueError``,
``TypeError`` or ``NotImplementedError`` ("clear error or correct answer").
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import torch

if TYPE_CHECKING:  # pragma: no cover
    from properties.problem import Problem

CausalAlignment = Literal["bottom-right", "top-left"]

ALL_DTYPES: frozenset[torch.dtype] = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})
#: Head dims a full-support kernel claims.
ALL_HEAD_DIMS: range = range(1, 257)


@dataclass(frozen=True)
class Limit:
    """A known limit of a kernel: problems where ``applies(problem)`` holds are not drawn.

    ``raises=True`` (the default) means the kernel refuses such problems with a clear error, and
    the error-contract property checks that it does. ``raises=False`` records a known wrong or
    unverifiable answer (with the evidence in ``reason``); the suite then only skips it.
    """

    reason: str
    applies: Callable[[Problem], bool]
    raises: bool = True


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
        fp32_matmul: how float32 products are done: ``"ieee"`` or ``"tf32"``. A tf32 kernel is
            judged against a tf32 yardstick (inputs rounded to tf32).
        limits: known limits, each with its reason.
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
    fp32_matmul: Literal["ieee", "tf32"] = "ieee"
    limits: tuple[Limit, ...] = field(default_factory=tuple)

    @property
    def dv_dims(self) -> Collection[int]:
        return self.head_dims if self.value_head_dims is None else self.value_head_dims

    def unsupported_reason(self, p: Problem, *, include_limits: bool = True) -> str | None:
        """Why the kernel does not declare problem ``p``, or ``None`` when it does."""
        if p.device not in self.devices:
            return f"device {p.device} not in {sorted(self.devices)}"
        if p.dtype not in self.dtypes:
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
        if self.max_seqlen is not None and max(p.nq, p.nk) > self.max_seqlen:
            return f"sequence length {max(p.nq, p.nk)} > max_seqlen {self.max_seqlen}"
        if p.block_m is not None and p.block_m not in self.block_m:
            return f"block_m={p.block_m} not declared"
        if p.block_n is not None and p.block_n not in self.block_n:
            return f"block_n={p.block_n} not declared"
        if include_limits:
            for limit in self.limits:
                if limit.applies(p):
                    return f"known limit: {limit.reason}"
        return None

    def must_raise(self, p: Problem) -> bool:
        """Whether the error contract demands a clear error for ``p`` (undeclared, not a
        ``raises=False`` limit). Problems only outside ``raises=False`` limits are not tested."""
        if self.unsupported_reason(p, include_limits=False) is not None:
            return not any(lim.applies(p) and not lim.raises for lim in self.limits)
        return any(lim.raises and lim.applies(p) for lim in self.limits) and not any(
            lim.applies(p) and not lim.raises for lim in self.limits
        )


FULL_SUPPORT = Capabilities()
