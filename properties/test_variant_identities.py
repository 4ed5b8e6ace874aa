"""Variant identities: a variant at its neutral setting is the plain problem.

- window-wide: a window at least as wide as the sequences on both sides equals no window;
- window-causal: ``window_size=(-1, 0)`` without ``causal`` equals ``causal=True``;
- softcap-huge: a softcap far above the logits equals no softcap (up to the exact difference);
- alibi-zero: zero slopes equal no ALiBi;
- sinks-neg-inf: sink logits at -inf equal no sinks;
- sinks-lse: with sinks z, ``lse = logaddexp(lse without sinks, z)`` and ``o = o_without *
  exp(lse_without - lse)``.

Two runs are compared within the sum of their tolerance-model budgets plus, where the exact
answers differ (softcap-huge), the difference of the two float64 goldens. Both problems an
identity runs are the kernel's declared ones: the strategy draws the first (``derive``: the
neutral setting put on the draw) and declares its twin (``related``), so a ``Limit`` on either
keeps the pair from running (and a property whose every pair is ruled out skips, naming it).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from flashprop.contract.problem import Problem
from flashprop.contract.registry import Kernel
from flashprop.harness.agreement import assert_agree, budgets, references_on, total
from flashprop.harness.check import Outputs, run_kernel, run_property
from flashprop.harness.strategies import Sizes
from flashprop.harness.variant_problems import variant_problems
from hypothesis import strategies as st

#: A softcap so far above every drawn logit (|s| < 1e4) that tanh barely bends it.
HUGE_SOFTCAP = 1e8


def _require(kernel: Kernel, variant: str) -> None:
    if not kernel.capabilities.declares_variant(variant):
        pytest.skip(f"kernel {kernel.name} does not declare variant {variant!r}")


def _pairs(a: Outputs, b: Outputs) -> list:
    return [("o", a.o, b.o), ("lse", a.lse, b.lse)]


def _compare_runs(
    kernel: Kernel, p: Problem, twin: Problem, prop: str, what: str, exact_gap: bool = False
) -> None:
    """Run ``p`` and ``twin`` (same tensors, other variant settings) and require agreement."""
    a, b = run_kernel(kernel, p, prop), run_kernel(kernel, twin, prop)
    ra, rb = references_on(kernel, p), references_on(kernel, twin)
    limits = total(budgets(p.dtype, ra), budgets(twin.dtype, rb))
    if exact_gap:
        for name in limits:
            ga, gb = getattr(ra[0], name), getattr(rb[0], name)
            finite = torch.isfinite(ga) & torch.isfinite(gb)
            limits[name] += float((ga - gb)[finite].abs().max()) if finite.any() else 0.0
    assert_agree(kernel, p, prop, what, _pairs(a, b), limits)


def _strategy(kernel: Kernel, device: str, sizes: Sizes, variant: str, derive: Callable[[Problem], Problem],
              twin: Callable[[Problem], Problem]) -> st.SearchStrategy[Problem]:
    """Problems using ``variant`` alone, at the setting the identity runs (``derive``), whose
    ``twin`` (the problem the identity compares them with) is declared too."""
    return variant_problems(kernel.capabilities, variant, device=device, sizes=sizes, modifiers=(variant,),
                            derive=derive, related=lambda p: [twin(p)])


def _no_window(p: Problem) -> Problem:
    return p.replace(window=None)


def _wide_window(p: Problem) -> Problem:
    """A window at least Nq + Nk wide on the left and, on the right, as wide or unbounded."""
    wide = p.nq + p.nk
    return p.replace(window=(wide, wide if p.seed % 2 else -1))


def test_window_wider_than_sequence(run, kernel, device, sizes):
    """``window_size`` of at least Nq + Nk on both sides (or (-1, -1)) equals no window."""
    _require(kernel, "window")
    prop = "window-wide"

    def check(kernel: Kernel, p: Problem) -> None:
        _compare_runs(kernel, p, _no_window(p), prop, f"window {p.window} against none")

    run_property(
        run, kernel, prop, _strategy(kernel, device, sizes, "window", _wide_window, _no_window), check,
        weight=0.5,
    )


def test_window_left_unbounded_right_zero_is_causal(run, kernel, device, sizes):
    """``window_size=(-1, 0)`` without causal equals ``causal=True`` without a window."""
    _require(kernel, "window")
    if not kernel.capabilities.causal:
        pytest.skip(f"kernel {kernel.name} does not declare causal")
    prop = "window-causal"

    def causal(p: Problem) -> Problem:
        return p.replace(window=None, causal=True)

    def check(kernel: Kernel, p: Problem) -> None:
        _compare_runs(kernel, p, causal(p), prop, "window (-1, 0) against causal=True")

    strategy = _strategy(kernel, device, sizes, "window", lambda p: p.replace(window=(-1, 0), causal=False),
                         causal)
    run_property(run, kernel, prop, strategy, check, weight=0.5)


def test_huge_softcap_is_no_softcap(run, kernel, device, sizes):
    """A softcap of 1e8 equals no softcap, up to the exact (golden) difference."""
    _require(kernel, "softcap")
    prop = "softcap-huge"

    def plain(p: Problem) -> Problem:
        return p.replace(softcap=0.0)

    def check(kernel: Kernel, p: Problem) -> None:
        _compare_runs(kernel, p, plain(p), prop, f"softcap {HUGE_SOFTCAP:g} against none", exact_gap=True)

    strategy = _strategy(kernel, device, sizes, "softcap", lambda p: p.replace(softcap=HUGE_SOFTCAP), plain)
    run_property(run, kernel, prop, strategy, check, weight=0.5)


def test_zero_alibi_slopes_are_no_alibi(run, kernel, device, sizes):
    """ALiBi slopes of 0 equal no ALiBi."""
    _require(kernel, "alibi")
    prop = "alibi-zero"

    def plain(p: Problem) -> Problem:
        return p.replace(alibi=None)

    def check(kernel: Kernel, p: Problem) -> None:
        _compare_runs(kernel, p, plain(p), prop, "zero slopes against no ALiBi")

    strategy = _strategy(kernel, device, sizes, "alibi", lambda p: p.replace(alibi=(p.alibi[0], 0.0)), plain)
    run_property(run, kernel, prop, strategy, check, weight=0.5)


def _no_sinks(p: Problem) -> Problem:
    return p.replace(sinks=None)


def _sinks_strategy(kernel: Kernel, device: str, sizes: Sizes) -> st.SearchStrategy[Problem]:
    """Problems with sinks alone whose twin without sinks is declared too."""
    return _strategy(kernel, device, sizes, "sinks", lambda p: p, _no_sinks)


def test_sinks_at_minus_infinity_are_no_sinks(run, kernel, device, sizes):
    """Sink logits of -inf contribute exp(-inf) = 0: the same as no sinks."""
    _require(kernel, "sinks")
    prop = "sinks-neg-inf"

    def check(kernel: Kernel, p: Problem) -> None:
        inp = p.kernel_inputs()
        inp.kwargs["sinks"] = torch.full_like(inp.kwargs["sinks"], float("-inf"))
        a, b = run_kernel(kernel, p, prop, inputs=inp), run_kernel(kernel, _no_sinks(p), prop)
        limits = total(*[budgets(p.dtype, references_on(kernel, _no_sinks(p)))] * 2)
        assert_agree(kernel, p, prop, "sinks at -inf against none", _pairs(a, b), limits)

    run_property(run, kernel, prop, _sinks_strategy(kernel, device, sizes), check, weight=0.5)


def test_sinks_shift_lse_by_logaddexp(run, kernel, device, sizes):
    """With sinks z_h: lse = logaddexp(lse_without, z_h) and o = o_without * exp(lse_without - lse)."""
    _require(kernel, "sinks")
    if not kernel.capabilities.returns_lse:
        pytest.skip(f"kernel {kernel.name} returns no lse")
    prop = "sinks-lse"

    def check(kernel: Kernel, p: Problem) -> None:
        z = p.variant_kwargs()["sinks"].detach()
        a, b = run_kernel(kernel, p, prop), run_kernel(kernel, _no_sinks(p), prop)
        shape = [1] * b.lse.dim()
        shape[-2 if p.mode != "varlen" else 0] = -1
        lse = torch.logaddexp(b.lse.double(), z.double().view(shape))
        factor = torch.exp(b.lse.double() - lse)
        factor = (
            factor.transpose(-1, -2)[..., None]
            if p.mode == "kvcache"
            else (factor.transpose(0, 1)[..., None] if p.mode == "varlen" else factor[..., None])
        )
        derived = Outputs(torch.where(torch.isfinite(factor), b.o.double() * factor, 0.0), lse)
        refs = references_on(kernel, p)
        limits = total(budgets(p.dtype, refs), budgets(p.dtype, references_on(kernel, _no_sinks(p))))
        # o_without * exp(lse_without - lse) carries the lse errors too, times |o| (factor <= 1)
        limits["o"] += limits["lse"] * float(refs[0].o.abs().max()) if refs[0].o.numel() else 0.0
        assert_agree(
            kernel, p, prop, "o and lse with sinks derived from the run without", _pairs(a, derived), limits
        )

    run_property(run, kernel, prop, _sinks_strategy(kernel, device, sizes), check, weight=0.5)
