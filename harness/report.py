"""Per-property bookkeeping for the fuzz summary: examples run, passed, refused, failed; what
each property was asked to run; why a test drew nothing (its skip reason); the failures, grouped
by cause (:mod:`harness.causes`), as text and as markdown (a CI job's summary page)."""

from __future__ import annotations

import argparse
import html
import json
import os
import sys
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field

from flashprop.harness import timebox
from flashprop.harness.causes import Failure, Group, group

OUTCOMES = ("passed", "refused", "failed")
#: The line of a failure report after which comes the command that replays it alone
#: (written by harness.check.failure, read by ci/replay_failures.py).
REPLAY_HEADER = "replay this property on this problem alone:"
#: The line above a failure's repro: a script that runs wherever flashprop imports, from the
#: folder the run started in (a kernel spec given as a path is relative to it).
REPRO_HEADER = "repro (a Python script; run it from the folder this run started in):"
#: The table's columns (the first six are the stable part that scripts may read; the rest were added later).
COLUMNS = ("kernel", "property", "run", "passed", "refused", "failed", "ex/s", "asked", "note")


@dataclass
class Tally:
    """One property on one kernel: examples by outcome, their seconds, the examples it was asked
    for (``max_examples`` times its weight, summed over processes), its last failure report and
    the reasons it was skipped (a test skipped before drawing has a tally with only those)."""

    passed: int = 0
    refused: int = 0
    failed: int = 0
    seconds: float = 0.0
    last_failure: str | None = None
    skipped: list[str] = field(default_factory=list)
    asked: int = 0

    @property
    def run(self) -> int:
        return self.passed + self.refused + self.failed


#: (kernel, property) -> Tally, filled by harness.check during the session.
TALLIES: dict[tuple[str, str], Tally] = defaultdict(Tally)
#: While examples are recorded, the tallies are also saved every this many seconds (see
#: :func:`autosave`): a process killed before its summary keeps all but its last seconds.
AUTOSAVE_SECONDS = 10.0
_autosave = {"path": None, "at": 0.0}
#: Examples and failures recorded in this process (for the progress lines).
_totals = {"examples": 0, "failed": 0}
#: The property the running test recorded examples of (its skip is noted there).
_item: dict[str, str | None] = {"prop": None}


def autosave(path: str) -> None:
    """Save the tallies to ``path`` now and then while the session runs, as :func:`dump` does at
    its end (``--tally-json``): a process killed by a time limit or a crash leaves its tally."""
    _autosave["path"] = path


def record(kernel: str, prop: str, outcome: str, seconds: float, failure: str | None = None) -> None:
    """Count one example of ``prop`` on ``kernel`` (``failure``: its report)."""
    tally = TALLIES[(kernel, prop)]
    setattr(tally, outcome, getattr(tally, outcome) + 1)
    tally.seconds += seconds
    _item["prop"] = prop
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
    timebox.tick(_totals["examples"], _totals["failed"], sum(t.run > 0 for t in TALLIES.values()))


def expect(kernel: str, prop: str, examples: int) -> None:
    """Note that ``prop`` on ``kernel`` is asked for ``examples`` examples (the profile's or
    ``--max-examples``'s number times the property's weight)."""
    TALLIES[(kernel, prop)].asked += examples
    _item["prop"] = prop


def forget(kernel: str) -> None:
    """Drop every tally of ``kernel`` (a meta-test's stand-in kernel, kept out of the summary)."""
    for key in [key for key in TALLIES if key[0] == kernel]:
        del TALLIES[key]


def start_item() -> None:
    """A test starts: a skip noted from now on belongs to the property it records, if any."""
    _item["prop"] = None


def note_skip(kernel: str, label: str, reason: str) -> None:
    """Note why the running test on ``kernel`` was skipped: on the property it recorded (a time
    box cut it), else on ``label`` (the test's name: it skipped before drawing)."""
    TALLIES[(kernel, _item["prop"] or label)].skipped.append(reason)


def _note(tally: Tally, numbers: dict[tuple[str, str], int], key: tuple[str, str]) -> str:
    if key in numbers:
        return f"failed: cause [{numbers[key]}]"
    reasons = list(dict.fromkeys(tally.skipped))
    if not reasons:
        return ""
    more = f" (and {len(reasons) - 1} other reasons)" if len(reasons) > 1 else ""
    return ("" if tally.run else "skipped: ") + reasons[0] + more


def _ordered() -> list[tuple[tuple[str, str], Tally]]:
    """Tallies that ran examples, then those only skipped, each by kernel and property."""
    return sorted(TALLIES.items(), key=lambda kv: (kv[1].run == 0, kv[0]))


def _skipped_alike(kernel: str) -> tuple[int, str] | None:
    """``(tests, reason)`` when every test of ``kernel`` was skipped before drawing, all for one
    reason (a kernel that cannot load here, a device it does not declare), else ``None``."""
    tallies = [t for (k, _), t in TALLIES.items() if k == kernel]
    reasons = {reason for t in tallies for reason in t.skipped}
    if len(tallies) < 2 or len(reasons) != 1 or any(t.run or t.asked for t in tallies):
        return None
    return len(tallies), reasons.pop()


def table_rows() -> list[tuple[str, ...]]:
    """The table's rows as strings, one per tally (:data:`COLUMNS`); a kernel whose tests were
    all skipped for one reason gets one row."""
    numbers = {(g.kernel, prop): i for i, g in enumerate(failure_groups(), 1) for prop in g.properties}
    alike = {kernel: found for kernel, _ in TALLIES if (found := _skipped_alike(kernel))}
    out: list[tuple[str, ...]] = []
    for key, t in _ordered():
        if key[0] in alike:
            tests, reason = alike[key[0]]
            row = (key[0], f"(all-{tests}-tests)", *("-",) * 6, f"skipped: {reason}")
            out += [] if row in out else [row]
            continue
        rate = f"{t.run / t.seconds:.1f}" if t.seconds > 0 else "-"
        counts = (str(t.run), str(t.passed), str(t.refused), str(t.failed), rate) if t.run else ("-",) * 5
        out.append((*key, *counts, str(t.asked) if t.asked else "-", _note(t, numbers, key)))
    return out


def summary_lines() -> list[str]:
    """A table: kernel, property, examples run, passed, refused, failed, examples/s, examples
    asked, and a note (the failure's cause number, or why the test was skipped)."""
    if not TALLIES:
        return []
    rows = [COLUMNS, *table_rows()]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS) - 1)]
    lines = ["  ".join([*(c.ljust(w) for c, w in zip(r, widths)), r[-1]]).rstrip() for r in rows]
    return [lines[0], "-" * len(lines[0]), *lines[1:]]


def failure_groups() -> list[Group]:
    """The failures in the tallies, grouped by cause (:func:`harness.causes.group`)."""
    return group(Failure(k, p, t.last_failure) for (k, p), t in sorted(TALLIES.items()) if t.last_failure)


def _heading(number: int, g: Group) -> str:
    if len(g.properties) == 1:
        return f"[{number}] {g.kernel} / {g.properties[0]}"
    return f"[{number}] {g.kernel}: {len(g.properties)} properties fail with one cause: {g.headline}"


def failure_lines() -> list[str]:
    """Each cause once: the properties it took down and the report of its smallest problem."""
    lines: list[str] = []
    for number, g in enumerate(failure_groups(), 1):
        lines.append(_heading(number, g))
        if len(g.properties) > 1:
            lines += [f"    properties: {', '.join(g.properties)}",
                      f"    the smallest problem among them ({g.smallest.prop}):"]
        lines += ["    " + line for line in g.smallest.report.splitlines()]
        lines.append("")
    return lines


def markdown_lines() -> list[str]:
    """The table and the failures by cause as markdown (for ``$GITHUB_STEP_SUMMARY``)."""
    if not TALLIES:
        return []
    failed = sum(t.failed > 0 for t in TALLIES.values())
    ran = sum(t.run > 0 for t in TALLIES.values())
    verdict = f"{failed} of {ran} properties failed" if failed else f"{ran} properties passed"
    kernels = ", ".join(sorted({kernel for kernel, _ in TALLIES}))
    lines = [f"## flashprop on {kernels}: {verdict}", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in table_rows()]
    groups = failure_groups()
    if groups:
        lines += ["", "### Failures by cause", ""]
    for number, g in enumerate(groups, 1):
        lines += [f"<details><summary>{html.escape(_heading(number, g))}</summary>", ""]
        if len(g.properties) > 1:
            lines += [f"properties: {', '.join(g.properties)}; the smallest problem ({g.smallest.prop}):", ""]
        lines += ["```", *g.smallest.report.splitlines(), "```", "", "</details>", ""]
    return [*lines, ""]


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
        tally.skipped += row.get("skipped", [])
        tally.asked += row.get("asked", 0)


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


def save_now() -> None:
    """Save the tallies to the :func:`autosave` path now (a worker about to end itself)."""
    if _autosave["path"]:
        dump(_autosave["path"])


def note_cause(cause: str) -> None:
    """Add what went wrong to the noted example (a worker about to end itself)."""
    path = _current["path"]
    if path and os.path.exists(path):
        with open(path) as f:
            noted = json.load(f)
        with open(path, "w") as f:
            json.dump({**noted, "cause": cause}, f)


def begin(kernel: str, prop: str, problem: str, replay: str) -> None:
    """Note the example about to run: kernel, property, problem and the command that replays it."""
    if _current["path"]:
        with open(_current["path"], "w") as f:
            json.dump({"kernel": kernel, "property": prop, "problem": problem, "replay": replay}, f)


def main(argv: list[str] | None = None) -> int:
    """``python -m harness.report TALLY.json...``: the merged table, then the failures by
    cause; exit 1 if any failed."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("tallies", nargs="+", help="files written by pytest --tally-json")
    args = parser.parse_args(argv)
    merge(args.tallies)
    print("\n".join(summary_lines()))
    failures = failure_lines()
    if failures:
        print("\nfailures by cause (the smallest problem of each, shrunk, with its repro):")
        print("\n".join(failures))
    return 1 if any(t.failed for t in TALLIES.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
