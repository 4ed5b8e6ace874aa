"""Per-property bookkeeping for the fuzz summary: examples run, passed, refused, failed; what
each property was asked to run; whether a time box stopped it; why a test drew nothing (its skip
reason); the failures, grouped by cause (:mod:`harness.causes`), as text and as markdown (a CI
job's summary page).

The text table fits :data:`WIDTH` columns (a note too long for its row wraps below it) and folds
the tests that drew nothing into one line per kernel and reason (``--all-skips``: a row each).
One session's tallies are a :class:`Tallies`, which its ``harness.run_context.RunContext`` owns.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import sys
import textwrap
import time
from collections import defaultdict
from dataclasses import dataclass, field, fields

from .causes import Group, group
from .failures import Failure

OUTCOMES = ("passed", "refused", "failed")
#: How the skip of a property that ``--skip-property`` left out begins (the property's name follows).
LEFT_OUT = "left out by --skip-property "
#: The table's columns (the first six are the stable part that scripts may read; the rest were added later).
COLUMNS = ("kernel", "property", "run", "passed", "refused", "failed", "ex/s", "asked", "note")
#: The widest line of the text table: a note that does not fit beside its row wraps under it (a
#: kernel spec and property name wider than this alone push the row past it).
WIDTH = 100
#: The narrowest room beside a row that a note wraps in; with less, it goes on the lines below.
NOTE_ROOM = 24


@dataclass
class Tally:
    """One property on one kernel: examples by outcome, their seconds, the examples it was asked
    for (``max_examples`` times its weight, summed over processes), its last failure and the last
    of each of its test cases (``failures``, by case: a property parametrized into several tests,
    such as malformed-inputs by malformed input, fails with a cause of its own in each), the
    reasons it was skipped (a test skipped before drawing has a tally with only those) and how
    many times a time box stopped it (a pass: the examples it ran before its share was spent)."""

    passed: int = 0
    refused: int = 0
    failed: int = 0
    seconds: float = 0.0
    last_failure: Failure | None = None
    failures: dict[str, Failure] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    asked: int = 0
    cut: int = 0

    @property
    def run(self) -> int:
        return self.passed + self.refused + self.failed


#: While examples are recorded, the tallies are also saved every this many seconds (see
#: :meth:`Tallies.autosave`): a process killed before its summary keeps all but its last seconds.
AUTOSAVE_SECONDS = 10.0


def failures_of(tally: Tally) -> list[Failure]:
    """The last failure of each test case of the tally's property (of a row an older flashprop
    wrote: its last failure)."""
    return list(tally.failures.values()) or ([tally.last_failure] if tally.last_failure else [])


def _note(tally: Tally, numbers: dict[tuple[str, str], list[int]], key: tuple[str, str]) -> str:
    if key in numbers:
        found = numbers[key]
        return f"cause{'s' * (len(found) > 1)} {', '.join(f'[{n}]' for n in found)}"
    notes = [f"time-boxed{f' ({tally.cut})' * (tally.cut > 1)}"] if tally.cut else []  # shares spent
    reasons = list(dict.fromkeys(tally.skipped))
    if reasons:
        more = f" (and {len(reasons) - 1} other reasons)" if len(reasons) > 1 else ""
        notes.append(("" if tally.run else "skipped: ") + reasons[0] + more)
    return "; ".join(notes)


def _drew_nothing(tally: Tally) -> bool:
    """A test skipped before its first example (it needs what the kernel does not declare, or the
    time box left it none): folded into one line per reason unless ``--all-skips``."""
    return tally.run == 0 and bool(tally.skipped)


def _rate(tally: Tally) -> str:
    """Examples per second: whole numbers from 100 on, else one decimal."""
    if tally.seconds <= 0:
        return "-"
    rate = tally.run / tally.seconds
    return f"{rate:.0f}" if rate >= 100 else f"{rate:.1f}"


def _reason(kernel: str, reason: str) -> str:
    """A skip reason on a line that names its kernel already: without "kernel NAME " in front."""
    return reason.removeprefix(f"kernel {kernel} ")


#: How the properties say that a kernel does not declare what a test needs ("kernel NAME does not
#: declare variant 'window'"): the text's lines join these reasons into one.
UNDECLARED = "does not declare "


def _skip_lines(folded: list[tuple[str, str, list[str]]], all_skips: bool) -> list[str]:
    """:meth:`skipped_before_drawing` as text, wrapped: per kernel, one line for the tests that
    need what it does not declare (what, and how many tests each), then one per other reason;
    ``all_skips``: a line per test and its reason."""
    if all_skips:
        return [line for kernel, reason, names in folded for name in names
                for line in textwrap.wrap(f"{kernel}  {name}: {_reason(kernel, reason)}", WIDTH,
                                          initial_indent="  ", subsequent_indent="      ")]
    lines: list[str] = []
    for kernel in dict.fromkeys(kernel for kernel, _, _ in folded):
        mine = [(_reason(kernel, reason), len(names)) for k, reason, names in folded if k == kernel]
        undeclared = [(r.removeprefix(UNDECLARED), n) for r, n in mine if r.startswith(UNDECLARED)]
        what = ", ".join(f"{thing} ({n})" if len(undeclared) > 1 else thing for thing, n in undeclared)
        merged = UNDECLARED + what, sum(n for _, n in undeclared)
        others = [(r, n) for r, n in mine if not r.startswith(UNDECLARED)]
        for reason, n in ([merged] if undeclared else []) + others:
            lines += textwrap.wrap(f"{kernel}  {n} test{'s' * (n > 1)}: {reason}", WIDTH,
                                   initial_indent="  ", subsequent_indent="      ")
    return lines


def _wrapped(prefix: str, note: str) -> list[str]:
    """A row (``prefix``: its columns but the note) and its note, in lines of at most
    :data:`WIDTH` columns: the note beside the row, wrapped in its column when it is at least
    :data:`NOTE_ROOM` wide and takes two lines there at most, else under the row (words whole)."""
    if not note:
        return [prefix.rstrip()]
    room = WIDTH - len(prefix)
    if len(note) <= room:
        return [prefix + note]
    whole = {"break_long_words": False, "break_on_hyphens": False}
    if room >= NOTE_ROOM and len(beside := textwrap.wrap(note, room, **whole)) <= 2:
        return [prefix + beside[0], *(" " * len(prefix) + line for line in beside[1:])]
    return [prefix.rstrip(), *textwrap.wrap(note, WIDTH, initial_indent="    ", subsequent_indent="    ",
                                            **whole)]


def _heading(number: int, g: Group) -> str:
    if len(g.properties) == 1:
        return f"[{number}] {g.kernel} / {g.properties[0]}"
    n = len(g.properties)
    inferred = f" ({len(g.inferred)} of them by its symptom, not diagnosed)" if g.inferred else ""
    return f"[{number}] {g.kernel}: {n} properties fail with one cause{inferred}: {g.headline}"


def _members(g: Group) -> list[str]:
    """A group's properties (those inferred by their symptom apart) and whose report it shows."""
    named = [prop for prop in g.properties if prop not in g.inferred]
    among = "among those diagnosed" if g.inferred else "among them"
    return [f"properties: {', '.join(named)}",
            *([f"with the same symptom, not diagnosed: {', '.join(g.inferred)}"] if g.inferred else []),
            f"the smallest problem {among} ({g.smallest.prop}):"]

class Tallies:
    """One session's tallies (one :class:`Tally` per kernel and property, :attr:`by_property`),
    what the running test recorded, and where they are saved while the run goes on: owned by the
    session's :class:`harness.run_context.RunContext` (a fresh one per pytest session; ``python -m
    flashprop.harness.report`` merges files into one of its own)."""

    def __init__(self) -> None:
        #: (kernel, property) -> Tally, filled by harness.check during the session.
        self.by_property: dict[tuple[str, str], Tally] = defaultdict(Tally)
        #: Examples and failures recorded in this process (for the progress lines).
        self.examples = self.failed_examples = 0
        #: The running test: the property it recorded examples of (its skip is noted there), its
        #: own share of that property's tally (a sharded or repeated property has several tests)
        #: and its case (``harness.campaign.case_of``: the key of its failure in the property's tally).
        self.item_prop: str | None = None
        self.item_tally = Tally()
        self.item_case = ""
        #: Where the tallies are saved now and then (:meth:`autosave`), and when they last were.
        self.autosave_path: str | None = None
        self.saved_at = 0.0
        #: Where a parallel worker notes the example it is about to run (:meth:`begin`), so that
        #: the controller can report the problem that killed it (a segfault, a lost CUDA context).
        self.current_path: str | None = None

    def __getitem__(self, key: tuple[str, str]) -> Tally:
        return self.by_property[key]

    def properties_run(self) -> int:
        """How many properties ran examples (for the progress lines)."""
        return sum(t.run > 0 for t in self.by_property.values())

    def status(self) -> int:
        """The run's exit status as the tallies see it: 1 if any property failed, else 0."""
        return 1 if any(t.failed for t in self.by_property.values()) else 0

    def autosave(self, path: str) -> None:
        """Save the tallies to ``path`` now and then while the session runs, as :meth:`dump` does at
        its end (``--tally-json``): a process killed by a time limit or a crash leaves its tally."""
        self.autosave_path = path

    def record(self, kernel: str, prop: str, outcome: str, seconds: float,
               failure: Failure | None = None) -> None:
        """Count one example of ``prop`` on ``kernel`` (``failure``: its record)."""
        tally = self.by_property[(kernel, prop)]
        for counted in (tally, self.item_tally):
            setattr(counted, outcome, getattr(counted, outcome) + 1)
            counted.seconds += seconds
        if failure is not None:
            self.keep_failure(kernel, prop, failure)
        self.item_prop = prop
        # saved at a property's first failure (not at each of its shrinking steps), else now and then
        first_failure = outcome == "failed" and tally.failed == 1
        now = time.monotonic()
        if self.autosave_path and (first_failure or now - self.saved_at >= AUTOSAVE_SECONDS):
            self.saved_at = now
            self.dump(self.autosave_path)
        self.examples += 1
        self.failed_examples += outcome == "failed"

    def keep_failure(self, kernel: str, prop: str, failure: Failure, part: int = 0) -> None:
        """``failure`` is the latest of ``prop`` on ``kernel``, and of the running test case (``part``:
        which of the distinct failures Hypothesis found in it)."""
        tally = self.by_property[(kernel, prop)]
        tally.last_failure = self.item_tally.last_failure = failure
        tally.failures[self.item_case + (f" ({part + 1})" if part else "")] = failure

    def expect(self, kernel: str, prop: str, examples: int) -> None:
        """Note that ``prop`` on ``kernel`` is asked for ``examples`` examples (the profile's or
        ``--max-examples``'s number times the property's weight)."""
        self.by_property[(kernel, prop)].asked += examples
        self.item_tally.asked += examples
        self.item_prop = prop

    def note_time_box(self, kernel: str, prop: str) -> None:
        """Note that the time box stopped ``prop`` on ``kernel`` when its share was spent."""
        self.by_property[(kernel, prop)].cut += 1
        self.item_tally.cut += 1

    def start_item(self, case: str | None = None) -> None:
        """A test starts (``case``: its case, ``harness.campaign.case_of``): a skip noted from now
        on belongs to the property it records, if any; its own counts start at 0."""
        self.item_prop, self.item_tally, self.item_case = None, Tally(), case or ""

    def running_item(self) -> tuple[str | None, Tally]:
        """The running test's property (``None``: it recorded none) and its own share of its tally."""
        return self.item_prop, self.item_tally

    def note_skip(self, kernel: str, label: str, reason: str) -> None:
        """Note why the running test on ``kernel`` was skipped: on the property it recorded (it had
        begun), else on ``label`` (the test's name: it skipped before drawing). Only the reason's
        first line: what Hypothesis appends to an exception (its examples) stays out of the table."""
        first = reason.strip().splitlines()[0] if reason.strip() else "(no reason given)"
        self.by_property[(kernel, self.item_prop or label)].skipped.append(first)

    def left_out(self) -> set[str]:
        """The properties that ``--skip-property`` left out in this run (their skips' notes)."""
        return {note.removeprefix(LEFT_OUT) for t in self.by_property.values() for note in t.skipped
                if note.startswith(LEFT_OUT)}

    def _ordered(self) -> list[tuple[tuple[str, str], Tally]]:
        """Tallies that ran examples, then those only skipped, each by kernel and property."""
        return sorted(self.by_property.items(), key=lambda kv: (kv[1].run == 0, kv[0]))

    def _skipped_alike(self, kernel: str) -> tuple[int, str] | None:
        """``(tests, reason)`` when every test of ``kernel`` was skipped before drawing, all for one
        reason (a kernel that cannot load here, a device it does not declare), else ``None``."""
        tallies = [t for (k, _), t in self.by_property.items() if k == kernel]
        reasons = {reason for t in tallies for reason in t.skipped}
        if len(tallies) < 2 or len(reasons) != 1 or any(t.run or t.asked for t in tallies):
            return None
        return len(tallies), reasons.pop()

    def table_rows(self) -> list[tuple[str, ...]]:
        """The table's rows as strings (:data:`COLUMNS`): one per tally that ran examples (or was
        asked for some and ran none); a kernel whose tests were all skipped for one reason gets one
        row; the tests that drew nothing are not rows (:meth:`skipped_before_drawing`)."""
        numbers: dict[tuple[str, str], list[int]] = defaultdict(list)
        for i, g in enumerate(self.failure_groups(), 1):
            for prop in dict.fromkeys(g.properties):
                numbers[(g.kernel, prop)].append(i)
        alike = {kernel: found for kernel, _ in self.by_property if (found := self._skipped_alike(kernel))}
        out: list[tuple[str, ...]] = []
        for key, t in self._ordered():
            if key[0] in alike:
                tests, reason = alike[key[0]]
                row = (key[0], f"(all-{tests}-tests)", *("-",) * 6, f"skipped: {reason}")
                out += [] if row in out else [row]
                continue
            if _drew_nothing(t):
                continue
            counts = ((str(t.run), str(t.passed), str(t.refused), str(t.failed), _rate(t)) if t.run
                      else ("-",) * 5)
            out.append((*key, *counts, str(t.asked) if t.asked else "-", _note(t, numbers, key)))
        return out

    def skipped_before_drawing(self) -> list[tuple[str, str, list[str]]]:
        """``(kernel, reason, tests)`` for the tests that drew no example, one per kernel and reason
        (a kernel's most common reason first); a kernel whose tests were all skipped for one reason
        is a row of the table instead."""
        alike = {kernel for kernel, _ in self.by_property if self._skipped_alike(kernel)}
        found: dict[tuple[str, str], list[str]] = defaultdict(list)
        for (kernel, prop), t in sorted(self.by_property.items()):
            if kernel not in alike and _drew_nothing(t):
                found[(kernel, t.skipped[0])].append(prop)
        return [(kernel, reason, tests) for (kernel, reason), tests in
                sorted(found.items(), key=lambda kv: (kv[0][0], -len(kv[1]), kv[0][1]))]

    def summary_lines(self, all_skips: bool = False) -> list[str]:
        """A table: kernel, property, examples run, passed, refused, failed, examples/s, examples
        asked, and a note (the failure's cause number, a time box's stop, why the test was skipped);
        then the tests that drew nothing, one line per kernel and reason (``all_skips``: one per
        test). Lines of at most :data:`WIDTH` columns (unless a row's kernel and property alone are
        wider)."""
        if not self.by_property:
            return []
        rows = [COLUMNS, *self.table_rows()]
        widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS) - 1)]
        header, *body = (_wrapped("  ".join([*(c.ljust(w) for c, w in zip(r, widths)), ""]), r[-1])
                         for r in rows)
        lines = [*header, "-" * min(WIDTH, len(header[0])), *(line for row in body for line in row)]
        folded = self.skipped_before_drawing()
        if folded:
            tests = sum(len(names) for _, _, names in folded)
            listed = ", each with its reason:" if all_skips else " (--all-skips lists each with its reason)"
            lines.append(f"skipped before drawing: {tests} test{'s' * (tests > 1)}{listed}")
        return lines + _skip_lines(folded, all_skips)

    def failure_groups(self) -> list[Group]:
        """The failures in the tallies, grouped by cause (:func:`harness.causes.group`)."""
        return group(f for _, t in sorted(self.by_property.items()) for f in failures_of(t))

    def failure_lines(self) -> list[str]:
        """Each cause once: the properties it took down (apart: those with its symptom and no
        diagnosis, :attr:`Group.inferred`) and the report of its smallest problem."""
        lines: list[str] = []
        for number, g in enumerate(self.failure_groups(), 1):
            lines.append(_heading(number, g))
            if len(g.properties) > 1:
                lines += ["    " + line for line in _members(g)]
            lines += ["    " + line for line in g.smallest.render().splitlines()]
            lines.append("")
        return lines

    def markdown_lines(self) -> list[str]:
        """The table and the failures by cause as markdown (for ``$GITHUB_STEP_SUMMARY``)."""
        if not self.by_property:
            return []
        failed = sum(t.failed > 0 for t in self.by_property.values())
        ran = sum(t.run > 0 for t in self.by_property.values())
        verdict = f"{failed} of {ran} properties failed" if failed else f"{ran} properties passed"
        kernels = ", ".join(sorted({kernel for kernel, _ in self.by_property}))
        lines = [f"## flashprop on {kernels}: {verdict}", "",
                 "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in self.table_rows()]
        folded = self.skipped_before_drawing()
        if folded:
            lines += ["", "Skipped before drawing (each reason lists its tests):", ""]
        for kernel, reason, names in folded:
            summary = html.escape(f"{kernel}: {len(names)} tests: {_reason(kernel, reason)}")
            lines += [f"<details><summary>{summary}</summary>", "", ", ".join(names), "", "</details>"]
        groups = self.failure_groups()
        if groups:
            lines += ["", "### Failures by cause", ""]
        for number, g in enumerate(groups, 1):
            lines += [f"<details><summary>{html.escape(_heading(number, g))}</summary>", ""]
            if len(g.properties) > 1:
                lines += ["; ".join(_members(g)), ""]
            lines += ["```", *g.smallest.render().splitlines(), "```", "", "</details>", ""]
        return [*lines, ""]

    def rows(self) -> list[dict]:
        """The tallies as JSON-able rows (what :meth:`dump` writes and :meth:`merge_rows` reads): the
        last failure as its record (``failure``) and its report (``last_failure``, for scripts), and
        the last of each test case (``failures``: case -> record)."""
        out = []
        for (k, p), t in sorted(self.by_property.items()):
            found = t.last_failure
            row = {f.name: getattr(t, f.name) for f in fields(t)
                   if f.name not in ("last_failure", "failures")}
            out.append({"kernel": k, "property": p, **row,
                        "last_failure": None if found is None else found.render(),
                        "failure": None if found is None else found.to_dict(),
                        "failures": {case: f.to_dict() for case, f in t.failures.items()}})
        return out

    def dump(self, path: str) -> None:
        """Write the tallies as JSON (one pytest process's share of a parallel run), its folder made
        if need be; the file is replaced whole, so a reader never sees half of it."""
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(f"{path}.tmp", "w") as f:
            json.dump(self.rows(), f, indent=1)
        os.replace(f"{path}.tmp", path)

    def merge_rows(self, found: list[dict]) -> None:
        """Add tallies of another process (rows as :meth:`rows` gives them) into :attr:`by_property`."""
        for row in found:
            tally = self.by_property[(row["kernel"], row["property"])]
            for outcome in OUTCOMES:
                setattr(tally, outcome, getattr(tally, outcome) + row[outcome])
            tally.seconds += row["seconds"]
            if row.get("failure"):
                tally.last_failure = Failure.from_dict(row["failure"])
            elif row.get("last_failure"):  # a row of a flashprop before records: its report as it was
                tally.last_failure = Failure(row["kernel"], row["property"],
                                             "(reported by an older flashprop)", (row["last_failure"],))
            tally.failures.update({case: Failure.from_dict(d) for case, d in row.get("failures", {}).items()})
            tally.skipped += row.get("skipped", [])
            tally.asked += row.get("asked", 0)
            tally.cut += row.get("cut", 0)

    def merge(self, paths: list[str]) -> None:
        """Add the tallies dumped by other processes into :attr:`by_property`."""
        for path in paths:
            with open(path) as f:
                self.merge_rows(json.load(f))

    def note_current(self, path: str | None) -> None:
        """Note each example's problem in ``path`` before it runs (``None``: do not)."""
        self.current_path = path

    def noting(self) -> bool:
        """Whether examples are noted (:meth:`note_current`)."""
        return self.current_path is not None

    def save_now(self) -> None:
        """Save the tallies to the :meth:`autosave` path now (a worker about to end itself)."""
        if self.autosave_path:
            self.dump(self.autosave_path)

    def note_cause(self, cause: str) -> None:
        """Add what went wrong to the noted example (a worker about to end itself)."""
        path = self.current_path
        if path and os.path.exists(path):
            with open(path) as f:
                noted = json.load(f)
            with open(path, "w") as f:
                json.dump({**noted, "cause": cause}, f)

    def begin(self, kernel: str, prop: str, problem: str, replay: str) -> None:
        """Note the example about to run: kernel, property, problem and the command that replays it."""
        if self.current_path:
            with open(self.current_path, "w") as f:
                json.dump({"kernel": kernel, "property": prop, "problem": problem, "replay": replay}, f)


def main(argv: list[str] | None = None) -> int:
    """``python -m flashprop.harness.report TALLY.json...``: the merged table, then the failures by
    cause; exit 1 if any failed."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("tallies", nargs="+", help="files written by pytest --tally-json")
    parser.add_argument("--all-skips", action="store_true",
                        help="a row for each test that drew nothing (default: one line per reason)")
    args = parser.parse_args(argv)
    tallies = Tallies()
    tallies.merge(args.tallies)
    print("\n".join(tallies.summary_lines(args.all_skips)))
    failures = tallies.failure_lines()
    if failures:
        print("\nfailures by cause (the smallest problem of each, shrunk, with its repro):")
        print("\n".join(failures))
    return tallies.status()


if __name__ == "__main__":
    sys.exit(main())
