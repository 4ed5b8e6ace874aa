"""The time box (``--time 10m``) and live progress of long runs.

A time box spreads the run's time over the property tests that draw examples. Which ones will is
known before the run: :func:`draws` runs each test's body up to its property (its checks of what
the kernel declares), so a test skipped there (an undeclared variant, no backward, no lse) gets
no share. Each property, when it starts, gets ``(time left) / (drawing properties left)`` (so the
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

_box: dict[str, float] = {}
_probing = {"on": False}
_progress: dict = {"write": None, "every": EVERY, "start": 0.0, "last": 0.0}


class _Draws(BaseException):
    """Raised by :func:`share` while :func:`draws` runs a test: it reached its property."""


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


def start(seconds: float, properties: int, idle: int = 0, processes: int = 1) -> None:
    """Box the run: ``seconds`` in all, for the ``properties`` property tests that draw examples
    (``idle``: the tests that will not, and so get no share), run by ``processes`` processes
    (pytest-xdist workers) that each box their part, ``properties / processes`` of them."""
    _box.update(end=time.monotonic() + seconds, left=max(1.0, properties / processes), total=seconds,
                cut=0.0, drawing=float(properties), idle=float(idle))


def draws(test: Callable[[], object]) -> bool:
    """Whether ``test`` (a property test, its arguments bound) will draw examples. It runs up to
    its property, where :func:`share` stops it, so only what comes before runs: the checks of
    what the kernel declares (keep them cheap). A skip there says no, and so does returning
    without a property; any other error says yes (the run reports it)."""
    _probing["on"] = True
    try:
        test()
    except _Draws:
        return True
    except pytest.skip.Exception:
        return False
    except (pytest.fail.Exception, Exception):
        return True
    finally:
        _probing["on"] = False
    return False


def boxed() -> bool:
    return bool(_box)


def share() -> tuple[float, float] | None:
    """At a property's start: ``(its deadline, its share in seconds)``, or ``None`` unboxed
    (under :func:`draws`: stop the test there)."""
    if _probing["on"]:
        raise _Draws
    if not _box:
        return None
    seconds = max(0.0, _box["end"] - time.monotonic()) / max(1.0, _box["left"])
    _box["left"] = max(1.0, _box["left"] - 1)
    return time.monotonic() + seconds, seconds


#: Seconds a property may spend shrinking its failure, from the failure found (``--shrink-seconds``).
SHRINK_SECONDS = {"limit": 60.0}
#: In a time box, a failure found at the end of its property's share still gets this long.
SHRINK_FLOOR = 10.0


class Shrinking:
    """The time one property spends shrinking its failures, and the failures found so far.

    Shrinking ends :data:`SHRINK_SECONDS` after the first failure; in a time box at the end of
    the property's share, or :data:`SHRINK_FLOOR` seconds after the failure if that is later
    (never past the limit). Once it has ended, a problem that failed before raises its error
    again and any other problem is not run (it "passes"): Hypothesis's shrinker then finds
    nothing smaller at once and reports the smallest failing problem found, and :attr:`cut`
    counts the problems left unrun."""

    def __init__(self, slot_end: float | None) -> None:
        self.slot_end = slot_end
        self.deadline: float | None = None
        self.started = 0.0
        self._failures: dict[object, BaseException] = {}
        self.cut = 0

    def failed(self, problem: object, error: BaseException) -> None:
        """``problem`` failed, raising ``error``; the first failure starts the shrinking clock."""
        if self.deadline is None:
            self.started = now = time.monotonic()
            limit = now + SHRINK_SECONDS["limit"]
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


def note_cut() -> None:
    _box["cut"] = _box.get("cut", 0.0) + 1


def summary() -> str | None:
    """The time box's closing line, or ``None`` when the run was not boxed or no property drew."""
    if not _box or not _box["drawing"]:
        return None
    idle = f" ({int(_box['idle'])} skipped before drawing got none)" if _box["idle"] else ""
    return (f"time box {_box['total'] / 60:.1f} min, shared by {int(_box['drawing'])} properties{idle}: "
            f"{int(_box['cut'])} stopped when their share was spent; go deeper with --time 30m (or more), "
            "or --max-examples N without --time")


def follow(write: Callable[[str], None], terminal: bool) -> None:
    """Write progress lines with ``write``, more often on a terminal than in a log."""
    _progress.update(write=write, every=EVERY if terminal else EVERY_CI, start=time.monotonic(),
                     last=time.monotonic())


def tick(examples: int, failed: int, properties: int) -> None:
    """Called after each example: a progress line when one is due."""
    now = time.monotonic()
    if _progress["write"] is None or now - _progress["last"] < _progress["every"]:
        return
    _progress["last"] = now
    elapsed = now - _progress["start"]
    left = f", {max(0.0, _box['end'] - now) / 60:.1f} min left in the time box" if _box else ""
    _progress["write"](f"flashprop progress: {properties} properties, {examples} examples, {failed} failed, "
                       f"{elapsed / 60:.1f} min{left}")
