"""Meta-tests of the output contract's dtypes and shapes (``contract/outputs.py``) and of the
sinks' dtype (``docs/variants.md``).

A planted kernel wraps ``ref-blocked``'s three entry points and changes only the dtype or the
layout of what they return (lse in float16, lse in float32 for float64 inputs, o in float32 for
16-bit inputs, lse transposed); its values stay right. Each must fail, with the contract's
dtype or shape in the message, a golden property (``run_kernel`` then ``assert_close_to_golden``)
and a property that reads lse without the golden (``deterministic-forward``: two runs compared
bitwise, where a silent cast would hide the dtype), in every entry point; ``judge`` (what a
repro calls) fails such an output outright. ``ref-blocked`` itself passes the same checks on the
same problems, so only the planted change can fail them.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from flashprop.contract.problem import Problem
from flashprop.contract.registry import Kernel
from flashprop.harness.check import (
    Outputs,
    PropertyFailure,
    assert_close_to_golden,
    budget_dtype,
    judge,
    run_kernel,
    run_property,
)
from flashprop.harness.run_context import RunContext
from flashprop.properties.test_determinism import _rerun_check
from flashprop.refimpl.blocked import attention as blocked
from hypothesis import Phase
from hypothesis import strategies as st

pytestmark = pytest.mark.meta

F16, F32, F64 = torch.float16, torch.float32, torch.float64
PROP = "meta-dtypes"

#: One small problem per entry point (a paged cache with splits for decode); Hq != Nq, so a
#: transposed lse has another shape.
PROBLEMS = {
    "dense": Problem(hq=2, hkv=1, nq=5, nk=7, d=8, dv=8, dtype=F16),
    "varlen": Problem(b=2, hq=2, hkv=1, nq=4, nk=5, d=8, dv=8, dtype=F16, seqlens=((4, 5), (3, 2))),
    "kvcache": Problem(b=2, hq=2, hkv=1, nq=3, nk=16, d=8, dv=8, dtype=F16, cache=(9, 16), page_size=8,
                       num_splits=2),
}

Change = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]

#: name -> (how the planted kernel changes (o, lse), the problem's dtype, what the report says).
PLANTS: dict[str, tuple[Change, torch.dtype, str]] = {
    "lse-float16": (lambda o, lse: (o, lse.half()), F16,
                    "lse dtype torch.float16 != torch.float32 (the contract's lse: float32 for 16-bit"),
    "lse-float32-for-float64": (lambda o, lse: (o, lse.float()), F64,
                                "lse dtype torch.float32 != torch.float64"),
    "o-float32": (lambda o, lse: (o.float(), lse), F16,
                  "o dtype torch.float32 != torch.float16 (the contract's o: the inputs' dtype"),
    "lse-transposed": (lambda o, lse: (o, lse.transpose(-1, -2)), F32, "lse shape"),
}


def planted(name: str) -> Kernel:
    """``ref-blocked`` whose three entry points return ``PLANTS[name]``'s changed outputs."""
    change = PLANTS[name][0]

    def wrap(entry: Callable) -> Callable:
        def fn(*args, **kwargs):
            return change(*entry(*args, **kwargs))

        return fn

    attn = wrap(blocked)
    attn.varlen, attn.kvcache = wrap(blocked.varlen), wrap(blocked.kvcache)
    return Kernel(f"planted-{name}", attn, blocked.capabilities)


REF = Kernel("ref-blocked-control", blocked, blocked.capabilities)


def golden_check(kernel: Kernel, p: Problem) -> None:
    """A golden property: o and lse against the float64 golden."""
    assert_close_to_golden(kernel, p, PROP, run_kernel(kernel, p, PROP), ("o", "lse"))


CHECKS = {"golden": golden_check, "deterministic-forward": _rerun_check(("o", "lse"), backward=False)[1]}


def _run(kernel: Kernel, p: Problem, prop_check: Callable[[Kernel, Problem], None]) -> None:
    """The given problem only: no database, no shrinking, in a run context of its own."""
    once = RunContext(database=None, phases=(Phase.explicit, Phase.generate))
    run_property(once, kernel, PROP, st.just(p), prop_check)


@pytest.mark.parametrize("mode", sorted(PROBLEMS))
@pytest.mark.parametrize("prop", sorted(CHECKS))
@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_wrong_output_dtype_or_shape_fails_every_property(plant, prop, mode):
    """A planted wrong dtype or layout of o or lse fails a golden property and a property that
    compares two runs, in every entry point, naming the contract's dtype or shape; the correct
    kernel passes the same check on the same problem."""
    _, dtype, says = PLANTS[plant]
    p = PROBLEMS[mode].replace(dtype=dtype)
    _run(REF, p, CHECKS[prop])
    with pytest.raises(PropertyFailure) as failed:
        _run(planted(plant), p, CHECKS[prop])
    report = str(failed.value)
    assert says in report, report
    assert "the kernel raised" not in report, report
    if plant == "lse-transposed":
        layout = {"dense": "(B, Hq, Nq)", "varlen": "(Hq, Tq)", "kvcache": "(B, Hq, Nq)"}[mode]
        assert f"!= {layout} = " in report, report


def test_wrong_o_shape_fails_before_the_backward():
    """With a backward, an o of the wrong shape is the contract's failure, not autograd's
    shape-mismatch error from the gradient call."""
    kernel = Kernel("planted-o-transposed", lambda *a, **kw: (lambda o, lse: (o.transpose(1, 2), lse))(
        *blocked(*a, **kw)), blocked.capabilities)
    p = PROBLEMS["dense"].replace(dtype=F32)
    with pytest.raises(PropertyFailure) as failed:
        run_kernel(kernel, p, PROP, backward=True)
    report = str(failed.value)
    assert "o shape (1, 5, 2, 8) != (B, Hq, Nq, Dv) = (1, 2, 5, 8) (the dense entry point's o)" in report, (
        report)
    assert "RuntimeError" not in report, report


@pytest.mark.parametrize("mode", sorted(PROBLEMS))
def test_judge_fails_a_float16_lse_outright(mode):
    """What a repro calls: judge fails an lse in float16 outright (its values right), o passes."""
    p = PROBLEMS[mode]
    out = run_kernel(REF, p, PROP)
    results = {r.name: r for r in judge(REF, p, Outputs(out.o, out.lse.half()), ("o", "lse"))}
    assert results["o"].ok
    assert not results["lse"].ok
    assert results["lse"].reason.startswith("lse dtype torch.float16 != torch.float32"), results["lse"].reason


@pytest.mark.parametrize("mode", ["dense", "varlen"])
def test_float64_problem_takes_float32_sinks_and_gives_float32_dsinks(mode):
    """Sinks are float32 in a float64 problem too; ref-blocked's dsinks is float32 and passes
    against the float64 golden at float32 precision (budget_dtype), o, lse and dq, dk, dv at
    float64's."""
    p = PROBLEMS[mode].replace(dtype=F64, sinks="mixed")
    assert p.variant_kwargs()["sinks"].dtype == F32
    out = run_kernel(REF, p, PROP, backward=True)
    assert out.dsinks.dtype == F32
    assert budget_dtype(p, "dsinks") == F32 and budget_dtype(p, "dq") == F64
    results = judge(REF, p, out, ("o", "lse", "dq", "dk", "dv", "dsinks"))
    assert all(r.ok for r in results), [r.describe() for r in results if not r.ok]


@pytest.mark.parametrize("dtype", [F16, torch.bfloat16, F64])
@pytest.mark.parametrize("inputs", [F32, F64])
def test_sinks_of_another_dtype_are_refused(dtype, inputs):
    """check_sinks (every adapter's) refuses sinks that are not float32 with a TypeError naming
    them, whatever the inputs' dtype."""
    q, k, v = Problem(hq=2, hkv=1, dtype=inputs).inputs()
    with pytest.raises(TypeError, match=f"sinks must be float32 whatever the inputs' dtype, got {dtype}"):
        blocked(q, k, v, sinks=torch.zeros(2, dtype=dtype))
