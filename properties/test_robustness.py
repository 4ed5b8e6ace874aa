"""Robustness: the corners where fused kernels go wrong, each drawn on purpose.

- empty rows (causal, bottom-right, Nq > Nk): the first Nq - Nk rows see no key, so o = 0 and
  dq = 0 exactly, lse = -inf, and no NaN anywhere (0/0 and -inf - -inf are the usual culprits);
- a single query or key (N = 1): one-element softmax, one-row tiles;
- extreme logits ("large": logits of order +-100, "negative": every logit very negative,
  "overflow" / "underflow": every logit of a row above +88 / below -88, beyond float32 exp's
  range): o stays finite (the running max must be subtracted before exp);
- NaN-poisoned views ("sliced", "strided": NaN in every neighbouring element) with lengths that
  are not multiples of the tile: an out-of-bounds read of a tile tail turns into NaN in o;
- odd head dims (1, 40, 72, 80, 96, 200): padded head-dim loads and masks.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from flashprop.contract.capabilities import Capabilities
from flashprop.contract.problem import Problem
from flashprop.contract.registry import Kernel
from flashprop.harness.check import (
    Outputs,
    PropertyFailure,
    assert_close_to_golden,
    failure,
    run_kernel,
    run_property,
)
from flashprop.harness.strategies import Sizes, candidate_problems, declared, problems
from hypothesis import strategies as st

ODD_HEAD_DIMS = (1, 40, 72, 80, 96, 200)
#: Value distributions of the extreme-logits property (contract/problem.py): logits of order
#: +-100, every logit very negative, every logit of a row above +88 or below -88.
EXTREME_DISTRIBUTIONS = ("large", "negative", "overflow", "underflow")
#: Lengths that are not a multiple of 16 are not a multiple of any power-of-two tile >= 16.
COMMON_TILE = 16


def _names(caps: Capabilities, p: Problem) -> tuple[str, ...]:
    """What to compare with the golden: o and lse, and the gradients where the kernel declares
    them for ``p`` (:meth:`Capabilities.backward_reason`: backward declared, no backward limit)."""
    return ("o", "lse", "dq", "dk", "dv") if caps.backward_reason(p) is None else ("o", "lse")


def _golden_check(prop: str) -> Callable[[Kernel, Problem], None]:
    """A check running the kernel (backward too when declared) and comparing with the golden."""

    def check(kernel: Kernel, p: Problem) -> None:
        names = _names(kernel.capabilities, p)
        out = run_kernel(kernel, p, prop, backward="dq" in names)
        assert_close_to_golden(kernel, p, prop, out, names)

    return check


def _nan_free(out: Outputs) -> list[str]:
    return [f"NaN in {name} ({int(torch.isnan(t).sum())} elements)"
            for name in ("o", "lse", "dq", "dk", "dv")
            if (t := getattr(out, name)) is not None and torch.isnan(t).any()]


# --------------------------------------------------------------------------- empty rows


def test_empty_rows(run, kernel, device, sizes):
    """Bottom-right causal with Nq > Nk: rows i < Nq - Nk see no key. There o == 0 and dq == 0
    exactly and lse == -inf; nothing is NaN; the rest agrees with the golden."""
    caps = kernel.capabilities
    if not caps.causal or not caps.unequal_lengths:
        pytest.skip(f"kernel {kernel.name} does not declare causal with Nq != Nk")
    if caps.causal_alignment != "bottom-right":
        pytest.skip(f"kernel {kernel.name} declares {caps.causal_alignment} causal alignment: "
                    "every row sees key 0, there are no empty rows")
    prop = "empty-rows"

    def check(kernel: Kernel, p: Problem) -> None:
        names = _names(caps, p)
        out = run_kernel(kernel, p, prop, backward="dq" in names)
        rows = (slice(None), slice(None), slice(0, p.nq - p.nk))
        bad = _nan_free(out)
        if out.o[rows].count_nonzero():
            bad.append(f"o != 0 on the empty rows 0..{p.nq - p.nk - 1}")
        if out.lse is not None and not bool((out.lse[rows] == float("-inf")).all()):
            bad.append(f"lse != -inf on the empty rows: {out.lse[rows].flatten()[:8].tolist()}")
        if out.dq is not None and out.dq[rows].count_nonzero():
            bad.append("dq != 0 on the empty rows")
        if bad:
            raise PropertyFailure(failure(kernel, p, prop, bad, backward=out.dq is not None))
        assert_close_to_golden(kernel, p, prop, out, names)

    strategy = problems(caps, device=device, sizes=sizes, causal=True, unequal=True,
                        derive=lambda p: p.replace(nq=max(p.nq, p.nk), nk=min(p.nq, p.nk)))
    run_property(run, kernel, prop, strategy, check, weight=0.5)


# --------------------------------------------------------------------------- N = 1


@st.composite
def _single_token(draw, caps: Capabilities, device: str, sizes: Sizes) -> Problem:
    p = draw(candidate_problems(caps, device=device, sizes=sizes))
    side = draw(st.sampled_from(("q", "k", "both") if caps.unequal_lengths else ("both",)))
    return declared(caps, p.replace(nq=p.nq if side == "k" else 1, nk=p.nk if side == "q" else 1))


def test_single_token(run, kernel, device, sizes):
    """Nq = 1, Nk = 1 or both: o, lse (and gradients) agree with the golden."""
    prop = "single-token"
    run_property(run, kernel, prop, _single_token(kernel.capabilities, device, sizes), _golden_check(prop),
                 weight=0.5)


# --------------------------------------------------------------------------- extreme logits


def test_extreme_logits(run, kernel, device, sizes):
    """Logits of order +-100 ("large"), all very negative ("negative"), or every logit of a row
    above +88 or below -88 ("overflow", "underflow"): o is finite everywhere
    (exp overflows or every term underflows unless the row max is subtracted), and o and lse
    agree with the golden."""
    prop = "extreme-logits"

    def check(kernel: Kernel, p: Problem) -> None:
        out = run_kernel(kernel, p, prop)
        if not bool(torch.isfinite(out.o).all()):
            bad = ~torch.isfinite(out.o)
            at = tuple(bad.nonzero()[0].tolist())
            raise PropertyFailure(failure(kernel, p, prop, [f"o is not finite in {int(bad.sum())} elements, "
                                                            f"first at {at}"]))
        assert_close_to_golden(kernel, p, prop, out, ("o", "lse"))

    strategy = problems(kernel.capabilities, device=device, sizes=sizes, dists=EXTREME_DISTRIBUTIONS)
    run_property(run, kernel, prop, strategy, check, weight=0.5)


# --------------------------------------------------------------------------- NaN-poisoned views


def _tile_tails(p: Problem) -> bool:
    """Nq and Nk both leave a partial tile: not a multiple of the drawn tile sizes (or of 16)."""
    return p.nq % (p.block_m or COMMON_TILE) != 0 and p.nk % (p.block_n or COMMON_TILE) != 0


def test_poisoned_views(run, kernel, device, sizes):
    """Views into NaN-filled buffers ("sliced": NaN around every dimension, "strided": NaN
    between head-dim elements) with partial tiles at both ends: a read outside the view (a
    tile tail, a wrong stride) picks up NaN, so o, lse (and gradients) must match the golden."""
    caps = kernel.capabilities
    if not caps.any_strides:
        pytest.skip(f"kernel {kernel.name} does not declare strided inputs")
    prop = "poisoned-views"
    strategy = problems(caps, device=device, sizes=sizes, layouts=("sliced", "strided"), where=_tile_tails)
    run_property(run, kernel, prop, strategy, _golden_check(prop), weight=0.5)


# --------------------------------------------------------------------------- odd head dims


@st.composite
def _odd_head_dim(draw, caps: Capabilities, device: str, sizes: Sizes, dims: list[int]) -> Problem:
    p = draw(candidate_problems(caps, device=device, sizes=sizes))
    d = draw(st.sampled_from(dims))
    dv = d if caps.dv_equals_d else draw(st.sampled_from((d, p.dv)))
    p = p.replace(d=d, dv=dv)
    if p.b * p.hq * p.nq * p.nk * max(d, dv) > sizes.max_work:  # keep the example cheap
        p = p.replace(b=1, hq=p.hq // p.hkv, hkv=1)
    while p.hq * p.nq * p.nk * max(d, dv) > sizes.max_work:
        p = p.replace(nq=max(1, p.nq // 2), nk=max(1, p.nk // 2))
    return declared(caps, p)


def test_odd_head_dims(run, kernel, device, sizes):
    """D in {1, 40, 72, 80, 96, 200} (those declared): o, lse (and gradients) match the golden."""
    caps = kernel.capabilities
    dims = [d for d in ODD_HEAD_DIMS if d in caps.head_dims and d <= sizes.max_head_dim]
    if not dims:
        pytest.skip(f"kernel {kernel.name} declares none of the head dims {ODD_HEAD_DIMS}")
    prop = "odd-head-dims"
    run_property(run, kernel, prop, _odd_head_dim(caps, device, sizes, dims), _golden_check(prop), weight=0.5)
