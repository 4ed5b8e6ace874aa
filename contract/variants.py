"""The variant table: one row per variant of the contract (``docs/variants.md``).

A row says what a problem that uses the variant looks like (:attr:`Variant.used`), the keywords a
call takes it by, which entry point it is or modifies, whether it has a backward, whether a
kernel's :class:`~contract.capabilities.Capabilities` declare it and, if they do not, why a
problem is outside them (:attr:`Variant.refusal`). ``Problem.variants``,
``Capabilities.declares_variant`` / ``unsupported_reason`` / ``variant_backward``'s default, the
strategies' variant names (``harness.variant_problems``), the CLI's ``kernels`` listing and the
property files' parametrisations read it.

How to add a variant: its row here, with its keywords and their defaults (``_kw(name=default)``:
the entry points' signatures, ``contract/entry_points.py``, are built from them; and its
:class:`~contract.problem.Problem` field and ``Capabilities`` field, which the row's functions
read); its keyword's check in
``contract/validate.py``; its score or mask modifier in ``contract/masks.py`` (the golden, the
yardstick and ``ref-blocked`` apply the modifiers there); its strategy in
``harness/variant_problems.py``. ``meta/test_meta_variants.py`` checks every row against them.
A stochastic variant (dropout) has no elementwise golden for a kernel's own random numbers: its
properties are a file of their own (``properties/test_dropout.py``), not ``test_variants.py``'s.
A variant of the inputs' format (FP8: two rows, FP8 q, k, v and an FP8 cache) is no modifier: its
definition is ``contract/fp8.py`` (what the tensors stand for, which the golden reads exactly),
the references take its keywords (the yardstick computes as such kernels do, and what the
contract lets them round is o's floor: ``refimpl.golden.attention_rounding_bound``), and its
relations beyond the golden are ``properties/test_fp8.py``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .fp8 import CACHE_QUERY_DTYPES, OUTPUT_DTYPE

#: A function of a kernel's Capabilities (typed loosely: this module sits below capabilities.py).
Caps = Any
#: A function of a Problem (likewise).
Prob = Any


@dataclass(frozen=True)
class Variant:
    """One variant (see the module docstring).

    Attributes:
        name: its name (``--properties`` and the reports use it).
        signature: the call's keywords that carry it, each with its default, which means "off"
            (:data:`REQUIRED`: none, the call gives it; empty: an entry point or a form of one).
            ``contract/entry_points.py`` builds the entry points' signatures from them.
        entry: the entry point it is or modifies: ``any`` (a score or mask modifier of every
            entry point), ``training`` (a modifier of the entry points with a backward: dense and
            varlen), ``varlen`` or ``kvcache`` (:data:`ENTRY_MODES`).
        backward: whether the contract has its gradient (a kernel declares which it gives in
            ``Capabilities.variant_backward``).
        used: whether a problem uses it.
        declared: whether a kernel's capabilities declare it at all.
        refusal: why a problem that uses it is outside the capabilities (``None``: it is not).
        stochastic: its output is a random draw that a seed picks (dropout): no elementwise golden
            judges a kernel's own random numbers, and it joins no other variant's problems.
    """

    name: str
    signature: tuple[tuple[str, object], ...]
    entry: str
    backward: bool
    used: Callable[[Prob], bool]
    declared: Callable[[Caps], bool]
    refusal: Callable[[Caps, Prob], str | None]
    stochastic: bool = False

    @property
    def keywords(self) -> tuple[str, ...]:
        """The call's keywords that carry it (empty: an entry point or a form of one)."""
        return tuple(name for name, _ in self.signature)

    @property
    def modes(self) -> tuple[str, ...]:
        """The entry points (``Problem.mode``) a problem using it calls."""
        return ENTRY_MODES[self.entry]


#: A keyword's default meaning "the call must give it" (``cache_seqlens``).
REQUIRED = inspect.Parameter.empty


def _kw(**defaults: object) -> tuple[tuple[str, object], ...]:
    """A row's :attr:`Variant.signature`: its keywords with their defaults, in the order given."""
    return tuple(defaults.items())


#: Per ``Variant.entry``: the entry points (``Problem.mode``) its problems call.
ENTRY_MODES: dict[str, tuple[str, ...]] = {
    "any": ("dense", "varlen", "kvcache"),
    "training": ("dense", "varlen"),
    "varlen": ("varlen",),
    "kvcache": ("kvcache",),
}


def _paged_refusal(caps: Caps, p: Prob) -> str | None:
    kv = caps.kvcache
    if kv is None:
        return None  # the kvcache row says it
    return f"page_size={p.page_size} not declared" if p.page_size not in kv.page_sizes else None


def _cache_refusal(caps: Caps, p: Prob) -> str | None:
    kv = caps.kvcache
    if kv is None:
        return "KV-cache decode not declared"
    if p.page_size is None and not kv.contiguous:
        return "contiguous KV cache not declared"
    return f"Nq={p.nq} queries > max_queries {kv.max_queries}" if p.nq > kv.max_queries else None


def _splits_refusal(caps: Caps, p: Prob) -> str | None:
    kv = caps.kvcache
    if kv is None:
        return None
    return f"num_splits={p.num_splits} > max_splits {kv.max_splits}" if p.num_splits > kv.max_splits else None


def _dropout_refusal(caps: Caps, p: Prob) -> str | None:
    if not caps.dropout:
        return "dropout not declared"
    if p.cache is not None:
        return "dropout in KV-cache decode (forward only: inference) is not in the contract"
    return None


def _fp8_refusal(caps: Caps, p: Prob) -> str | None:
    fp8 = caps.fp8
    if fp8 is None or not fp8.descales:
        return "FP8 q, k, v (q_descale, k_descale, v_descale) not declared"
    fmt, shape, _ = p.fp8
    if fmt not in fp8.formats:
        return f"FP8 format {fmt} not declared"
    if shape not in fp8.descales:
        return f"descales of shape {shape!r} not declared"
    if p.dtype != OUTPUT_DTYPE:
        return f"FP8 q, k, v give a bfloat16 o: the problem's dtype is bfloat16, not {p.dtype}"
    if p.dropout is not None:
        return "dropout of FP8 inputs is not in the contract (FA3's FP8 forward has none)"
    return None


def _fp8_cache_refusal(caps: Caps, p: Prob) -> str | None:
    fp8 = caps.fp8
    if caps.kvcache is None:
        return None  # the kvcache row says it
    if fp8 is None or not fp8.cache_scales:
        return "FP8 KV cache (k_scale, v_scale) not declared"
    fmt, shape, _ = p.fp8
    if fmt not in fp8.formats:
        return f"FP8 format {fmt} not declared"
    if shape not in fp8.cache_scales:
        return f"cache scales of shape {shape!r} not declared"
    if p.dtype not in CACHE_QUERY_DTYPES:
        return f"an FP8 cache is read with float16 or bfloat16 queries, not {p.dtype}"
    return None


TABLE: tuple[Variant, ...] = (
    Variant("window", _kw(window_size=None), "any", True, lambda p: p.window is not None,
            lambda c: c.window, lambda c, p: None if c.window else "window_size not declared"),
    Variant("softcap", _kw(softcap=0.0), "any", True, lambda p: bool(p.softcap),
            lambda c: c.softcap, lambda c, p: None if c.softcap else "softcap not declared"),
    Variant("alibi", _kw(alibi_slopes=None), "any", True, lambda p: p.alibi is not None,
            lambda c: bool(c.alibi),
            lambda c, p: None if p.alibi[0] in c.alibi else f"alibi_slopes of shape {p.alibi[0]!r} "
                                                           "not declared"),
    Variant("sinks", _kw(sinks=None), "any", True, lambda p: p.sinks is not None,
            lambda c: c.sinks, lambda c, p: None if c.sinks else "sinks not declared"),
    Variant("varlen", _kw(), "varlen", True, lambda p: p.seqlens is not None,
            lambda c: c.varlen, lambda c, p: None if c.varlen else "varlen (cu_seqlens) not declared"),
    Variant("kvcache", _kw(cache_seqlens=REQUIRED), "kvcache", False, lambda p: p.cache is not None,
            lambda c: c.kvcache is not None, _cache_refusal),
    Variant("paged", _kw(block_table=None), "kvcache", False, lambda p: p.page_size is not None,
            lambda c: c.kvcache is not None and bool(c.kvcache.page_sizes), _paged_refusal),
    Variant("splits", _kw(num_splits=0), "kvcache", False, lambda p: p.num_splits is not None,
            lambda c: c.kvcache is not None and c.kvcache.max_splits > 1, _splits_refusal),
    Variant("dropout", _kw(dropout_p=0.0, dropout_seed=None), "training", True,
            lambda p: p.dropout is not None, lambda c: c.dropout, _dropout_refusal, stochastic=True),
    Variant("fp8", _kw(q_descale=None, k_descale=None, v_descale=None), "training", False,
            lambda p: p.fp8 is not None and p.cache is None,
            lambda c: c.fp8 is not None and bool(c.fp8.descales), _fp8_refusal),
    Variant("fp8-cache", _kw(k_scale=None, v_scale=None), "kvcache", False,
            lambda p: p.fp8 is not None and p.cache is not None,
            lambda c: c.kvcache is not None and c.fp8 is not None and bool(c.fp8.cache_scales),
            _fp8_cache_refusal),
)
#: The variants' names, in the order the reports list them.
NAMES: tuple[str, ...] = tuple(v.name for v in TABLE)
#: The score and mask modifiers, combinable with every entry point.
MODIFIERS: tuple[str, ...] = tuple(v.name for v in TABLE if v.entry == "any")
#: The variants the elementwise golden judges (``properties/test_variants.py``): not the stochastic.
JUDGED: tuple[str, ...] = tuple(v.name for v in TABLE if not v.stochastic)
#: The variants with a backward (decode is forward only).
BACKWARD: frozenset[str] = frozenset(v.name for v in TABLE if v.backward)
BY_NAME: dict[str, Variant] = {v.name: v for v in TABLE}
