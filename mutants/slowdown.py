"""A planted slowdown: a pytest plugin that slows the ``triton`` kernel on purpose, to show the
bench gate catching it (the performance counterpart of the planted bugs in ``catalogue.py``).

    python -m pytest benchmarks/bench_attention.py -p mutants.slowdown ... --benchmark-json slow.json
    python ci/bench_gate.py ci/baselines/h200.json slow.json      # must exit 1 with a table

On a GPU every call is forced onto 16 x 16 tiles (no autotuning): the kernel stays correct and
gets several times slower. Never loaded unless named with ``-p``.
"""

from __future__ import annotations

import functools

import pytest

SLOW_TILE = 16


def pytest_configure(config: pytest.Config) -> None:
    import flashprop.kernels.triton_attention as triton_attention

    original = triton_attention.attention

    @functools.wraps(original)  # keeps .capabilities
    def slowed(q, k, v, *, causal=False, scale=None, block_m=None, block_n=None):
        return original(q, k, v, causal=causal, scale=scale, block_m=SLOW_TILE, block_n=SLOW_TILE)

    triton_attention.attention = slowed
