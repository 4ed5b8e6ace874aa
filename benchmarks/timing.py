"""Timing primitives shared by the GPU benchmarks and the on-demand anchor measurements.

On CUDA every timed round is bracketed by CUDA events and preceded (untimed) by zeroing a
256 MiB buffer, which evicts the H200's L2 (50 MiB), exactly as ``triton.testing.do_bench``
does. :func:`cuda_event_timer` plugs the events into pytest-benchmark: pass it as
``@pytest.mark.benchmark(timer=cuda_event_timer)`` and pytest-benchmark's ``end - start``
becomes the GPU time between the events (it waits for the end event). The L2 flush is the
``setup`` of ``benchmark.pedantic``, so it stays outside the timed region.

On the CPU rounds are timed in process CPU time (:data:`CPU_TIMER`): on a small CI box shared
with other jobs, wall-clock time mostly measures the neighbours.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

L2_FLUSH_BYTES = 256 * 1024 * 1024
#: Wall-clock seconds of timed rounds to aim for per measurement.
TARGET_SECONDS = 0.15
MIN_ROUNDS, MAX_ROUNDS = 5, 100
#: Fewer rounds suffice on the CPU, where a slow kernel call takes seconds.
CPU_MIN_ROUNDS = 3


@dataclass(frozen=True)
class _EventStamp:
    """A recorded CUDA event; ``end - start`` is the elapsed GPU time in seconds."""

    event: torch.cuda.Event

    def __sub__(self, start: _EventStamp) -> float:
        self.event.synchronize()
        return start.event.elapsed_time(self.event) / 1e3


def cuda_event_timer() -> _EventStamp:
    """A pytest-benchmark timer: records a CUDA event on the current stream."""
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return _EventStamp(event)


class L2Flush:
    """Zeroing a buffer larger than L2 before each round, like ``do_bench``."""

    def __init__(self, device: str):
        self.buffer = (
            torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device=device)
            if device == "cuda"
            else None
        )

    def __call__(self) -> None:
        if self.buffer is not None:
            self.buffer.zero_()


CPU_TIMER = time.process_time


def time_once(fn: Callable[[], object], device: str, flush: L2Flush) -> float:
    """Seconds of one call: CUDA events around it after an L2 flush, or CPU time."""
    if device != "cuda":
        start = CPU_TIMER()
        fn()
        return CPU_TIMER() - start
    flush()
    start = cuda_event_timer()
    fn()
    return cuda_event_timer() - start


def rounds_for(seconds_per_call: float, device: str) -> int:
    """How many timed rounds fit TARGET_SECONDS (clamped to the device's minimum..MAX_ROUNDS)."""
    wanted = math.ceil(TARGET_SECONDS / max(seconds_per_call, 1e-6))
    return max(MIN_ROUNDS if device == "cuda" else CPU_MIN_ROUNDS, min(MAX_ROUNDS, wanted))


def warm_up(fn: Callable[[], object], device: str, flush: L2Flush) -> float:
    """Run ``fn`` (twice on CUDA: compilation, autotuning); returns the last call's seconds."""
    seconds = 0.0
    for _ in range(2 if device == "cuda" else 1):
        seconds = time_once(fn, device, flush)
    return seconds


def median_seconds(fn: Callable[[], object], device: str, flush: L2Flush) -> float:
    """Median seconds of ``fn`` with the same protocol as the pytest-benchmark path."""
    per_call = warm_up(fn, device, flush)
    rounds = rounds_for(per_call, device)
    return statistics.median(time_once(fn, device, flush) for _ in range(rounds))
