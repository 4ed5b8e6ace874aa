"""Each variant against the float64 golden, forward and backward: one property per variant.

``<variant>-forward`` draws declared problems that use the variant (window, softcap, ALiBi,
sinks, varlen, KV-cache decode, paged cache, split-KV), with the kernel's other declared
variants joining at random, and judges o and lse against the golden of ``refimpl``
(``refimpl.layouts`` for varlen and decode) within the tolerance model. ``<variant>-backward``
judges dq, dk, dv (and dsinks) where the kernel declares that variant's gradients. A stochastic
variant (dropout) has no elementwise golden for a kernel's own random numbers: its properties are
``properties/test_dropout.py``.
"""

from __future__ import annotations

import pytest
from flashprop.contract.variants import BACKWARD, JUDGED
from flashprop.harness.check import assert_close_to_golden, gradient_names, run_kernel, run_property
from flashprop.harness.variant_problems import variant_problems


def _require(kernel, variant: str) -> None:
    if not kernel.capabilities.declares_variant(variant):
        pytest.skip(f"kernel {kernel.name} does not declare variant {variant!r}")


@pytest.mark.parametrize("variant", JUDGED)
def test_variant_forward_matches_golden(run, kernel, device, sizes, variant):
    """o and lse of declared problems using ``variant`` agree with the float64 golden."""
    _require(kernel, variant)
    prop = f"{variant}-forward"

    def check(kernel, problem):
        out = run_kernel(kernel, problem, prop)
        assert_close_to_golden(kernel, problem, prop, out, ("o", "lse"))

    strategy = variant_problems(kernel.capabilities, variant, device=device, sizes=sizes)
    run_property(run, kernel, prop, strategy, check)


@pytest.mark.parametrize("variant", [name for name in JUDGED if name in BACKWARD])
def test_variant_backward_matches_golden(run, kernel, device, sizes, variant):
    """dq, dk, dv (and dsinks) of declared problems using ``variant`` agree with the golden."""
    _require(kernel, variant)
    caps = kernel.capabilities
    if not caps.backward or variant not in caps.variant_backward:
        pytest.skip(f"kernel {kernel.name} does not declare the backward of {variant!r}")
    prop = f"{variant}-backward"

    def check(kernel, problem):
        out = run_kernel(kernel, problem, prop, backward=True)
        assert_close_to_golden(kernel, problem, prop, out, ("o", *gradient_names(problem)))

    strategy = variant_problems(caps, variant, device=device, sizes=sizes, backward=True)
    run_property(run, kernel, prop, strategy, check, weight=0.75)
