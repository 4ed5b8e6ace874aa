"""The symptom of a failed comparison with the golden: which quantities are off, and how.

:func:`harness.check.assert_close_to_golden` writes one line under the comparisons,

    off the golden: o (both ways), lse (above it); within budget: dq, dk, dv

naming each tensor off its budget with the kind of its error: ``NaN`` (NaN where the golden is
finite), ``inf`` (an inf pattern that differs), ``missing`` (no gradient), ``dtype``, ``shape``,
or the direction of the elements off the budget: ``above it`` (kernel > golden at all of them),
``below it``, ``both ways``.

A report of a property that compares with the golden itself (long-golden, the spread and huge
layouts, precision) has its comparisons and no such line: :func:`from_comparisons` reads the line
from them, a tensor off when its comparison has a reason (NaN, inf, missing, dtype, shape) or an
error over its budget (:meth:`Comparison.describe`: ``o: max|err| = 1.9e-01 ...; budget
1.9e-05 = ...``; precision's ``o: mean|err| = 7.8e-02 > ...``, written only when over), with
the kind ``off`` for a finite error: a comparison gives the largest error, not the direction of
every error off the budget.

The line is also the cause key of an undiagnosed mismatch (:mod:`harness.causes`), :func:`key`:
when the forward is off, its first tensor off (o, else lse) and that error's kind (the gradients
of a wrong forward are wrong with it, and the backward properties judge o without lse); when
only gradients are off, the set of them with their kinds. A direction is part of the key for lse
only: a bug that adds to or drops a term of lse moves it one way on every problem, while o and
the gradients are off both ways or one way by the chance of the signs of the values. A key
without lse's direction (read from comparisons) is :func:`undirected` of one with it.

A property that compares two runs of the kernel (:func:`harness.agreement.disagreement`: a
metamorphic relation) names the tensor and the kind of disagreement in its first line of one,
``o: NaN in 24 elements, ...``; :func:`relation_key` reads it (``relation o (NaN)``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import torch
from flashprop.harness.tolerance import Comparison

PREFIX = "off the golden: "
_WITHIN = "; within budget: "
FORWARD = ("o", "lse")
#: A reason of :meth:`Comparison.outright` or :func:`tolerance.compare`, by its start (after the
#: tensor's name, as :func:`contract.outputs.mismatch` writes it: ``o dtype ...``) -> kind.
_REASONS = {"NaN": "NaN", "inf": "inf", "no gradient": "missing", "dtype": "dtype", "shape": "shape"}
_DIRECTIONS = ("above it", "below it", "both ways")
_NAMES = "o|lse|dq|dk|dv|dsinks"
#: A line of :meth:`Comparison.describe`: the tensor, the reason (if any), the error, the budget.
_COMPARISON = re.compile(rf"^({_NAMES}): (?:(.+?); )?max\|err\| = ([^\s;]+)[^;]*; budget ([^\s;]+) ")
#: A line of the precision property (properties/test_precision.py): a mean error over its bound.
_MEAN = re.compile(r"^(o|lse): mean\|err\| = (\S+) > ")
#: A line of :func:`harness.agreement.disagreement`: the tensor, then what differs.
_DISAGREEMENT = re.compile(rf"^({_NAMES}): (NaN in|inf pattern differs|max\|a - b\||shapes)")
_DISAGREEMENT_KINDS = {"NaN in": "NaN", "inf pattern differs": "inf", "max|a - b|": "off", "shapes": "shape"}


def kind(r: Comparison, actual: torch.Tensor | None, golden: torch.Tensor | None) -> str:
    """The kind of a failed comparison's error (see the module docstring)."""
    if r.reason:
        return _reason_kind(r.name, r.reason)
    if actual is None or golden is None:
        return "off"
    a = actual.detach().to(torch.float64).cpu()
    g = golden.detach().to(torch.float64).cpu()
    diff = torch.where(torch.isfinite(a) & torch.isfinite(g), a - g, torch.zeros((), dtype=a.dtype))
    off = diff[diff.abs() > r.budget]
    if not off.numel():
        return "off"
    if bool((off > 0).all()):
        return _DIRECTIONS[0]
    return _DIRECTIONS[1] if bool((off < 0).all()) else _DIRECTIONS[2]


def _reason_kind(name: str, reason: str) -> str:
    """The kind of a comparison that failed for ``reason`` (``off``: a reason of no known kind)."""
    bare = reason.removeprefix(f"{name} ")
    return next((found for start, found in _REASONS.items() if bare.startswith(start)), "off")


def _line(off: Mapping[str, str], within: Sequence[str]) -> str:
    """The symptom line of the tensors ``off`` (name -> kind) and those ``within`` budget."""
    return (PREFIX + ", ".join(f"{name} ({found})" for name, found in off.items())
            + (_WITHIN + ", ".join(within) if within else ""))


def symptom(results: Sequence[Comparison], actual: Mapping[str, torch.Tensor | None],
            golden: Mapping[str, torch.Tensor | None]) -> str:
    """The symptom line of ``results`` (at least one failed), from the judged tensors."""
    off = {r.name: kind(r, actual.get(r.name), golden.get(r.name)) for r in results if not r.ok}
    return _line(off, [r.name for r in results if r.ok])


def _read(line: str) -> tuple[str, str | None] | None:
    """``(tensor, kind)`` of a comparison line (kind ``None``: within budget), or ``None``: not one."""
    if found := _MEAN.match(line):
        error = float(found[2])
        return found[1], "NaN" if error != error else "inf" if error == float("inf") else "off"
    if (found := _COMPARISON.match(line)) is None:
        return None
    name, reason, error, limit = found.groups()
    if reason:
        return name, _reason_kind(name, reason)
    return name, "off" if float(error) > float(limit) else None


def from_comparisons(lines: Sequence[str]) -> str | None:
    """The symptom line read from a report's comparison lines (see the module docstring), or
    ``None`` when none is over its budget. A tensor compared twice is off when either is; an
    error equal to its budget as printed (four digits) counts as within it, as the budget does."""
    off: dict[str, str] = {}
    within: list[str] = []
    for line in lines:
        if (read := _read(line)) is None:
            continue
        name, found = read
        if found is not None:
            off.setdefault(name, found)
        elif name not in within:
            within.append(name)
    return _line(off, [name for name in within if name not in off]) if off else None


def key(line: str) -> str | None:
    """The cause key of a symptom line (``None``: not one): ``forward o (NaN)``, ``forward lse
    (below it)``, ``backward dk (off), dv (NaN)``."""
    if not line.startswith(PREFIX):
        return None
    off: dict[str, str] = {}
    for part in line.removeprefix(PREFIX).split(_WITHIN)[0].split(", "):
        name, _, rest = part.partition(" (")
        off[name] = rest.removesuffix(")")
    for name in FORWARD:
        if name in off:
            found = off[name]
            return f"forward {name} ({'off' if name == 'o' and found in _DIRECTIONS else found})"
    grads = (f"{name} ({'off' if found in _DIRECTIONS else found})" for name, found in sorted(off.items()))
    return "backward " + ", ".join(grads)


def undirected(key: str) -> str:
    """``key`` with the direction of lse's error (the one direction a key holds) read as ``off``."""
    return re.sub(r"\((?:" + "|".join(_DIRECTIONS) + r")\)", "(off)", key)


def relation_key(line: str) -> str | None:
    """The key of a disagreement line of two runs (``None``: not one): ``relation o (NaN)``."""
    found = _DISAGREEMENT.match(line)
    return None if found is None else f"relation {found[1]} ({_DISAGREEMENT_KINDS[found[2]]})"
