"""Meta-tests of the tolerance model's float64 floor (``docs/tolerance.md``).

In float64 the yardstick rounds as the golden does, so the floor alone separates a correct kernel
from a wrong one; it must exceed the golden's own error, with room for a kernel that rounds
differently. :class:`Exact` computes tiny problems in mpmath at :data:`DIGITS` digits from the
definition (o and lse row by row; the gradients of ``sum(dO * o)`` by central differences of
step :data:`STEP`, whose truncation and cancellation errors are below 1e-30 relative), sharing no
arithmetic with the golden (only ``contract.masks``' visibility rule). Against it:

- the float64 golden (forward, backward, dsinks) stays within ``GOLDEN_ULPS`` units of the floor's
  scale, and within a quarter of the floor itself, on plain, softcap, ALiBi, sinks and window
  problems, the drawn value distributions included (``large``, ``spikes``, ``overflow`` ...);
- ``ref-reordered`` (``refimpl/reordered.py``: another summation order) passes the problems where
  the floor taken from max|lse| alone failed it (softcap 0.5, large logits, ALiBi, sinks), while
  a float64 kernel that computes in float32 still fails there;
- the conditioning: ``raw_logit_size`` against a pair-by-pair loop (GQA, key chunks), and L the
  larger of the raw logits' size and max|lse|.
"""

from __future__ import annotations

import mpmath
import pytest
import torch
from flashprop.contract.capabilities import ALIBI_SHAPES, Capabilities
from flashprop.contract.masks import causal_offset, visible_mask
from flashprop.contract.problem import Problem
from flashprop.contract.registry import Kernel, load_kernel
from flashprop.harness import tolerance
from flashprop.harness.agreement import budgets, references_on
from flashprop.harness.check import gradient_names, judge, reference_for, run_kernel
from flashprop.harness.long_references import golden_on_device, judge_long, yardstick_rows
from flashprop.harness.strategies import Sizes, problems
from flashprop.harness.tolerance import GOLDEN_ULPS, budget, conditioning, finite_max_abs
from flashprop.harness.variant_problems import variant_problems
from flashprop.refimpl import attention_golden, attention_golden_backward, attention_yardstick
from flashprop.refimpl.blocked import attention as blocked_attention
from hypothesis import given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.meta

F64 = torch.float64
EPS = torch.finfo(F64).eps
DIGITS = 50
STEP = mpmath.mpf(10) ** -20
TINY = Sizes(max_n=5, max_batch=2, max_kv_heads=1, max_group=2, max_head_dim=6, max_work=2_000)
DENSE_VARIANTS = Capabilities(window=True, softcap=True, alibi=ALIBI_SHAPES, sinks=True)
NAMES = ("o", "lse", "dq", "dk", "dv", "dsinks")
#: Problems where ref-reordered's dq, dk exceed the floor computed from max|lse| alone (as the
#: suite had it): a saturating softcap on large logits, with ALiBi or sinks (found by search).
FALSE_POSITIVES = (
    Problem(b=1, hq=2, hkv=1, nq=3, nk=4, d=6, dv=6, dtype=F64, scale=1.0, dist="large", seed=331,
            block_m=3, block_n=3, softcap=0.5, alibi=("head", 1.0)),
    Problem(b=1, hq=2, hkv=1, nq=8, nk=32, d=16, dv=16, dtype=F64, scale=2.0, dist="large", seed=49,
            block_m=16, block_n=16, softcap=0.5, alibi=("head", 1.0)),
    Problem(b=1, hq=2, hkv=1, nq=16, nk=8, d=32, dv=32, dtype=F64, scale=0.5, dist="large", seed=703,
            block_m=16, block_n=16, softcap=0.5, sinks="mixed"),
)


def _mp(t: torch.Tensor):
    """A tensor's values as nested lists of mpf (exact: a float converts without rounding)."""
    return [_mp(x) for x in t] if t.dim() else mpmath.mpf(float(t))


class Exact:
    """A dense problem computed in mpmath from the definition (``docs/variants.md``).

    ``s_ij = scale * q_i . k_j``, then ``s = t * tanh(s / t)`` (softcap t), then
    ``s -= slope * |i + c - j|`` (ALiBi); keys that query i does not see are left out; the sink z
    is one more logit with no value. ``lse_i = log(sum_j exp(s_ij) + exp(z))``,
    ``o_i = sum_j exp(s_ij - lse_i) v_j``; a row with no logit at all has o = 0, lse = -inf."""

    def __init__(self, p: Problem, alignment: str = "bottom-right"):
        q, k, v, do = (t.to(F64) for t in p.logical())
        kw = p.kernel_inputs().kwargs
        self.p, self.group = p, p.hq // p.hkv
        self.q, self.k, self.v, self.do = _mp(q), _mp(k), _mp(v), _mp(do)
        self.scale = mpmath.mpf(p.effective_scale)
        self.cap = mpmath.mpf(p.softcap) if p.softcap else None
        slopes = kw.get("alibi_slopes")
        self.slopes = None if slopes is None else _mp(slopes.to(F64).expand(p.b, p.hq))
        self.sinks = None if kw.get("sinks") is None else _mp(kw["sinks"].detach().to(F64))
        mask = visible_mask(p.nq, p.nk, causal=p.causal, alignment=alignment, window=p.window)
        self.visible = [[mask is None or bool(mask[i, j]) for j in range(p.nk)] for i in range(p.nq)]
        self.offset = causal_offset(p.nq, p.nk, alignment)

    def row(self, b: int, h: int, i: int) -> tuple[list, mpmath.mpf]:
        """``(o_i, lse_i)`` of query row i of head h, batch element b."""
        hk = h // self.group
        keys = [j for j in range(self.p.nk) if self.visible[i][j]]
        logits = []
        for j in keys:
            s = self.scale * _dot(self.q[b][h][i], self.k[b][hk][j])
            if self.cap is not None:
                s = self.cap * mpmath.tanh(s / self.cap)
            if self.slopes is not None:
                s -= self.slopes[b][h] * abs(i + self.offset - j)
            logits.append(s)
        every = logits + ([self.sinks[h]] if self.sinks is not None else [])
        if not every:
            return [mpmath.mpf(0)] * self.p.dv, mpmath.mpf("-inf")
        top = max(every)
        lse = top + mpmath.log(mpmath.fsum(mpmath.exp(s - top) for s in every))
        weights = [mpmath.exp(s - lse) for s in logits]
        o = [mpmath.fsum(w * self.v[b][hk][j][e] for w, j in zip(weights, keys, strict=True))
             for e in range(self.p.dv)]
        return o, lse

    def _loss(self, rows: list[tuple[int, int, int]]) -> mpmath.mpf:
        """``sum(dO * o)`` over ``rows``."""
        return mpmath.fsum(_dot(self.do[b][h][i], self.row(b, h, i)[0]) for b, h, i in rows)

    def _derivative(self, cell: list, index: int, rows: list[tuple[int, int, int]]) -> mpmath.mpf:
        """d loss / d cell[index] by a central difference over the ``rows`` it changes."""
        x = cell[index]
        cell[index] = x + STEP
        up = self._loss(rows)
        cell[index] = x - STEP
        down = self._loss(rows)
        cell[index] = x
        return (up - down) / (2 * STEP)

    def outputs(self) -> dict[str, torch.Tensor | list]:
        """o, lse and the gradients dq, dk, dv (and dsinks), as nested lists of mpf."""
        p, out = self.p, {}
        rows = [[[self.row(b, h, i) for i in range(p.nq)] for h in range(p.hq)] for b in range(p.b)]
        out["o"] = [[[r[0] for r in head] for head in batch] for batch in rows]
        out["lse"] = [[[r[1] for r in head] for head in batch] for batch in rows]
        out["dq"] = [[[[self._derivative(self.q[b][h][i], d, [(b, h, i)]) for d in range(p.d)]
                       for i in range(p.nq)] for h in range(p.hq)] for b in range(p.b)]
        for name, tensor, width in (("dk", self.k, p.d), ("dv", self.v, p.dv)):
            out[name] = [[[[self._derivative(tensor[b][hk][j], e, self._rows_of(b, hk)) for e in range(width)]
                           for j in range(p.nk)] for hk in range(p.hkv)] for b in range(p.b)]
        if self.sinks is not None:
            out["dsinks"] = [self._derivative(self.sinks, h, self._rows_of_head(h))
                             for h in range(p.hq)]
        return out

    def _rows_of_head(self, h: int) -> list[tuple[int, int, int]]:
        """The rows of query head ``h`` (every batch element)."""
        return [(b, h, i) for b in range(self.p.b) for i in range(self.p.nq)]

    def _rows_of(self, b: int, hk: int) -> list[tuple[int, int, int]]:
        """The rows that read kv head ``hk`` of batch element ``b``."""
        heads = range(hk * self.group, (hk + 1) * self.group)
        return [(b, h, i) for h in heads for i in range(self.p.nq)]


def _dot(a: list, b: list) -> mpmath.mpf:
    return mpmath.fsum(x * y for x, y in zip(a, b, strict=True))


def _flat(nested) -> list:
    return [x for item in nested for x in _flat(item)] if isinstance(nested, list) else [nested]


def _error(golden: torch.Tensor, exact: list) -> float:
    """max|golden - exact| over the entries where the exact value is finite, in mpmath."""
    pairs = zip(golden.detach().to(F64).reshape(-1).tolist(), _flat(exact), strict=True)
    return max((float(abs(mpmath.mpf(g) - x)) for g, x in pairs if mpmath.isfinite(x)), default=0.0)


def golden_errors(p: Problem) -> dict[str, tuple[float, float, float]]:
    """Per tensor: the golden's error against :class:`Exact`, its unit
    ``eps(float64) * max(1, L) * max(1, magnitude, values)`` and the float64 floor, with L,
    magnitude and values as :func:`harness.check.judge` takes them."""
    inp = p.kernel_inputs()
    kw = dict(causal=p.causal, scale=p.scale, **inp.kwargs)
    o, lse = attention_golden(*inp.args, **kw)
    found = attention_golden_backward(*inp.args, p.grad_output(), bounds=True, **kw)
    names = gradient_names(p)
    golden = {"o": o, "lse": lse, **dict(zip(names, found[: len(names)], strict=True))}
    bounds = {n: finite_max_abs(t) for n, t in zip(names, found[len(names) :], strict=True)}
    cond = conditioning(p)
    size = cond.logit_size(lse)
    with mpmath.workdps(DIGITS):
        exact = Exact(p).outputs()
        result = {}
        for name, g in golden.items():
            magnitude = bounds.get(name, finite_max_abs(g))
            values = cond.values if name == "o" else 0.0
            unit = EPS * max(1.0, size) * max(1.0, magnitude, values)
            floor = budget(name, F64, 0.0, magnitude, size, values)[1]
            result[name] = (_error(g, exact[name]), unit, floor)
    return result


def _assert_golden_within_bound(p: Problem) -> None:
    for name, (err, unit, floor) in golden_errors(p).items():
        assert err <= GOLDEN_ULPS * unit, f"{name}: golden error {err:.3e} is {err / unit:.2f} ulps"
        assert err <= floor / 4, f"{name}: golden error {err:.3e} > a quarter of the floor {floor:.3e}"


@settings(max_examples=12)
@given(problems(DENSE_VARIANTS, dtypes=(F64,), sizes=TINY))
def test_golden_error_plain(p: Problem):
    """Plain problems (every value distribution, causal, GQA, scales): the golden within
    GOLDEN_ULPS of the floor's scale and a quarter of the floor, against mpmath."""
    _assert_golden_within_bound(p)


@pytest.mark.parametrize("variant", ("softcap", "alibi", "sinks", "window"))
@settings(max_examples=8)
@given(data=st.data())
def test_golden_error_variants(variant: str, data: st.DataObject):
    """Problems using ``variant`` (the other dense variants joining at random), forward and
    backward, dsinks included: the golden within its bound, against mpmath."""
    p = data.draw(variant_problems(DENSE_VARIANTS, variant, dtypes=(F64,), sizes=TINY, mode="dense",
                                   backward=True), label="problem")
    _assert_golden_within_bound(p)


def test_golden_error_on_a_false_positive():
    """The tiny problem where the floor from max|lse| failed ref-reordered: the golden within its
    bound there too."""
    _assert_golden_within_bound(FALSE_POSITIVES[0])


# ---------------------------------------------------------------- ref-reordered on the floor's edge


def _in_float32(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs) -> tuple[torch.Tensor, ...]:
    """A wrong float64 kernel: ref-blocked run in float32 (tensors cast down, outputs cast back)."""
    kwargs = {n: t.float() if isinstance(t, torch.Tensor) else t for n, t in kwargs.items()}
    o, lse = blocked_attention(q.float(), k.float(), v.float(), **kwargs)
    return o.double(), lse.double()


_in_float32.capabilities = load_kernel("ref-reordered").capabilities


def _judged(kernel: Kernel, p: Problem) -> list:
    return judge(kernel, p, run_kernel(kernel, p, "meta", backward=True), ("o", "lse", *gradient_names(p)))


@pytest.mark.parametrize("p", FALSE_POSITIVES, ids=lambda p: f"{p.nq}x{p.nk}x{p.d}")
def test_reordered_passes_where_the_lse_floor_failed(p: Problem):
    """ref-reordered passes each fixed false positive, and a float64 kernel that computes in
    float32 still fails there."""
    kernel = load_kernel("ref-reordered")
    results = _judged(kernel, p)
    assert all(r.ok for r in results), "\n".join(r.describe() for r in results)
    wrong = _judged(Kernel("float32-inside", _in_float32, _in_float32.capabilities), p)
    assert not all(r.ok for r in wrong), "a float64 kernel computing in float32 passed"


def _beyond_the_lse_floor(p: Problem) -> list[str]:
    """The gradients of ref-reordered on ``p`` that the floor from max|lse| alone (as the suite
    had it) fails."""
    kernel = load_kernel("ref-reordered")
    golden, yard = reference_for(kernel, p, backward=True)
    out = run_kernel(kernel, p, "meta", backward=True)
    lse_only = finite_max_abs(golden.lse)
    beyond = []
    for name in ("dq", "dk"):
        g = getattr(golden, name)
        err = float((getattr(out, name).detach() - g).abs().max())
        y_err = float((getattr(yard, name) - g).abs().max())
        if err > budget(name, F64, y_err, golden.bounds[name], lse_only)[0]:
            beyond.append(name)
    return beyond


def test_the_false_positives_pin_the_fix():
    """On some fixed false positive the floor from max|lse| alone fails dq or dk, so the cases
    pin the fix. Which of them does depends on the machine: float64 matmuls round by the BLAS
    code path the CPU takes (MKL's AVX2 path on an AMD EPYC, session 32: the 8x32x16 case's
    errors were 0.16-0.17 of that floor, the 3x4x6 case's dk 1.15x and the 16x8x32 case's 1.11x;
    the machine the cases were found on failed all three)."""
    assert any(_beyond_the_lse_floor(p) for p in FALSE_POSITIVES), (
        "the floor from max|lse| alone passes every fixed false positive: they no longer pin the fix"
    )


# ---------------------------------------------------------------- the conditioning


@pytest.mark.parametrize(("hq", "hkv", "nk", "chunk"),
                         [(1, 1, 7, 1024), (6, 2, 11, 4), (4, 1, 9, 9), (2, 2, 0, 3)])
def test_raw_logit_size_is_the_largest_abs_sum(hq: int, hkv: int, nk: int, chunk: int):
    """raw_logit_size is scale * max sum_d |q_d||k_d| over every pair of a head, GQA's head map
    and key chunks included (a pair by pair loop), and 0 with no key."""
    g = torch.Generator().manual_seed(hq * 100 + nk)
    q = torch.randn(2, hq, 5, 3, generator=g, dtype=F64)
    k = torch.randn(2, hkv, nk, 3, generator=g, dtype=F64)
    group = hq // hkv
    pairs = [float((q[b, h, i].abs() * k[b, h // group, j].abs()).sum())
             for b in range(2) for h in range(hq) for i in range(5) for j in range(nk)]
    expected = 0.5 * max(pairs, default=0.0)
    assert tolerance.raw_logit_size(q, k, -0.5, chunk) == pytest.approx(expected, rel=1e-15)
    if nk:  # an entry past a decode cache's length (NaN) or an inf counts 0
        k[0, 0, 0] = float("nan")
        k[1, -1, -1] = float("inf")
        assert 0 < tolerance.raw_logit_size(q, k, 0.5, chunk) <= expected


def test_the_entry_points_layouts_give_an_upper_bound():
    """Conditioning.of_entry on a varlen pack and on a decode cache (contiguous and paged, NaN past
    each length) is at least the dense problem's: every query against every key of its group."""
    for p in (Problem(dtype=F64, hq=4, hkv=2, nq=5, nk=7, d=8, dv=8, seqlens=((5, 7), (3, 2))),
              Problem(dtype=F64, b=2, hq=4, hkv=2, nq=2, nk=16, d=8, dv=8, cache=(16, 9)),
              Problem(dtype=F64, b=2, hq=4, hkv=2, nq=2, nk=16, d=8, dv=8, cache=(5, 16), page_size=4)):
        inp = p.kernel_inputs()
        entry = tolerance.Conditioning.of_entry(p.mode, inp.args, p.effective_scale)
        dense = conditioning(p)
        assert entry.raw_logits >= dense.raw_logits * (1 - 1e-15) > 0, p.describe()
        assert entry.values >= dense.values * (1 - 1e-15) > 0, p.describe()


@pytest.mark.parametrize("p", FALSE_POSITIVES, ids=lambda p: f"{p.nq}x{p.nk}x{p.d}")
def test_every_budget_takes_the_conditioning(p: Problem):
    """The budgets of the properties that compare two runs (``harness.agreement.budgets``, on the
    problem's references or on its inputs passed again) and of the long-sequence judge are the
    single-run judge's: the floor's logit term from the raw logits there too, not max|lse|."""
    kernel = load_kernel("ref-reordered")
    out = run_kernel(kernel, p, "meta", backward=True)
    judged = {r.name: r.budget for r in judge(kernel, p, out, ("o", "lse"))}
    for refs in (references_on(kernel, p), references_on(kernel, p, p.inputs())):
        assert budgets(p.dtype, refs) == pytest.approx(judged, rel=1e-12)
    plain = p.replace(softcap=0.0, alibi=None, sinks=None)
    q, k, v = plain.inputs()
    do = plain.grad_output()
    golden, _ = golden_on_device(q, k, v, do, causal=False, scale=plain.scale, alignment="bottom-right",
                                 chunk=1024)
    yard = yardstick_rows(q, k, v, do, causal=False, scale=plain.scale, alignment="bottom-right",
                          tf32=False, max_scores=1 << 20)
    names = ("o", "lse", "dq", "dk", "dv")
    plain_out = run_kernel(kernel, plain, "meta", backward=True)
    long = {r.name: r.budget for r in judge_long(plain_out, golden, yard, plain.dtype, names)}
    single = {r.name: r.budget for r in judge(kernel, plain, plain_out, names)}
    assert long == pytest.approx(single, rel=1e-12)


def test_logit_size_takes_the_larger_of_raw_logits_and_lse():
    """L is the raw logits' size where a softcap caps the lse far below it, and max|lse| where
    a sink lies far above every logit; V is max|V|."""
    capped = Problem(dtype=F64, dist="large", softcap=0.5, nq=8, nk=8, d=16, dv=16)
    cond = conditioning(capped)
    golden = reference_for(load_kernel("ref-blocked"), capped, backward=False)[0]
    assert cond.raw_logits > 50 * finite_max_abs(golden.lse)
    assert cond.logit_size(golden.lse) == cond.raw_logits
    assert cond.values == finite_max_abs(capped.logical()[2])
    above = torch.tensor([[[cond.raw_logits + 120.0]]], dtype=F64)
    assert cond.logit_size(above) == cond.raw_logits + 120.0


@pytest.mark.parametrize("dist", ["normal", "large"])
def test_the_yardstick_keeps_a_huge_caps_logits_in_fp16(dist: str):
    """A cap of 1e8 is no cap: the fp16 yardstick's error is then about its error without a cap.
    Its softcap computed in fp16 put s / cap below fp16's smallest normal and moved the capped
    logits by units, so ``r x yardstick error`` passed a kernel whose tanh zeroes them (mutant
    ``triton_softcap_tanh_cancels``)."""
    capped = Problem(dtype=torch.float16, dist=dist, softcap=1e8, nq=16, nk=32, d=32, dv=32, seed=5)

    def lse_error(p: Problem) -> float:
        inp = p.kernel_inputs()
        golden = attention_golden(*inp.args, **inp.kwargs)[1]
        return (attention_yardstick(*inp.args, **inp.kwargs)[1].double() - golden).abs().max().item()

    assert lse_error(capped) <= 2 * lse_error(capped.replace(softcap=0.0)) + 1e-3
