"""Meta-tests of the failure diagnoses (harness/diagnosis.py): a kernel with each convention bug
fails the golden comparison and the report names the convention and the fix, on dense and
variant problems; a backward with one gradient wrong says which; a wrong double backward gets the
``once_differentiable`` hint, and a probe of double backward that raises is a tallied failure."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import pytest
import torch
from flashprop.contract.capabilities import Capabilities, KVCache
from flashprop.contract.problem import Problem
from flashprop.contract.registry import Kernel
from flashprop.harness import diagnosis
from flashprop.harness.check import PropertyFailure, assert_close_to_golden, gradient_names, run_kernel
from flashprop.harness.run_context import RunContext
from flashprop.harness.strategies import Sizes
from flashprop.properties import test_gradcheck
from flashprop.refimpl import attention_golden, attention_yardstick
from flashprop.refimpl.layouts import kvcache_golden, varlen_golden
from hypothesis import Phase, settings

from mutants import catalogue

pytestmark = pytest.mark.meta


def _kernel(name: str, fn, **caps) -> Kernel:
    fn.capabilities = Capabilities(**caps)
    return Kernel(name=name, fn=fn, capabilities=fn.capabilities)


def _mutant(name: str) -> Kernel:
    fn = getattr(catalogue, name)
    return Kernel(name=f"meta-{name}", fn=fn, capabilities=fn.capabilities)


def _typed(q: torch.Tensor, o: torch.Tensor, lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return o.to(q.dtype), lse.to(torch.float64 if q.dtype == torch.float64 else torch.float32)


def _exact(q, k, v, **kw):
    return _typed(q, *attention_golden(q, k, v, **kw))


def top_left(q, k, v, *, causal=False, scale=None):
    return _exact(q, k, v, causal=causal, scale=scale, alignment="top-left")


def scale_one(q, k, v, *, causal=False, scale=None):
    return _exact(q, k, v, causal=causal, scale=1.0 if scale is None else scale)


def scale_inverse_d(q, k, v, *, causal=False, scale=None, **variants):
    return _exact(q, k, v, causal=causal, scale=1 / q.shape[-1] if scale is None else scale, **variants)


def scale_sqrt_d(q, k, v, *, causal=False, scale=None):
    return _exact(q, k, v, causal=causal, scale=math.sqrt(q.shape[-1]) if scale is None else scale)


def _varlen_inverse_d(q, k, v, cu_q, cu_k, max_q, max_k, *, causal=False, scale=None, **variants):
    scale = 1 / q.shape[-1] if scale is None else scale
    return _typed(q, *varlen_golden(q, k, v, cu_q, cu_k, causal=causal, scale=scale, **variants))


def _kvcache_inverse_d(q, k_cache, v_cache, *, causal=False, scale=None, **keywords):
    scale = 1 / q.shape[-1] if scale is None else scale
    return _typed(q, *kvcache_golden(q, k_cache, v_cache, causal=causal, scale=scale, **keywords))


scale_inverse_d.varlen, scale_inverse_d.kvcache = _varlen_inverse_d, _kvcache_inverse_d


def lse_base2(q, k, v, *, causal=False, scale=None):
    o, lse = _exact(q, k, v, causal=causal, scale=scale)
    return o, lse / torch.log(torch.tensor(2.0, dtype=lse.dtype))


def in_float32(q, k, v, *, causal=False, scale=None):
    o, lse = attention_golden(*(t.float() for t in (q, k, v)), causal=causal, scale=scale)
    o32, lse32 = o.float(), lse.float()  # float32 results, as a float32 kernel gives them
    return o32.to(q.dtype), lse32.to(torch.float64)


def nan_empty_rows(q, k, v, *, causal=False, scale=None):
    o, lse = _exact(q, k, v, causal=causal, scale=scale)
    return torch.where(torch.isinf(lse)[..., None], float("nan"), o), lse


def next_kv_head(q, k, v, *, causal=False, scale=None):
    return _exact(q, k.roll(-1, 1), v.roll(-1, 1), causal=causal, scale=scale)


def gqa_modulo(q, k, v, *, causal=False, scale=None):
    heads = torch.arange(q.shape[1]) % k.shape[1]
    return _exact(q, k[:, heads], v[:, heads], causal=causal, scale=scale)


def _plain(q, k, v, visible, scale: float | None, subtract_max: bool = True):
    """Softmax attention written out (no GQA): float64, or float32 with ``subtract_max=False``
    (exp(s) as it comes: it overflows float32 past s = 88.7); ``visible(i, j)`` the mask."""
    dt = torch.float64 if subtract_max else torch.float32
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = scale * (q.to(dt) @ k.to(dt).transpose(-1, -2))
    rows, cols = torch.arange(q.shape[2])[:, None], torch.arange(k.shape[2])[None, :]
    s = s.masked_fill(~visible(rows, cols), float("-inf"))
    m = s.amax(-1, keepdim=True).clamp_min(-1e30) if subtract_max else torch.zeros_like(s[..., :1])
    p = torch.exp(s - m)
    l = p.sum(-1, keepdim=True)  # noqa: E741
    o = torch.where(l > 0, (p @ v.to(dt)) / l, 0.0) if subtract_max else (p @ v.to(dt)) / l
    return _typed(q, o, (m + torch.log(l))[..., 0])


@pytest.mark.parametrize("alignment", ["bottom-right", "top-left"])
@pytest.mark.parametrize("window", [None, (2, 0), (1, 3)], ids=["no-window", "window-2-0", "window-1-3"])
@pytest.mark.parametrize(("nq", "nk"), [(1, 1), (4, 6), (6, 3), (5, 5)])
def test_the_shifted_causal_goldens_are_their_masks(alignment: str, window, nq: int, nk: int):
    """The diagonal-excluded and one-key-ahead neighbours (built from the golden by dropping a key
    or a query, or by a window) equal attention under their masks written out: key j visible iff
    ``j <= i + c + shift`` and, with a window of left edge l, ``j >= i + c - l``."""
    p = Problem(nq=nq, nk=nk, d=4, dv=3, causal=True, window=window, dtype=torch.float64)
    q, k, v = p.inputs()
    c = nk - nq if alignment == "bottom-right" else 0
    left = math.inf if window is None else window[0]
    kw = dict(causal=True, scale=None, alignment=alignment, **p.variant_kwargs())
    shifted = {-1: diagnosis._diagonal_excluded, 1: diagnosis._one_key_ahead(p, alignment)}
    for shift, neighbour in shifted.items():
        o, lse = neighbour(q, k, v, **kw)
        want_o, want_lse = _plain(q, k, v, lambda i, j, s=shift: (j <= i + c + s) & (j >= i + c - left), None)
        assert torch.allclose(o, want_o, atol=1e-12) and torch.equal(torch.isinf(lse), torch.isinf(want_lse))
        assert torch.allclose(lse[torch.isfinite(lse)], want_lse[torch.isfinite(want_lse)], atol=1e-12)


def _causal(shift: int, alignment: str = "bottom-right"):
    """A causal kernel whose mask is ``j <= i + c + shift``."""

    def attention(q, k, v, *, causal=False, scale=None):
        c = k.shape[2] - q.shape[2] if alignment == "bottom-right" else 0
        return _plain(q, k, v, (lambda i, j: j <= i + c + shift) if causal else (lambda i, j: j >= 0), scale)

    return attention


def exp_without_max(q, k, v, *, causal=False, scale=None):
    return _plain(q, k, v, lambda i, j: j >= 0, scale, subtract_max=False)


CAUSAL = dict(causal=True)
CASES = [
    (top_left, {}, Problem(b=1, hq=2, hkv=2, nq=9, nk=5, d=8, dv=8, **CAUSAL), "top-left causal golden"),
    (scale_one, {}, Problem(b=1, hq=2, hkv=1, nq=7, nk=7, d=16, dv=16), "golden with scale 1 (no scale)"),
    (scale_inverse_d, {}, Problem(hq=2, nq=7, nk=7, d=16, dv=16), "golden with scale 1/D = 0.0625"),
    (scale_sqrt_d, {}, Problem(nq=5, nk=6, d=4, dv=4), "golden with scale sqrt(D) = 2"),
    (scale_inverse_d, dict(window=True, softcap=True),
     Problem(nq=7, nk=9, d=16, dv=16, window=(3, 1), softcap=5.0), "golden with scale 1/D"),
    (scale_inverse_d, dict(varlen=True),
     Problem(b=2, nq=5, nk=6, d=16, dv=16, seqlens=((5, 6), (3, 2)), **CAUSAL), "golden with scale 1/D"),
    (scale_inverse_d, dict(kvcache=KVCache(page_sizes=(2,), max_splits=4)),
     Problem(b=2, nq=2, nk=8, d=16, dv=16, cache=(5, 8), page_size=2, num_splits=2, **CAUSAL),
     "golden with scale 1/D"),
    (_causal(-1), {}, Problem(nq=5, nk=7, d=8, dv=8, **CAUSAL),
     "diagonal excluded (key j visible iff j < i + Nk"),
    (_causal(-1, "top-left"), dict(causal_alignment="top-left"), Problem(nq=7, nk=5, d=8, dv=8, **CAUSAL),
     "diagonal excluded (key j visible iff j < i,"),
    (_causal(1), {}, Problem(nq=6, nk=6, d=8, dv=8, **CAUSAL), "one key past the diagonal"),
    # the logits of row 0 underflow float32 (lse -215): a mask, not the max subtraction, moved it
    (_causal(1), {}, Problem(nq=2, nk=2, d=1, dv=1, dist="large", **CAUSAL), "one key past the diagonal"),
    (_causal(-1), {}, Problem(nq=3, nk=3, d=1, dv=1, dist="underflow", **CAUSAL), "diagonal excluded"),
    (exp_without_max, {}, Problem(b=2, hq=2, nq=6, nk=6, d=8, dv=8, dist="large"),
     "without its max subtraction: the output is inf/NaN on the"),
    (exp_without_max, {}, Problem(b=2, hq=2, nq=6, nk=4, d=16, dv=8, dist="negative"),
     "rows where exp(s) underflows float32"),
    (exp_without_max, {}, Problem(nq=7, nk=1, d=16, dv=16, dtype=torch.float16, dist="negative", **CAUSAL),
     "off the golden on the 1 rows where exp(s) underflows float32 (lse down to -100.3"),
    (lse_base2, {}, Problem(nq=6, nk=6, d=8, dv=8), "lse in base 2"),
    (in_float32, {}, Problem(nq=6, nk=9, d=8, dv=8, dtype=torch.float64), "only to float32 precision"),
    (nan_empty_rows, {}, Problem(nq=9, nk=4, d=8, dv=8, dtype=torch.float64, **CAUSAL), "NaN only on rows"),
    (next_kv_head, {}, Problem(hq=4, hkv=2, nq=5, nk=5, d=8, dv=8), "NEXT kv head"),
    (gqa_modulo, {}, Problem(hq=4, hkv=2, nq=5, nk=5, d=8, dv=8), "kv head h % Hkv"),
]


def _diagnoses(kernel: Kernel, problem: Problem, names: tuple[str, ...]) -> list[str]:
    out = run_kernel(kernel, problem, "forward", backward=any(n.startswith("d") for n in names))
    with pytest.raises(PropertyFailure) as failure:
        assert_close_to_golden(kernel, problem, "forward", out, names)
    return [line for line in str(failure.value).splitlines() if line.startswith("diagnosis:")]


def _case_id(case: tuple) -> str:
    fn, _, problem, _ = case
    return "-".join((fn.__name__.strip("_"), *problem.variants))


@pytest.mark.parametrize(("fn", "caps", "problem", "expected"), CASES,
                         ids=[f"{i}-{_case_id(c)}" for i, c in enumerate(CASES)])
def test_each_convention_bug_is_diagnosed(fn, caps: dict, problem: Problem, expected: str):
    kernel = _kernel(f"meta-{fn.__name__}", fn, **caps)
    diagnoses = _diagnoses(kernel, problem, ("o", "lse"))
    assert any(expected in line for line in diagnoses), diagnoses


@pytest.mark.parametrize(("mutant", "problem"), [
    ("blocked_diagonal_strict", Problem(nq=5, nk=7, d=8, dv=8, causal=True, block_m=3, block_n=3)),
    ("blocked_diagonal_strict", Problem(nq=6, nk=8, d=8, dv=8, causal=True, window=(3, 0), block_n=3)),
    ("blocked_diagonal_strict", Problem(b=2, nq=6, nk=7, d=8, dv=8, causal=True, seqlens=((6, 7), (4, 4)))),
])
def test_the_catalogues_strict_diagonal_is_diagnosed_with_variants(mutant: str, problem: Problem):
    """The planted ``<`` of the causal mask, dense, with a window and varlen (per sequence)."""
    diagnoses = _diagnoses(_mutant(mutant), problem, ("o", "lse"))
    assert any("with the diagonal excluded" in line for line in diagnoses), diagnoses


@pytest.mark.parametrize("problem", [
    Problem(nq=1, nk=1, d=1, dv=1, dtype=torch.float16, dist="large", block_m=3, block_n=3),  # its shrunk one
    Problem(b=2, hq=2, nq=7, nk=9, d=8, dv=8, dtype=torch.float16, dist="large", block_m=3, block_n=3),
])
def test_the_catalogues_exp_without_max_is_diagnosed(problem: Problem):
    """P = exp(s) cast to float16 for the PV product: inf past s = 11.1, 0 below s = -9.7."""
    diagnoses = _diagnoses(_mutant("blocked_exp_without_max"), problem, ("o", "lse"))
    assert any("a softmax without its max subtraction" in line and "float16" in line for line in diagnoses)


def test_a_large_problem_gets_the_row_patterns_only(monkeypatch: pytest.MonkeyPatch):
    """Past NEIGHBOUR_WORK (lowered here, to keep the problem small) the conventions are not
    tried (a dozen goldens); the row patterns, which need only the comparison's golden, still are."""
    monkeypatch.setitem(diagnosis.NEIGHBOUR_WORK, "cpu", 1 << 14)
    big = Problem(b=2, hq=2, nq=24, nk=24, d=8, dv=8, dist="large")
    assert diagnosis.work(big) > diagnosis.NEIGHBOUR_WORK["cpu"]
    overflow = _diagnoses(_kernel("meta-nomax", exp_without_max), big, ("o", "lse"))
    assert any("max subtraction" in line for line in overflow), overflow
    plain = big.replace(dist="normal")
    assert not _diagnoses(_kernel("meta-inverse-d", scale_inverse_d), plain, ("o", "lse"))


def _off_by(factor: float, shift: float):
    def broken(q, k, v, *, causal=False, scale=None):
        o, lse = exp_without_max(q, k, v, causal=causal, scale=scale)
        return factor * o + shift, lse

    return broken


@pytest.mark.parametrize(("fn", "problem"), [
    (_off_by(1.01, 0.0), Problem(b=2, hq=2, nq=6, nk=6, d=8, dv=8, dist="large")),
    (_off_by(1.0, 100.0), Problem(nq=1, nk=1, d=1, dv=1, dtype=torch.float16, dist="negative")),
    (_causal(1), Problem(nq=2, nk=2, d=1, dv=1, causal=True, dist="large")),
], ids=["small-rows-off", "one-row-off-finite", "underflowing-row-sees-a-key-more"])
def test_overflow_is_not_claimed_without_its_evidence(fn, problem: Problem):
    """Overflowing rows and o off elsewhere too; one row of tiny logits whose o is off by more
    than rounding to subnormals could make it (nothing to be right on, no mark of an overflow or
    underflow); the one row whose logits underflow off, with an lse far above the golden's (it
    sees a key more: a right row beside it is no evidence then): not the missing max
    subtraction."""
    diagnoses = _diagnoses(_kernel("meta-off", fn), problem, ("o", "lse"))
    assert not any("max subtraction" in line for line in diagnoses), diagnoses


def test_a_row_whose_exp_underflows_is_not_a_masked_row():
    """No max subtraction, causal, Nq = Nk + 1, every logit far below -88: the one row that sees a
    key underflows to o = 0, lse = -inf, as if the diagonal were excluded; that neighbour differs
    from the golden on that row alone, past exp's range, so the diagnosis is the softmax's."""
    def causal_exp_without_max(q, k, v, *, causal=False, scale=None):
        s = (q.shape[-1] ** -0.5 if scale is None else scale) * (q.float() @ k.float().transpose(-1, -2))
        rows, cols = torch.arange(q.shape[2])[:, None], torch.arange(k.shape[2])[None, :]
        p = torch.exp(s).masked_fill(causal & (cols > rows + k.shape[2] - q.shape[2]), 0.0)
        total = p.sum(-1, keepdim=True)  # 0 on a row that sees no key, and where every exp underflows
        o = torch.where(total > 0, p @ v.float() / total.clamp_min(1e-38), 0.0)
        return o.to(q.dtype), torch.log(total)[..., 0]

    problem = Problem(nq=2, nk=1, d=1, dv=1, causal=True, dist="underflow")
    diagnoses = _diagnoses(_kernel("meta-nomax-causal", causal_exp_without_max), problem, ("o", "lse"))
    assert diagnoses and "a softmax without its max subtraction" in diagnoses[0], diagnoses
    assert not any("diagonal excluded" in line for line in diagnoses), diagnoses


def test_a_correct_kernel_is_not_diagnosed_and_arithmetic_bugs_get_no_convention():
    """A kernel off by plain arithmetic (o scaled by 1.01) matches no neighbouring convention."""
    kernel = _kernel("meta-off", lambda q, k, v, *, causal=False, scale=None: (
        lambda o, lse: (1.01 * o, lse))(*_exact(q, k, v, causal=causal, scale=scale)))
    problem = Problem(b=2, hq=4, hkv=2, nq=9, nk=5, d=8, dv=8, causal=True, scale=0.5)
    out = run_kernel(kernel, problem, "forward")
    with pytest.raises(PropertyFailure) as failure:
        assert_close_to_golden(kernel, problem, "forward", out, ("o", "lse"))
    assert "diagnosis:" not in str(failure.value)
    assert "off the golden: o (both ways); within budget: lse" in str(failure.value)


# --------------------------------------------------------------------------- gradients


def dv_flipped(q, k, v, *, causal=False, scale=None):
    """Right forward; dV comes out with its key rows reversed."""
    v2 = v.detach() + (v - v.detach()).flip(-2)
    return attention_yardstick(q, k, v2, causal=causal, scale=scale)


@pytest.mark.parametrize(("planted", "problem", "expected"), [
    (_kernel("meta-dv-flipped", dv_flipped), Problem(hq=2, nq=5, nk=6, d=8, dv=8),
     ["dv does not match the golden: dq and dk do, and so does the forward; dV = P^T dO"]),
    (_mutant("blocked_dk_scale_twice"), Problem(nq=5, nk=6, d=8, dv=8, scale=0.5, block_m=3, block_n=3),
     ["dk does not match the golden: dq and dv do",
      "dk is the golden's times a constant: 0.5 x the golden's (= the scale: a factor"]),
    (_mutant("blocked_bwd_skips_key_tail"), Problem(nq=3, nk=2, d=8, dv=8, block_m=3, block_n=3),
     ["dq, dk and dv are zero where the golden's is not: never accumulated"]),
    (_mutant("blocked_dsinks_sign"), Problem(nq=4, nk=5, d=8, dv=8, sinks="mixed", block_m=3),
     ["dsinks does not match the golden: dq, dk and dv do", "(= -1: the sign is wrong)"]),
], ids=["dv-flipped", "dk-scale-twice", "key-tail-skipped", "dsinks-sign"])
def test_one_wrong_gradient_is_named_while_the_others_match(planted: Kernel, problem: Problem,
                                                            expected: list[str]):
    diagnoses = _diagnoses(planted, problem, ("o", "lse", *gradient_names(problem)))
    for text in expected:
        assert any(text in line for line in diagnoses), (text, diagnoses)


# --------------------------------------------------------------------------- double backward

_F64_CAPS = dict(dtypes=frozenset({torch.float64}), head_dims=range(1, 9), causal=False, gqa=False,
                 unequal_lengths=True, block_m=(), block_n=())
_TINY = Sizes(max_n=4, max_batch=1, max_kv_heads=1, max_group=1, max_head_dim=4, max_work=10_000)


class _SavedP(torch.autograd.Function):
    """Attention whose backward is written in torch ops on the probabilities P saved by the
    forward: differentiable, but P's dependence on q and k is lost, so double backward is wrong."""

    @staticmethod
    def forward(ctx, q, k, v, scale, raise_when_recorded):
        s = scale * q @ k.transpose(-1, -2)
        p = torch.softmax(s, -1)
        o = p @ v
        ctx.save_for_backward(q, k, v)
        ctx.p, ctx.o, ctx.scale, ctx.raise_when_recorded = p, o, scale, raise_when_recorded
        return o, torch.logsumexp(s, -1)

    @staticmethod
    def backward(ctx, do, dlse):
        q, k, v = ctx.saved_tensors
        p, o, scale = ctx.p, ctx.o, ctx.scale
        if torch.is_grad_enabled() and ctx.raise_when_recorded:  # create_graph=True: a graph of the backward
            raise RuntimeError("one of the variables needed for gradient computation has been modified")
        ds = p * (do @ v.transpose(-1, -2) - (do * o).sum(-1, keepdim=True))
        return scale * ds @ k, scale * ds.transpose(-1, -2) @ q, p.transpose(-1, -2) @ do, None, None


class _OnceDifferentiable(_SavedP):
    backward = staticmethod(torch.autograd.function.once_differentiable(_SavedP.backward))


def _autograd_kernel(name: str, function: type[torch.autograd.Function], *,
                     raise_when_recorded: bool = False) -> Kernel:
    def attention(q, k, v, *, causal=False, scale=None):
        scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
        return function.apply(q, k, v, scale, raise_when_recorded)

    return _kernel(name, attention, **_F64_CAPS)


@contextlib.contextmanager
def _few_examples() -> Iterator[RunContext]:
    """A few examples (gradgradcheck runs a quarter), no shrinking, in a run context of its own
    (the kernel's tallies out of the session's summary)."""
    settings.register_profile("flashprop-meta-diagnosis-saved", settings.default)
    settings.register_profile("flashprop-meta-diagnosis", settings.default, max_examples=40,
                              phases=[Phase.explicit, Phase.generate], database=None)
    settings.load_profile("flashprop-meta-diagnosis")
    try:
        yield RunContext()
    finally:
        settings.load_profile("flashprop-meta-diagnosis-saved")


def test_a_wrong_double_backward_gets_the_once_differentiable_hint():
    kernel = _autograd_kernel("meta-saved-p", _SavedP)
    with _few_examples() as run, pytest.raises(PropertyFailure) as failure:
        test_gradcheck.test_gradgradcheck(run, kernel, "cpu", _TINY)
    text = str(failure.value)
    assert "Jacobians of o differ" in text and "@torch.autograd.function.once_differentiable" in text, text


def test_a_wrong_first_derivative_is_named_before_the_second():
    """A backward that is wrong already (dV reversed): gradgradcheck's report says that gradcheck
    fails too on its problem, and gives no hint about once_differentiable."""
    kernel = _kernel("meta-dv-flipped-f64", dv_flipped, **_F64_CAPS)
    check = test_gradcheck._checker("gradgradcheck", torch.autograd.gradgradcheck)
    with pytest.raises(PropertyFailure) as failure:
        check(kernel, Problem(nq=3, nk=3, d=2, dv=2, dtype=torch.float64))
    assert "the first derivatives are wrong too (gradcheck fails" in str(failure.value)
    assert "once_differentiable" not in str(failure.value)


def test_a_once_differentiable_backward_is_a_clean_refusal():
    kernel = _autograd_kernel("meta-once", _OnceDifferentiable)
    with _few_examples() as run, pytest.raises(pytest.skip.Exception, match="not differentiable"):
        test_gradcheck.test_gradgradcheck(run, kernel, "cpu", _TINY)


def test_a_probe_of_double_backward_that_raises_is_a_tallied_failure():
    """The probe runs before the property's examples: its failure is still in the table and the
    causes, as the kernel's error."""
    kernel = _autograd_kernel("meta-probe-raises", _SavedP, raise_when_recorded=True)
    with _few_examples() as run:
        with pytest.raises(PropertyFailure) as failure:
            test_gradcheck.test_gradgradcheck(run, kernel, "cpu", _TINY)
        tally = run.tallies[kernel.name, "gradgradcheck"]
        assert tally.failed == 1 and tally.last_failure == failure.value.failure
        groups = [g for g in run.tallies.failure_groups() if g.kernel == kernel.name]
    assert [g.properties for g in groups] == [("gradgradcheck",)]
    assert groups[0].headline.startswith("the kernel raised RuntimeError: one of the variables"), groups[0]
    assert "once_differentiable" in str(failure.value)
