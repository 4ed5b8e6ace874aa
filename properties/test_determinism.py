"""Determinism: a kernel that declares it is deterministic gives bitwise-equal reruns.

Bitwise means the same bit patterns (NaN payloads included), compared through an integer view,
so no tolerance is involved: a kernel whose reduction order depends on scheduling (atomics in a
backward, split-KV with a racy combine) fails this even when each run is within budget.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from flashprop.contract.problem import Problem
from flashprop.contract.registry import Kernel
from flashprop.harness.check import Outputs, PropertyFailure, failure, run_kernel, run_property
from flashprop.harness.strategies import problems

_INT_VIEW = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bitwise_differences(a: Outputs, b: Outputs, names: tuple[str, ...]) -> list[str]:
    """For each named tensor that differs bitwise between the runs: how many elements, and where first."""
    out = []
    for name in names:
        x, y = getattr(a, name), getattr(b, name)
        if x is None and y is None:
            continue
        if x is None or y is None or x.shape != y.shape or x.dtype != y.dtype:
            out.append(f"{name}: the two runs returned different kinds of result")
            continue
        bits = _INT_VIEW[x.element_size()]
        diff = x.detach().contiguous().view(bits) != y.detach().contiguous().view(bits)
        if diff.any():
            at = tuple(diff.nonzero()[0].tolist())
            out.append(f"{name}: {int(diff.sum())} of {diff.numel()} elements differ bitwise, first at {at} "
                       f"({float(x[at]):.9g} vs {float(y[at]):.9g})")
    return out


def _rerun_check(names: tuple[str, ...], backward: bool) -> tuple[str, Callable[[Kernel, Problem], None]]:
    """The property's name and its check: run twice, compare bitwise."""
    prop = "deterministic-backward" if backward else "deterministic-forward"

    def check(kernel: Kernel, p: Problem) -> None:
        first, second = (run_kernel(kernel, p, prop, backward=backward) for _ in range(2))
        diffs = _bitwise_differences(first, second, names)
        if diffs:
            raise PropertyFailure(failure(kernel, p, prop, ["two runs on the same inputs differ:", *diffs],
                                          backward=backward))

    return prop, check


def _many_tiles(caps, device, sizes, backward: bool):
    """Declared problems (and gradients, with ``backward``) on the smallest declared tiles, so
    reductions span several tiles (where a scheduling-dependent order would show)."""
    smallest = {name: min(tiles) for name, tiles in (("block_m", caps.block_m), ("block_n", caps.block_n))
                if tiles}
    return problems(caps, device=device, sizes=sizes, derive=lambda p: p.replace(**smallest),
                    backward=backward)


def test_forward_bitwise_reproducible(run, kernel, device, sizes):
    """capabilities.deterministic: two forward runs give bitwise-equal o and lse."""
    if not kernel.capabilities.deterministic:
        pytest.skip(f"kernel {kernel.name} does not declare a deterministic forward")
    prop, check = _rerun_check(("o", "lse"), backward=False)
    run_property(run, kernel, prop, _many_tiles(kernel.capabilities, device, sizes, False), check, weight=0.5)


def test_backward_bitwise_reproducible(run, kernel, device, sizes):
    """capabilities.deterministic_backward: two backward runs give bitwise-equal dq, dk, dv."""
    caps = kernel.capabilities
    if not caps.backward:
        pytest.skip(f"kernel {kernel.name} does not declare backward")
    if not caps.deterministic_backward:
        pytest.skip(f"kernel {kernel.name} does not declare a deterministic backward")
    prop, check = _rerun_check(("o", "dq", "dk", "dv"), backward=True)
    run_property(run, kernel, prop, _many_tiles(caps, device, sizes, True), check, weight=0.5)
