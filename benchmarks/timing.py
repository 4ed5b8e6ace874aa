"""Timing primitives shared by the GPU benchmarks and the on-demand anchor measurements.

On CUDA every timed round is bracketed by CUDA events and preceded (untimed) by a
:class:`RoundSetup`: zeroing a 256 MiB buffer, which evicts the H200's L2 (50 MiB), exactly as
``triton.testing.do_bench`` does, then a spin kernel that keeps the GPU busy while the host
records the start event and enqueues the call (nvbench's "blocking kernel"). Without the spin
the flush (256 MiB at some 4 TB/s: about 60 us) ends before a Python launcher has enqueued
the call, the GPU idles meanwhile, and the round times the host's launch latency too; a C++
dispatcher such as SDPA's loses little of it. (On the H200, session 11, the triton forward's
small-N rows sat 0.2-0.3 ms above its own large-N trend: causal, d = 128, bf16 took 0.69-0.71 ms
at N = 2k and 1.22-1.31 ms at N = 8k, four times the FLOPs; the host column below is there to
confirm or refute that cause.) In a loop of calls the host runs ahead of the GPU and that
latency is hidden; it is reported apart instead (:func:`host_seconds`, the benchmarks'
``host_s``): a kernel whose host time exceeds its GPU time is launch-bound, whatever its
TFLOP/s say.

:func:`cuda_event_timer` plugs the events into pytest-benchmark: pass it as
``@pytest.mark.benchmark(timer=cuda_event_timer)`` and pytest-benchmark's ``end - start``
becomes the GPU time between the events (it waits for the end event). The round setup is the
``setup`` of ``benchmark.pedantic``, so it stays outside the timed region.

Each device's clock is declared once, as a :class:`Clock` (:data:`CLOCKS`), and every timed row
records its protocol; the report prints what the clock counts above each table. On the CPU the
kernel grid is timed in wall-clock seconds (``time.perf_counter``), with torch single-threaded:
a kernel's sleeps, waits for I/O or a lock and its other threads' work count, as they do for
whoever calls it. The CPU gate (``bench_suite.py``) keeps process CPU time
(``time.process_time``, :data:`GATE_CLOCK`) on purpose: it gates a ratio of the suite's own code
to a calibration anchor on a small CI box shared with other jobs, where wall-clock time mostly
measures the neighbours, and its hot paths neither sleep nor wait (a sleep costs no CPU time and
would be invisible to it).
"""

from __future__ import annotations

import functools
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


#: The spin before each round lasts this many times the call's measured host time, plus
#: HOLD_MARGIN_SECONDS (pytest-benchmark's own work between setup and the call), at most
#: HOLD_MAX_SECONDS.
HOLD_FACTOR, HOLD_MARGIN_SECONDS, HOLD_MAX_SECONDS = 2.0, 100e-6, 20e-3
#: Cycles of ``torch.cuda._sleep`` timed once per process to convert seconds to cycles.
_CALIBRATION_CYCLES = 10_000_000


@functools.cache
def _spin_cycles_per_second() -> float:
    """Clock cycles per second of ``torch.cuda._sleep`` on the current device (timed once)."""
    start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
    torch.cuda._sleep(_CALIBRATION_CYCLES)  # the clock ramps up on the first one
    start.record()
    torch.cuda._sleep(_CALIBRATION_CYCLES)
    end.record()
    end.synchronize()
    return _CALIBRATION_CYCLES / (start.elapsed_time(end) / 1e3)


class RoundSetup:
    """Before each timed round: evict L2 (zero a buffer larger than it, like ``do_bench``),
    then on CUDA keep the GPU spinning for ``hold_seconds`` so that the host's launch latency
    falls inside the spin, not inside the timed round (set by :func:`warm_up` from the call's
    host time)."""

    def __init__(self, device: str):
        self.buffer = (
            torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device=device)
            if device == "cuda"
            else None
        )
        self.hold_seconds = 0.0

    def __call__(self) -> None:
        if self.buffer is not None:
            self.buffer.zero_()
            if self.hold_seconds > 0:
                torch.cuda._sleep(int(self.hold_seconds * _spin_cycles_per_second()))


@dataclass(frozen=True)
class Clock:
    """How a benchmark's seconds are measured.

    Attributes:
        protocol: the name written with every timed row (``Row.timing``); ``ci/bench_gate.py``
            compares a ratio only with a baseline row of the same protocol, so a change of clock
            or of round setup that moves the ratios without a change of kernel code gets a new
            name (and the baselines are re-recorded).
        counts: what the clock counts, in one line (printed above the report's tables).
        timer: pytest-benchmark's timer (``@pytest.mark.benchmark(timer=...)``); ``end - start``
            of two of its readings is seconds.
    """

    protocol: str
    counts: str
    timer: Callable[[], object]


#: The clock of each device's kernel grid (``bench_attention.py``, ``bench_layer.py``).
CLOCKS = {
    "cuda": Clock(
        "cuda events, L2 flush, spin (2026-11-29)",
        "GPU time between CUDA events, after an L2 flush and a spin covering the launch",
        cuda_event_timer,
    ),
    "cpu": Clock(
        "wall-clock, 1 thread (2026-12-01)",
        "wall-clock time (time.perf_counter), torch single-threaded; sleeps and waits count",
        time.perf_counter,
    ),
}
#: The CPU gate's clock (``bench_suite.py``), chosen for a shared CI box (see the module's
#: docstring); its protocol is the one ``ci/baselines/cpu.json`` was recorded under.
GATE_CLOCK = Clock(
    "process CPU time (2026-11-29)",
    "process CPU time (time.process_time), torch single-threaded; a sleep or a wait is not counted",
    time.process_time,
)


def clock_counts(protocol: str) -> str:
    """What the clock of ``protocol`` counts; a protocol no clock declares (an older run's) as is."""
    for clock in (*CLOCKS.values(), GATE_CLOCK):
        if clock.protocol == protocol:
            return clock.counts
    return f"{protocol} (not a current clock)"


def time_once(fn: Callable[[], object], device: str, setup: RoundSetup) -> float:
    """Seconds of one call: CUDA events around it after the round setup, or the CPU grid's
    wall-clock time (:data:`CLOCKS`)."""
    if device != "cuda":
        timer = CLOCKS["cpu"].timer
        start = timer()
        fn()
        return timer() - start
    setup()
    start = cuda_event_timer()
    fn()
    return cuda_event_timer() - start


def host_seconds(fn: Callable[[], object], device: str) -> float | None:
    """Wall seconds the host spends in one call of ``fn`` with an idle GPU (median of three):
    the launch latency, or the whole GPU time when the call synchronises. ``None`` on the CPU,
    where the timed seconds are host seconds."""
    if device != "cuda":
        return None
    times = []
    for _ in range(3):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    torch.cuda.synchronize()
    return statistics.median(times)


def rounds_for(seconds_per_call: float, device: str) -> int:
    """How many timed rounds fit TARGET_SECONDS (clamped to the device's minimum..MAX_ROUNDS)."""
    wanted = math.ceil(TARGET_SECONDS / max(seconds_per_call, 1e-6))
    return max(MIN_ROUNDS if device == "cuda" else CPU_MIN_ROUNDS, min(MAX_ROUNDS, wanted))


@dataclass(frozen=True)
class WarmUp:
    """What :func:`warm_up` measured: seconds of the last timed call, host seconds per call."""

    seconds: float
    host_seconds: float | None


def warm_up(fn: Callable[[], object], device: str, setup: RoundSetup) -> WarmUp:
    """Run ``fn`` (twice on CUDA: compilation, autotuning), measure its host time and size the
    setup's spin for it; returns the last timed call's seconds and the host seconds."""
    seconds = 0.0
    for _ in range(2 if device == "cuda" else 1):
        seconds = time_once(fn, device, setup)
    host = host_seconds(fn, device)
    if host is not None:
        setup.hold_seconds = min(HOLD_MAX_SECONDS, HOLD_FACTOR * host + HOLD_MARGIN_SECONDS)
        seconds = time_once(fn, device, setup)
    return WarmUp(seconds, host)


def median_seconds(fn: Callable[[], object], device: str, setup: RoundSetup) -> float:
    """Median seconds of ``fn`` with the same protocol as the pytest-benchmark path."""
    rounds = rounds_for(warm_up(fn, device, setup).seconds, device)
    return statistics.median(time_once(fn, device, setup) for _ in range(rounds))
