"""Hypothesis strategies for variant problems (``docs/variants.md``), from a kernel's declaration.

:func:`variant_problems` draws a declared problem that uses one named variant (``window``,
``softcap``, ``alibi``, ``sinks``, ``varlen``, ``kvcache``, ``paged``, ``splits``, ``dropout``) and,
at random, any other declared modifier that combines with it (a stochastic variant, dropout, joins
no other's problems). The values favour the edges where kernels
break:

    window       sides 0, 1, small, >= N, -1 (unbounded), asymmetric
    softcap      small caps that saturate tanh (0.5, 1), large ones that barely bend it, and a
                 huge one (1e6) whose tanh arguments are tiny
    alibi        slopes 0, tiny, standard and large; per head and per batch element and head
    sinks        very negative (no effect), positive (they dominate), mixed, and far above or
                 far below every key logit of their head (``contract.problem.SINKS``)
    varlen       1..12 sequences, lengths 0, 1, at tile edges and random, very unequal
    kvcache      Nq 1..a few, capacities and cache lengths 0..capacity at tile edges, at page
                 edges and random, declared page sizes, shuffled block tables with NaN-filled
                 spare pages, num_splits 1..beyond the key blocks, and in half the draws
                 with splits a sequence with no cached key (its rows see no key in any split)
    dropout      p 0 (exactly none), small, 0.1, 0.5 and 0.9; seeds over all 64 bits (both
                 halves of the hash's seed)
    fp8          FP8 q, k, v (dense, varlen; o bfloat16) in each declared format, with descales of
                 each declared shape drawn per head group so that the values land near the
                 format's largest (448 for e4m3), saturate there, fall into its subnormals, or
                 sit 2^12 away from 1 (``contract.problem.FP8_PLACEMENTS``)
    fp8-cache    the same for a decode cache (k_scale, v_scale per tensor or per kv head), q
                 float16 or bfloat16

:func:`undeclared_variant_problems` steps outside the declaration along one variant axis, and
:data:`MALFORMED` lists the malformed inputs every declared entry point must refuse.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace

import torch
from hypothesis import assume, reject
from hypothesis import strategies as st

from ..contract.capabilities import ALIBI_SHAPES, Capabilities, KVCache
from ..contract.fp8 import CACHE_QUERY_DTYPES, CACHE_SCALE_SHAPES, DESCALE_SHAPES, FORMATS, OUTPUT_DTYPE
from ..contract.problem import FP8_PLACEMENTS, SINKS, KernelInputs, Problem
from ..contract.variants import BY_NAME, MODIFIERS, TABLE
from .strategies import (
    DEFAULT_SIZES,
    Derive,
    Related,
    Sizes,
    Where,
    candidate_problems,
    checked,
    edge_lengths,
    problems,
)

#: 1e6: tanh's arguments are tiny, where a tanh through exp(-2|x|) cancels (a capped logit off by
#: cap x an fp32 ulp of 1; mutant triton_softcap_tanh_cancels).
SOFTCAPS = (0.5, 1.0, 5.0, 30.0, 1000.0, 1e6)
ALIBI_MAX_SLOPES = (0.0, 1e-3, 0.25, 1.0, 8.0)
#: Largest number of packed sequences drawn.
MAX_SEQUENCES = 12
#: Dropout probabilities drawn: none (p = 0 must be exactly no dropout), small, and 0.1 to 0.9.
DROPOUT_PS = (0.0, 0.01, 0.1, 0.5, 0.9)


def dropout_seeds() -> st.SearchStrategy[int]:
    """Dropout seeds: any of ``[0, 2^64)``, and 0, 2^32 - 1 and 2^32 (the low word's edge, the high
    word's first bit) and 2^64 - 1 as likely."""
    return st.one_of(st.sampled_from((0, 2**32 - 1, 2**32, 2**64 - 1)), st.integers(0, 2**64 - 1))


#: What :func:`_modifiers` draws a softcap, ALiBi's largest slope and a sink setting from
#: (immutable strategies, built once).
_SOFTCAP_VALUES = st.one_of(st.sampled_from(SOFTCAPS), st.floats(0.1, 100.0).map(lambda x: round(x, 3)))
_ALIBI_SLOPES = st.sampled_from(ALIBI_MAX_SLOPES)
_SINK_SETTINGS = st.sampled_from(sorted(SINKS))


@functools.lru_cache(maxsize=1024)  # immutable strategies, built once per arguments
def _window_side(n: int) -> st.SearchStrategy[int]:
    """One side of a window over ``n`` keys: -1 (unbounded), 0, 1, 2, ``n``, beyond it, or any."""
    return st.one_of(st.sampled_from([-1, 0, 1, 2, n, n + 3]), st.integers(-1, max(n, 1)))


@functools.lru_cache(maxsize=1024)  # immutable strategies, built once per arguments
def _lengths(
    max_n: int, multiple: int = 1, min_n: int = 0, special: tuple[int, ...] = (0, 1, 2)
) -> st.SearchStrategy[int]:
    """Lengths in ``min_n..max_n``, each branch as likely: the ``special`` ones, tile edges
    (:func:`strategies.edge_lengths`) and any (multiples of ``multiple`` only)."""
    edges = edge_lengths(max(min_n, 1), max_n, multiple)
    if multiple > 1:
        multiples = st.integers(min_n // multiple + (min_n % multiple > 0), max_n // multiple).map(
            lambda i: i * multiple
        )
        return multiples if edges is None else st.one_of(multiples, edges)
    special = tuple(n for n in special if min_n <= n <= max_n)
    branches = ([st.sampled_from(special)] if special else []) + ([edges] if edges is not None else [])
    return st.one_of(*branches, st.integers(min_n, max_n))


@functools.lru_cache(maxsize=16)  # immutable strategies, built once per argument
def _alibi_shapes(declared: frozenset[str]) -> st.SearchStrategy[str]:
    """One of the ``declared`` ALiBi slope shapes."""
    return st.sampled_from(sorted(declared))


@st.composite
def _modifiers(
    draw, caps: Capabilities, p: Problem, required: str | None, allowed: tuple[str, ...]
) -> Problem:
    """``p`` with the required modifier on and every other declared, allowed one on at random."""
    changes: dict = {}
    n = max(p.nq, p.nk)
    for name in MODIFIERS:
        if name not in allowed or not caps.declares_variant(name):
            continue
        if name != required and not draw(st.booleans()):
            continue
        if name == "window":
            changes["window"] = (draw(_window_side(n)), draw(_window_side(n)))
        elif name == "softcap":
            changes["softcap"] = draw(_SOFTCAP_VALUES)
        elif name == "alibi":
            changes["alibi"] = (draw(_alibi_shapes(frozenset(caps.alibi))), draw(_ALIBI_SLOPES))
        else:
            changes["sinks"] = draw(_SINK_SETTINGS)
    return p.replace(**changes)


@st.composite
def _fp8(draw, formats, shapes) -> tuple[str, str, str]:
    """An FP8 problem's ``(format, shape, placement)`` among ``formats`` and ``shapes``."""
    return (draw(st.sampled_from(sorted(formats))), draw(st.sampled_from(sorted(shapes))),
            draw(st.sampled_from(FP8_PLACEMENTS)))


def _fp8_dtypes(caps: Capabilities, variant: str, dtypes: tuple[torch.dtype, ...] | None
                ) -> tuple[Capabilities, tuple[torch.dtype, ...] | None]:
    """The declaration and dtypes a ``variant`` problem's base is drawn with: bfloat16 (o's dtype)
    for FP8 q, k, v whatever the 16-bit dtypes declared; float16 or bfloat16 q for an FP8 cache."""
    if variant == "fp8":
        return replace(caps, dtypes=frozenset({OUTPUT_DTYPE})), (OUTPUT_DTYPE,)
    if variant == "fp8-cache":
        allowed = tuple(d for d in sorted(CACHE_QUERY_DTYPES, key=str) if dtypes is None or d in dtypes)
        return caps, allowed
    return caps, dtypes


@st.composite
def _varlen(draw, caps: Capabilities, p: Problem, sizes: Sizes) -> Problem:
    count = draw(st.integers(1, MAX_SEQUENCES))
    m = caps.seqlen_multiple
    pairs = []
    budget = sizes.max_work // max(1, p.hq * max(p.d, p.dv))
    for _ in range(count):
        nq = draw(_lengths(sizes.max_n, m))
        nk = draw(_lengths(sizes.max_n, m)) if caps.unequal_lengths else nq
        if pairs and (nq * nk > budget):
            break
        budget -= nq * nk
        pairs.append((nq, nk))
    if not any(nq for nq, _ in pairs) or not any(nk for _, nk in pairs):
        pairs[0] = (max(1, m), max(1, m))
    return p.replace(
        b=len(pairs),
        nq=max(nq for nq, _ in pairs),
        nk=max(nk for _, nk in pairs),
        seqlens=tuple(pairs),
    )


@st.composite
def _decode(
    draw, caps: Capabilities, kv: KVCache, p: Problem, sizes: Sizes, paged: bool | None, splits: bool | None
) -> Problem:
    kinds = ([None] if kv.contiguous and paged is not True else []) + (
        list(kv.page_sizes) if paged is not False else []
    )
    if not kinds:
        reject()
    page = draw(st.sampled_from(kinds))
    nq = draw(st.one_of(st.just(1), st.integers(1, min(kv.max_queries, 8))))
    if page is None:
        capacity = draw(_lengths(max(2, 2 * sizes.max_n), min_n=max(1, nq // 2), special=()))
    else:
        capacity = page * draw(st.integers(1, max(1, (2 * sizes.max_n) // page + 1)))
    b = draw(st.integers(1, max(sizes.max_batch, 3)))
    # empty, full, as many keys as queries; one off a page's end (a length that ends a page, or
    # spills one key into the next)
    special = [0, capacity, min(nq, capacity)]
    if page is not None:
        special += [n for k in range(1, capacity // page + 1) for n in (k * page - 1, k * page + 1)
                    if 0 < n <= capacity]
    lengths = tuple(draw(_lengths(capacity, special=tuple(special))) for _ in range(b))
    use_splits = (kv.max_splits > 1 and draw(st.booleans())) if splits is None else splits
    num_splits = (
        draw(st.one_of(st.sampled_from([1, 2, kv.max_splits]), st.integers(1, kv.max_splits)))
        if use_splits
        else None
    )
    if num_splits is not None and num_splits > 1 and 0 not in lengths and draw(st.booleans()):
        # rows that see no key under split-KV: every split's partial is empty, and the combine
        # must still give o = 0, lse = -inf (not exp2(-inf - -inf) = NaN); rare among the
        # lengths above (a catalogue mutant survived 120 s of the CI profile without it)
        lengths = (*lengths[:-1], 0)
    return p.replace(b=b, nq=nq, nk=capacity, cache=lengths, page_size=page, num_splits=num_splits)


@st.composite
def variant_problems(
    draw,
    caps: Capabilities,
    variant: str,
    *,
    device: str = "cpu",
    sizes: Sizes = DEFAULT_SIZES,
    backward: bool = False,
    modifiers: tuple[str, ...] = MODIFIERS,
    mode: str | None = None,
    dtypes: tuple[torch.dtype, ...] | None = None,
    causal: bool | None = None,
    derive: Derive | None = None,
    where: Where | None = None,
    related: Related | None = None,
    dropout_ps: tuple[float, ...] = DROPOUT_PS,
) -> Problem:
    """A declared problem that uses ``variant``; other declared ``modifiers`` join at random.

    ``mode`` pins the entry point (``dense``, ``varlen``, ``kvcache``; default: drawn among the
    declared ones, or the one ``variant`` names); ``backward`` draws only problems whose
    gradients the kernel declares; ``dtypes`` and ``causal`` as for :func:`candidate_problems`;
    ``derive``, ``where`` and ``related`` as for :func:`problems` (the problem the property
    runs, made from the draw; its own condition on it; the problems it derives from it and
    runs too, every one declared); ``dropout_ps``: the dropout probabilities drawn for ``dropout``."""
    if not caps.declares_variant(variant):
        raise ValueError(f"variant {variant!r} is not declared")
    if mode is None:  # the row's entry points among the declared (its own one where it names one)
        entries = {"dense": True, "varlen": caps.varlen, "kvcache": caps.kvcache is not None and not backward}
        modes = BY_NAME[variant].modes
        mode = draw(st.sampled_from([m for m in modes if entries[m]] or list(modes)))
    base_caps, base_dtypes = _fp8_dtypes(caps, variant, dtypes)
    base: Problem = draw(candidate_problems(base_caps, device=device, sizes=sizes, dtypes=base_dtypes,
                                            causal=causal))
    if mode == "varlen":
        base = draw(_varlen(caps, base, sizes))
    elif mode == "kvcache":
        base = draw(
            _decode(
                caps,
                caps.kvcache,
                base,
                sizes,
                paged=True if variant == "paged" else None,
                splits=True if variant == "splits" else None,
            )
        )
    required = variant if variant in MODIFIERS else None
    p = draw(_modifiers(caps, base, required, modifiers))
    if variant == "dropout":
        p = p.replace(dropout=(draw(st.sampled_from(dropout_ps)), draw(dropout_seeds())))
    elif variant in ("fp8", "fp8-cache"):
        shapes = caps.fp8.descales if variant == "fp8" else caps.fp8.cache_scales
        p = p.replace(fp8=draw(_fp8(caps.fp8.formats, shapes)))
    return checked(caps, p, derive=derive, where=where, related=related, backward=backward)


# ------------------------------------------------------------------------- the error contract
#: Page sizes tried as undeclared (the ones a kernel does not list).
ODD_PAGE_SIZES = (2, 3, 5, 7, 12, 32, 48, 128)


def variant_axes(caps: Capabilities) -> list[str]:
    """The variant axes along which a kernel declares less than everything: modifiers of every
    entry point or of the training ones (dropout, FP8 inputs) it does not take, ALiBi shapes,
    sequence-length granularity, modifiers without a backward, FP8 formats and descale shapes
    and, for a decode entry point, page sizes, a contiguous cache, splits and queries beyond its
    limits and an FP8 cache."""
    axes = [v.name for v in TABLE if v.entry in ("any", "training") and not caps.declares_variant(v.name)]
    kv = caps.kvcache
    fp8 = caps.fp8
    if fp8 is not None and (fp8.descales or fp8.cache_scales) and set(FORMATS) - fp8.formats:
        axes.append("fp8-format")
    if fp8 is not None and fp8.descales and set(DESCALE_SHAPES) - fp8.descales:
        axes.append("fp8-descale-shape")
    if kv is not None:
        if not caps.declares_variant("fp8-cache"):
            axes.append("fp8-cache")
        elif set(CACHE_SCALE_SHAPES) - fp8.cache_scales:
            axes.append("fp8-cache-scale-shape")
        axes += ["splits-over", "queries-over"]
        if any(size not in kv.page_sizes for size in ODD_PAGE_SIZES):
            axes.append("page-size")
        if not kv.contiguous:
            axes.append("contiguous")
    if caps.alibi and caps.alibi != ALIBI_SHAPES:
        axes.append("alibi-shape")
    if caps.seqlen_multiple > 1:
        axes.append("granularity")
    if caps.backward:
        axes += [
            f"backward-{v}" for v in MODIFIERS if caps.declares_variant(v) and v not in caps.variant_backward
        ]
    return axes


@st.composite
def undeclared_variant_problems(
    draw, caps: Capabilities, *, device: str = "cpu", sizes: Sizes = DEFAULT_SIZES
) -> Problem:
    """A declared dense problem given one variant the kernel does not declare (or a sequence
    length off its ``seqlen_multiple``, or a variant's backward it does not declare)."""
    axis = draw(st.sampled_from(variant_axes(caps)))
    small = Sizes(max_n=min(sizes.max_n, 40), max_head_dim=64)
    # an FP8 axis's problem is bfloat16's (o's) or a 16-bit decode's, whatever dtypes are declared
    base = replace(caps, dtypes=caps.dtypes | {OUTPUT_DTYPE}) if axis.startswith("fp8") else caps
    p: Problem = draw(problems(base, device=device, sizes=small))
    if axis.startswith("fp8"):
        p = draw(_undeclared_fp8(caps, axis, p, small))
    elif axis in ("splits-over", "queries-over", "page-size", "contiguous"):
        kv = caps.kvcache
        p = draw(_decode(caps, kv, p, small, paged=None, splits=None))
        if axis == "splits-over":
            p = p.replace(num_splits=kv.max_splits + draw(st.integers(1, 3)))
        elif axis == "queries-over":
            p = p.replace(nq=kv.max_queries + 1)
        elif axis == "contiguous":
            p = p.replace(page_size=None)
        else:
            size = draw(st.sampled_from([s for s in ODD_PAGE_SIZES if s not in kv.page_sizes]))
            pages = draw(st.integers(1, 3))
            lengths = tuple(min(n, size * pages) for n in p.cache)
            p = p.replace(page_size=size, nk=size * pages, cache=lengths)
    elif axis.startswith("backward-"):
        p = draw(_modifiers(caps, p, axis.removeprefix("backward-"), (axis.removeprefix("backward-"),)))
    elif axis == "window":
        p = p.replace(window=(draw(st.integers(0, 4)), draw(st.integers(-1, 4))))
    elif axis == "softcap":
        p = p.replace(softcap=draw(st.sampled_from(SOFTCAPS)))
    elif axis == "alibi":
        p = p.replace(alibi=(draw(st.sampled_from(sorted(ALIBI_SHAPES))), 0.5))
    elif axis == "alibi-shape":
        p = p.replace(alibi=(draw(st.sampled_from(sorted(ALIBI_SHAPES - caps.alibi))), 0.5))
    elif axis == "sinks":
        p = p.replace(sinks=draw(st.sampled_from(sorted(SINKS))))
    elif axis == "dropout":  # p > 0: an answer that ignores it is wrong (p = 0 would be right)
        p = p.replace(dropout=(draw(st.sampled_from(DROPOUT_PS[1:])), draw(dropout_seeds())))
    else:
        m = caps.seqlen_multiple
        p = p.replace(nq=p.nq + draw(st.integers(1, m - 1)))
    if not axis.startswith("backward-"):
        assume(caps.must_raise(p))
    return p


@st.composite
def _undeclared_fp8(draw, caps: Capabilities, axis: str, p: Problem, sizes: Sizes) -> Problem:
    """Declared problem ``p`` made an FP8 one outside the declaration along ``axis``: FP8 q, k, v
    (``fp8``) or an FP8 cache (``fp8-cache``) the kernel does not take, or a format or descale
    shape it does not list."""
    fp8 = caps.fp8
    formats, shapes = set(FORMATS), set(DESCALE_SHAPES)
    cache = axis in ("fp8-cache", "fp8-cache-scale-shape") or (
        axis == "fp8-format" and not fp8.descales)
    if axis == "fp8-format":
        formats -= fp8.formats
        shapes = set(fp8.cache_scales if cache else fp8.descales)
    elif axis == "fp8-descale-shape":
        shapes -= fp8.descales
    elif axis == "fp8-cache-scale-shape":
        shapes = set(CACHE_SCALE_SHAPES) - fp8.cache_scales
    elif cache:
        shapes = set(CACHE_SCALE_SHAPES)
    if cache:
        p = draw(_decode(caps, caps.kvcache, p, sizes, paged=None, splits=None))
        p = p.replace(dtype=draw(st.sampled_from(sorted(CACHE_QUERY_DTYPES, key=str))))
    else:
        p = p.replace(dtype=OUTPUT_DTYPE)
    return p.replace(fp8=draw(_fp8(formats, shapes)))


def _set_cu(inp: KernelInputs, which: int, values: list[int]) -> None:
    cu = inp.args[3 + which]
    inp.args = (
        *inp.args[: 3 + which],
        torch.tensor(values, dtype=cu.dtype, device=cu.device),
        *inp.args[4 + which :],
    )


def _cu_not_monotone(inp: KernelInputs) -> None:
    cu = inp.args[3].tolist()
    cu[1] = cu[-1] + 1  # jumps past the end, then comes back
    _set_cu(inp, 0, cu)


def _cu_short_end(inp: KernelInputs) -> None:
    cu = inp.args[4].tolist()
    cu[-1] -= 1
    _set_cu(inp, 1, cu)


def _cu_bad_start(inp: KernelInputs) -> None:
    _set_cu(inp, 0, [1, *inp.args[3].tolist()[1:]])


def _cu_int64(inp: KernelInputs) -> None:
    inp.args = (*inp.args[:3], inp.args[3].long(), *inp.args[4:])


def _cu_lengths_differ(inp: KernelInputs) -> None:
    cu = inp.args[4]
    inp.args = (*inp.args[:4], torch.cat([cu, cu[-1:]]), *inp.args[5:])


def _max_seqlen_small(inp: KernelInputs) -> None:
    inp.args = (*inp.args[:5], inp.args[5] - 1, *inp.args[6:])


def _cache_over_capacity(inp: KernelInputs) -> None:
    k = inp.args[1]
    table = inp.kwargs.get("block_table")
    capacity = k.shape[1] if table is None else table.shape[1] * k.shape[1]
    inp.kwargs["cache_seqlens"] = inp.kwargs["cache_seqlens"].clone().fill_(capacity + 1)


def _cache_negative(inp: KernelInputs) -> None:
    inp.kwargs["cache_seqlens"] = inp.kwargs["cache_seqlens"].clone().fill_(-1)


def _cache_int64(inp: KernelInputs) -> None:
    inp.kwargs["cache_seqlens"] = inp.kwargs["cache_seqlens"].long()


def _table_out_of_range(inp: KernelInputs) -> None:
    table = inp.kwargs["block_table"].clone()
    table[0, 0] = inp.args[1].shape[0]  # one past the last page
    inp.kwargs["block_table"] = table


def _table_negative(inp: KernelInputs) -> None:
    table = inp.kwargs["block_table"].clone()
    table[-1, -1] = -1
    inp.kwargs["block_table"] = table


def _alibi_wrong_shape(inp: KernelInputs) -> None:
    slopes = inp.kwargs["alibi_slopes"]
    inp.kwargs["alibi_slopes"] = torch.cat([slopes, slopes[..., :1]], dim=-1)


def _window_below(inp: KernelInputs) -> None:
    inp.kwargs["window_size"] = (-2, inp.kwargs["window_size"][1])


def _softcap_negative(inp: KernelInputs) -> None:
    inp.kwargs["softcap"] = -inp.kwargs["softcap"]


def _sinks_wrong_shape(inp: KernelInputs) -> None:
    z = inp.kwargs["sinks"].detach()
    inp.kwargs["sinks"] = torch.cat([z, z[:1]])


def _sinks_as(dtype: torch.dtype) -> Callable[[KernelInputs], None]:
    """Sinks in ``dtype``: the contract's are float32 whatever the inputs' dtype."""

    def corrupt(inp: KernelInputs) -> None:
        inp.kwargs["sinks"] = inp.kwargs["sinks"].detach().to(dtype)

    return corrupt


def _dropout_set(name: str, value: object) -> Callable[[KernelInputs], None]:
    """The dropout keyword ``name`` set to ``value`` (malformed whatever the drawn p and seed)."""

    def corrupt(inp: KernelInputs) -> None:
        inp.kwargs[name] = value

    return corrupt


def _dropout_without_seed(inp: KernelInputs) -> None:
    inp.kwargs["dropout_p"] = 0.5
    del inp.kwargs["dropout_seed"]


def _scale_wrong_shape(name: str) -> Callable[[KernelInputs], None]:
    """Descale ``name`` with its entries and one more laid out (1, 1, n + 1): no shape of the
    contract's ((), (Hkv,), (B, Hkv)) whatever the problem's sizes."""

    def corrupt(inp: KernelInputs) -> None:
        d = inp.kwargs[name].reshape(1, 1, -1)
        inp.kwargs[name] = torch.cat([d, d[..., :1]], dim=-1)

    return corrupt


def _scale_as(name: str, dtype: torch.dtype) -> Callable[[KernelInputs], None]:
    """Descale ``name`` in ``dtype``: the contract's are float32."""

    def corrupt(inp: KernelInputs) -> None:
        inp.kwargs[name] = inp.kwargs[name].to(dtype)

    return corrupt


def _args_as(positions: tuple[int, ...],
             dtype: Callable[[torch.dtype], torch.dtype]) -> Callable[[KernelInputs], None]:
    """The positional tensors at ``positions`` converted to ``dtype(their dtype)`` (their values
    kept), the descales left as they are."""

    def corrupt(inp: KernelInputs) -> None:
        args = list(inp.args)
        for i in positions:
            args[i] = args[i].float().to(dtype(args[i].dtype))
        inp.args = tuple(args)

    return corrupt


def _other_format(dtype: torch.dtype) -> torch.dtype:
    """The FP8 format that is not ``dtype``."""
    return next(f for f in FORMATS.values() if f != dtype)


#: name -> (the variant whose inputs it breaks, the corruption, applied in place).
MALFORMED: dict[str, tuple[str, Callable[[KernelInputs], None]]] = {
    "cu_seqlens not monotone": ("varlen", _cu_not_monotone),
    "cu_seqlens_k not ending at Tk": ("varlen", _cu_short_end),
    "cu_seqlens_q not starting at 0": ("varlen", _cu_bad_start),
    "cu_seqlens int64": ("varlen", _cu_int64),
    "cu_seqlens_q and cu_seqlens_k lengths differ": ("varlen", _cu_lengths_differ),
    "max_seqlen_q below a sequence's length": ("varlen", _max_seqlen_small),
    "cache_seqlens above capacity": ("kvcache", _cache_over_capacity),
    "cache_seqlens negative": ("kvcache", _cache_negative),
    "cache_seqlens int64": ("kvcache", _cache_int64),
    "block_table past the last page": ("paged", _table_out_of_range),
    "block_table negative": ("paged", _table_negative),
    "alibi_slopes of the wrong length": ("alibi", _alibi_wrong_shape),
    "window_size below -1": ("window", _window_below),
    "softcap negative": ("softcap", _softcap_negative),
    "sinks of the wrong length": ("sinks", _sinks_wrong_shape),
    "sinks float16": ("sinks", _sinks_as(torch.float16)),
    "sinks float64": ("sinks", _sinks_as(torch.float64)),
    "dropout_p of 1": ("dropout", _dropout_set("dropout_p", 1.0)),
    "dropout_p negative": ("dropout", _dropout_set("dropout_p", -0.1)),
    "dropout_p without a seed": ("dropout", _dropout_without_seed),
    "dropout_seed not an int": ("dropout", _dropout_set("dropout_seed", 3.0)),
    "dropout_seed negative": ("dropout", _dropout_set("dropout_seed", -1)),
    "q_descale of the wrong shape": ("fp8", _scale_wrong_shape("q_descale")),
    "k_descale float16": ("fp8", _scale_as("k_descale", torch.float16)),
    "descales with bfloat16 q, k, v": ("fp8", _args_as((0, 1, 2), lambda _: torch.bfloat16)),
    "k in the other FP8 format than q": ("fp8", _args_as((1,), _other_format)),
    "v_scale of the wrong shape": ("fp8-cache", _scale_wrong_shape("v_scale")),
    "k_scale float64": ("fp8-cache", _scale_as("k_scale", torch.float64)),
    "FP8 cache with float32 queries": ("fp8-cache", _args_as((0,), lambda _: torch.float32)),
}


def malformed_inputs(p: Problem, corruption: str) -> KernelInputs:
    """The inputs of ``p``'s call with the malformed input ``corruption`` (a :data:`MALFORMED`
    name) applied: what the error contract passes, and what its failure's repro rebuilds."""
    inp = p.kernel_inputs()
    MALFORMED[corruption][1](inp)
    return inp


def malformed_for(caps: Capabilities) -> list[str]:
    """The malformed inputs that apply to what the kernel declares."""
    return [name for name, (variant, _) in MALFORMED.items() if caps.declares_variant(variant)]
