"""torch.autograd.gradcheck (and gradgradcheck) of o in float64, on tiny problems.

Finite differences in float64 check the kernel's backward against its own forward, with no
reference implementation involved: dO·(dq, dk, dv) must match the directional derivatives of
o (causal and not, GQA, Nq != Nk, every layout, as drawn). ``fast_mode`` projects the Jacobian
onto random vectors, so one example costs a handful of kernel calls instead of one per input
element. Only o is differentiated: the contract does not require lse to be differentiable.

gradgradcheck runs where the kernel's backward is itself differentiable. That is probed once:
the gradients taken with ``create_graph=True`` must require grad and depend on q, k, v or dO
again; a backward marked ``once_differentiable`` or computed outside autograd is a clean refusal
(its gradients do not require grad, or differentiating them raises RuntimeError or
NotImplementedError) and the test is skipped with the reason. A backward that builds a graph
but gets the second derivatives wrong fails, and so does a probe that raises anything else (a
tallied failure, as an example's). Where the first derivatives are right, the report says that
a backward not meant to be differentiated is marked ``@torch.autograd.function.once_differentiable``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import pytest
import torch
from flashprop.contract.capabilities import Capabilities
from flashprop.contract.problem import Problem
from flashprop.contract.registry import Kernel
from flashprop.harness.check import PropertyFailure, failure, run_property
from flashprop.harness.diagnosis import PREFIX
from flashprop.harness.run_context import RunContext
from flashprop.harness.strategies import Sizes, problems

F64 = torch.float64
#: Errors of a second derivative that refuse it cleanly (``once_differentiable`` raises RuntimeError).
REFUSALS = (RuntimeError, NotImplementedError)


def once_differentiable_hint(what: str) -> str:
    """The diagnosis of a double backward that fails (``what``: how), for a backward that may not
    be meant to be differentiated."""
    return (f"{PREFIX}{what}: if the backward is not meant to be differentiated, decorate it with "
            "@torch.autograd.function.once_differentiable (or compute it outside autograd); the suite "
            "then checks that double backward is refused cleanly instead")


def _tiny(caps: Capabilities, sizes: Sizes, n: int = 9, d: int = 8) -> Sizes:
    """N <= n, D <= d (or the smallest declared D), batch 1, at most 2 kv heads of 2."""
    return replace(sizes, max_n=min(sizes.max_n, n), max_batch=1, max_kv_heads=min(sizes.max_kv_heads, 2),
                   max_group=min(sizes.max_group, 2), max_head_dim=max(d, min(caps.head_dims)))


def _o_of(kernel: Kernel, p: Problem) -> Callable[..., torch.Tensor]:
    def o(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return kernel(q, k, v, causal=p.causal, scale=p.scale, block_m=p.block_m, block_n=p.block_n)[0]

    return o


def _require_float64_backward(kernel: Kernel) -> None:
    caps = kernel.capabilities
    if F64 not in caps.dtypes:
        pytest.skip(f"kernel {kernel.name} does not declare float64 (finite differences need it)")
    if not caps.backward:
        pytest.skip(f"kernel {kernel.name} does not declare backward")


def _checker(prop: str, check_fn: Callable[..., bool]) -> Callable[[Kernel, Problem], None]:
    """A check running ``check_fn(o, inputs, fast_mode=True)``: a mismatch or an error is a failure.

    Mismatches are detected with ``raise_exception=False``: torch's message would recompute the
    full Jacobians in slow mode on every failing example Hypothesis shrinks through; the repro
    line does that once."""

    def check(kernel: Kernel, p: Problem) -> None:
        inputs = p.inputs(requires_grad=True)
        repro = (f"{prop} repro: torch.autograd.{prop}(lambda q, k, v: load_kernel({kernel.name!r})(q, k, v, "
                 f"causal=p.causal, scale=p.scale, block_m=p.block_m, block_n=p.block_n)[0], (q, k, v))")

        def failed(detail: str) -> PropertyFailure:
            hint = [_double_backward_hint(kernel, p)] if prop == "gradgradcheck" else []
            return PropertyFailure(failure(kernel, p, prop, [detail, *hint, repro], backward=True))

        try:
            ok = check_fn(_o_of(kernel, p), inputs, fast_mode=True, raise_exception=False)
        except (RuntimeError, ValueError, TypeError, NotImplementedError) as err:
            raise failed(f"{prop} raised {type(err).__name__}: {str(err).strip().splitlines()[0]}") from err
        if not ok:
            raise failed(f"{prop}: analytical and finite-difference (float64) Jacobians of o differ "
                         "(fast mode)")

    return check


def _double_backward_hint(kernel: Kernel, p: Problem) -> str:
    """The diagnosis of a failed gradgradcheck: the first derivatives are wrong too (gradcheck
    fails on the same problem), or the hint for a backward not meant to be differentiated."""
    try:
        first = torch.autograd.gradcheck(_o_of(kernel, p), p.inputs(requires_grad=True), fast_mode=True,
                                         raise_exception=False)
    except (RuntimeError, ValueError, TypeError, NotImplementedError):
        first = False
    if not first:
        return (f"{PREFIX}the first derivatives are wrong too (gradcheck fails on this problem): "
                "fix the backward before its derivative")
    return once_differentiable_hint("the backward builds a graph but its derivatives are wrong")


def test_gradcheck(run, kernel, device, sizes):
    """Analytical gradients of o (the kernel's backward) equal float64 finite differences."""
    _require_float64_backward(kernel)
    caps = kernel.capabilities
    strategy = problems(caps, device=device, sizes=_tiny(caps, sizes), dtypes=(F64,), backward=True)
    run_property(run, kernel, "gradcheck", strategy, _checker("gradcheck", torch.autograd.gradcheck),
                 weight=0.5)


def _probe(caps: Capabilities, device: str) -> Problem | None:
    """A tiny declared float64 problem to probe double backward on, if there is one."""
    d = min(caps.head_dims)
    p = Problem(nq=3, nk=3, d=d, dv=d if caps.dv_equals_d or d in caps.dv_dims else min(caps.dv_dims),
                dtype=F64, block_m=caps.block_m[0] if caps.block_m else None,
                block_n=caps.block_n[0] if caps.block_n else None, device=device)
    return p if caps.unsupported_reason(p) is None else None


def _double_backward_unsupported(run: RunContext, kernel: Kernel, p: Problem) -> str | None:
    """Why the kernel's backward cannot be differentiated (``None`` when it can be). A probe that
    raises other than with a clean refusal is the property's failure on ``p``, tallied."""
    start, stage = time.perf_counter(), "the forward"
    try:
        q, k, v = p.inputs(requires_grad=True)
        do = p.grad_output().requires_grad_()
        o = _o_of(kernel, p)(q, k, v)
        stage = "the backward with create_graph=True"
        grads = torch.autograd.grad(o, (q, k, v), do, create_graph=True)
        if not all(g.requires_grad for g in grads):
            return "its gradients do not require grad"
        stage = "the backward of the backward"
        try:
            second = torch.autograd.grad(sum(g.sum() for g in grads), (q, k, v, do), allow_unused=True)
        except REFUSALS as err:
            return str(err).splitlines()[0]
    except Exception as err:
        text = (str(err).strip().splitlines() or [""])[0]
        details = [f"(probing double backward, in {stage})"]
        if stage != "the forward":
            details.append(once_differentiable_hint("its backward fails when autograd differentiates it"))
        message = failure(kernel, p, "gradgradcheck", details, backward=True,
                          error=f"the kernel raised {type(err).__name__}: {text}")
        run.tallies.record(kernel.name, "gradgradcheck", "failed", time.perf_counter() - start, message)
        raise PropertyFailure(message) from err
    if all(g is None for g in second):  # e.g. once_differentiable: a graph that leads nowhere
        return "its gradients are not connected to q, k, v or dO"
    return None


def test_gradgradcheck(run, kernel, device, sizes):
    """Where the backward is differentiable: second derivatives of o match finite differences
    of the kernel's own first derivatives (N <= 5, D <= 4: a double backward is costly)."""
    _require_float64_backward(kernel)
    caps = kernel.capabilities
    probe = _probe(caps, device)
    if probe is None:
        pytest.skip(f"kernel {kernel.name} declares no tiny float64 problem to probe double backward on")
    reason = _double_backward_unsupported(run, kernel, probe)
    if reason is not None:
        pytest.skip(f"backward is not differentiable (kernel does not support double backward): {reason}")
    strategy = problems(caps, device=device, sizes=_tiny(caps, sizes, n=5, d=4), dtypes=(F64,), backward=True)
    run_property(run, kernel, "gradgradcheck", strategy,
                 _checker("gradgradcheck", torch.autograd.gradgradcheck), weight=0.25)
