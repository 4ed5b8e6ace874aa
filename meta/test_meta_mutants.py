"""The mutant catalogue against the current kernels: every mutant's snippet occurs exactly once in
its target, and the planted source still parses. A kernel edit that moves a snippet fails here, in
seconds, instead of in ``mutants.run`` at the end of the CI run (``MutantDrift``). And the run
order a mutant names reaches the probe."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

from mutants.catalogue import MUTANTS, ROOT, mutated_source
from mutants.run import first_tests, property_files

pytestmark = pytest.mark.meta


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_each_mutant_plants_once_and_parses(mutant) -> None:
    """``mutated_source`` finds the snippet exactly once; the result is valid Python that differs
    from the target's source."""
    planted = mutated_source(mutant)
    ast.parse(planted, filename=mutant.target)
    assert mutant.original != mutant.replacement


def test_a_run_order_naming_a_test_puts_it_first_within_each_kernel() -> None:
    """An order entry ``file::test`` stands for its file in the file order and names a test
    that ``mutants.probe`` (``FLASHPROP_PROBE_FIRST``) moves ahead of its kernel's other tests,
    each kernel's tests still together."""
    order = ("test_variants.py::test_variant_backward_matches_golden", "test_variants.py")
    assert property_files(order)[0] == "properties/test_variants.py"
    assert property_files(order).count("properties/test_variants.py") == 1
    assert first_tests(order) == ["test_variant_backward_matches_golden"]
    env = dict(os.environ, FLASHPROP_PROBE_FIRST="test_variant_backward_matches_golden",
               TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "properties/test_variants.py", "--collect-only", "-q",
         "-p", "no:cacheprovider", "-p", "mutants.probe", "--kernel", "ref-blocked", "--kernel", "triton"],
        cwd=ROOT, env=env, capture_output=True, text=True, check=True,
    ).stdout
    ids = [line for line in out.splitlines() if "::" in line]
    kernels = [i.split("[")[1].split("-")[0] for i in ids]
    assert kernels == sorted(kernels, key=kernels.index)  # each kernel's tests together
    for kernel in ("ref", "triton"):
        tests = [i.split("::")[1].split("[")[0] for i, k in zip(ids, kernels) if k == kernel]
        backward = tests.count("test_variant_backward_matches_golden")
        assert backward and tests[:backward] == ["test_variant_backward_matches_golden"] * backward
        assert "test_variant_forward_matches_golden" in tests[backward:]
