"""A kernel that breaks its CUDA context on one problem: the planted crash of a GPU campaign.

``ci/planted_crash.py:attention`` is the ``triton`` kernel (same capabilities), except that a
problem with Nq = 13 first launches a Triton program that stores 2^40 elements past the output's
address: a real illegal memory access, after which the process's CUDA context is unusable. A
campaign over pytest-xdist (``flashprop fuzz ci/planted_crash.py:attention -n 4``) must report
that failure once, with its problem and repro, replace the worker and complete every other
property's tally. GPU only; on a machine without CUDA the kernel is unavailable.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from flashprop.kernels import triton_attention

CRASH_NQ = 13


@triton.jit
def _store_far_away(ptr):
    tl.store(ptr + (1 << 40), 1.0)


def unavailable_reason() -> str | None:
    return None if torch.cuda.is_available() else "the planted crash needs CUDA"


def attention(q, k, v, *, causal=False, scale=None, block_m=None, block_n=None):
    """The Triton kernel, except an illegal memory access when Nq = 13."""
    if q.shape[2] == CRASH_NQ:
        target = torch.empty(1, device=q.device, dtype=torch.float32)
        _store_far_away[(1,)](target)
        torch.cuda.synchronize()
    return triton_attention.attention(q, k, v, causal=causal, scale=scale, block_m=block_m, block_n=block_n)


attention.capabilities = triton_attention.attention.capabilities
