"""Tensors past 2^31 elements: where 32-bit offsets break (``harness/scale_problems.py``).

- huge-heads, huge-batch, huge-rows, huge-varlen (GPU): a dense problem with a tensor of more
  than 2^31 elements along one axis; the unit holding element 2^31 of each such tensor, and the
  last unit, equal the same problem run alone: o, lse and (where declared) dq, dk, dv. Bitwise
  where the kernel declares determinism (``deterministic``, ``deterministic_backward``) and the
  property fixes its tiles by keyword (both runs then run the same tiles; for one long
  sequence, tiles that divide 128). A kernel that picks its tiles or splits by problem size, as
  FlashAttention-2's split-KV heuristic does, is not promised the same bits across sizes by
  ``deterministic`` alone: otherwise the comparison is within the sum of both runs'
  tolerance-model budgets. Memory, not FLOPs: 25-70 GiB, seconds.
- spread-batch, spread-heads, spread-rows (CPU and GPU): small problems whose tensors are views
  spanning past element 2^31 of their allocation; o, lse and gradients against the float64
  golden within the tolerance model. The CPU's version of the huge properties: the same
  offsets, in megabytes of memory.
- scale-error-contract: a kernel that declares ``max_elements`` refuses, with a clear error,
  problems and views past it, or answers them correctly.

A huge example holds its GPU alone (a lock per GPU shared by the xdist workers of ``ci/gpu_check.py``)
and skips, saying so, when the GPU has not the memory (or runs out of it).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from flashprop.contract.problem import Problem
from flashprop.contract.registry import Kernel
from flashprop.harness.agreement import budgets, disagreement, total
from flashprop.harness.check import (
    KernelRefused,
    Outputs,
    PropertyFailure,
    failure,
    judge,
    reference_for,
    run_kernel,
    run_property,
)
from flashprop.harness.run_context import RunContext
from flashprop.harness.scale_problems import (
    AXES,
    ROW_BLOCK_ALIGN,
    SPREAD_LAYOUTS,
    Unit,
    axis_of,
    boundary_note,
    device_free_bytes,
    exclusive_device,
    host_reserve_limit,
    huge_bytes,
    huge_inputs,
    huge_problems,
    spread_inputs,
    spread_problems,
    spread_span_bytes,
    units,
)
from flashprop.harness.symptoms import Relation, Symptom
from flashprop.harness.tolerance import budget
from hypothesis import reject
from hypothesis import strategies as st

GRADIENTS = ("dq", "dk", "dv")
#: Fraction of the GPU's free memory (at the test's start) a huge problem may plan to use.
MEMORY_SHARE = 0.85
#: The least memory a huge problem takes (fp16 heads: q, o, dO, dq and an fp32 accumulator).
SMALLEST_HUGE_BYTES = 30 * 2**30
#: Examples per property, as a share of the profile's (gpu: 3 huge, 15 spread; ci: 1 huge, 3 spread).
HUGE_WEIGHT, SPREAD_WEIGHT = 0.03, 0.15
_INT_VIEW = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class OutOfDeviceMemory(Exception):
    """The problem did not fit the GPU after all (other processes, the kernel's workspace)."""


@dataclass
class Verdict:
    """A huge or spread example's outcome: refused (a clear error on an undeclared problem), or
    what differed (empty: it passed); ``judged``: the outputs its repro judges against the golden
    (none for a huge example, whose units are compared with themselves run alone)."""

    refused: bool = False
    details: list[str] | None = None
    judged: tuple[str, ...] = ()
    error: str | None = None
    symptom: Symptom | None = None
    relation: Relation | None = None

    @classmethod
    def of(cls, err: PropertyFailure, where: str, judged: tuple[str, ...] = ()) -> Verdict:
        """The verdict of a run that failed (``err``, of :func:`harness.check.run_kernel`):
        its record's fields, ``where`` the first detail."""
        f = err.failure
        return cls(details=[where, *f.details], judged=judged, error=f.error, symptom=f.symptom,
                   relation=f.relation)

    def outcome(self, kernel: Kernel, p: Problem, prop: str, inputs: str) -> str | None:
        """What a property check returns: ``"refused"``, ``None`` for a pass; a difference raises
        :class:`PropertyFailure` with the repro that rebuilds the tensors by ``inputs``."""
        if self.refused:
            return "refused"
        if self.details or self.error:
            raise PropertyFailure(failure(kernel, p, prop, self.details or [], judged=self.judged,
                                          inputs=("flashprop.harness.scale_problems", inputs),
                                          error=self.error, symptom=self.symptom, relation=self.relation))
        return None


def bitwise_difference(name: str, a: torch.Tensor, b: torch.Tensor) -> str | None:
    """Why ``a`` and ``b`` are not the same bits (``None`` when they are)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"{name}: {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}"
    a, b = a.detach(), b.detach().to(a.device)
    bits = _INT_VIEW[a.element_size()]
    diff = a.contiguous().view(bits) != b.contiguous().view(bits)
    if not diff.any():
        return None
    at = tuple(diff.nonzero()[0].tolist())
    return (f"{name}: {int(diff.sum())} of {diff.numel()} elements differ bitwise, first at {at} "
            f"({float(a[at]):.9g} vs {float(b[at]):.9g})")


def unit_limits(kernel: Kernel, unit: Problem, backward: bool) -> dict[str, float]:
    """Budgets for a unit compared with itself alone: twice its tolerance-model budget per
    tensor (:mod:`harness.agreement`), the gradients' floors from the golden's bounds."""
    golden, yard = reference_for(kernel, unit, backward=backward)
    limits = total(*[budgets(unit.dtype, (golden, yard))] * 2)
    if backward:
        logit = golden.conditioning.logit_size(golden.lse)
        for name in GRADIENTS:
            g, y = getattr(golden, name), getattr(yard, name).to(torch.float64)
            err = float((y - g).abs().max()) if g.numel() else 0.0
            limits[name] = 2 * budget(name, unit.dtype, err, golden.bounds[name], logit)[0]
    return limits


def compare_unit(kernel: Kernel, full: Outputs, unit: Unit, alone: Outputs, *, explicit_tiles: bool,
                 backward: bool) -> tuple[list[str], Relation | None]:
    """How the unit's part of the huge run differs from the unit run alone (empty: it does not),
    and the first disagreement beyond both runs' budgets."""
    caps = kernel.capabilities
    pairs = [("o", full.o[unit.q_index], alone.o)]
    if full.lse is not None and alone.lse is not None:
        pairs.append(("lse", full.lse[unit.lse_index], alone.lse))
    if backward:
        pairs += [("dq", full.dq[unit.q_index], alone.dq), ("dk", full.dk[unit.kv_index], alone.dk),
                  ("dv", full.dv[unit.kv_index], alone.dv)]
    limits = None
    bad, first = [], None
    for name, a, b in pairs:
        exact = explicit_tiles and (caps.deterministic_backward if name in GRADIENTS else caps.deterministic)
        if exact:
            msg = bitwise_difference(name, a, b)
            if msg is not None:
                limits = limits or unit_limits(kernel, unit.problem, backward)
                within = disagreement(name, a, b, limits[name]) is None
                msg += (" (within both runs' tolerance-model budgets: the kernel declares "
                        "determinism and ran the same tiles, so its part of a larger problem "
                        "should be the same bits)" if within else "")
        else:
            limits = limits or unit_limits(kernel, unit.problem, backward)
            relation = disagreement(name, a, b, limits[name])
            first = first or relation
            msg = None if relation is None else relation.line
        if msg is not None:
            bad.append(msg)
    return bad, first


def _out_of_memory(err: BaseException) -> bool:
    return isinstance(err, torch.cuda.OutOfMemoryError) or isinstance(
        err.__cause__, torch.cuda.OutOfMemoryError)


def run_huge(kernel: Kernel, p: Problem, prop: str, *, declared: bool = True) -> Verdict:
    """The huge problem, then each compared unit alone. Holds the GPU's memory only inside;
    raises :class:`OutOfDeviceMemory` when it does not fit."""
    caps = kernel.capabilities
    backward = declared and caps.backward and caps.backward_reason(p) is None
    if p.device == "cuda" and device_free_bytes(p.device) < huge_bytes(p):
        reject()  # the GPU is busier than when the problem was drawn
    try:
        inputs, do = huge_inputs(p, caps.causal_alignment, backward)
        full = run_kernel(kernel, p, prop, backward=backward, inputs=inputs, grad_output=do,
                          declared=declared)
    except KernelRefused:
        return Verdict(refused=True)
    except (torch.cuda.OutOfMemoryError, PropertyFailure) as err:
        if _out_of_memory(err):
            raise OutOfDeviceMemory(f"{type(err).__name__}: {str(err).splitlines()[0]}") from None
        return Verdict.of(err, "the huge problem, run whole")  # the huge tensors go with the frame
    del inputs, do
    # the same tiles in both runs: given by keyword, and (one long sequence) aligned on the
    # unit's first row, so that dK and dV sum the unit's rows in the same groups
    explicit = p.block_m is not None and p.block_n is not None and (
        axis_of(p) != "rows" or ROW_BLOCK_ALIGN % p.block_m == 0)
    details, relation = [], None
    for unit in units(p, caps.causal_alignment):
        try:
            alone = run_kernel(kernel, unit.problem, prop, backward=backward)
        except PropertyFailure as err:
            return Verdict.of(err, f"{unit.what}, run alone")
        bad, first = compare_unit(kernel, full, unit, alone, explicit_tiles=explicit, backward=backward)
        relation = relation or first
        if bad:
            details += [f"{unit.what} differs from the same problem alone, "
                        f"{unit.problem.describe()}:", *bad]
    return Verdict(details=details, relation=relation)


def huge_check(prop: str, *, declared: bool = True):
    """The check of a huge property (:func:`run_huge` under the GPU's lock)."""

    def check(kernel: Kernel, p: Problem) -> str | None:
        try:
            with exclusive_device(p.device):
                verdict = run_huge(kernel, p, prop, declared=declared)
        except OutOfDeviceMemory as err:
            shape = f"B={p.b}, Hq={p.hq}, Hkv={p.hkv}, Nq={p.nq}, Nk={p.nk}, D={p.d}, Dv={p.dv}, {p.dtype}"
            pytest.skip(f"{prop}: out of device memory at {shape} (planned "
                        f"{huge_bytes(p) / 2**30:.0f} GiB): {str(err).splitlines()[0]}; "
                        "the examples before it ran")
        inputs = f"huge_inputs(p, {kernel.capabilities.causal_alignment!r}, requires_grad=True)"
        return verdict.outcome(kernel, p, prop, inputs)

    return check


def _huge_budget(device: str) -> int:
    budget = int(device_free_bytes(device) * MEMORY_SHARE)
    if budget < SMALLEST_HUGE_BYTES:
        pytest.skip(f"a huge problem needs about {SMALLEST_HUGE_BYTES / 2**30:.0f} GiB of device "
                    f"memory; {budget / 2**30:.1f} GiB are free to it here")
    return budget


def _int32_refusal(kernel: Kernel, what: str) -> str | None:
    """The skip reason when ``kernel`` declares a ``max_elements`` below 2^31: every huge problem
    and spread view holds more, and test_scale_error_contract checks that it refuses ``what``."""
    limit = kernel.capabilities.max_elements
    if limit is None or limit >= 2**31:
        return None
    return (f"kernel {kernel.name} declares max_elements={limit}: its refusal of {what} is "
            "test_scale_error_contract's")


def huge_skip_reason(kernel: Kernel, device: str, axis: str) -> str | None:
    """Why test_huge_independence does not run ``kernel`` on ``device`` along ``axis``, if it
    does not: no GPU, an undeclared variant, or a declared ``max_elements`` below 2^31 (every
    huge problem holds more; test_scale_error_contract checks that the kernel refuses them)."""
    caps = kernel.capabilities
    if device != "cuda":
        return ("dense tensors of 2^31 elements (4 GiB each in fp16, 30 GiB and more a "
                "problem) are for a GPU; on the CPU test_spread_layouts reaches the same offsets")
    if axis == "varlen" and not caps.varlen:
        return f"kernel {kernel.name} does not declare varlen"
    return _int32_refusal(kernel, "problems past it")


@pytest.mark.parametrize("axis", AXES)
def test_huge_independence(run: RunContext, kernel: Kernel, device: str, axis: str):
    """Along ``axis``, the units holding element 2^31 of a tensor, and the last unit, equal the
    same problems run alone (forward, lse, gradients)."""
    caps = kernel.capabilities
    if reason := huge_skip_reason(kernel, device, axis):
        pytest.skip(reason)
    strategy = huge_problems(caps, axis, device=device, budget=_huge_budget(device))
    run_property(run, kernel, f"huge-{axis}", strategy, huge_check(f"huge-{axis}"), weight=HUGE_WEIGHT)


def _spread_max_bytes(device: str) -> int:
    """Bytes one spread allocation may take: the host's reservable address space, or a fifth
    of the GPU's free memory (four tensors: q, k, v, dO)."""
    limit = host_reserve_limit() if device == "cpu" else int(device_free_bytes(device) * MEMORY_SHARE) // 5
    if limit < 2**32:
        pytest.skip(f"a view past 2^31 fp16 elements needs 4 GiB of "
                    f"{'address space' if device == 'cpu' else 'device memory'}; "
                    f"{limit / 2**30:.1f} GiB can be reserved here")
    return limit


def run_spread(kernel: Kernel, p: Problem, prop: str, *, declared: bool = True) -> Verdict:
    """The spread problem's outputs against the golden of the same values laid out densely."""
    caps = kernel.capabilities
    backward = declared and caps.backward and caps.backward_reason(p) is None
    if p.device == "cuda" and 4 * spread_span_bytes(p) > device_free_bytes(p.device):
        reject()
    inputs, do = spread_inputs(p, backward)
    names = ("o", "lse", *GRADIENTS) if backward else ("o", "lse")
    try:
        out = run_kernel(kernel, p, prop, backward=backward, inputs=inputs, grad_output=do,
                         declared=declared)
    except KernelRefused:
        return Verdict(refused=True)
    except PropertyFailure as err:  # reported with the spread repro, not the dense one
        return Verdict.of(err, boundary_note(p), judged=names)
    del inputs, do
    results = judge(kernel, p.replace(layout="contiguous"), out, names)
    if all(r.ok for r in results):
        return Verdict(details=[])
    return Verdict(details=[boundary_note(p), *(r.describe() for r in results)], judged=names,
                   symptom=Symptom.of(results))


def spread_check(prop: str, *, declared: bool = True):
    """The check of a spread property (:func:`run_spread` under the GPU's lock)."""

    def check(kernel: Kernel, p: Problem) -> str | None:
        with exclusive_device(p.device):
            verdict = run_spread(kernel, p, prop, declared=declared)
        inputs = f"spread_inputs(p, requires_grad={'dq' in verdict.judged})"
        return verdict.outcome(kernel, p, prop, inputs)

    return check


@pytest.mark.parametrize("layout", sorted(SPREAD_LAYOUTS))
def test_spread_layouts(run: RunContext, kernel: Kernel, device: str, layout: str):
    """Views whose last slice lies past element 2^31 of their allocation: o, lse and gradients
    agree with the golden of the same values laid out densely."""
    caps = kernel.capabilities
    if not caps.any_strides:
        pytest.skip(f"kernel {kernel.name} declares contiguous inputs only (any_strides=False)")
    if reason := _int32_refusal(kernel, "such views"):
        pytest.skip(reason)
    strategy = spread_problems(caps, layout, device=device, max_bytes=_spread_max_bytes(device))
    run_property(run, kernel, layout, strategy, spread_check(layout), weight=SPREAD_WEIGHT)


def test_scale_error_contract(run: RunContext, kernel: Kernel, device: str):
    """A kernel that declares ``max_elements`` refuses (ValueError, TypeError,
    NotImplementedError) views that span more, and on a GPU dense problems that hold more, or
    answers them correctly."""
    caps = kernel.capabilities
    if caps.max_elements is None:
        pytest.skip(f"kernel {kernel.name} declares no max_elements: it claims every size, which "
                    "test_huge_independence and test_spread_layouts hold it to")
    prop = "scale-error-contract"
    spread = [spread_problems(caps, layout, device=device, declared=False,
                              max_bytes=_spread_max_bytes(device)) for layout in sorted(SPREAD_LAYOUTS)]
    strategies = [st.one_of(*spread)]
    if device == "cuda" and device_free_bytes(device) * MEMORY_SHARE >= SMALLEST_HUGE_BYTES:
        budget = _huge_budget(device)
        strategies += [huge_problems(caps, axis, device=device, budget=budget, declared=False)
                       for axis in AXES[:3]]
    spread_once, huge_once = spread_check(prop, declared=False), huge_check(prop, declared=False)

    def check(kernel: Kernel, p: Problem) -> str | None:
        return (spread_once if p.layout in SPREAD_LAYOUTS else huge_once)(kernel, p)

    run_property(run, kernel, prop, st.one_of(*strategies), check, weight=SPREAD_WEIGHT)
