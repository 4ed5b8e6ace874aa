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
3. its symptom line (``off the golden: ...``, :mod:`harness.symptoms`), or, in a report that
   compares with the golden without one (long-golden, the spread and huge layouts, precision),
   the line :func:`harness.symptoms.from_comparisons` reads from its comparison lines: an
   undiagnosed mismatch with the golden; the key is the first forward tensor off with its kind
   of error, or, when the forward is right, the set of gradients off with theirs (an undiagnosed
   wrong dK is one cause for the backward, odd-dims and sinks-backward properties alike; a
   long-golden report with o and lse off has the key of a forward report with o off).

Two failures of one kernel with equal keys share a cause. A group of key 3 (a symptom, no
diagnosis) joins a group of key 2 of its kernel when a member of that group has the same symptom
key (its own symptom line, or the one read from its comparisons), or one whose
:func:`harness.symptoms.undirected` is it (comparisons do not show lse's direction): the large
problems a diagnosis is not computed for fail with the symptom of the small ones it explains.
Such members (and the failures joined to them by their problem, below) are inferred, not
diagnosed: the group lists them apart (:attr:`Group.inferred`) and shows a diagnosed report.
Where two groups of key 2 have a member with the symptom, it joins the one of more properties
before any such join (then the first cause key in sorted order). A failure with none of these (a
property's own check: a metamorphic relation, determinism, gradcheck) joins a group of that
kernel with key 2 or 3 that holds its identical shrunk problem; else

4. a disagreement of two runs of the kernel (``o: NaN in 24 elements``, :mod:`harness.agreement`)
   has the key ``relation o (NaN)``: the tensor and the kind (NaN, inf, off, shape), as one
   cause for every metamorphic relation it breaks;

else it joins the other failures without a key of its identical problem (one problem failing
several properties), else stands alone. Failures with different keys are never merged, whatever
their problems (but for the inferred members above): each key is evidence of its own, and
failures with different diagnoses stay apart. Where one kernel has two undiagnosed bugs with
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
    #: Those of ``properties`` with the symptom of a diagnosed member and no diagnosis of their
    #: own (joined by rule 3's symptom, see the module docstring), sorted.
    inferred: tuple[str, ...] = ()


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
    found = _symptom(details)
    return None if found is None else _Named(3, *found)


def _symptom(details: list[str]) -> tuple[str, str] | None:
    """``(key, line)`` of the symptom of a report's details (rule 3): its symptom line, else the
    line read from its comparisons; ``None``: neither."""
    line = next((line for line in details if line.startswith(symptoms.PREFIX)), None)
    line = line or symptoms.from_comparisons(details)
    return None if line is None else (symptoms.key(line), line)


def cause_line(report: str) -> str | None:
    """The detail line of ``report`` that names its cause (a diagnosis's first clause; a symptom
    read from comparisons, the line read), or ``None``."""
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


def _by_symptom(named: dict[tuple[str, str], list[tuple[Failure, str]]], rule: dict[tuple[str, str], int],
                joined: dict[tuple[str, str], list[Failure]]) -> dict[tuple[str, str], tuple[str, str]]:
    """The groups of rule 3 that join a group of rule 2 by their symptom (see the module
    docstring): ``(kernel, symptom key) -> (kernel, diagnosis key)``."""
    seen: dict[tuple[str, str], set[str]] = {}  # (kernel, diagnosis key) -> its members' symptom keys
    for place, members in named.items():
        if rule[place] == 2:
            keys = {found[0] for f, _ in members if (found := _symptom(_details(f.report)))}
            seen[place] = keys | {symptoms.undirected(k) for k in keys}
    moves = {}
    for place in (place for place in named if rule[place] == 3):
        targets = [t for t, keys in seen.items() if t[0] == place[0] and place[1] in keys]
        if targets:
            moves[place] = min(targets, key=lambda t: (-len(named[t]) - len(joined.get(t, [])), t[1]))
    return moves


def group(failures: Iterable[Failure]) -> list[Group]:
    """Failures grouped by cause (see the module docstring); groups of more properties first,
    then by kernel and property name."""
    named: dict[tuple[str, str], list[tuple[Failure, str]]] = {}
    rule: dict[tuple[str, str], int] = {}
    mismatch: dict[tuple[str, str], tuple[str, str]] = {}  # (kernel, problem) -> a rule 2 or 3 key
    rest: list[Failure] = []
    for f in sorted(failures, key=lambda f: (f.kernel, f.prop)):
        found = _named(f.report)
        if found is None:
            rest.append(f)
            continue
        named.setdefault((f.kernel, found.key), []).append((f, found.line))
        rule[(f.kernel, found.key)] = found.rule
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
            rule[(f.kernel, relation[0])] = 4
        else:
            by_problem.setdefault(place, []).append(f)
    inferred: dict[tuple[str, str], list[Failure]] = {}
    for place, target in _by_symptom(named, rule, joined).items():
        inferred.setdefault(target, []).extend([*(f for f, _ in named.pop(place)), *joined.pop(place, [])])
    groups: list[Group] = []
    for (kernel, key), members in named.items():
        smallest = _smallest([f for f, _ in members])
        line = next(line for f, line in members if f is smallest)
        guessed = sorted(f.prop for f in inferred.get((kernel, key), []))
        own = [*(f.prop for f, _ in members), *(f.prop for f in joined.get((kernel, key), []))]
        props = sorted([*own, *guessed])
        groups.append(Group(kernel, key, tuple(props), smallest, line, tuple(guessed)))
    for (kernel, text), members in by_problem.items():
        if len(members) > 1:
            groups.append(Group(kernel, PROBLEM_PREFIX + text, tuple(f.prop for f in members),
                                _smallest(members), "one shrunk problem, no cause named"))
        else:
            groups.append(Group(kernel, None, (members[0].prop,), members[0], "outputs off the golden"))
    return sorted(groups, key=lambda g: (-len(g.properties), g.kernel, g.properties))
