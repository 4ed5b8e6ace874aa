"""The precision properties' bounds: a correct kernel's allowed roundings pass, a rounded
intermediate fails (``properties/test_precision.py``)."""

from __future__ import annotations

import pytest
from flashprop.contract.registry import load_kernel
from flashprop.harness.check import PropertyFailure
from flashprop.harness.strategies import Sizes
from flashprop.properties.test_precision import (
    DECODE_CANCELLING,
    SOFTCAP_CANCELLING,
    check_decode,
    check_softcap,
    softcap_problems,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.meta

#: Drawn softcap problems the power test judges, and the least share of them on which the
#: rounded-softcap mutant's o must fail its bound (the one the P term widens; measured: 308 of the
#: first 400 derandomized draws, 77%, and 380 by o or lse).
POWER_DRAWS = 40
POWER_SHARE = 0.6


def test_softcap_precision_counts_p_rounding_on_a_cancelling_output():
    """The campaign's false alarm passes the correct kernel, whose P (rounded to fp16 for P V)
    moves a cancelling o by an ulp; the softcap rounded to fp16 still fails on the same problem."""
    check_softcap(load_kernel("ref-blocked"), SOFTCAP_CANCELLING)
    with pytest.raises(PropertyFailure, match="softcap-precision"):
        check_softcap(load_kernel("mutants.catalogue:blocked_softcap_low_precision"), SOFTCAP_CANCELLING)


@pytest.mark.parametrize("num_splits", [1, 2, 4])
def test_decode_precision_counts_float32_partials_on_a_cancelling_output(num_splits: int):
    """The campaign's false alarm (two float32 partials of about +-4 cancelling to o = -2e-4)
    passes the correct kernel with any number of splits; partials kept in fp16 still fail it."""
    p = DECODE_CANCELLING.replace(num_splits=num_splits)
    check_decode(load_kernel("ref-blocked"), p)
    if num_splits > 1:
        with pytest.raises(PropertyFailure, match="o: mean"):
            check_decode(load_kernel("mutants.catalogue:blocked_split_partials_low_precision"), p)


def test_softcap_precision_keeps_its_power():
    """With P's rounding in o's bound, the correct kernel passes every drawn problem and the
    rounded softcap's o still fails that bound on most of them (not only somewhere in a run, nor
    only by lse)."""
    good = load_kernel("ref-blocked")
    mutant = load_kernel("mutants.catalogue:blocked_softcap_low_precision")
    caught: list[bool] = []

    @settings(max_examples=POWER_DRAWS, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def judge(data: st.DataObject) -> None:
        p = data.draw(softcap_problems(good.capabilities, device="cpu", sizes=Sizes()))
        check_softcap(good, p)
        try:
            check_softcap(mutant, p)
            caught.append(False)
        except PropertyFailure as failure:
            caught.append("o: mean|err|" in str(failure))

    judge()
    assert len(caught) >= POWER_DRAWS // 2
    assert sum(caught) >= POWER_SHARE * len(caught), f"the mutant's o failed {sum(caught)} of {len(caught)}"
