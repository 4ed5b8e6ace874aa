"""The mutant catalogue against the current kernels: every mutant's snippet occurs exactly once in
its target, and the planted source still parses. A kernel edit that moves a snippet fails here, in
seconds, instead of in ``mutants.run`` at the end of the CI run (``MutantDrift``)."""

from __future__ import annotations

import ast

import pytest

from mutants.catalogue import MUTANTS, mutated_source

pytestmark = pytest.mark.meta


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_each_mutant_plants_once_and_parses(mutant) -> None:
    """``mutated_source`` finds the snippet exactly once; the result is valid Python that differs
    from the target's source."""
    planted = mutated_source(mutant)
    ast.parse(planted, filename=mutant.target)
    assert mutant.original != mutant.replacement
