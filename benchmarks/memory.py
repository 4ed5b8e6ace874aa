"""Peak extra memory of one call: what a kernel allocates beyond what was live before it.

CUDA: ``torch.cuda.max_memory_allocated()`` after ``reset_peak_memory_stats()``, minus the
bytes allocated before the call. CPU: the process's peak resident set (``VmHWM``), reset by
writing ``5`` to ``/proc/self/clear_refs`` (Linux >= 4.0), minus the resident set before the
call, after ``malloc_trim(0)`` has handed freed heap pages back (else reused resident pages hide
allocations); coarse (page granular) but enough to tell O(N) from O(N^2).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import math
from collections.abc import Callable
from pathlib import Path

import torch

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_bytes(field: str) -> int:
    for line in _STATUS.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} missing from {_STATUS}")


def _malloc_trim() -> None:
    """Return freed heap memory to the OS (glibc); a no-op where there is no ``malloc_trim``."""
    libc_name = ctypes.util.find_library("c")
    trim = getattr(ctypes.CDLL(libc_name), "malloc_trim", None) if libc_name else None
    if trim is not None:
        trim(0)


def cpu_peak_supported() -> str | None:
    """Why CPU peak memory cannot be measured here, or ``None`` when it can."""
    try:
        _CLEAR_REFS.write_text("5")
        _status_bytes("VmHWM")
    except (OSError, RuntimeError) as err:
        return f"cannot reset/read the peak RSS via /proc ({err})"
    return None


def peak_extra_bytes(fn: Callable[[], object], device: str) -> int:
    """Peak bytes allocated by ``fn()`` beyond those live before it (its result included)."""
    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        result = fn()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
    else:
        _malloc_trim()
        before = _status_bytes("VmRSS")
        _CLEAR_REFS.write_text("5")
        result = fn()
        peak = _status_bytes("VmHWM")
    del result
    return max(0, peak - before)


def growth_exponent(n1: int, bytes1: int, n2: int, bytes2: int) -> float:
    """``log(bytes2/bytes1) / log(n2/n1)``: about 1 for O(N) memory, about 2 for O(N^2)."""
    return math.log(max(bytes2, 1) / max(bytes1, 1)) / math.log(n2 / n1)
