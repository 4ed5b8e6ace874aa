"""The error contract: an undeclared problem gets a clear error or a correct answer.

Clear means ValueError, TypeError or NotImplementedError. A wrong answer, a NaN, a crash or any
other exception on an undeclared problem is a failure ("clear error or correct answer").
"""

from __future__ import annotations

from properties.check import KernelRefused, assert_close_to_golden, run_kernel, run_property
from properties.strategies import undeclared_problems


def test_undeclared_problem_raises_clear_error_or_is_correct(kernel, device, sizes):
    def check(kernel, problem):
        try:
            out = run_kernel(kernel, problem, "error-contract", declared=False)
        except KernelRefused:
            return "refused"
        assert_close_to_golden(kernel, problem, "error-contract", out, ("o", "lse"))
        return None

    run_property(
        kernel,
        "error-contract",
        undeclared_problems(kernel.capabilities, device=device, sizes=sizes),
        check,
        weight=0.5,
    )
