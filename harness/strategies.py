"""Hypothesis strategies that draw whole problems from a kernel's declared capabilities.

:func:`problems` draws only declared problems; :func:`undeclared_problems` draws problems that
step outside the declaration along exactly one axis (a dtype, a head dim, causal, Nq != Nk, GQA,
an explicit scale, a strided layout, a sequence length, a tile size): the kernel must refuse
those with a clear error or answer them correctly.

Sizes are bounded by :class:`Sizes`, chosen per run by conftest (profile, device, interpreter).
Sequence lengths favour 1 and small primes, and tile edges (:func:`edge_lengths`: a multiple of
16, 64 or 128 and one off it, about a third of the draws), so full tiles and tails that do not
fill a tile are both drawn often.

Every problem a property runs goes through the kernel's declaration (:func:`declared`): the
drawn one, or the one the property makes of it (``derive=``), and those it derives and runs
too (``related=``).

The strategies that depend only on hashable arguments (:func:`edge_lengths`, the sequence
lengths and head dims :func:`candidate_problems` draws) are built once per arguments, by
``functools.lru_cache``: a strategy is immutable and draws the same values whether it is shared
or new, and a shared one is not built and validated by Hypothesis again at every draw.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch
from hypothesis import assume, reject
from hypothesis import strategies as st

from ..contract.capabilities import ALL_DTYPES, Capabilities
from ..contract.problem import DISTRIBUTIONS, LAYOUTS, Problem

#: Head dims worth trying first: odd, non-power-of-two and the common ones.
FAVOURITE_HEAD_DIMS = (1, 8, 16, 24, 32, 40, 64, 72, 80, 96, 128, 200, 256)
#: Head dims no kernel claims by default (the contract's head dims are 1..256: capabilities.py).
OVERSIZED_HEAD_DIMS = (257, 264, 288, 320, 512)
_DTYPE_ORDER = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass(frozen=True)
class Sizes:
    """Upper bounds for drawn problems (keep CPU examples cheap)."""

    max_n: int = 64
    max_batch: int = 2
    max_kv_heads: int = 2
    max_group: int = 3
    max_head_dim: int = 256
    #: Above this many score elements (B * Hq * Nq * Nk * D), the draw prefers smaller sizes.
    max_work: int = 2_000_000
    #: Sequence lengths of the long-sequence property (properties/test_long.py), both ends in.
    long_n: tuple[int, int] = (129, 260)


DEFAULT_SIZES = Sizes()


@dataclass
class Declarations:
    """What the declaration check saw of one property run's draws (:func:`drawing`): how many
    problems it passed, and the reasons of those it rejected, by count."""

    passed: int = 0
    refused: Counter[str] = field(default_factory=Counter)

    def nothing_declared(self) -> str | None:
        """When no draw passed the check and some were refused by it: the refusals, most frequent
        first. Draws that met the property's own conditions (``where``) reached the check, so this
        means the kernel declares none of the problems the property needs, not that the
        property's strategy draws nothing."""
        if self.passed or not self.refused:
            return None
        total = sum(self.refused.values())
        top = "; ".join(f"{reason} ({count})" for reason, count in self.refused.most_common(3))
        return f"all {total} drawn problems are undeclared: {top}"


#: The record of the draws under way (:func:`drawing`): a context variable, so that the
#: strategies, which Hypothesis draws, reach the record of the ``run_property`` call drawing them.
_DRAWING: ContextVar[Declarations | None] = ContextVar("flashprop_drawing", default=None)


@contextmanager
def drawing() -> Iterator[Declarations]:
    """A fresh record of the declaration check for the draws made while the context lasts (one
    property run: ``harness.check.run_property``)."""
    token = _DRAWING.set(record := Declarations())
    try:
        yield record
    finally:
        _DRAWING.reset(token)


def _drawn() -> Declarations:
    """The record of the draws under way (a throwaway one outside :func:`drawing`)."""
    return _DRAWING.get() or Declarations()


def declared(
    caps: Capabilities, p: Problem, related: Iterable[Problem] = (), *, backward: bool = False
) -> Problem:
    """``p`` when the kernel declares it (and its gradients, with ``backward``) and each of
    ``related`` (the problems a property derives from it and runs too); otherwise the draw is
    rejected, its first reason noted in the record of the draws (:func:`drawing`; the checks stop
    there: a dispatcher's check builds tensors)."""
    reason = _first_reason(caps, p, related, backward)
    drawn = _drawn()
    if reason is not None:
        drawn.refused[reason.splitlines()[0]] += 1
        reject()
    drawn.passed += 1
    return p


def _first_reason(caps: Capabilities, p: Problem, related: Iterable[Problem], backward: bool) -> str | None:
    """The first reason ``p`` or one of ``related`` is not declared; with ``backward``, their
    gradients too (a backward property takes the gradients of every problem it runs)."""
    runs = (p, *related)
    for q in runs:
        reason = caps.unsupported_reason(q)
        if reason is not None:
            return reason
    if not backward:
        return None
    return next((why for q in runs if (why := caps.backward_reason(q)) is not None), None)


def device_sizes(device: str, max_n: int | None = None) -> Sizes:
    """The suite's size bounds on a device: small on the CPU (the Triton interpreter), larger on a
    GPU; ``max_n`` (``--max-n``) overrides the sequence-length bound."""
    if device == "cuda":
        return Sizes(max_n=max_n or 300, max_batch=2, max_kv_heads=3, max_group=4,
                     max_work=20_000_000, long_n=(512, 1100))
    return Sizes(max_n=max_n or 48, max_work=400_000)


#: Value distributions drawn twice as often as the others: rows whose every logit lies beyond
#: float32 ``exp``'s range (where public bugs live), so that they stay frequent after the
#: variants that tame them (a small softcap, a steep ALiBi) take their share
#: (``meta/test_meta_draws.py`` holds each strategy to 5% of its draws).
EXTREME_DISTRIBUTIONS = ("overflow", "underflow")


def _weighted(dists: tuple[str, ...]) -> tuple[str, ...]:
    """``dists`` with each of :data:`EXTREME_DISTRIBUTIONS` among them listed twice."""
    return (*dists, *(d for d in dists if d in EXTREME_DISTRIBUTIONS))


#: Tile widths whose multiples, and one off them, lengths favour: 16 (the MMA tile and the
#: smallest block kernels use), 64 and 128 (the common query and key blocks).
TILE_EDGES = (16, 64, 128)
#: Small lengths drawn on purpose: one row, one-element tiles, primes that divide no tile.
SMALL_LENGTHS = (1, 2, 3, 5, 7, 13)


def tile_edges(min_n: int, max_n: int, multiple: int = 1) -> dict[int, list[int]]:
    """Per tile width ``t`` of :data:`TILE_EDGES`: the lengths ``k t - 1, k t, k t + 1``
    (``k >= 1``) in ``min_n..max_n`` that are multiples of ``multiple``; widths with none left
    out (on the CPU's bound of 48, only 16's)."""
    edges = {}
    for t in TILE_EDGES:
        near = sorted({k * t + o for k in range(1, max_n // t + 2) for o in (-1, 0, 1)})
        near = [n for n in near if min_n <= n <= max_n and n % multiple == 0]
        if near:
            edges[t] = near
    return edges


@functools.lru_cache(maxsize=256)  # immutable strategies, built once per arguments
def edge_lengths(min_n: int, max_n: int, multiple: int = 1) -> st.SearchStrategy[int] | None:
    """A length at a tile edge (:func:`tile_edges`): a tile width first, each as likely (so a
    multiple of 128, or one off it, is as likely as one of 16 where the bounds allow both),
    then one of its lengths; ``None`` when no edge lies in ``min_n..max_n``."""
    edges = tile_edges(min_n, max_n, multiple)
    if not edges:
        return None
    return st.one_of(*(st.sampled_from(lengths) for lengths in edges.values()))


@functools.lru_cache(maxsize=256)  # immutable strategies, built once per arguments
def _seq_lens(max_n: int, min_n: int = 1, multiple: int = 1) -> st.SearchStrategy[int]:
    """Sequence lengths in ``min_n..max_n``, each branch as likely: small ones (1, small primes),
    tile edges (:func:`edge_lengths`) and any; only multiples of ``multiple`` when the kernel
    declares a granularity (tile edges among them)."""
    edges = edge_lengths(min_n, max_n, multiple)
    if multiple > 1:
        low = max(1, -(-min_n // multiple))
        multiples = st.integers(low, max(low, max_n // multiple)).map(lambda i: i * multiple)
        return multiples if edges is None else st.one_of(multiples, edges)
    small = [n for n in SMALL_LENGTHS if min_n <= n <= max_n]
    branches = ([st.sampled_from(small)] if small else []) + ([edges] if edges is not None else [])
    return st.one_of(*branches, st.integers(min_n, max_n))


def _dims(allowed: Collection[int], max_d: int) -> st.SearchStrategy[int]:
    """Head dims among ``allowed`` up to ``max_d``, each branch as likely: the favourites
    (:data:`FAVOURITE_HEAD_DIMS`; any when none is allowed) and any."""
    return _dims_of(tuple(allowed), max_d)


@functools.lru_cache(maxsize=64)  # immutable strategies, built once per arguments
def _dims_of(allowed: tuple[int, ...], max_d: int) -> st.SearchStrategy[int]:
    """:func:`_dims` of ``allowed`` as a tuple (a cache key)."""
    fav = [d for d in FAVOURITE_HEAD_DIMS if d in allowed and d <= max_d]
    rest = sorted(d for d in allowed if d <= max_d)
    if not rest:
        return st.nothing()
    return st.one_of(st.sampled_from(fav or rest), st.sampled_from(rest))


def _dtypes(caps: Capabilities, only: tuple[torch.dtype, ...] | None) -> list[torch.dtype]:
    return [dt for dt in _DTYPE_ORDER if dt in caps.dtypes and (only is None or dt in only)]


@st.composite
def candidate_problems(
    draw,
    caps: Capabilities,
    *,
    device: str = "cpu",
    sizes: Sizes = DEFAULT_SIZES,
    dtypes: tuple[torch.dtype, ...] | None = None,
    causal: bool | None = None,
    unequal: bool | None = None,
    explicit_scale: bool | None = None,
    layouts: tuple[str, ...] = LAYOUTS,
    dists: tuple[str, ...] = DISTRIBUTIONS,
    min_n: int = 1,
    head_dims: tuple[int, ...] | None = None,
    default_tiles: bool = False,
) -> Problem:
    """A problem drawn within the kernel's declared axes, before its known limits are checked
    (:func:`problems` checks them; :func:`variant_problems` adds a variant first). Keyword
    arguments pin an axis (``None``: draw it); ``min_n`` bounds both sequence lengths from below,
    ``head_dims`` narrows the head dims drawn (those declared among them), ``default_tiles``
    leaves the tiles to the kernel."""
    allowed = _dtypes(caps, dtypes)
    if not allowed:  # an FP8-only kernel's 16-bit problems, say: none to draw, and the skip says why
        _drawn().refused["no dtype of the draw declared (Capabilities.dtypes)"] += 1
        reject()
    dtype = draw(st.sampled_from(allowed))
    hkv = draw(st.integers(1, sizes.max_kv_heads))
    group = draw(st.integers(1, sizes.max_group)) if caps.gqa else 1
    b = draw(st.integers(1, sizes.max_batch))
    max_n = sizes.max_n if caps.max_seqlen is None else min(sizes.max_n, caps.max_seqlen)
    m = caps.seqlen_multiple
    nq = draw(_seq_lens(max_n, min_n, m))
    if unequal is None:
        unequal = caps.unequal_lengths and draw(st.booleans())
    nk = draw(_seq_lens(max_n, min_n, m).filter(lambda n: n != nq)) if unequal else nq
    dims = caps.head_dims if head_dims is None else [d for d in head_dims if d in caps.head_dims]
    dv_dims = caps.dv_dims if head_dims is None else [d for d in head_dims if d in caps.dv_dims]
    d = draw(_dims(dims, sizes.max_head_dim))
    dv = d if caps.dv_equals_d or draw(st.booleans()) else draw(_dims(dv_dims, sizes.max_head_dim))
    is_causal = (caps.causal and draw(st.booleans())) if causal is None else causal
    use_scale = (caps.custom_scale and draw(st.booleans())) if explicit_scale is None else explicit_scale
    scale = draw(st.sampled_from([0.03125, 0.125, 0.5, 1.0, 2.0])) if use_scale else None
    layout = draw(st.sampled_from(layouts if caps.any_strides else ("contiguous",)))
    # dO's own layout, shrinking to contiguous (None: half the draws where every layout is
    # allowed): the backward properties hand it over
    strided = tuple(x for x in layouts if x != "contiguous") if caps.any_strides else ()
    grad_layouts = (None, None, None, *strided) if strided else (None,)
    grad_layout = draw(st.sampled_from(grad_layouts))
    # A declared tile or none at all: the default path (autotuned on a GPU) is what users call.
    def tile(declared: tuple[int, ...]) -> int | None:
        if not declared or default_tiles:
            return None
        return draw(st.one_of(st.sampled_from(declared), st.none()))

    block_m, block_n = tile(caps.block_m), tile(caps.block_n)
    p = Problem(
        b=b,
        hq=hkv * group,
        hkv=hkv,
        nq=nq,
        nk=nk,
        d=d,
        dv=dv,
        dtype=dtype,
        causal=is_causal,
        scale=scale,
        layout=layout,
        dist=draw(st.sampled_from(_weighted(dists))),
        seed=draw(st.integers(0, 2**31 - 1)),
        block_m=block_m,
        block_n=block_n,
        device=device,
        grad_layout=grad_layout,
    )
    if b * p.hq * nq * nk * max(d, dv) > sizes.max_work:
        p = (
            p.replace(b=1, hq=hkv, hkv=hkv)
            if hkv * nq * nk * max(d, dv) <= sizes.max_work
            else p.replace(b=1, hq=1, hkv=1)
        )
    return p


#: What a property makes of a drawn problem: the problem it runs (``derive``), its own condition
#: on it (``where``) and the other problems it derives from it and runs too (``related``).
Derive = Callable[[Problem], Problem]
Where = Callable[[Problem], bool]
Related = Callable[[Problem], Iterable[Problem]]


def checked(
    caps: Capabilities,
    p: Problem,
    *,
    derive: Derive | None = None,
    where: Where | None = None,
    related: Related | None = None,
    backward: bool = False,
) -> Problem:
    """The problem a property runs, made from draw ``p`` by ``derive`` (``p`` itself without),
    when it meets ``where`` and the kernel declares it and each of ``related(it)``
    (:func:`declared`); otherwise the draw is rejected."""
    if derive is not None:
        p = derive(p)
    if where is not None and not where(p):
        reject()
    return declared(caps, p, related(p) if related is not None else (), backward=backward)


@st.composite
def problems(
    draw,
    caps: Capabilities,
    *,
    derive: Derive | None = None,
    where: Where | None = None,
    related: Related | None = None,
    backward: bool = False,
    **axes: Any,
) -> Problem:
    """A problem the kernel declares; ``axes`` pin or bound what is drawn, as for
    :func:`candidate_problems` (``device``, ``sizes``, ``dtypes``, ``causal``, ...).

    ``derive``: what the property makes of the draw (the smallest tiles, Nq and Nk swapped, a
    neutral variant setting), the problem it runs and the one returned; ``where``: the
    property's own condition on that problem, checked before the declaration; ``related``: the
    problems the property derives from it and runs too, which must be declared as well. A
    property whose draws all meet ``where`` and fail the declaration is skipped, naming the
    declaration (:meth:`Declarations.nothing_declared`). ``backward``: the property takes the
    gradients, which must be declared too (:meth:`Capabilities.backward_reason`)."""
    p = draw(candidate_problems(caps, **axes))
    return checked(caps, p, derive=derive, where=where, related=related, backward=backward)


AXES = ("dtype", "head_dim", "causal", "unequal", "gqa", "scale", "layout", "seqlen", "block_m", "block_n")


def undeclared_axes(caps: Capabilities) -> list[str]:
    """The axes along which a kernel declares less than full support."""
    axes = []
    if set(ALL_DTYPES) - set(caps.dtypes):
        axes.append("dtype")
    axes.append("head_dim")  # every kernel has undeclared head dims (at least > 256)
    if not caps.causal:
        axes.append("causal")
    if not caps.unequal_lengths:
        axes.append("unequal")
    if not caps.gqa:
        axes.append("gqa")
    if not caps.custom_scale:
        axes.append("scale")
    if not caps.any_strides:
        axes.append("layout")
    if caps.max_seqlen is not None:
        axes.append("seqlen")
    if caps.block_m:
        axes.append("block_m")
    if caps.block_n:
        axes.append("block_n")
    return axes


@st.composite
def undeclared_problems(
    draw, caps: Capabilities, *, device: str = "cpu", sizes: Sizes = DEFAULT_SIZES
) -> Problem:
    """A declared problem pushed outside the declaration along one undeclared axis."""
    axis = draw(st.sampled_from(undeclared_axes(caps)))
    base: Problem = draw(
        problems(caps, device=device, sizes=Sizes(max_n=min(sizes.max_n, 40), max_head_dim=64))
    )
    if axis == "dtype":
        p = base.replace(dtype=draw(st.sampled_from([d for d in _DTYPE_ORDER if d not in caps.dtypes])))
    elif axis == "head_dim":
        outside = [d for d in (*range(1, 257), *OVERSIZED_HEAD_DIMS) if d not in caps.head_dims]
        d = draw(st.sampled_from(outside))
        p = base.replace(
            d=d, dv=d if caps.dv_equals_d else base.dv, nq=min(base.nq, 8), nk=min(base.nk, 8), b=1
        )
    elif axis == "causal":
        p = base.replace(causal=True)
    elif axis == "unequal":
        p = base.replace(nk=base.nq + draw(st.integers(1, 9)))
    elif axis == "gqa":
        p = base.replace(hq=2 * base.hkv)
    elif axis == "scale":
        p = base.replace(scale=0.5)
    elif axis == "layout":
        p = base.replace(layout=draw(st.sampled_from(LAYOUTS[1:])))
    elif axis == "seqlen":
        p = base.replace(nq=caps.max_seqlen + 1, nk=caps.max_seqlen + 1)
    else:
        declared = caps.block_m if axis == "block_m" else caps.block_n
        tile = draw(st.sampled_from([t for t in (2, 5, 12, 24, 48, 100, 256) if t not in declared]))
        p = base.replace(**{axis: tile})
    assume(caps.must_raise(p))
    return p
