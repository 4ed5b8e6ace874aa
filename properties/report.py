"""Per-property bookkeeping for the fuzz summary: examples run, passed, refused, failed."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

OUTCOMES = ("passed", "refused", "failed")


@dataclass
class Tally:
    passed: int = 0
    refused: int = 0
    failed: int = 0
    seconds: float = 0.0
    last_failure: str | None = None
    skipped: list[str] = field(default_factory=list)

    @property
    def run(self) -> int:
        return self.passed + self.refused + self.failed


#: (kernel, property) -> Tally, filled by properties.check during the session.
TALLIES: dict[tuple[str, str], Tally] = defaultdict(Tally)


def record(kernel: str, prop: str, outcome: str, seconds: float, failure: str | None = None) -> None:
    tally = TALLIES[(kernel, prop)]
    setattr(tally, outcome, getattr(tally, outcome) + 1)
    tally.seconds += seconds
    if failure is not None:
        tally.last_failure = failure


def summary_lines() -> list[str]:
    """A table: kernel, property, examples run, passed, refused, failed, examples/s."""
    if not TALLIES:
        return []
    rows = [("kernel", "property", "run", "passed", "refused", "failed", "ex/s")]
    for (kernel, prop), t in sorted(TALLIES.items()):
        rate = f"{t.run / t.seconds:.1f}" if t.seconds > 0 else "-"
        rows.append((kernel, prop, str(t.run), str(t.passed), str(t.refused), str(t.failed), rate))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return [lines[0], "-" * len(lines[0]), *lines[1:]]
