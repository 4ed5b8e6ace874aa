"""Failures grouped by cause: one root cause that takes down many properties is reported once.

A failure is a record (:class:`harness.failures.Failure`), made where the property failed; its
*cause key* is the first of, read from the record's fields (never from its text):

1. its ``error``: ``the kernel raised <Type>: <message>``, ``the kernel refused a declared
   problem: ...``, ``declares returns_lse but returned only o``, an output of another dtype or
   shape than the contract's (``lse dtype torch.float16 != torch.float32 ...``,
   :mod:`contract.outputs`), a dead worker; the key is the line with numbers and addresses
   blanked (a kernel that fails to compile at one head dim, or raises the same error on every
   problem, gives one cause for every property it takes down, whatever the sizes in the
   message);
2. its first diagnosis (:mod:`harness.diagnosis`); the key is the diagnosis's first clause
   (:func:`harness.diagnosis.clause`: the convention or pattern it names; the rest is the fix
   and the evidence), numbers blanked: ``matches the golden with scale 1/D = 0.125`` is one
   cause at every head dim, ``dv does not match the golden`` one cause whichever gradients do;
3. its ``symptom`` (:class:`harness.symptoms.Symptom`): an undiagnosed mismatch with the golden;
   the key is the first forward tensor off with its kind of error, or, when the forward is
   right, the set of gradients off with theirs (an undiagnosed wrong dK is one cause for the
   backward, odd-dims and sinks-backward properties alike; a long-golden failure with o and lse
   off has the key of a forward failure with o off).

Two failures of one kernel with equal keys share a cause. A group of key 2 whose every member
also has, among its diagnoses, the key of a larger group of key 2 joins that group (one problem
can fit two conventions: at Nq = Nk + 1 a causal mask one key early is the top-left one, and the
diagnosis that explains every failure is the cause; the group shows a report that names it
first). A group of key 3 (a symptom, no
diagnosis) joins a group of key 2 of its kernel when a member of that group has the same symptom
key, or one whose :func:`harness.symptoms.undirected` is it (a comparison made without its
tensors does not know lse's direction): the large
problems a diagnosis is not computed for fail with the symptom of the small ones it explains.
Such members (and the failures joined to them by their problem, below) are inferred, not
diagnosed: the group lists them apart (:attr:`Group.inferred`) and shows a diagnosed report.
Where two groups of key 2 have a member with the symptom, it joins the one of more properties
before any such join (then the first cause key in sorted order). A failure with none of these (a
property's own check: a metamorphic relation, determinism, gradcheck) joins a group of that
kernel with key 2 or 3 that holds its identical shrunk problem; else

4. its ``relation``, a disagreement of two runs of the kernel (:mod:`harness.agreement`), has the
   key ``relation o (NaN)``: the tensor and the kind (NaN, inf, off, shape), as one cause for
   every metamorphic relation it breaks;

else it joins the other failures without a key of its identical problem (one problem failing
several properties), else stands alone. Failures with different keys are never merged, whatever
their problems (but for the inferred members above): each key is evidence of its own, and
failures with different diagnoses stay apart. Where one kernel has two undiagnosed bugs with
the same symptom (o off the golden, finite), they are one entry: the report of the smallest
problem shows one of them, the next run the other.

A group shows the failure of its smallest problem (least work ``b*hq*nq*nk*max(d, dv)``, then
fewest variants, then fewest fields off their defaults, then the shortest report: the plainest),
the one to debug first.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, fields

from ..contract.problem import Problem
from . import diagnosis, symptoms
from .failures import Failure

#: The cause key of failures without one that share their shrunk problem: this, then the problem.
PROBLEM_PREFIX = "problem: "
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


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


@dataclass(frozen=True)
class _Named:
    """The cause a report names: by which rule (1 to 3 of the module docstring), its key, and
    its line (of a diagnosis, the first clause)."""

    rule: int
    key: str
    line: str


def _named(f: Failure) -> _Named | None:
    """The first cause the failure's record names (rules 1 to 3), or ``None``."""
    if f.error:
        return _Named(1, normalize(f.error), f.error)
    if f.diagnoses:
        found = diagnosis.clause(f.diagnoses[0])
        return _Named(2, normalize(found), found)
    return None if f.symptom is None else _Named(3, f.symptom.key(), f.symptom.line())


def _clause_like(f: Failure, key: str, fallback: str) -> str:
    """The first clause of ``f``'s diagnosis whose key is ``key`` (its own numbers), else
    ``fallback``."""
    clauses = (diagnosis.clause(line) for line in f.diagnoses)
    return next((found for found in clauses if normalize(found) == key), fallback)


def cause_line(f: Failure) -> str | None:
    """The line that names the failure's cause (an error; a diagnosis's first clause; a symptom),
    or ``None``."""
    named = _named(f)
    return None if named is None else named.line


def normalize(line: str) -> str:
    """``line`` with addresses and numbers blanked and spaces collapsed."""
    return " ".join(_NUMBER.sub("#", _ADDRESS.sub("0x#", line)).split())


def problem_size(f: Failure) -> tuple[float, int, int]:
    """Sort key of the failure's problem: work ``b*hq*nq*nk*max(d, dv)`` (varlen: summed over its
    sequences), number of variants, number of fields off their defaults (layout, distribution,
    dtype, ...); unreadable problems last."""
    try:
        p = Problem.parse(f.problem)
    except (ValueError, SyntaxError, TypeError, KeyError):
        return math.inf, 0, 0
    plain = Problem(device=p.device)
    off = sum(getattr(p, f.name) != getattr(plain, f.name) for f in fields(Problem))
    return diagnosis.work(p), len(p.variants), off


def _smallest(members: list[Failure]) -> Failure:
    return min(members, key=lambda f: (problem_size(f), len(f.render()), f.prop))


def _by_shared_diagnosis(named: dict[tuple[str, str], list[tuple[Failure, str]]],
                          rule: dict[tuple[str, str], int]) -> dict[tuple[str, str], tuple[str, str]]:
    """The groups of rule 2 that join a larger group of rule 2 whose key each of their members
    has among its diagnoses (see the module docstring): ``(kernel, key) -> (kernel, key)``, each
    target one that moves nowhere; of several, the one of more members, then the first key."""
    clauses = {id(f): {normalize(diagnosis.clause(line)) for line in f.diagnoses}
               for members in named.values() for f, _ in members}
    diagnosed = sorted((place for place in named if rule[place] == 2), key=lambda p: (-len(named[p]), p[1]))
    moves: dict[tuple[str, str], tuple[str, str]] = {}
    for i, place in enumerate(diagnosed):  # larger groups first: a target never moves on
        targets = [t for t in diagnosed[:i] if t[0] == place[0] and t not in moves
                   and len(named[t]) > len(named[place])
                   and all(t[1] in clauses[id(f)] for f, _ in named[place])]
        if targets:
            moves[place] = targets[0]
    return moves


def _by_symptom(named: dict[tuple[str, str], list[tuple[Failure, str]]], rule: dict[tuple[str, str], int],
                joined: dict[tuple[str, str], list[Failure]]) -> dict[tuple[str, str], tuple[str, str]]:
    """The groups of rule 3 that join a group of rule 2 by their symptom (see the module
    docstring): ``(kernel, symptom key) -> (kernel, diagnosis key)``."""
    seen: dict[tuple[str, str], set[str]] = {}  # (kernel, diagnosis key) -> its members' symptom keys
    for place, members in named.items():
        if rule[place] == 2:
            keys = {f.symptom.key() for f, _ in members if f.symptom is not None}
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
        found = _named(f)
        if found is None:
            rest.append(f)
            continue
        named.setdefault((f.kernel, found.key), []).append((f, found.line))
        rule[(f.kernel, found.key)] = found.rule
        if found.rule > 1:
            mismatch.setdefault((f.kernel, f.problem), (f.kernel, found.key))
    second: set[int] = set()  # failures whose cause is a diagnosis of theirs other than the first
    for place, target in _by_shared_diagnosis(named, rule).items():
        worded = named[target][0][1]  # the target's clause, as its first member words it
        moved = named.pop(place)
        second |= {id(f) for f, _ in moved}
        named[target] += [(f, _clause_like(f, target[1], worded)) for f, _ in moved]
        mismatch = {where: target if key == place else key for where, key in mismatch.items()}
    joined: dict[tuple[str, str], list[Failure]] = {}
    by_problem: dict[tuple[str, str], list[Failure]] = {}
    for f in rest:
        place = (f.kernel, f.problem)
        if place in mismatch:
            joined.setdefault(mismatch[place], []).append(f)
        elif f.relation is not None:
            named.setdefault((f.kernel, f.relation.key()), []).append((f, f.relation.line))
            rule[(f.kernel, f.relation.key())] = 4
        else:
            by_problem.setdefault(place, []).append(f)
    inferred: dict[tuple[str, str], list[Failure]] = {}
    for place, target in _by_symptom(named, rule, joined).items():
        inferred.setdefault(target, []).extend([*(f for f, _ in named.pop(place)), *joined.pop(place, [])])
    groups: list[Group] = []
    for (kernel, key), members in named.items():  # shown: a report whose first diagnosis is the cause
        smallest = _smallest([f for f, _ in members if id(f) not in second] or [f for f, _ in members])
        line = next(line for f, line in members if f is smallest)
        own = {*(f.prop for f, _ in members), *(f.prop for f in joined.get((kernel, key), []))}
        guessed = sorted({f.prop for f in inferred.get((kernel, key), [])} - own)  # a property once
        props = sorted(own | set(guessed))
        groups.append(Group(kernel, key, tuple(props), smallest, line, tuple(guessed)))
    for (kernel, text), members in by_problem.items():
        if len(members) > 1:
            groups.append(Group(kernel, PROBLEM_PREFIX + text, tuple(dict.fromkeys(f.prop for f in members)),
                                _smallest(members), "one shrunk problem, no cause named"))
        else:
            groups.append(Group(kernel, None, (members[0].prop,), members[0], "outputs off the golden"))
    return sorted(groups, key=lambda g: (-len(g.properties), g.kernel, g.properties))
