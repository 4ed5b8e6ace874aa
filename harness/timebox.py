"""The time box (``--time 10m``) and live progress of long runs.

A time box (:class:`TimeBox`, the session's, which its ``harness.run_context.RunContext`` owns)
spreads the run's time over the property tests that draw examples. Which ones will is known
before the run: :meth:`TimeBox.draws` runs each test's body up to its property (its checks of
what the kernel declares), so a test skipped there (an undeclared variant, no backward, no lse)
gets no share. Each property, when it starts, gets ``(time left) / (drawing properties left)`` (so the
time of properties that finish early goes to the later ones) and stops drawing examples when its
share is spent. A property that has found a failure is never cut: it shrinks and reports as
usual. A cut property passes with the examples it ran, noted ``time-boxed`` in the table (one cut
before its first example is skipped, saying so); libFuzzer's ``-max_total_time`` is the habit.
Under pytest-xdist each worker boxes the properties it runs, as if it had ``1 / workers`` of them.

Progress: while examples run, a line every :data:`EVERY` seconds (every :data:`EVERY_CI`
seconds when the output is not a terminal, as in CI logs) says how many properties, examples
and failures so far, and the time.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import pytest

#: Seconds between progress lines on a terminal, and in logs.
EVERY, EVERY_CI = 15.0, 120.0
_DURATION = re.compile(r"\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s?)?\s*")


def parse_duration(text: str) -> float:
    """Seconds of ``90``, ``90s``, ``10m``, ``1h``, ``1h30m``: more than 0 (a box of no time is
    a mistake, refused as one)."""
    parts = _DURATION.fullmatch(text)
    if not text.strip() or parts is None or not any(parts.groups()):
        raise ValueError(f"not a duration: {text!r} (examples: 600, 90s, 10m, 1h30m)")
    hours, minutes, seconds = (float(g) if g else 0.0 for g in parts.groups())
    total = hours * 3600 + minutes * 60 + seconds
    if total <= 0:
        raise ValueError(f"a time box of {text!r} is no time (examples: 600, 90s, 10m, 1h30m)")
    return total


#: Seconds a property may spend shrinking its failure, from the failure found: the default of
#: ``--shrink-seconds`` (``RunContext.shrink_seconds``).
SHRINK_SECONDS = 60.0
#: In a time box, a failure found at the end of its property's share still gets this long.
SHRINK_FLOOR = 10.0


class Shrinking:
    """The time one property spends shrinking its failures, and the failures found so far.

    Shrinking ends ``limit`` seconds (``--shrink-seconds``) after the first failure; in a time
    box at the end of the property's share, or :data:`SHRINK_FLOOR` seconds after the failure if that is later
    (never past the limit). Once it has ended, a problem that failed before raises its error
    again and any other problem is not run (it "passes"): Hypothesis's shrinker then finds
    nothing smaller at once and reports the smallest failing problem found, and :attr:`cut`
    counts the problems left unrun."""

    def __init__(self, slot_end: float | None, limit: float = SHRINK_SECONDS) -> None:
        self.slot_end, self.limit = slot_end, limit
        self.deadline: float | None = None
        self.started = 0.0
        self._failures: dict[object, BaseException] = {}
        self.cut = 0

    def failed(self, problem: object, error: BaseException) -> None:
        """``problem`` failed, raising ``error``; the first failure starts the shrinking clock."""
        if self.deadline is None:
            self.started = now = time.monotonic()
            limit = now + self.limit
            box = limit if self.slot_end is None else max(self.slot_end, now + SHRINK_FLOOR)
            self.deadline = min(limit, box)
        self._failures[problem] = error

    def failure_of(self, problem: object) -> BaseException | None:
        """The error ``problem`` raised when it failed, if it did (Hypothesis may replay any
        failing example it ran, not only its best, so every one is kept)."""
        return self._failures.get(problem)

    def over(self) -> bool:
        """Whether shrinking has run out of time."""
        return self.deadline is not None and time.monotonic() > self.deadline

    def note(self) -> str | None:
        """The report's closing line when shrinking was cut short, else ``None``."""
        if not self.cut or self.deadline is None:
            return None
        why = "its share of the time box" if self.slot_end is not None else "--shrink-seconds"
        return (f"shrinking stopped after {self.deadline - self.started:.0f} s ({why}), "
                f"{self.cut} smaller candidates untried: a smaller problem may fail too "
                "(--shrink-seconds gives it longer)")


class _Draws(BaseException):
    """Raised by :meth:`TimeBox.share` while :meth:`TimeBox.draws` runs a test: it reached its
    property."""


class TimeBox:
    """One session's time box (unboxed until :meth:`start`) and its progress lines
    (:meth:`follow`): owned by the session's :class:`harness.run_context.RunContext`."""

    def __init__(self) -> None:
        self.end: float | None = None  # None: the run is not boxed
        self.left = 1.0
        self.total = 0.0
        self.cut = 0
        self.drawing = 0
        self.idle = 0
        self.probing = False
        self.write: Callable[[str], None] | None = None
        self.every = EVERY
        self.started = self.last = 0.0

    def start(self, seconds: float, properties: int, idle: int = 0, processes: int = 1) -> None:
        """Box the run: ``seconds`` in all, for the ``properties`` property tests that draw examples
        (``idle``: the tests that will not, and so get no share), run by ``processes`` processes
        (pytest-xdist workers) that each box their part, ``properties / processes`` of them."""
        self.end = time.monotonic() + seconds
        self.left = max(1.0, properties / processes)
        self.total, self.cut, self.drawing, self.idle = seconds, 0, properties, idle

    def draws(self, test: Callable[[], object]) -> bool:
        """Whether ``test`` (a property test, its arguments bound: its ``run`` this box's context)
        will draw examples. It runs up to its property, where :meth:`share` stops it, so only what
        comes before runs: the checks of what the kernel declares (keep them cheap). A skip there
        says no, and so does returning without a property; any other error says yes (the run
        reports it)."""
        self.probing = True
        try:
            test()
        except _Draws:
            return True
        except pytest.skip.Exception:
            return False
        except (pytest.fail.Exception, Exception):
            return True
        finally:
            self.probing = False
        return False

    def share(self) -> tuple[float, float] | None:
        """At a property's start: ``(its deadline, its share in seconds)``, or ``None`` unboxed
        (under :meth:`draws`: stop the test there)."""
        if self.probing:
            raise _Draws
        if self.end is None:
            return None
        seconds = max(0.0, self.end - time.monotonic()) / max(1.0, self.left)
        self.left = max(1.0, self.left - 1)
        return time.monotonic() + seconds, seconds

    def note_cut(self) -> None:
        """A property stopped when its share was spent."""
        self.cut += 1

    def summary(self) -> str | None:
        """The time box's closing line, or ``None`` when the run was not boxed or no property drew."""
        if self.end is None or not self.drawing:
            return None
        idle = f" ({self.idle} skipped before drawing got none)" if self.idle else ""
        return (f"time box {self.total / 60:.1f} min, shared by {self.drawing} properties{idle}: "
                f"{self.cut} stopped when their share was spent; go deeper with --time 30m (or more), "
                "or --max-examples N without --time")

    def follow(self, write: Callable[[str], None], terminal: bool) -> None:
        """Write progress lines with ``write``, more often on a terminal than in a log."""
        self.write, self.every = write, EVERY if terminal else EVERY_CI
        self.started = self.last = time.monotonic()

    def tick(self, examples: int, failed: int, properties: int) -> None:
        """Called after each example: a progress line when one is due."""
        now = time.monotonic()
        if self.write is None or now - self.last < self.every:
            return
        self.last = now
        elapsed = now - self.started
        left = ("" if self.end is None
                else f", {max(0.0, self.end - now) / 60:.1f} min left in the time box")
        self.write(f"flashprop progress: {properties} properties, {examples} examples, {failed} failed, "
                   f"{elapsed / 60:.1f} min{left}")
