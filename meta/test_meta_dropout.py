"""Meta-tests of dropout's convention (``refimpl/dropout.py``, ``docs/variants.md``): the hash is
the documented one, its keep decisions are Bernoulli(1 - p) and independent where the properties
assume so, the references apply it as the contract says, ``ref-blocked`` follows it (dense,
varlen as the padded dense batch, p = 0 bitwise the plain call) and every malformed dropout
keyword is refused with a clear error.
"""

from __future__ import annotations

import math

import pytest
import torch
from flashprop.contract.capabilities import ALIBI_SHAPES, Capabilities
from flashprop.contract.problem import Problem
from flashprop.contract.validate import check_dropout, dropout_threshold
from flashprop.harness.strategies import Sizes
from flashprop.harness.tolerance import budget, conditioning
from flashprop.harness.variant_problems import variant_axes, variant_problems
from flashprop.meta.test_meta_variants import EVERYTHING, definition, run_variant_error_contract
from flashprop.properties.test_dropout import FALSE_ALARM, _bernstein
from flashprop.refimpl import attention_golden, attention_golden_backward, attention_yardstick
from flashprop.refimpl.blocked import attention
from flashprop.refimpl.dropout import Dropout, dropout_hash, dropout_mask, dropout_of
from flashprop.refimpl.layouts import varlen_golden
from hypothesis import given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.meta

F64 = torch.float64
M32 = 0xFFFFFFFF


def _fmix32(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & M32
    x ^= x >> 13
    x = (x * 0xC2B2AE35) & M32
    return x ^ (x >> 16)


def _hash(seed: int, b: int, h: int, i: int, j: int) -> int:
    """The docstring's hash in plain Python integers (uint32 arithmetic by masking)."""
    state = 0
    for word in (seed & M32, seed >> 32, b, h, i, j):
        state = _fmix32(((state ^ word) + 0x9E3779B9) & M32)
    return state


#: Pinned values: a kernel author reproducing the mask can check these first.
PINNED = {(0, 0, 0, 0, 0): 3136461558, (1, 0, 0, 0, 0): 2816056887, (0, 0, 0, 0, 1): 3925107260,
          (2**64 - 1, 1, 2, 3, 4): 1999604522, (12345, 7, 11, 13, 17): 2008576302}


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**64 - 1), st.lists(st.integers(0, 2**31 - 1), min_size=4, max_size=4))
def test_the_hash_is_the_documented_one(seed, idx):
    b, h, i, j = idx
    got = int(dropout_hash(seed, b, h, torch.tensor(i), torch.tensor(j)))
    assert got == _hash(seed, b, h, i, j)


def test_pinned_hash_values():
    for (seed, b, h, i, j), want in PINNED.items():
        assert _hash(seed, b, h, i, j) == want
        assert int(dropout_hash(seed, b, h, torch.tensor(i), torch.tensor(j))) == want


def test_threshold_is_exact_and_p_zero_keeps_everything():
    assert dropout_threshold(0.0) == 0 and dropout_threshold(0.5) == 2**31
    assert dropout_threshold(0.25) == 2**30
    assert dropout_threshold(1e-10) == 1  # any p > 0 drops something
    assert dropout_of(0.0, 7) is None and dropout_of(0.0, None) is None
    assert bool(dropout_mask(2, 3, 5, 7, dropout_p=0.0, dropout_seed=1).all())


def _within_binomial(count: int, n: int, q: float) -> bool:
    """``count`` of n independent Bernoulli(q) draws within Bernstein's bound at FALSE_ALARM."""
    return abs(count - n * q) <= _bernstein(n * q * (1 - q), max(q, 1 - q), math.log(2 / FALSE_ALARM))


@pytest.mark.parametrize("p", [0.01, 0.1, 0.5, 0.9])
def test_keep_decisions_are_bernoulli_and_independent(p):
    """Over a (2, 4, 64, 64) grid: a fraction p dropped; disjoint pairs of neighbours along each
    index (and seeds s, s + 1) both dropped a fraction p^2 (as independent draws would be)."""
    seed = 2**32 - 1  # its successor carries into the high word
    keep = dropout_mask(2, 4, 64, 64, dropout_p=p, dropout_seed=seed)
    drop = ~keep
    exact = dropout_threshold(p) / 2**32
    assert _within_binomial(int(drop.sum()), drop.numel(), exact)
    pairs = {
        "b": drop[0] & drop[1],
        "h": drop[:, 0::2] & drop[:, 1::2],
        "i": drop[:, :, 0::2] & drop[:, :, 1::2],
        "j": drop[..., 0::2] & drop[..., 1::2],
        "seed": drop & ~dropout_mask(2, 4, 64, 64, dropout_p=p, dropout_seed=seed + 1),
    }
    for axis, both in pairs.items():
        assert _within_binomial(int(both.sum()), both.numel(), exact * exact), axis


def test_a_dropout_shifted_in_batch_is_the_next_batch_elements():
    """``Dropout(batch=s)`` at b = 0 is batch element s's mask (how a varlen sequence draws)."""
    whole = dropout_mask(3, 2, 5, 6, dropout_p=0.5, dropout_seed=99)
    alone = dropout_mask(1, 2, 5, 6, dropout_p=0.5, dropout_seed=99, batch_start=2)
    assert torch.equal(whole[2:], alone)
    idx = torch.arange(5)[:, None], torch.arange(6)[None, :]
    assert torch.equal(Dropout(0.5, 99, 1).keep(1, 0, *idx), whole[2, 0])


BAD = [
    (True, 1, TypeError), ("0.1", 1, TypeError), (-0.1, 1, ValueError), (1.0, 1, ValueError),
    (float("nan"), 1, ValueError), (0.5, None, ValueError), (0.5, 1.0, TypeError), (0.5, True, TypeError),
    (0.5, -1, ValueError), (0.5, 2**64, ValueError), (0.0, -1, ValueError),
]


@pytest.mark.parametrize("p, seed, error", BAD, ids=[f"p={p!r}, seed={s!r}" for p, s, _ in BAD])
def test_malformed_dropout_keywords_are_refused(p, seed, error):
    """check_dropout, and ref-blocked's dense and varlen entry points through it, refuse each."""
    with pytest.raises(error, match="dropout"):
        check_dropout(p, seed)
    q = torch.randn(1, 1, 3, 4)
    with pytest.raises(error, match="dropout"):
        attention(q, q, q, dropout_p=p, dropout_seed=seed)
    cu = torch.tensor([0, 3], dtype=torch.int32)
    with pytest.raises(error, match="dropout"):
        attention.varlen(q[0].transpose(0, 1), q[0].transpose(0, 1), q[0].transpose(0, 1), cu, cu, 3, 3,
                         dropout_p=p, dropout_seed=seed)


def test_decode_refuses_dropout():
    """Dropout is not in the KV-cache decode contract: ref-blocked's fn.kvcache refuses the keyword."""
    p = Problem(b=1, nq=1, nk=4, d=4, dv=4, cache=(3,))
    inp = p.kernel_inputs()
    with pytest.raises(TypeError, match="dropout_p"):
        attention.kvcache(*inp.args, **inp.kwargs, dropout_p=0.1, dropout_seed=1)


def test_p_zero_is_bitwise_the_plain_call():
    p = Problem(b=2, hq=2, hkv=1, nq=7, nk=9, d=8, dv=8, causal=True, block_m=3, block_n=3)
    runs = []
    for kw in ({}, {"dropout_p": 0.0, "dropout_seed": 5}, {"dropout_p": 0.0}):
        inp = p.kernel_inputs(requires_grad=True)
        o, lse = attention(*inp.args, causal=True, block_m=3, block_n=3, **kw)
        runs.append((o, lse, *torch.autograd.grad(o, inp.args, p.grad_output())))
    for other in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], other, strict=True))


SIZES = Sizes(max_n=12, max_head_dim=8, max_work=40_000)


@settings(max_examples=30, deadline=None)
@given(variant_problems(EVERYTHING, "dropout", sizes=SIZES, dtypes=(F64,), mode="dense"))
def test_dense_dropout_golden_equals_the_definition(p: Problem):
    """The streaming golden (in key chunks of 4: every chunk's mask offset) and the yardstick
    equal ``(P * M / (1 - p)) V`` with P the contract's softmax (meta/test_meta_variants's
    definition, on one-hot values) and M the seed's mask; the golden's gradients equal autograd's
    through it; lse is the undropped one; ref-blocked within the float64 floor of all of them."""
    inp = p.kernel_inputs()
    q, k, v = inp.args
    kw = {name: val.detach() if isinstance(val, torch.Tensor) else val for name, val in inp.kwargs.items()}
    plain = {name: val for name, val in kw.items() if not name.startswith("dropout")}
    rate, seed = p.dropout
    qd, kd, vd = (t.detach().to(F64).requires_grad_() for t in (q, k, v))
    eye = torch.eye(p.nk, dtype=F64).expand(p.b, p.hkv, p.nk, p.nk)
    probs, lse = definition(qd, kd, eye, causal=p.causal, scale=p.effective_scale, **plain)
    weights = dropout_mask(p.b, p.hq, p.nq, p.nk, dropout_p=rate, dropout_seed=seed).to(F64) / (1 - rate)
    o = (probs * weights) @ vd.repeat_interleave(p.hq // p.hkv, 1)
    grads = torch.autograd.grad(o, (qd, kd, vd), p.grad_output().to(F64))
    go, glse = attention_golden(q, k, v, causal=p.causal, scale=p.scale, chunk=4, **kw)
    yo, _ = attention_yardstick(q, k, v, causal=p.causal, scale=p.scale, **kw)
    bo, blse = attention(q, k, v, causal=p.causal, scale=p.scale, block_m=p.block_m, block_n=p.block_n, **kw)
    logits, values = conditioning(p).raw_logits, conditioning(p).values / (1 - rate)
    for name, got in (("golden o", go), ("yardstick o", yo), ("ref-blocked o", bo)):
        _close(name, got, o, logits, values=values)
    for name, got in (("golden lse", glse), ("ref-blocked lse", blse)):
        _close(name, got, lse, logits)
    golden = attention_golden_backward(q, k, v, p.grad_output(), causal=p.causal, scale=p.scale, chunk=4,
                                       bounds=True, **kw)
    bounds = golden[3 + (p.sinks is not None):]
    for name, got, want, bound in zip(("dq", "dk", "dv"), golden[:3], grads, bounds):
        _close(name, got, want, logits, magnitude=float(bound.abs().max()) if bound.numel() else 0.0)


def _close(name: str, got: torch.Tensor, want: torch.Tensor, logits: float, *, values: float = 0.0,
           magnitude: float | None = None) -> None:
    """``got`` within the float64 floor of ``want`` (``values``: what an o averages, max|V| / (1 - p))."""
    got, want = got.detach().to(F64), want.detach().to(F64)
    assert torch.equal(torch.isinf(got), torch.isinf(want)), f"{name}: inf pattern differs"
    finite = torch.isfinite(want)
    size = float(want[finite].abs().max()) if finite.any() else 0.0
    kind = "o" if name.endswith(" o") else "lse" if name.endswith("lse") else "dq"
    limit = budget(kind, F64, 0.0, size if magnitude is None else magnitude, max(size, logits), values)[0]
    err = float((got - want)[finite].abs().max()) if finite.any() else 0.0
    assert err <= limit, f"{name}: max|got - definition| = {err:.3e} > float64 floor {limit:.3e}"


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 4), st.integers(1, 9), st.integers(1, 9), st.sampled_from([0.1, 0.5, 0.9]),
       st.integers(0, 2**64 - 1), st.booleans())
def test_varlen_drops_as_the_padded_dense_batch(count, nq, nk, rate, seed, causal):
    """Sequence s of a varlen call drops as batch element s of a dense call (positions counted
    from the sequence's start): ref-blocked's and the golden's varlen o equal the dense call on
    the same sequences stacked (equal lengths, so nothing is padded)."""
    p = Problem(b=count, hq=2, hkv=1, nq=nq, nk=nk, d=4, dv=4, dtype=F64, causal=causal,
                seqlens=((nq, nk),) * count, dropout=(rate, seed))
    inp = p.kernel_inputs()
    q, k, v = inp.args[:3]

    def dense(t: torch.Tensor) -> torch.Tensor:  # packed (T, H, D) -> (count, H, N, D)
        return t.reshape(count, -1, *t.shape[1:]).transpose(1, 2)

    kw = dict(causal=causal, dropout_p=rate, dropout_seed=seed)
    want, _ = attention_golden(dense(q), dense(k), dense(v), **kw)
    for name, got in (("ref-blocked varlen o", attention.varlen(*inp.args, **kw)[0]),
                      ("golden varlen o", varlen_golden(*inp.args, **kw)[0])):
        _close(name, dense(got), want, conditioning(p).raw_logits, values=conditioning(p).values / (1 - rate))


def _swallows_dropout(q, k, v, *, causal=False, scale=None, dropout_p=0.0, dropout_seed=None):
    """Takes the dropout keywords and answers without dropout (float32: the plain golden's)."""
    o, lse = attention_golden(q, k, v, causal=causal, scale=scale)
    return o.to(q.dtype), lse.float()


def _no_dropout_keywords(q, k, v, *, causal=False, scale=None):
    """Knows no dropout keyword: a plain function refuses one with TypeError."""
    return _swallows_dropout(q, k, v, causal=causal, scale=scale)


UNDECLARED = {"refuses": (_no_dropout_keywords, False), "reference-mask": (attention, False),
              "ignores": (_swallows_dropout, True)}


@pytest.mark.parametrize("fn, caught", UNDECLARED.values(), ids=UNDECLARED.keys())
def test_the_error_contract_draws_undeclared_dropout(fn, caught):
    """A kernel that declares every variant but dropout is drawn ``dropout_p > 0`` problems by the
    variant error contract: refusing them passes, answering with the reference mask is a correct
    answer, answering without dropout fails."""
    caps = Capabilities(dtypes=frozenset({torch.float32}), devices=frozenset({"cpu"}), window=True,
                        softcap=True, alibi=ALIBI_SHAPES, sinks=True, fp8=EVERYTHING.fp8)
    assert variant_axes(caps) == ["dropout"]
    run_variant_error_contract(f"meta-dropout-{fn.__name__}", fn, caps, caught)
