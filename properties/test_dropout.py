"""Dropout (``dropout_p``, ``dropout_seed``; ``docs/variants.md``): properties that need no access
to the kernel's random numbers, and two that use its keep mask when it can return one.

A kernel draws its own mask (FlashAttention's Philox), so its output cannot be compared
elementwise with a golden that draws another. What the contract fixes, and these check:

    dropout-same-seed     the same seed gives bitwise the same o, lse (and gradients) twice
    dropout-seeds-differ  seeds s and s + 1 give different o
    dropout-independence  identical inputs in every batch element and head (and varlen sequence)
                          give different outputs: no two of them share a mask
    dropout-zero          p = 0 is no dropout: o, lse (and gradients) against the plain golden
    dropout-lse           at any p, lse is the undropped softmax's (the golden's)
    dropout-mean          the mean of o over S seeds converges to the undropped golden at the rate
                          the variance predicts (a Bernstein bound; below)
    dropout-gradcheck     the backward is the gradient of the forward at the same seed (float64
                          finite differences with the seed fixed, tiny problems)
    dropout-mask-fraction (``fn.dropout_mask``) the fraction of visible entries dropped is p,
                          within a binomial (Bernstein) bound; none at p = 0
    dropout-mask-golden   (``fn.dropout_mask``) o, lse (and gradients) against the golden computed
                          with the kernel's own mask: the exact check

A failure's repro makes the call (its golden would be the reference mask's, not the kernel's);
its replay command reruns the property on the problem.

The statistical properties are built to fail a correct kernel with probability at most
:data:`FALSE_ALARM` per example, assuming only that its keep decisions are independent
Bernoulli(1 - p) draws across entries and seeds. The mean's bound: with ``M_sij`` the mask of
seed s, each seed's exact output ``o_s = sum_j P_ij v_j M_sij / (1 - p)`` is an unbiased estimate
of the golden's ``o = sum_j P_ij v_j``; ``mean_s o_s - o = (1 / S) sum_{s,j} X_sj`` with
independent, zero-mean ``X_sj = P_ij v_jd (M_sij / (1 - p) - 1)``, ``|X_sj| <= a_j c``,
``Var X_sj = a_j^2 p / (1 - p)`` (``a_j = P_ij |v_jd|``, ``c = max(1, p / (1 - p))``). Bernstein's
inequality, ``P(|sum X| >= t) <= 2 exp(-t^2 / (2 (V + b t / 3)))`` with ``V = S p/(1-p) sum_j a_j^2``
and ``b = c max_j a_j``, gives at ``L = ln(2 n / FALSE_ALARM)`` (a union over the n entries)

    |mean_s o_s - o|  <=  (b L / 3 + sqrt((b L / 3)^2 + 2 V L)) / S

which for S = :data:`SEEDS` is about ``7.5 sigma / sqrt(S)`` where the sum is Gaussian-like. Each
seed's output is also allowed its rounding: the tolerance model's budget for o of that seed's
problem with the reference mask (a draw of the same law as the kernel's, ``refimpl/dropout.py``),
averaged over the seeds. The probabilities P come from the golden itself (its output for the
values ``V = I``: one-hot rows, one per key).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from flashprop.contract.masks import visible_mask
from flashprop.contract.problem import KernelInputs, Problem
from flashprop.contract.registry import Kernel
from flashprop.harness.check import (
    PropertyFailure,
    assert_close_to_golden,
    failure,
    gradient_names,
    reference_for,
    references_with,
    run_kernel,
    run_property,
)
from flashprop.harness.strategies import Sizes
from flashprop.harness.tolerance import budget, unravel
from flashprop.harness.variant_problems import DROPOUT_PS, variant_problems
from flashprop.properties.test_determinism import _bitwise_differences
from flashprop.properties.test_gradcheck import _tiny
from flashprop.refimpl import attention_golden
from flashprop.refimpl.golden import expand_kv
from hypothesis import strategies as st

#: The chance that a statistical property fails a correct kernel, per example, at most.
FALSE_ALARM = 1e-9
#: Seeds the mean is taken over.
SEEDS = 16
#: The p > 0 draws, and those at which two masks of a few hundred entries surely differ (at
#: p = 0.01 two masks agree on each entry with probability 0.98, on 121 with 0.09).
POSITIVE = DROPOUT_PS[1:]
DIFFERING = tuple(p for p in POSITIVE if p >= 0.1)
#: Each sequence length at least this in the properties that need masks to differ: 11 x 11 = 121
#: entries agree under two independent masks with probability (p^2 + (1 - p)^2)^121 <= 4e-11.
MIN_N = 11


def _require(kernel: Kernel, *, backward: bool = False, mask: bool = False) -> None:
    caps = kernel.capabilities
    if not caps.declares_variant("dropout"):
        pytest.skip(f"kernel {kernel.name} does not declare variant 'dropout'")
    if backward and (not caps.backward or "dropout" not in caps.variant_backward):
        pytest.skip(f"kernel {kernel.name} does not declare the backward of 'dropout'")
    if mask and not callable(getattr(kernel.fn, "dropout_mask", None)):
        pytest.skip(f"kernel {kernel.name} cannot return its dropout mask (no fn.dropout_mask)")


def _problems(kernel: Kernel, device: str, sizes: Sizes, **kw) -> st.SearchStrategy[Problem]:
    """Declared dropout problems (:func:`harness.variant_problems.variant_problems`, ``kw`` as there)."""
    return variant_problems(kernel.capabilities, "dropout", device=device, sizes=sizes, **kw)


def _backward(kernel: Kernel) -> bool:
    caps = kernel.capabilities
    return caps.backward and "dropout" in caps.variant_backward


def _seeded(p: Problem, seed: int) -> Problem:
    return p.replace(dropout=(p.dropout[0], seed % 2**64))


def _agreement(p: float, entries: int) -> float:
    """The chance that two independent keep masks of ``entries`` entries agree everywhere."""
    return (p * p + (1 - p) ** 2) ** entries


def _lengths_at_least(p: Problem, n: int) -> Problem:
    """``p`` with every (sequence's) Nq, Nk at least ``n``."""
    if p.seqlens is None:
        return p.replace(nq=max(p.nq, n), nk=max(p.nk, n))
    seqs = tuple((max(a, n), max(b, n)) for a, b in p.seqlens)
    return p.replace(seqlens=seqs, nq=max(a for a, _ in seqs), nk=max(b for _, b in seqs))


def _plain(p: Problem) -> Problem:
    """``p`` with every key visible and weighted (no causal mask, window, bias or sink, normal
    values at the default scale), Nq, Nk >= :data:`MIN_N`: an entry a mask changes changes o."""
    p = p.replace(causal=False, window=None, alibi=None, sinks=None, dist="normal", scale=None)
    return _lengths_at_least(p, MIN_N)


def _entries(p: Problem) -> int:
    """The (b, h, i, j) entries of a problem's mask."""
    pairs = p.seqlens if p.seqlens is not None else ((p.nq, p.nk),) * p.b
    return p.hq * sum(a * b for a, b in pairs)


# ----------------------------------------------------------------------- same seed, other seeds
def test_dropout_same_seed_reproduces_bitwise(run, kernel, device, sizes):
    """The same seed gives bitwise the same o and lse, and gradients where the dropout backward
    is declared (the mask is a function of the seed, not of a generator's state)."""
    _require(kernel)
    caps = kernel.capabilities
    if not caps.deterministic:
        pytest.skip(f"kernel {kernel.name} does not declare a deterministic forward")
    backward = _backward(kernel) and caps.deterministic_backward
    prop = "dropout-same-seed"

    def check(kernel: Kernel, p: Problem) -> None:
        first, second = (run_kernel(kernel, p, prop, backward=backward) for _ in range(2))
        names = ("o", "lse", *(gradient_names(p) if backward else ()))
        diffs = _bitwise_differences(first, second, names)
        if diffs:
            raise PropertyFailure(failure(kernel, p, prop, ["two runs with the same dropout_seed differ:",
                                                            *diffs], judged=()))

    strategy = _problems(kernel, device, sizes, backward=backward, dropout_ps=POSITIVE)
    run_property(run, kernel, prop, strategy, check, weight=0.5)


def test_dropout_seeds_differ(run, kernel, device, sizes):
    """Seeds s and s + 1 give different o (p >= 0.1, at least 121 entries whose drop changes o:
    two independent masks agree with probability below 4e-11)."""
    _require(kernel)
    prop = "dropout-seeds-differ"

    def check(kernel: Kernel, p: Problem) -> None:
        other = _seeded(p, p.dropout[1] + 1)
        o1, o2 = run_kernel(kernel, p, prop).o, run_kernel(kernel, other, prop).o
        if torch.equal(o1, o2):
            raise PropertyFailure(failure(kernel, p, prop, [
                f"dropout_seed={p.dropout[1]} and {other.dropout[1]} give the same o: the mask does not "
                f"depend on the seed (two independent masks of {_entries(p)} entries agree with "
                f"probability {_agreement(p.dropout[0], _entries(p)):.1e})"], judged=()))

    strategy = _problems(kernel, device, sizes, dropout_ps=DIFFERING, derive=_plain,
                         related=lambda p: [_seeded(p, p.dropout[1] + 1)])
    run_property(run, kernel, prop, strategy, check, weight=0.5)


# ------------------------------------------------------------------------------ independence
def _replicated_unit(p: Problem) -> Problem:
    """A :func:`_plain` problem with two units at least (batch elements or varlen sequences, times
    query heads), every varlen sequence as long as the first."""
    p = _plain(p)
    if p.b * p.hq < 2:
        p = p.replace(b=2)
    if p.seqlens is not None:
        (nq, nk), count = p.seqlens[0], max(p.b, 2 if p.hq < 2 else 1)
        p = p.replace(b=count, nq=nq, nk=nk, seqlens=((nq, nk),) * count)
    return p


def _replicated_inputs(p: Problem) -> tuple[KernelInputs, Callable[[torch.Tensor], torch.Tensor]]:
    """The inputs of ``p`` with batch element (sequence) 0 and head 0's q, k, v in every batch
    element (sequence) and head, and the map from o to its units (B * Hq, Nq * Dv)."""
    q, k, v = p.logical()[:3]
    if p.seqlens is None:
        q, k, v = (t[:1, :1].expand(t.shape).contiguous() for t in (q, k, v))
        return p.kernel_inputs(logical=(q, k, v)), lambda o: o.reshape(p.b * p.hq, -1)
    nq, nk = p.seqlens[0]
    q = q[:, :1, :nq].repeat(1, p.hq, p.b, 1)
    k, v = (t[:, :1, :nk].repeat(1, p.hkv, p.b, 1) for t in (k, v))
    # packed o (Tq, Hq, Dv): sequence s holds rows s * nq .. (s + 1) * nq - 1
    return p.kernel_inputs(logical=(q, k, v)), lambda o: o.reshape(p.b, nq, p.hq, -1).transpose(1, 2).reshape(
        p.b * p.hq, -1)


def test_dropout_masks_independent_across_batch_and_heads(run, kernel, device, sizes):
    """With the same q, k, v in every batch element (varlen sequence) and query head, no two of
    them give the same o: each (b, h) draws its own mask (an RNG offset reused across heads,
    GQA groups, batch elements or sequences makes two equal)."""
    _require(kernel)
    prop = "dropout-independence"

    def check(kernel: Kernel, p: Problem) -> None:
        inputs, units = _replicated_inputs(p)
        o = units(run_kernel(kernel, p, prop, inputs=inputs).o.detach())
        hq = p.hq
        for a in range(o.shape[0]):
            for b in range(a):
                if torch.equal(o[a], o[b]):
                    raise PropertyFailure(failure(kernel, p, prop, [
                        f"identical inputs in batch element {b // hq}, head {b % hq} and batch element "
                        f"{a // hq}, head {a % hq} (q, k, v of element 0, head 0 everywhere) give the same o "
                        f"at dropout_p={p.dropout[0]}: they share a dropout mask (two independent masks of "
                        f"{_entries(p) // (p.b * hq)} entries agree with probability "
                        f"{_agreement(p.dropout[0], _entries(p) // (p.b * hq)):.1e})"], judged=()))

    strategy = _problems(kernel, device, sizes, dropout_ps=DIFFERING, derive=_replicated_unit)
    run_property(run, kernel, prop, strategy, check, weight=0.5)


# ---------------------------------------------------------------------------- p = 0 and the lse
def test_dropout_zero_is_no_dropout(run, kernel, device, sizes):
    """dropout_p = 0 is no dropout: o, lse (and gradients) within the tolerance model of the
    golden without dropout."""
    _require(kernel)
    backward = _backward(kernel)
    prop = "dropout-zero"

    def check(kernel: Kernel, p: Problem) -> None:
        out = run_kernel(kernel, p, prop, backward=backward)
        assert_close_to_golden(kernel, p, prop, out, ("o", "lse", *(gradient_names(p) if backward else ())))

    strategy = _problems(kernel, device, sizes, backward=backward, dropout_ps=(0.0,))
    run_property(run, kernel, prop, strategy, check, weight=0.5)


def test_dropout_leaves_lse_undropped(run, kernel, device, sizes):
    """At every p the lse is the undropped softmax's, the golden's (dropout applies to the
    normalised probabilities; a mask applied before the normalisation changes lse)."""
    _require(kernel)
    if not kernel.capabilities.returns_lse:
        pytest.skip(f"kernel {kernel.name} does not return lse")
    prop = "dropout-lse"

    def check(kernel: Kernel, p: Problem) -> None:
        assert_close_to_golden(kernel, p, prop, run_kernel(kernel, p, prop), ("lse",))

    run_property(run, kernel, prop, _problems(kernel, device, sizes, dropout_ps=POSITIVE), check, weight=0.5)


# ------------------------------------------------------------------------------------ the mean
def _probabilities(p: Problem, q: torch.Tensor, k: torch.Tensor, kw: dict, alignment: str) -> torch.Tensor:
    """P (B, Hq, Nq, Nk) in float64: the golden without dropout on the values V = I (row j of
    kv head g is the one-hot e_j), so output row i is row i of P (0 where a row sees no key)."""
    eye = torch.eye(p.nk, dtype=q.dtype, device=q.device).expand(p.b, p.hkv, p.nk, p.nk)  # exact in any dtype
    plain = {name: val for name, val in kw.items() if not name.startswith("dropout")}
    return attention_golden(q, k, eye, causal=p.causal, scale=p.scale, alignment=alignment, **plain)[0]


def _bernstein(variance: torch.Tensor | float, bound: torch.Tensor | float, log: float):
    """The ``t`` with ``2 exp(-t^2 / (2 (V + b t / 3))) = 2 e^-log``: Bernstein's bound on
    ``|sum X|`` for independent zero-mean X of total variance V, each within ``[-b, b]``."""
    third = bound * log / 3
    return third + (third * third + 2 * variance * log) ** 0.5


def _mean_bounds(
    p: Problem, probs: torch.Tensor, v: torch.Tensor, golden: torch.Tensor
) -> tuple[torch.Tensor, float]:
    """Bernstein bounds (the module docstring), each at failure probability ``FALSE_ALARM / 2``: on
    ``|mean_s o_s - o|`` per entry (B, Hq, Nq, Dv), and on the deviation along o,
    ``|sum_e o_e (mean_s o_s - o)_e|`` = ``|(1 / S) sum_{s,i,j} c_ij (M_sij / (1 - p) - 1)|`` with
    ``c_ij = P_ij (o_i . v_j)`` (independent terms again: a bias proportional to o, as a missing
    1/(1 - p) makes, adds up over every entry there while the noise does not)."""
    rate = p.dropout[0]
    ratio = rate / (1 - rate)
    spread = max(1.0, ratio)  # M / (1 - p) - 1 is -1 or p / (1 - p)
    values = expand_kv(v.to(torch.float64), p.hq // p.hkv)
    a = probs[..., None] * values.abs()[:, :, None]  # a_j = P_ij |v_jd|: (B, Hq, Nq, Nk, Dv)
    log = math.log(4 * max(1, golden.numel()) / FALSE_ALARM)  # a union over the entries
    entry = _bernstein(SEEDS * ratio * (a * a).sum(3), spread * a.amax(3), log) / SEEDS
    coef = probs * (golden @ values.transpose(-1, -2))
    along = _bernstein(SEEDS * ratio * float((coef * coef).sum()), spread * float(coef.abs().max()),
                       math.log(4 / FALSE_ALARM))
    return entry, along / SEEDS


def _rounding(kernel: Kernel, p: Problem) -> float:
    """The mean over the seeds of the tolerance model's budget for o of each seed's problem with
    the reference mask: what each output may lose to rounding (per entry)."""
    total = 0.0
    for s in range(SEEDS):
        golden, yard = reference_for(kernel, _seeded(p, p.dropout[1] + s))
        cond = golden.conditioning
        magnitude = float(golden.o.abs().max()) if golden.o.numel() else 0.0
        error = float((yard.o.to(torch.float64) - golden.o).abs().max()) if golden.o.numel() else 0.0
        total += budget("o", p.dtype, error, magnitude, cond.logit_size(golden.lse), cond.values_for("o"))[0]
    return total / SEEDS


def test_dropout_mean_converges_to_the_golden(run, kernel, device, sizes):
    """The mean of o over :data:`SEEDS` seeds is within the Bernstein bounds (plus each output's
    rounding budget) of the golden without dropout, per entry and along o: each seed's o is an
    unbiased estimate (a missing 1/(1 - p), or a keep probability other than 1 - p, biases it)."""
    _require(kernel)
    prop = "dropout-mean"
    alignment = kernel.capabilities.causal_alignment

    def check(kernel: Kernel, p: Problem) -> None:
        outs = [run_kernel(kernel, _seeded(p, p.dropout[1] + s), prop).o.detach().to(torch.float64)
                for s in range(SEEDS)]
        mean = torch.stack(outs).mean(0)
        inp = p.kernel_inputs()
        q, k, v = inp.args
        golden = reference_for(kernel, p.replace(dropout=(0.0, p.dropout[1])))[0].o
        entry, along = _mean_bounds(p, _probabilities(p, q, k, inp.kwargs, alignment), v, golden)
        rounding = _rounding(kernel, p)
        entry, along = entry + rounding, along + rounding * float(golden.abs().sum())
        deviation = mean - golden
        projected = float((deviation * golden).sum())
        excess = deviation.abs() - entry
        seeds = f"{SEEDS} seeds ({p.dropout[1]}..{p.dropout[1] + SEEDS - 1})"
        details = []
        if not bool(torch.isfinite(mean).all()):
            details.append(f"the mean of o over {seeds} is not finite")
        elif bool((excess > 0).any()):
            at = unravel(int(excess.argmax()), excess.shape)
            details.append(
                f"the mean of o over {seeds} is {float(mean[at]):.6g} at {at}, the golden without dropout "
                f"{float(golden[at]):.6g}: |difference| {float(deviation.abs()[at]):.3e} > bound "
                f"{float(entry[at]):.3e} (Bernstein at {FALSE_ALARM / 2:g} plus rounding); "
                f"{int((excess > 0).sum())} of {excess.numel()} entries beyond it")
        if abs(projected) > along:
            square = float((golden * golden).sum())
            details.append(
                f"the mean of o over {seeds} deviates along the golden o: sum o (mean - o) = "
                f"{projected:.4g}, bound {along:.3e} (Bernstein at {FALSE_ALARM / 2:g} plus rounding): the "
                f"mean is about {1 + projected / square:.4g} times the golden (1 - p = {1 - p.dropout[0]:g})")
        if details:
            raise PropertyFailure(failure(kernel, p, prop, details, judged=()))

    strategy = _problems(kernel, device, sizes, mode="dense", dropout_ps=POSITIVE,
                         derive=lambda p: p.replace(block_m=None, block_n=None),
                         related=lambda p: [p.replace(dropout=(0.0, p.dropout[1])),
                                            *(_seeded(p, p.dropout[1] + s) for s in range(1, SEEDS))])
    run_property(run, kernel, prop, strategy, check, weight=0.25)


# --------------------------------------------------------------------- the kernel's own mask
def _mask_of(kernel: Kernel, p: Problem, prop: str, inp: KernelInputs) -> torch.Tensor:
    """``fn.dropout_mask`` of the call: a bool (B, Hq, Nq, Nk) tensor, or a failure."""
    try:
        mask, _ = kernel.call("dropout_mask", inp.args, inp.kwargs, causal=p.causal, scale=p.scale,
                              block_m=p.block_m, block_n=p.block_n)
    except Exception as err:
        raise PropertyFailure(failure(kernel, p, prop, [], judged=(),
                                      error=f"fn.dropout_mask raised {type(err).__name__}: {err}")) from err
    want = (p.b, p.hq, p.nq, p.nk)
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or tuple(mask.shape) != want:
        got = (f"{mask.dtype} {tuple(mask.shape)}" if isinstance(mask, torch.Tensor) else type(mask).__name__)
        raise PropertyFailure(failure(kernel, p, prop, [], judged=(),
                                      error=f"fn.dropout_mask returned {got}, not a bool tensor {want}"))
    return mask


def test_dropout_mask_drops_a_fraction_p(run, kernel, device, sizes):
    """The kernel's keep mask drops a fraction p of the visible entries, within the Bernstein
    bound ``b L / 3 + sqrt((b L / 3)^2 + 2 n p (1 - p) L)`` (``b = max(p, 1 - p)``,
    ``L = ln(2 / FALSE_ALARM)``) of ``n p``; none at p = 0."""
    _require(kernel, mask=True)
    prop = "dropout-mask-fraction"

    def check(kernel: Kernel, p: Problem) -> None:
        inp = p.kernel_inputs()
        mask = _mask_of(kernel, p, prop, inp)
        visible = visible_mask(p.nq, p.nk, causal=p.causal, alignment=kernel.capabilities.causal_alignment,
                               device=mask.device, window=p.window)
        seen = torch.ones_like(mask) if visible is None else visible.expand(mask.shape)
        n, dropped = int(seen.sum()), int((seen & ~mask).sum())
        rate = p.dropout[0]
        log = math.log(2 / FALSE_ALARM)
        slack = _bernstein(n * rate * (1 - rate), max(rate, 1 - rate), log) if rate else 0.0
        if abs(dropped - n * rate) > slack:
            raise PropertyFailure(failure(kernel, p, prop, [
                f"fn.dropout_mask drops {dropped} of {n} visible entries at dropout_p={rate}: expected "
                f"{n * rate:.1f} +- {slack:.1f} (Bernstein at {FALSE_ALARM:g})"], judged=()))

    run_property(run, kernel, prop, _problems(kernel, device, sizes, mode="dense"), check, weight=0.5)


def test_dropout_matches_the_golden_with_the_kernels_mask(run, kernel, device, sizes):
    """o, lse (and gradients) within the tolerance model of the golden (and yardstick) computed
    with the keep mask the kernel returns for the call (``fn.dropout_mask``)."""
    _require(kernel, mask=True)
    caps = kernel.capabilities
    backward = _backward(kernel)
    prop = "dropout-mask-golden"

    def check(kernel: Kernel, p: Problem) -> None:
        mask = _mask_of(kernel, p, prop, p.kernel_inputs())
        out = run_kernel(kernel, p, prop, backward=backward)
        refs = references_with(p, caps.causal_alignment, caps.fp32_matmul == "tf32", backward,
                               extra={"dropout_mask": mask})
        names = ("o", "lse", *(gradient_names(p) if backward else ()))
        assert_close_to_golden(kernel, p, prop, out, names, refs)

    strategy = _problems(kernel, device, sizes, mode="dense", backward=backward)
    run_property(run, kernel, prop, strategy, check, weight=0.5)


# ---------------------------------------------------------------------------------- gradcheck
# (last: finite differences are the slowest check, and the exact ones above catch most first)
def test_dropout_gradcheck(run, kernel, device, sizes):
    """The backward is the gradient of the forward at the same seed: float64 finite differences
    of o (fast mode) with dropout_p and dropout_seed fixed, dense and varlen, on tiny problems."""
    _require(kernel, backward=True)
    caps = kernel.capabilities
    if torch.float64 not in caps.dtypes:
        pytest.skip(f"kernel {kernel.name} does not declare float64 (finite differences need it)")
    prop = "dropout-gradcheck"

    def check(kernel: Kernel, p: Problem) -> None:
        inp = p.kernel_inputs(requires_grad=True)
        rest = inp.args[3:]
        kw = {name: val.detach() if isinstance(val, torch.Tensor) else val
              for name, val in inp.kwargs.items()}

        def o(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return kernel.call(p.mode, (q, k, v, *rest), kw, causal=p.causal, scale=p.scale,
                               block_m=p.block_m, block_n=p.block_n)[0]

        try:
            ok = torch.autograd.gradcheck(o, inp.args[:3], fast_mode=True, raise_exception=False)
        except (RuntimeError, ValueError, TypeError, NotImplementedError) as err:
            said = f"gradcheck raised {type(err).__name__}: {str(err).strip().splitlines()[0]}"
            raise PropertyFailure(failure(kernel, p, prop, [said], judged=())) from err
        if not ok:
            raise PropertyFailure(failure(kernel, p, prop, [
                "analytical and finite-difference (float64) Jacobians of o differ at the same dropout_seed "
                "(fast mode): the backward's mask or scale is not the forward's"], judged=()))

    strategy = _problems(kernel, device, _tiny(caps, sizes), backward=True, dtypes=(torch.float64,),
                         dropout_ps=POSITIVE)
    run_property(run, kernel, prop, strategy, check, weight=0.5)
