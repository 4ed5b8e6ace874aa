"""Per-property bookkeeping for the fuzz summary: examples run, passed, refused, failed."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field

from flashprop.properties import timebox

OUTCOMES = ("passed", "refused", "failed")
#: The line of a failure report after which comes the command that replays it alone
#: (written by properties.check.failure, read by ci/replay_failures.py).
REPLAY_HEADER = "replay this property on this problem alone:"


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
#: While examples are recorded, the tallies are also saved every this many seconds (see
#: :func:`autosave`): a process killed before its summary keeps all but its last seconds.
AUTOSAVE_SECONDS = 10.0
_autosave = {"path": None, "at": 0.0}
#: Examples and failures recorded in this process (for the progress lines).
_totals = {"examples": 0, "failed": 0}


def autosave(path: str) -> None:
    """Save the tallies to ``path`` now and then while the session runs, as :func:`dump` does at
    its end (``--tally-json``): a process killed by a time limit or a crash leaves its tally."""
    _autosave["path"] = path


def record(kernel: str, prop: str, outcome: str, seconds: float, failure: str | None = None) -> None:
    """Count one example of ``prop`` on ``kernel`` (``failure``: its report)."""
    tally = TALLIES[(kernel, prop)]
    setattr(tally, outcome, getattr(tally, outcome) + 1)
    tally.seconds += seconds
    if failure is not None:
        tally.last_failure = failure
    # saved at a property's first failure (not at each of its shrinking steps), else now and then
    first_failure = outcome == "failed" and tally.failed == 1
    now = time.monotonic()
    if _autosave["path"] and (first_failure or now - _autosave["at"] >= AUTOSAVE_SECONDS):
        _autosave["at"] = now
        dump(_autosave["path"])
    _totals["examples"] += 1
    _totals["failed"] += outcome == "failed"
    timebox.tick(_totals["examples"], _totals["failed"], len(TALLIES))


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


def rows() -> list[dict]:
    """The tallies as JSON-able rows (what :func:`dump` writes and :func:`merge_rows` reads)."""
    return [{"kernel": k, "property": p, **asdict(t)} for (k, p), t in sorted(TALLIES.items())]


def dump(path: str) -> None:
    """Write the tallies as JSON (one pytest process's share of a parallel run); the file is
    replaced whole, so a reader never sees half of it."""
    with open(f"{path}.tmp", "w") as f:
        json.dump(rows(), f, indent=1)
    os.replace(f"{path}.tmp", path)


def merge_rows(found: list[dict]) -> None:
    """Add tallies of another process (rows as :func:`rows` gives them) into :data:`TALLIES`."""
    for row in found:
        tally = TALLIES[(row["kernel"], row["property"])]
        for outcome in OUTCOMES:
            setattr(tally, outcome, getattr(tally, outcome) + row[outcome])
        tally.seconds += row["seconds"]
        tally.last_failure = row["last_failure"] or tally.last_failure


def merge(paths: list[str]) -> None:
    """Add the tallies dumped by other processes into :data:`TALLIES`."""
    for path in paths:
        with open(path) as f:
            merge_rows(json.load(f))


#: Where a parallel worker notes the example it is about to run (:func:`begin`), so that the
#: controller can report the problem that killed it (a segfault, a lost CUDA context).
_current = {"path": None}


def note_current(path: str | None) -> None:
    """Note each example's problem in ``path`` before it runs (``None``: do not)."""
    _current["path"] = path


def noting() -> bool:
    """Whether examples are noted (:func:`note_current`)."""
    return _current["path"] is not None


def begin(kernel: str, prop: str, problem: str, replay: str) -> None:
    """Note the example about to run: kernel, property, problem and the command that replays it."""
    if _current["path"]:
        with open(_current["path"], "w") as f:
            json.dump({"kernel": kernel, "property": prop, "problem": problem, "replay": replay}, f)


def main(argv: list[str] | None = None) -> int:
    """``python -m properties.report TALLY.json...``: the merged table; exit 1 if any failed."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("tallies", nargs="+", help="files written by pytest --tally-json")
    args = parser.parse_args(argv)
    merge(args.tallies)
    print("\n".join(summary_lines()))
    failed = [(k, t) for k, t in sorted(TALLIES.items()) if t.failed]
    for (kernel, prop), t in failed:
        print(f"\n--- {kernel} / {prop}: {t.failed} failed\n{t.last_failure}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
