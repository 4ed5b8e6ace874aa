"""Failures grouped by cause: one root cause that takes down many properties is reported once.

A failure report (:func:`harness.check.failure`) is ``property 'P' failed for kernel 'K'``,
``problem: Problem(...)``, the details, then the repro. Its *cause key* is the first of:

1. a detail line that names an error: ``the kernel raised <Type>: <message>``, ``the kernel
   refused a declared problem: ...``, ``declares returns_lse but returned only o``, an output
   of another dtype or shape than the contract's (``lse dtype torch.float16 != torch.float32
   ...``, :mod:`contract.outputs`), a dead worker; the key is the line with numbers and
   addresses blanked (a kernel that fails to compile at one head dim, or raises the same error
   on every problem, gives one cause for every property it takes down, whatever the sizes in
   the message);
2. its first ``diagnosis:`` line (:mod:`harness.diagnosis`); the key is that line's first clause
   (up to ``": "``, the convention or pattern it names; the rest is the fix and the evidence),
   numbers blanked: ``matches the golden with scale 1/D = 0.125`` is one cause at every head dim,
   ``dv does not match the golden`` one cause whichever gradients do;
3. its symptom line (``off the golden: ...``, :mod:`harness.symptoms`): an undiagnosed mismatch
   with the golden; the key is the first forward tensor off with its kind of error, or, when the
   forward is right, the set of gradients off with theirs (an undiagnosed wrong dK is one cause
   for the backward, odd-dims and sinks-backward properties alike).

Two failures of one kernel with equal keys share a cause. A failure with none of these (a
property's own check: a metamorphic relation, determinism, gradcheck) joins a group of that
kernel with key 2 or 3 that holds its identical shrunk problem; else

4. a disagreement of two runs of the kernel (``o: NaN in 24 elements``, :mod:`harness.agreement`)
   has the key ``relation o (NaN)``: the tensor and the kind (NaN, inf, off, shape), as one
   cause for every metamorphic relation it breaks;

else it joins the other failures without a key of its identical problem (one problem failing
several properties), else stands alone. Failures with different keys are never merged, whatever
their problems: each key is evidence of its own. Where one kernel has two undiagnosed bugs with
the same symptom (o off the golden, finite), they are one entry: the report of the smallest
problem shows one of them, the next run the other.

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
from flashprop.harness import diagnosis, symptoms

#: Detail lines that name a cause, by their start (a dead worker's line contains ``died``).
CAUSE_PREFIXES = (
    "the kernel raised ",
    "the kernel refused a declared problem: ",
    "declares returns_lse but returned only o",
    "the worker ",
)
#: A line of :func:`contract.outputs.mismatch`: an output of another dtype or shape than the contract's.
_CONTRACT = re.compile(r"^(o|lse) (dtype \S+ != |shape \(.*\) != |is a \w+, not a tensor)")
PROBLEM_PREFIX = "problem: "
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
    """Failures of one kernel with one cause: ``cause`` is the cause key (``None``: one failure
    with no key, alone in its group), ``headline`` the cause as the report of ``smallest`` words
    it (numbers not blanked), ``smallest`` the failure whose problem is smallest among those
    that name the cause."""

    kernel: str
    cause: str | None
    properties: tuple[str, ...]
    smallest: Failure
    headline: str


def _details(report: str) -> list[str]:
    """The lines between the problem and the repro (:data:`harness.report.REPRO_HEADER`)."""
    from flashprop.harness.report import REPRO_HEADER  # report imports this module

    lines = report.splitlines()
    start = next((i + 1 for i, line in enumerate(lines) if line.startswith(PROBLEM_PREFIX)), 0)
    end = next((i for i, line in enumerate(lines) if line.startswith(REPRO_HEADER)), len(lines))
    return [line.strip() for line in lines[start:end]]


@dataclass(frozen=True)
class _Named:
    """The cause a report names: by which rule (1 to 3 of the module docstring), its key, and
    its line (of a diagnosis, the first clause)."""

    rule: int
    key: str
    line: str


def _named(report: str) -> _Named | None:
    """The first cause the report's details name, or ``None``."""
    details = _details(report)
    for line in details:
        if (line.startswith(CAUSE_PREFIXES[:3]) or (line.startswith(CAUSE_PREFIXES[3]) and " died" in line)
                or _CONTRACT.match(line)):
            return _Named(1, normalize(line), line)
    for line in details:
        if line.startswith(diagnosis.PREFIX):
            clause = line.split(": ", 2)[1]
            return _Named(2, normalize(clause), clause)
    for line in details:
        if (found := symptoms.key(line)) is not None:
            return _Named(3, found, line)
    return None


def cause_line(report: str) -> str | None:
    """The detail line of ``report`` that names its cause (a diagnosis's first clause), or ``None``."""
    named = _named(report)
    return None if named is None else named.line


def normalize(line: str) -> str:
    """``line`` with addresses and numbers blanked and spaces collapsed."""
    return " ".join(_NUMBER.sub("#", _ADDRESS.sub("0x#", line)).split())


def _problem_text(report: str) -> str:
    return next((line.removeprefix(PROBLEM_PREFIX) for line in report.splitlines()
                 if line.startswith(PROBLEM_PREFIX)), "")


def problem_size(report: str) -> tuple[float, int, int]:
    """Sort key of the report's problem: work ``b*hq*nq*nk*max(d, dv)`` (varlen: summed over its
    sequences), number of variants, number of fields off their defaults (layout, distribution,
    dtype, ...); unreadable problems last."""
    try:
        p = Problem.parse(_problem_text(report))
    except (ValueError, SyntaxError, TypeError, KeyError):
        return math.inf, 0, 0
    plain = Problem(device=p.device)
    off = sum(getattr(p, f.name) != getattr(plain, f.name) for f in fields(Problem))
    return diagnosis.work(p), len(p.variants), off


def _smallest(members: list[Failure]) -> Failure:
    return min(members, key=lambda f: (problem_size(f.report), len(f.report), f.prop))


def _relation(report: str) -> tuple[str, str] | None:
    """``(key, line)`` of the first disagreement of two runs in the report's details, or ``None``."""
    return next(((key, line) for line in _details(report) if (key := symptoms.relation_key(line))), None)


def group(failures: Iterable[Failure]) -> list[Group]:
    """Failures grouped by cause (see the module docstring); groups of more properties first,
    then by kernel and property name."""
    named: dict[tuple[str, str], list[tuple[Failure, str]]] = {}
    mismatch: dict[tuple[str, str], tuple[str, str]] = {}  # (kernel, problem) -> a rule 2 or 3 key
    rest: list[Failure] = []
    for f in sorted(failures, key=lambda f: (f.kernel, f.prop)):
        found = _named(f.report)
        if found is None:
            rest.append(f)
            continue
        named.setdefault((f.kernel, found.key), []).append((f, found.line))
        if found.rule > 1:
            mismatch.setdefault((f.kernel, _problem_text(f.report)), (f.kernel, found.key))
    joined: dict[tuple[str, str], list[Failure]] = {}
    by_problem: dict[tuple[str, str], list[Failure]] = {}
    for f in rest:
        place = (f.kernel, _problem_text(f.report))
        relation = _relation(f.report)
        if place in mismatch:
            joined.setdefault(mismatch[place], []).append(f)
        elif relation is not None:
            named.setdefault((f.kernel, relation[0]), []).append((f, relation[1]))
        else:
            by_problem.setdefault(place, []).append(f)
    groups: list[Group] = []
    for (kernel, key), members in named.items():
        smallest = _smallest([f for f, _ in members])
        line = next(line for f, line in members if f is smallest)
        props = sorted(f.prop for f in [*(f for f, _ in members), *joined.get((kernel, key), [])])
        groups.append(Group(kernel, key, tuple(props), smallest, line))
    for (kernel, text), members in by_problem.items():
        if len(members) > 1:
            groups.append(Group(kernel, PROBLEM_PREFIX + text, tuple(f.prop for f in members),
                                _smallest(members), "one shrunk problem, no cause named"))
        else:
            groups.append(Group(kernel, None, (members[0].prop,), members[0], "outputs off the golden"))
    return sorted(groups, key=lambda g: (-len(g.properties), g.kernel, g.properties))
