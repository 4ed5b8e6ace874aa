"""Forward and backward against the float64 golden, within the tolerance model's budget."""

from __future__ import annotations

import pytest
from flashprop.harness.check import assert_close_to_golden, run_kernel, run_property
from flashprop.harness.strategies import problems


def test_forward_matches_golden(run, kernel, device, sizes):
    """o and lse of every declared problem agree with the float64 golden."""

    def check(kernel, problem):
        out = run_kernel(kernel, problem, "forward")
        assert_close_to_golden(kernel, problem, "forward", out, ("o", "lse"))

    run_property(run, kernel, "forward", problems(kernel.capabilities, device=device, sizes=sizes), check)


def test_backward_matches_golden(run, kernel, device, sizes):
    """dq, dk, dv agree with the float64 golden backward (streamed, exact formula)."""
    if not kernel.capabilities.backward:
        pytest.skip(f"kernel {kernel.name} does not declare backward")

    def check(kernel, problem):
        out = run_kernel(kernel, problem, "backward", backward=True)
        assert_close_to_golden(kernel, problem, "backward", out, ("o", "dq", "dk", "dv"))

    run_property(
        run, kernel, "backward", problems(kernel.capabilities, device=device, sizes=sizes, backward=True),
        check, weight=0.75,
    )
