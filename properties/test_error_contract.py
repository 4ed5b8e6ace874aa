"""The error contract: an undeclared problem gets a clear error or a correct answer.

Clear means ValueError, TypeError or NotImplementedError. A wrong answer, a NaN, a crash or any
other exception on an undeclared problem is a failure ("clear error or correct answer").
"""

from __future__ import annotations

import pytest
from flashprop.harness.check import (
    KernelRefused,
    PropertyFailure,
    assert_close_to_golden,
    failure,
    gradient_names,
    run_kernel,
    run_property,
)
from flashprop.harness.strategies import undeclared_problems
from flashprop.harness.variant_problems import (
    MALFORMED,
    malformed_inputs,
    undeclared_variant_problems,
    variant_axes,
    variant_problems,
)


def test_undeclared_problem_raises_clear_error_or_is_correct(run, kernel, device, sizes):
    def check(kernel, problem):
        try:
            out = run_kernel(kernel, problem, "error-contract", declared=False)
        except KernelRefused:
            return "refused"
        assert_close_to_golden(kernel, problem, "error-contract", out, ("o", "lse"))
        return None

    run_property(
        run, kernel,
        "error-contract",
        undeclared_problems(kernel.capabilities, device=device, sizes=sizes),
        check,
        weight=0.5,
    )


def test_undeclared_variant_raises_clear_error_or_is_correct(run, kernel, device, sizes):
    """A variant the kernel does not declare (a window, softcap, ALiBi shape, sinks, a sequence
    length off its granularity, or the backward of a variant declared forward only) is refused
    with a clear error or answered correctly."""
    caps = kernel.capabilities
    if not variant_axes(caps):
        pytest.skip(f"kernel {kernel.name} declares every variant and its backward")

    def check(kernel, problem):
        # the backward of a variant declared forward only, unless a limit of the backward rules it out
        backward = (caps.backward and caps.unsupported_reason(problem) is None
                    and caps.backward_limit(problem) is None)
        names = ("o", *gradient_names(problem)) if backward else ("o", "lse")
        try:
            out = run_kernel(kernel, problem, "variant-error-contract", declared=False, backward=backward)
        except KernelRefused:
            return "refused"
        assert_close_to_golden(kernel, problem, "variant-error-contract", out, names)
        return None

    run_property(
        run, kernel,
        "variant-error-contract",
        undeclared_variant_problems(caps, device=device, sizes=sizes),
        check,
        weight=0.5,
    )


@pytest.mark.parametrize("corruption", sorted(MALFORMED))
def test_malformed_variant_inputs_raise_clear_error(run, kernel, device, sizes, corruption):
    """Malformed variant inputs (cu_seqlens, cache lengths, block tables, slopes, windows,
    softcaps, sinks) of a declared entry point raise ValueError, TypeError or
    NotImplementedError: never an answer, a NaN or a crash."""
    variant = MALFORMED[corruption][0]
    if not kernel.capabilities.declares_variant(variant):
        pytest.skip(f"kernel {kernel.name} does not declare variant {variant!r}")
    prop = "malformed-inputs"

    def check(kernel, problem):
        inp = malformed_inputs(problem, corruption)
        try:
            run_kernel(kernel, problem, prop, inputs=inp, declared=False, malformed=corruption)
        except KernelRefused:
            return "refused"
        answered = f"malformed input ({corruption}) was answered instead of refused with a clear error"
        raise PropertyFailure(failure(kernel, problem, prop, [], error=answered,
                                      malformed=(corruption, tuple(inp.kwargs))))

    two = corruption == "cu_seqlens not monotone"  # a second sequence to jump back to
    strategy = variant_problems(kernel.capabilities, variant, device=device, sizes=sizes,
                                where=(lambda p: p.b >= 2) if two else None)
    run_property(run, kernel, prop, strategy, check, weight=0.25)
