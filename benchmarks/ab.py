"""The statistics of an A/B run: the ratio of a candidate's time to a base's, its confidence
interval, and the verdict against a threshold (``flashprop bench --against``, :mod:`.against`).

Data. Round i of a row times one call of each kernel back to back (``timing.time_once``), in an
order that alternates from round to round; ``c_i`` and ``b_i`` are the candidate's and the base's
seconds, and ``l_i = ln(c_i / b_i)`` the round's log-ratio.

Ratio. ``R = exp(median(l_1 .. l_n))``: candidate time / base time, above 1 when the candidate is
slower. Pairing the two calls of a round cancels whatever drifts slower than a round (GPU clocks
and heat, a neighbour's job on a shared CPU); the median ignores the rounds a one-off stall hit;
the log treats a ratio and its inverse alike (2x slower and 2x faster are equally far from 1).

Interval. A percentile bootstrap over rounds: ``resamples`` samples of n rounds drawn with
replacement (a round keeps its pair), the median of each sample's log-ratios, and
``[exp(q(alpha / 2)), exp(q(1 - alpha / 2))]`` of those medians, ``alpha = 1 - confidence``
(default 95%). It assumes the rounds independent (the round setup starts every call from an
evicted L2 and an idle GPU) and nothing about their distribution; a rank test (the
Hodges-Lehmann interval of the Wilcoxon signed-rank test) would also need their log-ratios to be
symmetric about the median. The generator is seeded, so the same timings always give the same
interval: a verdict can be re-derived from the recorded rounds.

Verdict, for a threshold t (default 5%):

    REGRESSION  lo > 1 + t            the whole interval lies beyond the threshold: the candidate
                                      is slower by more than t, with the interval's confidence
    unclear     lo <= 1 + t < hi      the interval reaches past the threshold (more rounds decide)
    faster      hi < 1 / (1 + t)      the mirror image: faster by more than the threshold
    ok          otherwise

Only a REGRESSION fails a run: a row fails when its interval lies wholly beyond the threshold,
never on a point estimate that noise pushed past it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

DEFAULT_THRESHOLD = 0.05
DEFAULT_CONFIDENCE = 0.95
RESAMPLES = 2000
SEED = 0
REGRESSION, UNCLEAR, FASTER, OK = "REGRESSION", "unclear", "faster", "ok"


@dataclass(frozen=True)
class Interval:
    """The ratio (candidate / base time) and its bootstrap interval ``[lo, hi]``."""

    ratio: float
    lo: float
    hi: float
    confidence: float


def log_ratios(candidate: Sequence[float], base: Sequence[float]) -> np.ndarray:
    """``ln(c_i / b_i)`` per round; both sequences hold one positive time per round."""
    c, b = np.asarray(candidate, dtype=np.float64), np.asarray(base, dtype=np.float64)
    if c.shape != b.shape or c.ndim != 1 or c.size == 0:
        raise ValueError(f"one time per round for each kernel: got {c.shape} and {b.shape}")
    if not (np.all(c > 0) and np.all(b > 0)):
        raise ValueError("round times must be positive")
    return np.log(c / b)


def ratio_interval(candidate: Sequence[float], base: Sequence[float], *,
                   confidence: float = DEFAULT_CONFIDENCE, resamples: int = RESAMPLES,
                   seed: int = SEED) -> Interval:
    """The ratio ``exp(median(l))`` of paired round times and its percentile-bootstrap interval
    (module docstring); deterministic for a given ``seed``."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    logs = log_ratios(candidate, base)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, logs.size, size=(resamples, logs.size))
    medians = np.median(logs[picks], axis=1)
    alpha = 1.0 - confidence
    lo, hi = np.quantile(medians, [alpha / 2, 1 - alpha / 2])
    return Interval(math.exp(float(np.median(logs))), math.exp(float(lo)), math.exp(float(hi)),
                    confidence)


def verdict(interval: Interval, threshold: float = DEFAULT_THRESHOLD) -> str:
    """REGRESSION, unclear, faster or ok (module docstring) for a relative ``threshold``."""
    if threshold <= 0:
        raise ValueError(f"threshold must be positive, got {threshold}")
    if interval.lo > 1 + threshold:
        return REGRESSION
    if interval.hi > 1 + threshold:
        return UNCLEAR
    if interval.hi < 1 / (1 + threshold):
        return FASTER
    return OK
