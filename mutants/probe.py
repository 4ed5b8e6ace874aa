"""A pytest plugin for :mod:`mutants.run`: where and when the first property failure happened.

Loaded with ``-p mutants.probe``; it does nothing unless ``FLASHPROP_PROBE_OUT`` names a file.
It wraps the per-example bookkeeping of :mod:`properties.check` (every example of every property
passes through ``record``) and, at the end of the session, writes JSON to that file:
``examples`` (examples run before and including the first failing one, over all properties),
``seconds`` (from the end of collection to that failure), ``property`` (the first failing
property), and ``failure`` (the last failure message: after shrinking, the minimal problem).

``FLASHPROP_SHRINK_SECONDS`` caps the time Hypothesis spends shrinking a failure (its private
``MAX_SHRINKING_SECONDS``, 300 s by default), so a slow kernel cannot spend its whole budget
shrinking.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

OUT_ENV = "FLASHPROP_PROBE_OUT"
SHRINK_ENV = "FLASHPROP_SHRINK_SECONDS"


class Probe:
    """Counts examples and remembers the first and the last failure."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.start = time.perf_counter()
        self.examples = 0
        self.first: dict | None = None
        self.last_failure: str | None = None

    def wrap(self, record: Callable[..., None]) -> Callable[..., None]:
        def probed(kernel: str, prop: str, outcome: str, seconds: float, failure: str | None = None) -> None:
            self.examples += 1
            if outcome == "failed":
                if self.first is None:
                    elapsed = time.perf_counter() - self.start
                    self.first = {"property": prop, "examples": self.examples, "seconds": elapsed}
                self.last_failure = failure
            record(kernel, prop, outcome, seconds, failure)

        return probed

    def write(self) -> None:
        result = {"examples_total": self.examples, "failure": self.last_failure, **(self.first or {})}
        self.out.write_text(json.dumps(result))


_PROBE: Probe | None = None


def pytest_configure(config: pytest.Config) -> None:
    """Cap Hypothesis' shrinking time when ``FLASHPROP_SHRINK_SECONDS`` is set."""
    seconds = os.environ.get(SHRINK_ENV)
    if seconds:
        from hypothesis.internal.conjecture import engine

        engine.MAX_SHRINKING_SECONDS = float(seconds)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the clock and hook ``properties.check.record`` once the test modules are imported."""
    global _PROBE
    out = os.environ.get(OUT_ENV)
    if not out:
        return
    import flashprop.properties.check as check

    _PROBE = Probe(Path(out))
    check.record = _PROBE.wrap(check.record)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _PROBE is not None:
        _PROBE.write()
