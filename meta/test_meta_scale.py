"""Meta-tests of the scale properties' helpers (kernel-independent, CPU, seconds).

The spread layouts put part of every tensor's last slice past element 2^31 and never overlap
slices; the units of a huge problem hold element 2^31 of each tensor that has one; the huge
strategies draw declared problems past 2^31 that fit their budget, along their axis; the huge
check itself, run on the CPU with the boundary moved down to element 3000, passes a correct
kernel and catches one that loses what lies past the boundary, along every axis; the yardstick
computed by blocks of rows is the plain yardstick; and the error contract at scale passes a
kernel that refuses views past its ``max_elements`` and fails one that answers them wrongly;
the ``triton`` kernel takes its slower 64-bit row offsets only for tensors that need them.
"""

from __future__ import annotations

import math

import pytest
import torch
from flashprop.contract.capabilities import FULL_SUPPORT, Capabilities, Limit
from flashprop.contract.problem import Problem
from flashprop.contract.registry import Kernel, load_kernel
from flashprop.harness import scale_problems
from flashprop.harness.check import PropertyFailure
from flashprop.harness.long_references import row_segments, yardstick_rows
from flashprop.harness.run_context import RunContext
from flashprop.harness.scale_problems import (
    AXES,
    BOUNDARY,
    SPREAD_LAYOUTS,
    axis_of,
    huge_bytes,
    huge_problems,
    logical_shapes,
    spread_geometry,
    undeclared_reason,
    units,
)
from flashprop.kernels.sdpa import sdpa_flash
from flashprop.properties import test_huge
from flashprop.refimpl import attention_yardstick
from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable

pytestmark = pytest.mark.meta

F64 = torch.float64
BUDGET = 80 * 2**30


@given(st.lists(st.integers(1, 40), min_size=4, max_size=4), st.sampled_from(sorted(SPREAD_LAYOUTS)))
def test_spread_layouts_cross_the_boundary(shape: list[int], layout: str):
    """Slices of a spread view never overlap, their gap is 16-byte aligned (a multiple of 8
    elements), and at least half of the last slice (all of it when it is under 16 elements)
    lies at or past element 2^31."""
    lead = SPREAD_LAYOUTS[layout]
    count, inner = math.prod(shape[:lead]), math.prod(shape[lead:])
    strides, span = spread_geometry(tuple(shape), layout)
    if count < 2:
        assert span == count * inner
        return
    gap = strides[lead - 1]
    assert gap % 8 == 0 and gap >= inner
    last = (count - 1) * gap
    assert span == last + inner
    assert last + inner - BOUNDARY >= -(-inner // 2)  # elements of the last slice past 2^31
    assert last <= BOUNDARY + 8 * (count - 1)


def _flat_range(shape: tuple[int, ...], index: tuple) -> tuple[int, int]:
    """First and one-past-last flat offset of a contiguous tensor's ``index`` (slices of the
    leading dims, the rest whole)."""
    strides = [math.prod(shape[i + 1 :]) for i in range(len(shape))]
    first = sum(s.start * st for s, st in zip(index, strides, strict=False))
    last = sum((s.stop - 1) * st for s, st in zip(index, strides, strict=False))
    last += sum((n - 1) * st for n, st in zip(shape[len(index) :], strides[len(index) :], strict=True))
    return first, last + 1


@settings(max_examples=40)
@given(st.data())
def test_huge_draws_cross_the_boundary_along_their_axis(data: st.DataObject):
    """Each huge problem is declared, fits the budget, lies along its axis and has a tensor
    past 2^31 elements; its units hold element 2^31 of each tensor that has one, and the last
    unit is compared too. No tensor is built."""
    caps = data.draw(st.sampled_from([FULL_SUPPORT, sdpa_flash.capabilities, Capabilities(varlen=True)]))
    axis = data.draw(st.sampled_from([a for a in AXES if a != "varlen" or caps.varlen]))
    p: Problem = data.draw(huge_problems(caps, axis, device="cuda", budget=BUDGET))
    assert undeclared_reason(caps, p) is None and huge_bytes(p) <= BUDGET
    assert axis_of(p) == axis
    shapes = logical_shapes(p)
    if axis == "varlen":  # packed (T, H, D)
        tq, tk = (sum(pair[i] for pair in p.seqlens) for i in (0, 1))
        shapes = {"q": (tq, p.hq, p.d), "k": (tk, p.hkv, p.d), "v": (tk, p.hkv, p.dv), "o": (tq, p.hq, p.dv)}
    assert max(math.prod(s) for s in shapes.values()) > BOUNDARY
    parts = units(p, caps.causal_alignment)
    for name, shape in shapes.items():
        if math.prod(shape) <= BOUNDARY:
            continue
        index_of = (lambda u: u.q_index) if name in ("q", "o") else (lambda u: u.kv_index)
        ranges = [_flat_range(shape, index_of(u)) if index_of(u) else (0, math.prod(shape)) for u in parts]
        assert any(a <= BOUNDARY < b for a, b in ranges), f"no unit holds element 2^31 of {name}"
        assert any(b == math.prod(shape) for _, b in ranges), f"the last unit of {name} is missing"
    for u in parts:
        assert u.problem.b == 1 and math.prod(logical_shapes(u.problem)["q"]) < BOUNDARY
        assert undeclared_reason(caps, u.problem) is None


@pytest.mark.parametrize("axis", AXES)
def test_huge_independence_skips_what_max_elements_refuses(axis: str):
    """A kernel declaring max_elements below 2^31 draws no huge problem (each holds more), so
    test_huge_independence skips it on a GPU, naming the declaration, rather than failing the
    draw as unsatisfiable (as it did on the H200 for the SDPA backends and Flex); a kernel
    declaring no limit runs it."""
    limited = Capabilities(varlen=True, max_elements=2**31 - 1)
    with pytest.raises(Unsatisfiable):
        find(huge_problems(limited, axis, device="cuda", budget=BUDGET), lambda p: True)
    kernel = Kernel(name="meta-limited", fn=lambda q, k, v: q, capabilities=limited)
    assert "max_elements=2147483647" in test_huge.huge_skip_reason(kernel, "cuda", axis)
    full = Kernel(name="meta-full", fn=lambda q, k, v: q, capabilities=Capabilities(varlen=True))
    assert test_huge.huge_skip_reason(full, "cuda", axis) is None
    assert "for a GPU" in test_huge.huge_skip_reason(full, "cpu", axis)


GRID_LIMIT_65535 = Limit(reason="batch * heads above 65535 (a CUDA grid dimension)",
                         applies=lambda p: p.b * p.hq > 65535)


@settings(max_examples=30)
@given(st.data())
def test_huge_varlen_draws_respect_a_limit_on_batch_times_heads(data: st.DataObject):
    """A limit on B x Hq sees a huge varlen problem's number of sequences: the H200 drew, for
    the triton kernel (which declares this limit), Problem(b=257, hq=256, ...) with 257
    sequences as declared, because the problem its limits were asked about kept two sequences.
    Draws respect the limit, and the problem found there is undeclared, naming it."""
    caps = Capabilities(varlen=True, limits=(GRID_LIMIT_65535,))
    p: Problem = data.draw(huge_problems(caps, "varlen", device="cuda", budget=BUDGET))
    assert p.b * p.hq <= 65535
    found = Problem(b=257, hq=256, hkv=64, nq=512, nk=512, d=16, dv=64, dtype=torch.float16,
                    device="cuda", seqlens=((512, 512),) * 257)
    assert GRID_LIMIT_65535.reason in (undeclared_reason(caps, found) or "")


#: Problems past a boundary moved to element 3000, one per axis (causal or not, GQA, Nq != Nk).
SCALED_BOUNDARY = 3000
SCALED = (
    Problem(b=2, hq=8, hkv=4, nq=17, nk=9, d=16, dv=16, seed=1, causal=True),
    Problem(b=9, hq=2, hkv=1, nq=17, nk=17, d=16, dv=8, seed=2, causal=True),
    Problem(b=1, hq=1, hkv=1, nq=200, nk=7, d=16, dv=16, seed=3, causal=True),
    Problem(b=1, hq=1, hkv=1, nq=200, nk=7, d=16, dv=16, seed=3),
    Problem(b=5, hq=2, hkv=1, nq=33, nk=20, d=16, dv=16, seed=4, seqlens=((33, 20),) * 5, causal=True),
)


def _loses_past_boundary(fn):
    """``fn`` reading zeros past element :data:`SCALED_BOUNDARY` of q (a lost upper half)."""

    def attention(q, k, v, *args, **kw):
        lost = q.detach().clone()
        lost.view(-1)[SCALED_BOUNDARY:] = 0.0
        return fn(q + (lost - q).detach(), k, v, *args, **kw)

    return attention


@pytest.mark.parametrize("planted", [False, True], ids=["correct", "loses-past-boundary"])
def test_huge_check_at_a_scaled_boundary(planted: bool, monkeypatch: pytest.MonkeyPatch):
    """The huge check (units, their values, the bitwise comparison with explicit tiles) with the
    boundary moved to element 3000: the blocked kernel passes on every axis; the same kernel
    reading zeros past the boundary in q fails on every axis."""
    monkeypatch.setattr(scale_problems, "BOUNDARY", SCALED_BOUNDARY)
    base = load_kernel("ref-blocked")
    fn = base.fn
    if planted:
        fn = _loses_past_boundary(base.fn)
        fn.varlen = _loses_past_boundary(base.fn.varlen)
    kernel = Kernel(name="meta-scaled-boundary", fn=fn, capabilities=base.capabilities)
    for p in SCALED:
        axis = axis_of(p)
        verdict = test_huge.run_huge(kernel, p.replace(block_m=16, block_n=16), "meta")
        assert bool(verdict.details) == planted, f"{axis}: {verdict.details}"


@settings(max_examples=15)
@given(st.integers(1, 24), st.integers(1, 24), st.booleans(), st.sampled_from(["bottom-right", "top-left"]),
       st.integers(24, 400), st.integers(0, 2**31 - 1))
def test_yardstick_by_rows_is_the_yardstick(nq: int, nk: int, causal: bool, alignment: str,
                                            max_scores: int, seed: int):
    """o, lse and dq of the yardstick computed by blocks of rows (each row's softmax alone, with
    the keys it sees: :func:`row_segments`) equal the plain yardstick's, in float64."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 2, nq, 8, generator=g, dtype=F64)
    k, v = (torch.randn(1, 1, nk, 8, generator=g, dtype=F64) for _ in range(2))
    do = torch.randn(1, 2, nq, 8, generator=g, dtype=F64)
    segments = [s for a in range(0, nq, 7)
                for s in row_segments(nq, nk, causal, alignment, a, min(nq, a + 7))]
    assert [r for s in segments for r in range(s.r0, s.r1)] == list(range(nq))
    got = yardstick_rows(q, k, v, do, causal=causal, scale=None, alignment=alignment, tf32=False,
                         max_scores=max_scores)
    qg = q.clone().requires_grad_()
    o, lse = attention_yardstick(qg, k, v, causal=causal, alignment=alignment)
    (dq,) = torch.autograd.grad(o, qg, do)
    torch.testing.assert_close(got.o, o.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got.lse, lse.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got.dq, dq, rtol=1e-12, atol=1e-12)


_SMALL_OFFSETS = Capabilities(dtypes=frozenset({torch.float16, torch.float32}), head_dims=range(1, 65),
                              devices=frozenset({"cpu"}), max_elements=2**31 - 1)


def _span(t: torch.Tensor) -> int:
    return 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))


def _offsets_kernel(*, refuse: bool):
    """A kernel declaring ``max_elements = 2^31 - 1`` that refuses views spanning more
    (``refuse``) or answers them wrongly."""

    def attention(q, k, v, *, causal=False, scale=None):
        o, lse = attention_yardstick(q.double(), k.double(), v.double(), causal=causal, scale=scale)
        if max(_span(t) for t in (q, k, v)) > 2**31 - 1:
            if refuse:
                raise NotImplementedError("views spanning 2^31 elements or more: 32-bit offsets")
            o = o + 1
        return o.to(q.dtype), lse.float()

    return attention


@pytest.mark.parametrize("refuse", [True, False], ids=["refuses", "answers-wrongly"])
def test_scale_error_contract_catches_wrong_answers(refuse: bool):
    """The error contract at scale passes a kernel that refuses views past its max_elements and
    fails one that answers them wrongly (in a run context of its own, out of the session's summary)."""
    name = f"meta-offsets-{'refuses' if refuse else 'lies'}"
    kernel = Kernel(name=name, fn=_offsets_kernel(refuse=refuse), capabilities=_SMALL_OFFSETS)
    saved = settings.default
    settings.register_profile("flashprop-meta-scale", saved, max_examples=20,
                              phases=[Phase.explicit, Phase.generate])
    settings.load_profile("flashprop-meta-scale")
    try:
        if refuse:
            test_huge.test_scale_error_contract(RunContext(), kernel, "cpu")
        else:
            with pytest.raises(PropertyFailure, match="scale-error-contract"):
                test_huge.test_scale_error_contract(RunContext(), kernel, "cpu")
    finally:
        settings.register_profile("flashprop-meta-scale-saved", saved)
        settings.load_profile("flashprop-meta-scale-saved")


def test_extent_and_check_elements():
    """A view's extent is first to last element of its storage; check_elements refuses a tensor,
    or an output, past the limit and names it."""
    from flashprop.contract.validate import check_elements, extent

    t = torch.empty(2, 3, 4, 5)
    assert extent(t) == t.numel() == extent(t.transpose(1, 2))
    assert extent(t[:, :, ::2]) == 1 + 1 * 60 + 2 * 20 + 1 * 10 + 4 * 1  # rows 0 and 2 of 4
    assert extent(t[:, :, :0]) == 0
    check_elements("k", 120, "why", t, t, t)
    with pytest.raises(NotImplementedError, match="q spans 120 elements, more than 119: why"):
        check_elements("k", 119, "why", t, t, t)
    q, v = torch.empty(1, 1, 2, 1), torch.empty(1, 1, 1, 4)  # the output (1, 1, 2, 4) holds 8
    check_elements("k", 8, "why", q, v, v)
    with pytest.raises(NotImplementedError, match="the output spans 8 elements, more than 7"):
        check_elements("k", 7, "why", q, v, v)


def test_triton_widens_row_offsets_only_past_int32():
    """``WIDE_ROWS`` (64-bit row offsets, which cost the tuned kernels registers) for a tensor or
    view spanning more than 2^31 - 1 elements only: not for ordinary tensors, transposed or
    strided views of them, nor one row short of 2^31 elements (meta tensors: no memory)."""
    from flashprop.kernels.triton_attention import wide_rows

    q = torch.empty(2, 4, 128, 64)
    assert not wide_rows(q, q.transpose(1, 2), q[:, :, ::2])
    assert not wide_rows(torch.empty(1, 1, 2**27 - 1, 16, device="meta"))
    assert wide_rows(q, torch.empty(1, 1, 2**27 + 1, 16, device="meta"))
    rows_apart = torch.empty(BOUNDARY + 64, dtype=torch.float16, device="meta").as_strided(
        (1, 1, 45, 72), (0, 0, BOUNDARY // 44, 1))  # a spread-rows q: one slice, rows 2^31 / 44 apart
    assert wide_rows(q, rows_apart)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_long_golden_far_end_is_the_end_of_the_range_and_declared(device: str):
    """The far end runs the longest N (Nq = Nk) and Nq about Nk / 4, causal with GQA for a kernel
    that declares both, within the device's work budget; for one declaring neither GQA nor
    causal it falls back to one kv head per query head, not causal; for one declaring no long
    head dim or dtype, nothing."""
    from flashprop.contract.capabilities import Limit
    from flashprop.properties.test_long_golden import LONG, far_end

    hi, work = LONG[device]["n"][1], LONG[device]["work"]
    full = far_end(FULL_SUPPORT, device)
    assert [(p.nq, p.nk) for p in full] == [(hi, hi), (hi // 4 + 1, hi - 3)]
    for p in full:
        assert p.causal and p.hq > p.hkv == 1 and p.b * p.hq * p.nq * p.nk * p.d <= work
        assert FULL_SUPPORT.unsupported_reason(p) is None
    no_gqa_causal = Capabilities(limits=(Limit("no GQA when causal", lambda p: p.causal and p.hq != p.hkv),))
    plain = Capabilities(gqa=False, causal=False)
    assert [(p.causal, p.hq) for p in far_end(no_gqa_causal, device)] == [(True, 1), (True, 1)]
    assert [(p.causal, p.hq) for p in far_end(plain, device)] == [(False, 1), (False, 1)]
    assert far_end(Capabilities(head_dims=range(1, 33)), device) == []
