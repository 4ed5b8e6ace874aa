"""The online-softmax algebra (refimpl.online_softmax) and the kernel's split-KV consistency.

Meta-properties (kernel-independent, float64): the state ``(m, l, acc)`` of a key set forms a
commutative monoid under :meth:`SoftmaxState.merge` with identity ``(-inf, 0, 0)``, so any
partition of the keys, merged in any order, finalises to the golden ``(o, lse)``; and finalised
split-KV partials merge by lse (:func:`merge_partials`) to the same result.

Float64 tolerances: commutativity and identity are exact (the merge computes the same
correctly rounded operations in either order; rescaling by ``exp(0) = 1`` and adding 0 are
exact). Re-association only reorders roundings: every merge or block rounds each entry a
bounded number of times, and an exponent ``s - m`` carries an absolute error of about
``eps * L`` for logits of size ``L``, so after ``n`` merges the results differ by at most about
``n * eps * (1 + L)`` relative to the values' size. The bound used, :func:`_tolerance`, is 8x
that; an algebraic slip (a missing rescale, a wrong identity) is wrong by O(1).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TypeVar

import pytest
import torch
from flashprop.contract.masks import visible_mask
from flashprop.contract.problem import Problem
from flashprop.contract.registry import Kernel
from flashprop.harness.agreement import assert_agree, budgets, pairs, references_on
from flashprop.harness.check import Outputs, run_kernel, run_property
from flashprop.harness.strategies import problems
from flashprop.refimpl import attention_golden
from flashprop.refimpl.online_softmax import SoftmaxState, merge_partials
from hypothesis import given
from hypothesis import strategies as st

T = TypeVar("T")
F64 = torch.float64
EPS = torch.finfo(F64).eps


def _tolerance(n_merges: int, logits: torch.Tensor) -> float:
    """Relative float64 tolerance after ``n_merges`` merges of logits ``logits`` (module doc)."""
    finite = logits[torch.isfinite(logits)]
    size = float(finite.abs().max()) if finite.numel() else 0.0
    return 8 * (n_merges + 1) * EPS * (1 + size)


def _assert_same(actual: tuple[torch.Tensor, torch.Tensor], expected: tuple[torch.Tensor, torch.Tensor],
                 rel: float, what: str) -> None:
    """o and lse within ``rel`` times their magnitude (at least 1); -inf exactly where expected
    (empty rows), and o = 0 exactly there."""
    for name, a, e in zip(("o", "lse"), actual, expected):
        assert not torch.isnan(a).any(), f"{what}: NaN in {name}"
        inf_a, inf_e = torch.isinf(a), torch.isinf(e)
        same_inf = torch.equal(inf_a, inf_e) and torch.equal(a[inf_a], e[inf_e])
        assert same_inf, f"{what}: {name} inf pattern differs"
        finite = torch.isfinite(e)
        limit = rel * max(1.0, float(e[finite].abs().max()) if finite.any() else 0.0)
        err = float((a - e)[finite].abs().max()) if finite.any() else 0.0
        assert err <= limit, f"{what}: max|{name} diff| = {err:.3e} > {limit:.3e}"
    empty = torch.isinf(expected[1])
    assert torch.equal(actual[0][empty], torch.zeros_like(actual[0][empty])), f"{what}: o != 0 on empty rows"


# --------------------------------------------------------------------------- meta-properties


@st.composite
def attention_cases(draw) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool, str]:
    """Tiny float64 ``(q, k, v, causal, alignment)``; logits up to ~ +-100 * sqrt(D) * scale."""
    nq, nk = draw(st.integers(1, 8)), draw(st.integers(1, 24))
    d, dv = draw(st.integers(1, 8)), draw(st.integers(1, 8))
    size = draw(st.sampled_from([1.0, 8.0, 64.0]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    q = size * torch.randn(1, 1, nq, d, generator=g, dtype=F64)
    k = torch.randn(1, 1, nk, d, generator=g, dtype=F64)
    v = torch.randn(1, 1, nk, dv, generator=g, dtype=F64)
    return q, k, v, draw(st.booleans()), draw(st.sampled_from(["bottom-right", "top-left"]))


def _logits(q: torch.Tensor, k: torch.Tensor, causal: bool, alignment: str) -> torch.Tensor:
    s = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    mask = visible_mask(q.shape[2], k.shape[2], causal=causal, alignment=alignment)
    return s if mask is None else s.masked_fill(~mask, float("-inf"))


@st.composite
def partitions(draw, n: int) -> list[torch.Tensor]:
    """A partition of ``range(n)`` into non-empty blocks of arbitrary (non-contiguous) keys."""
    perm = draw(st.permutations(range(n)))
    cuts = sorted(draw(st.sets(st.integers(1, n - 1), max_size=n - 1))) if n > 1 else []
    bounds = [0, *cuts, n]
    return [torch.tensor(perm[a:b]) for a, b in itertools.pairwise(bounds)]


def _fold(draw: Callable, items: list[T], merge: Callable[[T, T], T]) -> T:
    """Merge ``items`` pairwise in an order drawn by Hypothesis (any binary tree, any order)."""
    items = list(items)
    while len(items) > 1:
        i = draw(st.integers(0, len(items) - 1))
        a = items.pop(i)
        j = draw(st.integers(0, len(items) - 1))
        items[j] = merge(a, items[j])
    return items[0]


def _states(case: tuple) -> tuple[list[SoftmaxState], torch.Tensor]:
    q, k, v, causal, alignment = case
    s = _logits(q, k, causal, alignment)
    nk = k.shape[2]
    cut = sorted({0, nk // 3, 2 * nk // 3, nk})
    states = [SoftmaxState.from_scores(s[..., a:b], v[:, :, a:b]) for a, b in itertools.pairwise(cut)]
    return states, s


@pytest.mark.meta
@given(attention_cases())
def test_merge_commutative_and_identity(case):
    """a.merge(b) == b.merge(a) and identity.merge(a) == a.merge(identity) == a, bitwise."""
    states, _ = _states(case)
    a, b = states[0], states[-1]
    e = SoftmaxState.identity(a.m.shape, a.acc.shape[-1], dtype=F64, device="cpu")
    for x, y in ((a.merge(b), b.merge(a)), (e.merge(a), a), (a.merge(e), a), (e.merge(e), e)):
        for name in ("m", "l", "acc"):
            assert torch.equal(getattr(x, name), getattr(y, name)), f"{name} differs"


@pytest.mark.meta
@given(attention_cases())
def test_merge_associative(case):
    """(a.merge(b)).merge(c) and a.merge(b.merge(c)) finalise to the same (o, lse) (2 merges)."""
    states, s = _states(case)
    a, b, c = (states * 3)[:3]
    left, right = a.merge(b).merge(c), a.merge(b.merge(c))
    assert torch.equal(left.m, right.m)
    _assert_same(left.finalize(), right.finalize(), _tolerance(2, s), "associativity")


@pytest.mark.meta
@given(attention_cases(), st.data())
def test_block_partition_invariance(case, data):
    """Any partition of the keys into blocks, merged in any order, finalises to refimpl.golden."""
    q, k, v, causal, alignment = case
    s = _logits(q, k, causal, alignment)
    blocks = data.draw(partitions(k.shape[2]))
    states = [SoftmaxState.from_scores(s[..., idx], v[:, :, idx]) for idx in blocks]
    result = _fold(data.draw, states, SoftmaxState.merge).finalize()
    expected = attention_golden(q, k, v, causal=causal, alignment=alignment)
    _assert_same(result, expected, _tolerance(len(blocks), s), f"partition {[b.tolist() for b in blocks]}")


@pytest.mark.meta
@given(attention_cases(), st.data())
def test_merge_partials_equals_full(case, data):
    """Finalised split-KV partials ``(o_i, lse_i)`` (empty ones included) merged by lse in any
    order equal the golden over all keys."""
    q, k, v, causal, alignment = case
    s = _logits(q, k, causal, alignment)
    blocks = data.draw(partitions(k.shape[2]))
    parts = [SoftmaxState.from_scores(s[..., idx], v[:, :, idx]).finalize() for idx in blocks]
    result = _fold(data.draw, parts, lambda a, b: merge_partials(*a, *b))
    expected = attention_golden(q, k, v, causal=causal, alignment=alignment)
    _assert_same(result, expected, _tolerance(len(blocks), s), f"partition {[b.tolist() for b in blocks]}")


# --------------------------------------------------------------------------- kernel property


def _split(p: Problem) -> int:
    """Where the keys are split: 1 .. Nk - 1, from the seed (shrinks to 1)."""
    return 1 + p.seed % (p.nk - 1)


def test_split_kv_merge_equals_full(run, kernel, device, sizes):
    """Non-causal: kernel(q, k[:s], v[:s]) and kernel(q, k[s:], v[s:]) merged by lse
    (merge_partials, in float64) equal kernel(q, k, v).

    Budget: each half is within its tolerance-model budget b_i of its golden and the goldens
    merge exactly to the full golden. Merging with weights w_i = exp(lse_i - lse) (w_1 + w_2 = 1)
    gives an lse error <= max_i |dlse_i| <= b_1(lse) + b_2(lse), and an o error
    <= max_i |do_i| + |dw_1| |o_1 - o_2| <= b_1(o) + b_2(o) + (b_1(lse) + b_2(lse)) * M / 2,
    since |dw_1| = w_1 w_2 |dlse_1 - dlse_2| <= (|dlse_1| + |dlse_2|) / 4 and |o_1 - o_2| <= 2M
    (M = max |golden o| of the halves). The full run adds its own budget."""
    caps = kernel.capabilities
    if not caps.returns_lse:
        pytest.skip(f"kernel {kernel.name} returns no lse (split-KV partials merge by lse)")
    if not caps.unequal_lengths:
        pytest.skip(f"kernel {kernel.name} does not declare Nq != Nk (the halves have fewer keys)")
    prop = "split-kv-merge"

    def check(kernel: Kernel, p: Problem) -> None:
        s = _split(p)
        q, k, v = p.inputs()
        halves = [(p.replace(nk=s), (q, k[:, :, :s], v[:, :, :s])),
                  (p.replace(nk=p.nk - s), (q, k[:, :, s:], v[:, :, s:]))]
        outs = [run_kernel(kernel, hp, prop, inputs=inputs) for hp, inputs in halves]
        refs = [references_on(kernel, hp, inputs) for hp, inputs in halves]
        full = run_kernel(kernel, p, prop)
        b1, b2 = (budgets(p.dtype, r) for r in refs)
        bf = budgets(p.dtype, references_on(kernel, p))
        m = max(float(r[0].o.abs().max()) for r in refs)
        limits = {"o": b1["o"] + b2["o"] + (b1["lse"] + b2["lse"]) * m / 2 + bf["o"],
                  "lse": b1["lse"] + b2["lse"] + bf["lse"]}
        merged = Outputs(*merge_partials(*(t.to(F64) for out in outs for t in (out.o, out.lse))))
        what = f"keys split at {s}: merge_partials(kernel(:{s}), kernel({s}:)) vs kernel(all keys)"
        assert_agree(kernel, p, prop, what, pairs(merged, full), limits)

    strategy = problems(caps, device=device, sizes=sizes, causal=False, where=lambda p: p.nk >= 2,
                        related=lambda p: [p.replace(nk=n) for n in (_split(p), p.nk - _split(p))])
    run_property(run, kernel, prop, strategy, check, weight=0.5)
