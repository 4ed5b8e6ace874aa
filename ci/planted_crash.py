"""A kernel that breaks its CUDA context on one problem: the planted crash of a GPU campaign.

``ci/planted_crash.py:attention`` is the ``triton`` kernel (same capabilities), except that the
first problem with Nq >= 13 that any process on the machine sees (the file named by
``FLASHPROP_CRASH_MARK`` does not exist yet; the kernel creates it) first launches a Triton
program that stores 2^40 elements past a buffer: a real illegal memory access, after which the
process's CUDA context is unusable. One problem of the whole campaign crashes, whichever worker
draws it. A campaign over pytest-xdist (``flashprop fuzz ci/planted_crash.py:attention -n 4``)
must report that failure once, with its problem and repro, replace the worker and complete
every other property's tally. GPU only; on a machine without CUDA the kernel is unavailable.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from flashprop.kernels import triton_attention

CRASH_NQ = 13
MARK_ENV = "FLASHPROP_CRASH_MARK"


@triton.jit
def _store_far_away(ptr):
    tl.store(ptr + (1 << 40), 1.0)


def _first_crash() -> bool:
    """Whether this call is the one to crash: it creates the mark (atomically) if nobody has."""
    try:
        os.close(os.open(os.environ[MARK_ENV], os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return False
    return True


def unavailable_reason() -> str | None:
    if not torch.cuda.is_available():
        return "the planted crash needs CUDA"
    return None if os.environ.get(MARK_ENV) else f"set {MARK_ENV} to a path that does not exist yet"


def attention(q, k, v, *, causal=False, scale=None, block_m=None, block_n=None):
    """The Triton kernel, except an illegal memory access on the machine's first Nq >= 13."""
    if q.shape[2] >= CRASH_NQ and _first_crash():
        target = torch.empty(1, device=q.device, dtype=torch.float32)
        _store_far_away[(1,)](target)
        torch.cuda.synchronize()
    return triton_attention.attention(q, k, v, causal=causal, scale=scale, block_m=block_m, block_n=block_n)


attention.capabilities = triton_attention.attention.capabilities
