"""Metamorphic properties: two kernel runs whose exact results are related must agree.

Each property runs the kernel on a drawn problem and on a transformed copy whose exact answer is
known from the first (equal, or lse shifted by a known constant), and compares the two runs
within the sum of their tolerance-model budgets (:mod:`harness.agreement`). None of them
needs the kernel to be close to the golden, only consistent with itself, so they find bugs the
golden comparison can miss (and they localise them: a wrong batch stride shows up as batch
dependence, a wrong kv-head index as GQA inconsistency).
"""

from __future__ import annotations

import pytest
import torch
from flashprop.contract.masks import causal_offset
from flashprop.contract.problem import Problem
from flashprop.contract.registry import Kernel
from flashprop.harness.agreement import assert_agree, budgets, pairs, references_on, restrict, total
from flashprop.harness.check import run_kernel, run_property
from flashprop.harness.strategies import problems


def _shift_constant(problem: Problem) -> float:
    """The appended q column's value c: a power of two of either sign (exact in every dtype)."""
    return (-1.0) ** problem.seed * 2.0 ** (problem.seed % 4)


def _shifted(kernel: Kernel, p: Problem) -> Problem:
    """The problem with one more q/k column (and a zero v column when Dv must equal D)."""
    pad_v = kernel.capabilities.dv_equals_d
    return p.replace(d=p.d + 1, dv=p.dv + pad_v, scale=p.effective_scale)


def test_shift_invariance(run, kernel, device, sizes):
    """Appending a column c to q and a column of ones to k, with the explicit scale s of the
    original problem, adds s*c to every logit:  o' = o  and  lse' = lse + s*c.

    (When the kernel needs Dv = D, v gets a zero column too; that column of o' must be 0.)"""
    caps = kernel.capabilities
    if not caps.custom_scale:
        pytest.skip(f"kernel {kernel.name} does not declare an explicit scale (to keep s fixed at D+1)")
    if not any(d + 1 in caps.head_dims for d in caps.head_dims if d + 1 <= sizes.max_head_dim):
        pytest.skip(f"kernel {kernel.name} declares no head dims D and D+1 both")
    prop = "shift-invariance"

    def check(kernel: Kernel, p: Problem) -> None:
        c = _shift_constant(p)
        sp = _shifted(kernel, p)
        q, k, v = p.inputs()
        q2 = torch.cat([q, torch.full_like(q[..., :1], c)], dim=-1)
        k2 = torch.cat([k, torch.ones_like(k[..., :1])], dim=-1)
        v2 = torch.cat([v, torch.zeros_like(v[..., :1])], dim=-1) if sp.dv > p.dv else v
        a = run_kernel(kernel, p, prop)
        b = run_kernel(kernel, sp, prop, inputs=(q2, k2, v2))
        shift = p.effective_scale * c
        limits = total(budgets(p.dtype, references_on(kernel, p)),
                       budgets(p.dtype, references_on(kernel, sp, (q2, k2, v2))))
        what = f"appended q column c = {c:g} and k column 1 with scale {p.effective_scale:.6g} (D -> {sp.d})"
        if b.lse is not None:
            b.lse = b.lse.to(torch.float64) - shift
        extra, b.o = b.o[..., p.dv :], b.o[..., : p.dv]
        compared = pairs(a, b)
        if sp.dv > p.dv:
            compared.append(("o", extra, torch.zeros_like(extra)))
        assert_agree(kernel, p, prop, what, compared, limits)

    strategy = problems(caps, device=device, sizes=sizes, related=lambda p: [_shifted(kernel, p)])
    run_property(run, kernel, prop, strategy, check, weight=0.5)


def test_key_permutation_invariance(run, kernel, device, sizes):
    """Without a mask, attention is a function of the set of (key, value) pairs: permuting the
    keys and values jointly (one permutation on the N axis) leaves o and lse unchanged."""
    prop = "kv-permutation"

    def check(kernel: Kernel, p: Problem) -> None:
        q, k, v = p.inputs()
        perm = torch.randperm(p.nk, generator=torch.Generator().manual_seed(p.seed)).to(k.device)
        kp, vp = k[:, :, perm], v[:, :, perm]
        a = run_kernel(kernel, p, prop)
        b = run_kernel(kernel, p, prop, inputs=(q, kp, vp))
        limits = total(budgets(p.dtype, references_on(kernel, p)),
                       budgets(p.dtype, references_on(kernel, p, (q, kp, vp))))
        assert_agree(kernel, p, prop, f"keys/values permuted by {perm.tolist()}", pairs(a, b), limits)

    run_property(run, kernel, prop, problems(kernel.capabilities, device=device, sizes=sizes, causal=False),
                 check, weight=0.5)


def test_batch_independence(run, kernel, device, sizes):
    """Batch elements are independent problems: o[i], lse[i] of the batch equal the outputs of
    running element i alone (the same views, so the layout is kept)."""
    if sizes.max_batch < 2:
        pytest.skip("sizes allow no batch of 2")
    prop = "batch-independence"

    def check(kernel: Kernel, p: Problem) -> None:
        q, k, v = p.inputs()
        full = run_kernel(kernel, p, prop)
        refs = references_on(kernel, p)
        for i in range(p.b):
            idx = (slice(i, i + 1),)
            alone = run_kernel(kernel, p.replace(b=1), prop, inputs=(q[idx], k[idx], v[idx]))
            limits = total(*[budgets(p.dtype, restrict(refs, idx))] * 2)
            assert_agree(kernel, p, prop, f"batch element {i} run alone", pairs(full, alone, idx), limits)

    strategy = problems(kernel.capabilities, device=device, sizes=sizes, where=lambda p: p.b >= 2,
                        related=lambda p: [p.replace(b=1)])
    run_property(run, kernel, prop, strategy, check, weight=0.5)


def test_head_independence(run, kernel, device, sizes):
    """Each kv head and its query-head group form an independent problem: running kv head j
    with query heads j*g .. (j+1)*g - 1 alone gives those heads' o and lse of the full run."""
    if sizes.max_kv_heads < 2:
        pytest.skip("sizes allow no second kv head")
    prop = "head-independence"

    def check(kernel: Kernel, p: Problem) -> None:
        q, k, v = p.inputs()
        g = p.hq // p.hkv
        full = run_kernel(kernel, p, prop)
        refs = references_on(kernel, p)
        for j in range(p.hkv):
            qi = (slice(None), slice(j * g, (j + 1) * g))
            ki = (slice(None), slice(j, j + 1))
            alone = run_kernel(kernel, _one_kv_head(p), prop, inputs=(q[qi], k[ki], v[ki]))
            limits = total(*[budgets(p.dtype, restrict(refs, qi))] * 2)
            what = f"kv head {j} with query heads {j * g}..{(j + 1) * g - 1} run alone"
            assert_agree(kernel, p, prop, what, pairs(full, alone, qi), limits)

    strategy = problems(kernel.capabilities, device=device, sizes=sizes, where=lambda p: p.hkv >= 2,
                        related=lambda p: [_one_kv_head(p)])
    run_property(run, kernel, prop, strategy, check, weight=0.5)


def _one_kv_head(p: Problem) -> Problem:
    """One kv head of ``p`` with its group of query heads, as a problem of its own."""
    return p.replace(hq=p.hq // p.hkv, hkv=1)


def _future_rows(kernel: Kernel, p: Problem) -> tuple[int, int]:
    """``(r, first)``: rows ``0..r-1`` see only keys ``< first`` and keys ``first..Nk-1`` exist."""
    offset = causal_offset(p.nq, p.nk, kernel.capabilities.causal_alignment)
    r = 1 + p.seed % min(p.nq, p.nk - offset - 1)
    return r, max(0, r + offset)


def test_causal_future_independence(run, kernel, device, sizes):
    """Causal: rows 0..r-1 see only keys j <= r-1 + offset (offset = Nk - Nq bottom-right, 0
    top-left). Overwriting every later key and value with large finite values must not change
    o or lse of those rows. Later key r' + t is set to 4 q_(t mod r) (of the group's first query
    head), so a leaked key has a logit 4 s |q|^2 above its target row's typical logits, and its
    value 1000 would dominate that row's output."""
    caps = kernel.capabilities
    if not caps.causal:
        pytest.skip(f"kernel {kernel.name} does not declare causal")
    prop = "causal-future"

    def check(kernel: Kernel, p: Problem) -> None:
        r, first = _future_rows(kernel, p)
        q, k, v = p.inputs()
        k2, v2 = k.clone(), v.clone()
        targets = torch.arange(p.nk - first, device=q.device) % r
        k2[:, :, first:] = 4 * q[:, :: p.hq // p.hkv][:, :, targets]
        v2[:, :, first:] = 1000.0
        a = run_kernel(kernel, p, prop)
        b = run_kernel(kernel, p, prop, inputs=(q, k2, v2))
        rows = (slice(None), slice(None), slice(0, r))
        limits = total(*[budgets(p.dtype, restrict(references_on(kernel, p), rows))] * 2)
        what = f"keys/values {first}..{p.nk - 1} overwritten; rows 0..{r - 1} compared"
        assert_agree(kernel, p, prop, what, pairs(a, b, rows, rows), limits)

    def has_future(p: Problem) -> bool:
        return p.nk - causal_offset(p.nq, p.nk, caps.causal_alignment) - 1 >= 1

    strategy = problems(caps, device=device, sizes=sizes, causal=True, where=has_future)
    run_property(run, kernel, prop, strategy, check, weight=0.5)


def test_scale_folding(run, kernel, device, sizes):
    """softmax(s * (2q) k^T) = softmax((2s) * q k^T): kernel(2q, k, v, scale=s) equals
    kernel(q, k, v, scale=2s). The factor is a power of two, so 2q and 2s are exact and the
    yardstick gives bitwise-equal references for both runs (one budget, counted twice)."""
    caps = kernel.capabilities
    if not caps.custom_scale:
        pytest.skip(f"kernel {kernel.name} does not declare an explicit scale")
    prop = "scale-folding"

    def check(kernel: Kernel, p: Problem) -> None:
        s = p.effective_scale
        q, k, v = p.inputs()
        a = run_kernel(kernel, p.replace(scale=s), prop, inputs=(2 * q, k, v))
        b = run_kernel(kernel, p.replace(scale=2 * s), prop)
        limits = total(*[budgets(p.dtype, references_on(kernel, p.replace(scale=2 * s)))] * 2)
        what = f"kernel(2q, k, v, scale={s:.6g}) vs kernel(q, k, v, scale={2 * s:.6g})"
        assert_agree(kernel, p, prop, what, pairs(a, b), limits)

    strategy = problems(caps, device=device, sizes=sizes, related=lambda p: [
        p.replace(scale=p.effective_scale), p.replace(scale=2 * p.effective_scale)])
    run_property(run, kernel, prop, strategy, check, weight=0.5)


def test_gqa_consistency(run, kernel, device, sizes):
    """GQA reads kv head h // g for query head h: the kernel on (q, k, v) equals the kernel on
    k and v repeated to Hq heads (``repeat_interleave(g, dim=1)``). The goldens are identical."""
    caps = kernel.capabilities
    if not caps.gqa:
        pytest.skip(f"kernel {kernel.name} does not declare GQA/MQA")
    if sizes.max_group < 2:
        pytest.skip("sizes allow no GQA group of 2")
    prop = "gqa-consistency"

    def check(kernel: Kernel, p: Problem) -> None:
        g = p.hq // p.hkv
        q, k, v = p.inputs()
        a = run_kernel(kernel, p, prop)
        b = run_kernel(kernel, p.replace(hkv=p.hq), prop,
                       inputs=(q, k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)))
        limits = total(*[budgets(p.dtype, references_on(kernel, p))] * 2)
        assert_agree(kernel, p, prop, f"k, v repeated {g}x to Hq={p.hq} heads", pairs(a, b), limits)

    strategy = problems(caps, device=device, sizes=sizes, where=lambda p: p.hq > p.hkv,
                        related=lambda p: [p.replace(hkv=p.hq)])
    run_property(run, kernel, prop, strategy, check, weight=0.5)

