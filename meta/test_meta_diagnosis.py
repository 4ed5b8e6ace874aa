"""Meta-tests of the failure diagnoses (harness/diagnosis.py): a kernel with each convention
bug fails the forward property, and the report names the convention and the fix."""

from __future__ import annotations

import pytest
import torch
from flashprop.contract.capabilities import Capabilities
from flashprop.contract.problem import Problem
from flashprop.contract.registry import Kernel
from flashprop.harness.check import PropertyFailure, assert_close_to_golden, run_kernel
from flashprop.refimpl import attention_golden

pytestmark = pytest.mark.meta


def _kernel(name: str, fn, **caps) -> Kernel:
    fn.capabilities = Capabilities(**caps)
    return Kernel(name=name, fn=fn, capabilities=fn.capabilities)


def _exact(q, k, v, **kw):
    o, lse = attention_golden(q, k, v, **kw)
    return o.to(q.dtype), lse.to(torch.float64 if q.dtype == torch.float64 else torch.float32)


def top_left(q, k, v, *, causal=False, scale=None):
    return _exact(q, k, v, causal=causal, scale=scale, alignment="top-left")


def scale_one(q, k, v, *, causal=False, scale=None):
    return _exact(q, k, v, causal=causal, scale=1.0 if scale is None else scale)


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


CASES = [
    (top_left, Problem(b=1, hq=2, hkv=2, nq=9, nk=5, d=8, dv=8, causal=True), "top-left causal golden"),
    (scale_one, Problem(b=1, hq=2, hkv=1, nq=7, nk=7, d=16, dv=16), "golden with scale 1"),
    (lse_base2, Problem(nq=6, nk=6, d=8, dv=8), "lse in base 2"),
    (in_float32, Problem(nq=6, nk=9, d=8, dv=8, dtype=torch.float64), "only to float32 precision"),
    (nan_empty_rows, Problem(nq=9, nk=4, d=8, dv=8, causal=True, dtype=torch.float64), "NaN only on rows"),
    (next_kv_head, Problem(hq=4, hkv=2, nq=5, nk=5, d=8, dv=8), "NEXT kv head"),
    (gqa_modulo, Problem(hq=4, hkv=2, nq=5, nk=5, d=8, dv=8), "kv head h % Hkv"),
]


@pytest.mark.parametrize(("fn", "problem", "expected"), CASES, ids=[c[0].__name__ for c in CASES])
def test_each_convention_bug_is_diagnosed(fn, problem: Problem, expected: str):
    kernel = _kernel(f"meta-{fn.__name__}", fn)
    out = run_kernel(kernel, problem, "forward")
    with pytest.raises(PropertyFailure) as failure:
        assert_close_to_golden(kernel, problem, "forward", out, ("o", "lse"))
    diagnoses = [line for line in str(failure.value).splitlines() if line.startswith("diagnosis:")]
    assert any(expected in line for line in diagnoses), str(failure.value)


def test_a_correct_kernel_is_not_diagnosed_and_arithmetic_bugs_get_no_convention():
    """A kernel off by plain arithmetic (o scaled by 1.01) matches no neighbouring convention."""
    kernel = _kernel("meta-off", lambda q, k, v, *, causal=False, scale=None: (
        lambda o, lse: (1.01 * o, lse))(*_exact(q, k, v, causal=causal, scale=scale)))
    problem = Problem(b=2, hq=4, hkv=2, nq=9, nk=5, d=8, dv=8, causal=True, scale=0.5)
    out = run_kernel(kernel, problem, "forward")
    with pytest.raises(PropertyFailure) as failure:
        assert_close_to_golden(kernel, problem, "forward", out, ("o", "lse"))
    assert "diagnosis:" not in str(failure.value)
