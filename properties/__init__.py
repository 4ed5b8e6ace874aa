"""Hypothesis strategies, the tolerance model and the property tests."""
