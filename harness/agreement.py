"""Budgets for comparing two kernel runs with each other (metamorphic properties).

Two runs ``a`` and ``b`` whose exact results are equal (``g_a = g_b``, or ``g_b = g_a + shift``)
are each allowed the tolerance model's error against their own float64 golden, so by the
triangle inequality

    max|X_a - X_b|  <=  max|X_a - g_a| + max|g_a - g_b| + max|g_b - X_b|
                    <=  budget_a(X) + budget_b(X)      (+ the goldens' own float64 rounding)

where each ``budget`` is ``harness.tolerance.budget``: r times the yardstick's error on that
run's inputs plus the floor of that run's magnitudes. No new tolerance is invented here: the
budgets are the ones :func:`harness.check.assert_close_to_golden` applies to each run alone.

Exact requirements come first: a NaN in either run fails (the golden never has one), and inf
entries (lse of empty rows) must sit at the same places with the same value in both runs.
"""

from __future__ import annotations

import torch

from ..contract.problem import KernelInputs, Problem
from ..contract.registry import Kernel
from .check import (
    REFERENCES,
    Outputs,
    PropertyFailure,
    failure,
    reference_for,
    with_rounding,
    yardstick_precision,
)
from .symptoms import Relation
from .tolerance import Conditioning, budget, unravel

#: Forward tensors the metamorphic properties compare.
FORWARD = ("o", "lse")

Inputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
Index = tuple[slice, ...]


def references_on(kernel: Kernel, problem: Problem, inputs: Inputs | KernelInputs | None = None,
                  scale: float | None = None) -> tuple[Outputs, Outputs]:
    """Forward golden and yardstick on ``inputs`` (default: the problem's own, cached).

    ``inputs`` is a whole :class:`KernelInputs` of the problem's entry point, or a dense
    problem's ``q, k, v`` (with the problem's variant keywords); ``problem`` supplies the entry
    point, causal and the dtype; ``scale`` overrides ``problem.scale``; the causal alignment is
    the kernel's declared one."""
    if inputs is None and scale is None:
        return reference_for(kernel, problem)
    if inputs is None:
        inputs = problem.kernel_inputs()
    elif not isinstance(inputs, KernelInputs):
        inputs = KernelInputs(tuple(inputs), problem.variant_kwargs(), {})
    golden_fn, _, yard_fn = REFERENCES[problem.mode]

    def plain(x):
        return x.detach() if isinstance(x, torch.Tensor) else x

    args = tuple(plain(a) for a in inputs.args)
    kw = dict(causal=problem.causal, scale=problem.scale if scale is None else scale,
              alignment=kernel.capabilities.causal_alignment,
              **{name: plain(val) for name, val in inputs.kwargs.items()})
    effective = problem.replace(scale=kw["scale"]).effective_scale
    cond = with_rounding(Conditioning.of_entry(problem.mode, args, effective, kw), problem.mode, args, kw)
    golden = Outputs(*golden_fn(*args, **kw), conditioning=cond)
    with torch.no_grad(), yardstick_precision(kernel.capabilities.fp32_matmul == "tf32", args[0]):
        yard = Outputs(*yard_fn(*args, **kw))
    return golden, yard


def restrict(refs: tuple[Outputs, Outputs], index: Index) -> tuple[Outputs, Outputs]:
    """The references of a sub-problem (some batch elements or heads): the same index into each."""
    return tuple(Outputs(r.o[index], r.lse[index], conditioning=r.conditioning) for r in refs)


def _max_finite_abs(t: torch.Tensor) -> float:
    finite = t[torch.isfinite(t)]
    return float(finite.abs().max()) if finite.numel() else 0.0


def _max_finite_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    both = torch.isfinite(a) & torch.isfinite(b)
    return float((a - b)[both].abs().max()) if both.any() else 0.0


def budgets(dtype: torch.dtype, refs: tuple[Outputs, Outputs]) -> dict[str, float]:
    """The tolerance model's budget for o and lse of one run with references ``(golden, yardstick)``
    (the golden's conditioning gives the floor's logit and values terms, as in
    :func:`harness.check.judge`; of a restricted run, the whole run's: an upper bound)."""
    golden, yard = refs
    cond = golden.conditioning
    logit_size = cond.logit_size(golden.lse)
    out = {}
    for name in FORWARD:
        g, y = getattr(golden, name), getattr(yard, name).to(torch.float64)
        out[name] = budget(name, dtype, _max_finite_diff(y, g), _max_finite_abs(g), logit_size,
                           cond.values_for(name), cond.rounding_for(name))[0]
    return out


def total(*parts: dict[str, float]) -> dict[str, float]:
    """Budgets of several runs, added per tensor."""
    return {name: sum(p[name] for p in parts) for name in FORWARD}


def disagreement(name: str, a: torch.Tensor, b: torch.Tensor, limit: float) -> Relation | None:
    """How ``a`` and ``b`` disagree beyond ``limit`` (``None`` when they agree): the tensor, the
    kind (``shape``, ``NaN``, ``inf``, ``off``) and the line that says where."""
    a, b = a.detach().to(torch.float64), b.detach().to(device=a.device, dtype=torch.float64)
    if a.shape != b.shape:
        return Relation(name, "shape", f"{name}: shapes {tuple(a.shape)} and {tuple(b.shape)} differ")
    nan = torch.isnan(a) | torch.isnan(b)
    if nan.any():
        return Relation(name, "NaN", f"{name}: NaN in {int(nan.sum())} elements, first at "
                        f"{tuple(nan.nonzero()[0].tolist())}")
    inf = (torch.isinf(a) | torch.isinf(b)) & (a != b)
    if inf.any():
        at = tuple(inf.nonzero()[0].tolist())
        return Relation(name, "inf", f"{name}: inf pattern differs in {int(inf.sum())} elements, first at "
                        f"{at} ({a[at]} vs {b[at]})")
    err = _max_finite_diff(a, b)
    if err > limit:
        diff = torch.where(torch.isfinite(a), (a - b).abs(), 0.0)
        at = unravel(int(diff.argmax()), diff.shape)
        return Relation(name, "off", f"{name}: max|a - b| = {err:.3e} at {at} ({float(a[at]):.6g} vs "
                        f"{float(b[at]):.6g}) > budget {limit:.3e} (sum of both runs' tolerance-model "
                        "budgets)")
    return None


Pair = tuple[str, torch.Tensor | None, torch.Tensor | None]


def pairs(a: Outputs, b: Outputs, a_index: Index = (), b_index: Index = ()) -> list[Pair]:
    """``(name, a.name[a_index], b.name[b_index])`` for o and lse; ``None`` for a missing lse."""
    def pick(out: Outputs, name: str, index: Index) -> torch.Tensor | None:
        t = getattr(out, name)
        return None if t is None else t[index]

    return [(name, pick(a, name, a_index), pick(b, name, b_index)) for name in FORWARD]


def assert_agree(kernel: Kernel, problem: Problem, prop: str, what: str,
                 compared: list[Pair], limits: dict[str, float]) -> None:
    """Fail with :func:`harness.check.failure` unless each compared ``(name, a, b)`` agrees within
    ``limits[name]``; pairs with a ``None`` side (a kernel without lse) are skipped."""
    bad = [found for name, a, b in compared if a is not None and b is not None
           if (found := disagreement(name, a, b, limits[name])) is not None]
    if bad:
        lines = [what, *(r.line for r in bad)]
        raise PropertyFailure(failure(kernel, problem, prop, lines, relation=bad[0]))
