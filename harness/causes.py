"""Failures grouped by cause: one root cause that takes down many properties is reported once.

A failure report (:func:`harness.check.failure`) is ``property 'P' failed for kernel 'K'``,
``problem: Problem(...)``, the details, then the repro. Its *cause* is the first detail line that
names one: ``the kernel raised <Type>: <message>``, ``the kernel refused a declared problem:
...``, ``declares returns_lse but returned only o``, a dead worker, or else its first
``diagnosis:`` line (:mod:`harness.diagnosis`). Two failures of one kernel share a cause when
those lines are equal once numbers and addresses are blanked (a kernel that fails to compile at
one head dim, or raises the same error on every problem, gives one cause for every property it
takes down, whatever the sizes in the message). Failures with no such line (outputs off the
golden, with no neighbouring convention matched) each stand alone.

A group shows the report of its smallest problem (least work ``b*hq*nq*nk*max(d, dv)``, then
fewest variants, then fewest fields off their defaults, then the shortest report: the plainest),
the one to debug first.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, fields

from flashprop.contract.problem import Problem

#: Detail lines that name a cause, by their start (a dead worker's line contains ``died``).
CAUSE_PREFIXES = (
    "the kernel raised ",
    "the kernel refused a declared problem: ",
    "declares returns_lse but returned only o",
    "the worker ",
)
DIAGNOSIS_PREFIX = "diagnosis: "
PROBLEM_PREFIX = "problem: "
#: The line after the details (:func:`harness.check.failure`).
REPRO_PREFIX = "repro (run from"
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


@dataclass(frozen=True)
class Failure:
    """One property's failure on one kernel: its report as recorded in the tallies."""

    kernel: str
    prop: str
    report: str


@dataclass(frozen=True)
class Group:
    """Failures of one kernel with one cause (``cause`` None: a failure with no named cause,
    alone in its group). ``smallest`` is the failure whose problem is smallest."""

    kernel: str
    cause: str | None
    properties: tuple[str, ...]
    smallest: Failure

    @property
    def headline(self) -> str:
        """The cause as the smallest failure's report words it (numbers not blanked)."""
        return cause_line(self.smallest.report) or "outputs off the golden"


def _details(report: str) -> list[str]:
    lines = report.splitlines()
    start = next((i + 1 for i, line in enumerate(lines) if line.startswith(PROBLEM_PREFIX)), 0)
    end = next((i for i, line in enumerate(lines) if line.startswith(REPRO_PREFIX)), len(lines))
    return lines[start:end]


def cause_line(report: str) -> str | None:
    """The detail line of ``report`` that names its cause, or ``None``."""
    details = [line.strip() for line in _details(report)]
    for line in details:
        if line.startswith(CAUSE_PREFIXES[:3]) or (line.startswith(CAUSE_PREFIXES[3]) and " died" in line):
            return line
    return next((line for line in details if line.startswith(DIAGNOSIS_PREFIX)), None)


def normalize(line: str) -> str:
    """``line`` with addresses and numbers blanked and spaces collapsed: the grouping key."""
    return " ".join(_NUMBER.sub("#", _ADDRESS.sub("0x#", line)).split())


def problem_size(report: str) -> tuple[float, int, int]:
    """Sort key of the report's problem: work ``b*hq*nq*nk*max(d, dv)`` (varlen: summed over its
    sequences), number of variants, number of fields off their defaults (layout, distribution,
    dtype, ...); unreadable problems last."""
    lines = report.splitlines()
    text = next((line.removeprefix(PROBLEM_PREFIX) for line in lines if line.startswith(PROBLEM_PREFIX)), "")
    try:
        p = Problem.parse(text)
    except (ValueError, SyntaxError, TypeError, KeyError):
        return math.inf, 0, 0
    pairs = p.seqlens if p.seqlens is not None else ((p.nq, p.nk),) * p.b
    plain = Problem(device=p.device)
    off = sum(getattr(p, f.name) != getattr(plain, f.name) for f in fields(Problem))
    return sum(q * k for q, k in pairs) * p.hq * max(p.d, p.dv), len(p.variants), off


def group(failures: Iterable[Failure]) -> list[Group]:
    """Failures grouped by (kernel, normalized cause); groups of more properties first, then by
    kernel and property name."""
    keyed: dict[tuple[str, str], list[Failure]] = {}
    alone: list[Group] = []
    for f in failures:
        line = cause_line(f.report)
        if line is None:
            alone.append(Group(f.kernel, None, (f.prop,), f))
        else:
            keyed.setdefault((f.kernel, normalize(line)), []).append(f)
    groups = [
        Group(kernel, cause, tuple(sorted(f.prop for f in members)),
              min(members, key=lambda f: (problem_size(f.report), len(f.report), f.prop)))
        for (kernel, cause), members in keyed.items()
    ]
    return sorted([*groups, *alone], key=lambda g: (-len(g.properties), g.kernel, g.properties))
