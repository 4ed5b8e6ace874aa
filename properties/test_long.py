"""Long sequences along the kernel's default path.

The other properties draw sequences of at most ``--max-n`` (300 on a GPU) so that thousands of
examples stay cheap. Kernels often switch code paths with size: the ``triton`` kernel autotunes
its tiles (and compiles specialised kernels: unit strides as constants, pipelined loads) only
for 16-bit problems with Nq * Nk >= 512^2, which is the path its users and the benchmarks run.
Here Nq and Nk are both drawn from ``sizes.long_n`` (512..1100 on a GPU, 129..260 on the CPU,
where the interpreter has no such path), the tiles are left to the kernel, the layouts are the
two everyone uses ((B, H, N, D) and (B, N, H, D) memory) and the head dims are 64 and 128 where
declared; forward and backward are compared with the float64 golden.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from flashprop.harness.check import assert_close_to_golden, run_kernel, run_property
from flashprop.harness.strategies import problems

LONG_HEAD_DIMS = (64, 128)
LONG_LAYOUTS = ("contiguous", "transposed")


def test_long_sequences(run, kernel, device, sizes):
    """o, lse (and dq, dk, dv when declared) agree with the golden for Nq, Nk in sizes.long_n."""
    caps = kernel.capabilities
    lo, hi = sizes.long_n
    if caps.max_seqlen is not None and caps.max_seqlen < lo:
        pytest.skip(f"kernel {kernel.name} declares sequences up to {caps.max_seqlen} < {lo}")
    if not any(d in caps.head_dims for d in LONG_HEAD_DIMS):
        pytest.skip(f"kernel {kernel.name} declares none of the head dims {LONG_HEAD_DIMS}")
    layouts = LONG_LAYOUTS if caps.any_strides else ("contiguous",)
    long_sizes = replace(sizes, max_n=hi, max_work=sizes.max_work * (hi // 64) ** 2)
    names = ("o", "lse", "dq", "dk", "dv") if caps.backward else ("o", "lse")

    def check(kernel, problem):
        out = run_kernel(kernel, problem, "long-sequences", backward=caps.backward)
        assert_close_to_golden(kernel, problem, "long-sequences", out, names)

    strategy = problems(caps, device=device, sizes=long_sizes, min_n=lo, head_dims=LONG_HEAD_DIMS,
                        default_tiles=True, layouts=layouts)
    # few examples: each new head-dim / dtype / causal combination autotunes a kernel like
    # `triton` (about 24 compilations, a minute) before it runs
    run_property(run, kernel, "long-sequences", strategy, check, weight=0.05)
