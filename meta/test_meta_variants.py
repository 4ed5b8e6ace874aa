"""Meta-tests of the variant references: the golden against the contract's own words.

:func:`definition` computes attention straight from docs/variants.md, one (i, j) pair at a time
(Python loops over the visibility and bias rules, a dense float64 softmax with the sink as one
more column, gradients by autograd), sharing no code with ``contract.masks``. The streaming
golden (dense, varlen per sequence, decode on the gathered cache) must equal it, forward and
backward (dsinks included), within the float64 floor.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import flashprop.properties.test_error_contract as error_contract
import pytest
import torch
from flashprop.contract.capabilities import ALIBI_SHAPES, FP8, Capabilities, KVCache
from flashprop.contract.fp8 import CACHE_SCALE_SHAPES, DESCALE_SHAPES, FORMATS
from flashprop.contract.problem import Problem
from flashprop.contract.registry import Kernel
from flashprop.contract.variants import MODIFIERS, TABLE, Variant
from flashprop.harness.check import REFERENCES, PropertyFailure, gradient_names, references_with
from flashprop.harness.run_context import RunContext
from flashprop.harness.strategies import Sizes
from flashprop.harness.tolerance import budget, conditioning
from flashprop.harness.variant_problems import variant_problems
from flashprop.refimpl import attention_golden, attention_golden_backward
from flashprop.refimpl.layouts import kvcache_golden, varlen_golden, varlen_golden_backward
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.meta

F64 = torch.float64
SIZES = Sizes(max_n=12, max_head_dim=8, max_work=40_000)
EVERYTHING = Capabilities(
    window=True,
    softcap=True,
    alibi=ALIBI_SHAPES,
    sinks=True,
    varlen=True,
    kvcache=KVCache(page_sizes=(1, 3, 4), max_splits=4),
    dropout=True,
    fp8=FP8(formats=frozenset(FORMATS), descales=frozenset(DESCALE_SHAPES),
            cache_scales=frozenset(CACHE_SCALE_SHAPES)),
)


def definition(q, k, v, *, causal, scale, window_size=None, softcap=0.0, alibi_slopes=None, sinks=None):
    """Attention of one (B, H, N, D) problem from the contract's words: query i sees key j iff
    ``i + c - left <= j <= i + c + right`` (-1 unbounded; causal caps the right at the diagonal),
    with ``c = Nk - Nq``; ``s = softcap * tanh(s / softcap)``, then ``s -= slope * |i + c - j|``;
    the sink is one more logit with a zero value. Returns ``(o, lse)``, differentiable."""
    b, hq, nq, _ = q.shape
    group = hq // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    c = k.shape[2] - nq
    left, right = window_size if window_size is not None else (-1, -1)
    visible = torch.zeros(nq, k.shape[2], dtype=torch.bool)
    distance = torch.zeros(nq, k.shape[2], dtype=F64)
    for i in range(nq):
        for j in range(k.shape[2]):
            ok = (left < 0 or j >= i + c - left) and (right < 0 or j <= i + c + right)
            visible[i, j] = ok and (not causal or j <= i + c)
            distance[i, j] = abs(i + c - j)
    s = scale * q @ k.transpose(-1, -2)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if alibi_slopes is not None:
        slopes = alibi_slopes.to(F64).reshape(-1 if alibi_slopes.dim() == 2 else 1, hq, 1, 1)
        s = s - slopes * distance
    s = s.masked_fill(~visible, -math.inf)
    z = (
        torch.full((b, hq, nq, 1), -math.inf, dtype=F64)
        if sinks is None
        else sinks.to(F64)[None, :, None, None].expand(b, hq, nq, 1)
    )
    full = torch.cat([s, z], dim=-1)
    lse = torch.logsumexp(full, dim=-1)
    p = torch.where(torch.isfinite(lse)[..., None], torch.exp(full - lse[..., None]), 0.0)[..., :-1]
    return p @ v, lse


def _close(name: str, got: torch.Tensor, want: torch.Tensor, magnitude: float | None = None,
           logits: float = 0.0) -> None:
    """``got`` within the float64 floor of ``want``; ``logits``: the problem's raw logit size
    (:func:`harness.tolerance.conditioning`), which the rounding of ``exp`` scales with."""
    got, want = got.detach().to(F64), want.detach().to(F64)
    assert torch.equal(torch.isinf(got), torch.isinf(want)), f"{name}: inf pattern differs"
    finite = torch.isfinite(want)
    size = float(want[finite].abs().max()) if finite.any() else 0.0
    limit = budget(
        name if name in ("o", "lse") else "dq", F64, 0.0, size if magnitude is None else magnitude,
        max(size, logits),
    )[0]
    err = float((got - want)[finite].abs().max()) if finite.any() else 0.0
    assert err <= limit, f"{name}: max|golden - definition| = {err:.3e} > float64 floor {limit:.3e}"


def _dense_check(p: Problem, q, k, v, do, kw) -> None:
    qd, kd, vd = (t.detach().to(F64).requires_grad_() for t in (q, k, v))
    sinks = kw.get("sinks")
    zd = None if sinks is None else sinks.detach().to(F64).requires_grad_()
    o, lse = definition(qd, kd, vd, causal=p.causal, scale=p.effective_scale, **{**kw, "sinks": zd})
    wrt = [qd, kd, vd] + ([zd] if zd is not None else [])
    grads = torch.autograd.grad(o, wrt, do.to(F64))
    go, glse = attention_golden(q, k, v, causal=p.causal, scale=p.scale, **kw)
    logits = conditioning(p).raw_logits
    _close("o", go, o, logits=logits)
    _close("lse", glse, lse, logits=logits)
    golden_grads = attention_golden_backward(q, k, v, do, causal=p.causal, scale=p.scale, bounds=True, **kw)
    n = len(wrt)
    for name, g, want, bound in zip(("dq", "dk", "dv", "dsinks"), golden_grads[:n], grads, golden_grads[n:]):
        _close(name, g, want, float(bound.abs().max()) if bound.numel() else 0.0, logits)


@settings(max_examples=40)
@given(
    st.sampled_from(MODIFIERS).flatmap(
        lambda v: variant_problems(EVERYTHING, v, sizes=SIZES, dtypes=(F64,), mode="dense")
    )
)
def test_dense_variant_golden_equals_definition(p: Problem):
    inp = p.kernel_inputs()
    _dense_check(
        p,
        *inp.args,
        p.grad_output(),
        {k: v.detach() if hasattr(v, "detach") else v for k, v in inp.kwargs.items()},
    )


@settings(max_examples=25)
@given(st.one_of(
    st.sampled_from((*MODIFIERS, "dropout")).flatmap(
        lambda v: variant_problems(EVERYTHING, v, sizes=SIZES, mode="dense", backward=True)),
    variant_problems(EVERYTHING, "varlen", sizes=SIZES, backward=True)))
def test_references_golden_backward_is_the_plain_call(p: Problem):
    """The golden gradients and bounds of ``harness.check.references`` (which hands the golden
    backward, dense or varlen, the forward it has just computed) are exactly those of the golden
    backward alone."""
    golden, _ = references_with(p, "bottom-right", False, True)
    inp = p.kernel_inputs()
    q, k, v, *rest = inp.args
    alone = REFERENCES[p.mode][1](q, k, v, p.grad_output(), *rest, causal=p.causal, scale=p.scale,
                                  bounds=True, **inp.kwargs)
    names = gradient_names(p)
    for name, t in zip(names, alone[: len(names)], strict=True):
        assert torch.equal(getattr(golden, name), t), name
    assert golden.bounds == {n: float(t.abs().max()) if t.numel() else 0.0
                             for n, t in zip(names, alone[len(names) :], strict=True)}


@settings(max_examples=25)
@given(variant_problems(EVERYTHING, "varlen", sizes=SIZES, dtypes=(F64,)))
def test_varlen_golden_is_the_definition_per_sequence(p: Problem):
    inp = p.kernel_inputs()
    q, k, v, cu_q, cu_k, mq, mk = inp.args
    kw = {name: val.detach() if hasattr(val, "detach") else val for name, val in inp.kwargs.items()}
    o, lse = varlen_golden(*inp.args, causal=p.causal, scale=p.scale, **kw)
    grads = varlen_golden_backward(
        q, k, v, p.grad_output(), cu_q, cu_k, mq, mk, causal=p.causal, scale=p.scale, bounds=True, **kw
    )
    n = 4 if p.sinks is not None else 3
    bound = {
        name: float(t.abs().max()) if t.numel() else 0.0 for name, t in zip(("dq", "dk", "dv"), grads[n:])
    }
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for s in range(p.b):
        sq, sk = slice(cq[s], cq[s + 1]), slice(ck[s], ck[s + 1])
        kws = dict(kw)
        if p.alibi is not None and p.alibi[0] == "batch-head":
            kws["alibi_slopes"] = kw["alibi_slopes"][s]
        seq = p.replace(b=1, nq=sq.stop - sq.start, nk=sk.stop - sk.start, seqlens=None)
        qd, kd, vd = (
            t.detach()[sl].transpose(0, 1)[None].to(F64).requires_grad_()
            for t, sl in ((q, sq), (k, sk), (v, sk))
        )
        od, lsed = definition(qd, kd, vd, causal=p.causal, scale=seq.effective_scale, **kws)
        logits = conditioning(p).raw_logits
        _close("o", o[sq], od[0].transpose(0, 1), logits=logits)
        _close("lse", lse[:, sq], lsed[0], logits=logits)
        if od.numel():
            dq, dk, dv = torch.autograd.grad(od, (qd, kd, vd), p.grad_output()[sq].transpose(0, 1)[None])
            _close("dq", grads[0][sq], dq[0].transpose(0, 1), bound["dq"], logits)
            _close("dk", grads[1][sk], dk[0].transpose(0, 1), bound["dk"], logits)
            _close("dv", grads[2][sk], dv[0].transpose(0, 1), bound["dv"], logits)


@settings(max_examples=25)
@given(variant_problems(EVERYTHING, "kvcache", sizes=SIZES, dtypes=(F64,)))
def test_kvcache_golden_is_the_definition_on_the_valid_cache(p: Problem):
    """Decode reads only ``cache_seqlens[b]`` keys of batch element b (the NaN poison beyond
    would show), through the block table when paged."""
    inp = p.kernel_inputs()
    kw = {name: val.detach() if hasattr(val, "detach") else val for name, val in inp.kwargs.items()}
    o, lse = kvcache_golden(*inp.args, causal=p.causal, scale=p.scale, **kw)
    q, k, v, _ = p.logical()
    for b, length in enumerate(p.cache):
        kws = {n: val for n, val in kw.items() if n not in ("cache_seqlens", "block_table", "num_splits")}
        if p.alibi is not None and p.alibi[0] == "batch-head":
            kws["alibi_slopes"] = kw["alibi_slopes"][b]
        od, lsed = definition(
            q[b : b + 1].to(p.dtype).to(F64),
            k[b : b + 1, :, :length].to(p.dtype).to(F64),
            v[b : b + 1, :, :length].to(p.dtype).to(F64),
            causal=p.causal,
            scale=p.effective_scale,
            **kws,
        )
        _close("o", o[b], od[0].transpose(0, 1), logits=conditioning(p).raw_logits)
        _close("lse", lse[b], lsed[0], logits=conditioning(p).raw_logits)


@pytest.mark.parametrize("row", TABLE, ids=lambda row: row.name)
def test_each_row_of_the_variant_table_holds_for_its_problems(row: Variant):
    """A problem drawn for a variant uses it (``Problem.variants``), its call carries the row's
    keywords through the row's entry point; a kernel declaring everything declares it and
    refuses none of them, one that does not declare it refuses each with a reason (but a single
    split, which every decode takes); a row with a backward has drawable backward problems."""
    nothing = replace(EVERYTHING, **_without(row.name))

    @settings(max_examples=15, deadline=None, database=None, derandomize=True)
    @given(variant_problems(EVERYTHING, row.name, device="cpu", sizes=SIZES, backward=False))
    def check(p: Problem) -> None:
        assert row.used(p) and row.name in p.variants, p.describe()
        assert p.mode in row.modes, p.describe()
        assert set(row.keywords) <= set(p.kernel_inputs().kwargs), (row.keywords, p.describe())
        assert row.declared(EVERYTHING) and row.refusal(EVERYTHING, p) is None
        assert EVERYTHING.unsupported_reason(p) is None
        assert not row.declared(nothing)
        if row.name != "splits" or p.num_splits > 1:  # num_splits=1 (no split) is every decode's
            assert nothing.unsupported_reason(p) is not None, p.describe()

    check()
    if row.backward:
        found = []

        @settings(max_examples=3, deadline=None, database=None, derandomize=True)
        @given(variant_problems(EVERYTHING, row.name, device="cpu", sizes=SIZES, backward=True))
        def backward(p: Problem) -> None:
            found.append(EVERYTHING.backward_reason(p))

        backward()
        assert found and all(reason is None for reason in found), found


def run_variant_error_contract(name: str, fn: Callable, caps: Capabilities, caught: bool) -> None:
    """The variant error contract on the stand-in kernel ``fn`` declaring ``caps``: 8 generated
    examples of tiny problems under a profile of their own (the loaded one restored after);
    ``caught``: the property must fail, else pass. In a run context of its own (the stand-in's
    tallies out of the session's summary)."""
    kernel = Kernel(name=name, fn=fn, capabilities=caps)
    prop = error_contract.test_undeclared_variant_raises_clear_error_or_is_correct
    sizes = Sizes(max_n=6, max_batch=1, max_kv_heads=1, max_group=2, max_head_dim=8, max_work=10_000)
    saved = settings.default
    settings.register_profile(f"flashprop-{name}", saved, max_examples=8, phases=[Phase.generate])
    settings.load_profile(f"flashprop-{name}")
    try:
        if caught:
            with pytest.raises(PropertyFailure, match="variant-error-contract"):
                prop(RunContext(), kernel, "cpu", sizes)
        else:
            prop(RunContext(), kernel, "cpu", sizes)
    finally:
        settings.register_profile(f"flashprop-{name}-saved", saved)
        settings.load_profile(f"flashprop-{name}-saved")


def _without(name: str) -> dict:
    """Capabilities fields that leave variant ``name`` undeclared (the others as EVERYTHING's)."""
    off = {"window": {"window": False}, "softcap": {"softcap": False}, "alibi": {"alibi": frozenset()},
           "sinks": {"sinks": False}, "varlen": {"varlen": False}, "kvcache": {"kvcache": None},
           "paged": {"kvcache": KVCache(page_sizes=(), max_splits=4)},
           "splits": {"kvcache": KVCache(page_sizes=(1, 3, 4), max_splits=1)}, "dropout": {"dropout": False},
           "fp8": {"fp8": FP8(formats=frozenset(FORMATS), descales=frozenset(),
                              cache_scales=frozenset(CACHE_SCALE_SHAPES))},
           "fp8-cache": {"fp8": FP8(formats=frozenset(FORMATS), descales=frozenset(DESCALE_SHAPES))}}
    return off[name]
