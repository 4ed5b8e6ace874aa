"""The precision properties' bounds: a correct kernel's allowed roundings pass, a rounded
intermediate fails (``properties/test_precision.py``)."""

from __future__ import annotations

import pytest
from flashprop.contract.registry import load_kernel
from flashprop.harness.check import PropertyFailure
from flashprop.properties.test_precision import SOFTCAP_CANCELLING, check_softcap

pytestmark = pytest.mark.meta


def test_softcap_precision_counts_p_rounding_on_a_cancelling_output():
    """The campaign's false alarm passes the correct kernel, whose P (rounded to fp16 for P V)
    moves a cancelling o by an ulp; the softcap rounded to fp16 still fails on the same problem."""
    check_softcap(load_kernel("ref-blocked"), SOFTCAP_CANCELLING)
    with pytest.raises(PropertyFailure, match="softcap-precision"):
        check_softcap(load_kernel("mutants.catalogue:blocked_softcap_low_precision"), SOFTCAP_CANCELLING)
