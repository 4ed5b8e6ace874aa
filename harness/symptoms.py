"""The symptom of a failed comparison with the golden: which quantities are off, and how.

:func:`harness.check.assert_close_to_golden` writes one line under the comparisons,

    off the golden: o (both ways), lse (above it); within budget: dq, dk, dv

naming each tensor off its budget with the kind of its error: ``NaN`` (NaN where the golden is
finite), ``inf`` (an inf pattern that differs), ``missing`` (no gradient), ``dtype``, ``shape``,
or the direction of the elements off the budget: ``above it`` (kernel > golden at all of them),
``below it``, ``both ways``.

The line is also the cause key of an undiagnosed mismatch (:mod:`harness.causes`), :func:`key`:
when the forward is off, its first tensor off (o, else lse) and that error's kind (the gradients
of a wrong forward are wrong with it, and the backward properties judge o without lse); when
only gradients are off, the set of them with their kinds. A direction is part of the key for lse
only: a bug that adds to or drops a term of lse moves it one way on every problem, while o and
the gradients are off both ways or one way by the chance of the signs of the values.

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
#: A reason of :meth:`Comparison.outright` or :func:`tolerance.compare`, by its start -> kind.
_REASONS = {"NaN": "NaN", "inf": "inf", "no gradient": "missing", "output dtype": "dtype", "shape": "shape"}
_DIRECTIONS = ("above it", "below it", "both ways")
#: A line of :func:`harness.agreement.disagreement`: the tensor, then what differs.
_DISAGREEMENT = re.compile(r"^(o|lse|dq|dk|dv|dsinks): (NaN in|inf pattern differs|max\|a - b\||shapes)")
_DISAGREEMENT_KINDS = {"NaN in": "NaN", "inf pattern differs": "inf", "max|a - b|": "off", "shapes": "shape"}


def kind(r: Comparison, actual: torch.Tensor | None, golden: torch.Tensor | None) -> str:
    """The kind of a failed comparison's error (see the module docstring)."""
    for start, name in _REASONS.items():
        if r.reason.startswith(start):
            return name
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


def symptom(results: Sequence[Comparison], actual: Mapping[str, torch.Tensor | None],
            golden: Mapping[str, torch.Tensor | None]) -> str:
    """The symptom line of ``results`` (at least one failed), from the judged tensors."""
    off = [f"{r.name} ({kind(r, actual.get(r.name), golden.get(r.name))})" for r in results if not r.ok]
    within = [r.name for r in results if r.ok]
    return PREFIX + ", ".join(off) + (_WITHIN + ", ".join(within) if within else "")


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


def relation_key(line: str) -> str | None:
    """The key of a disagreement line of two runs (``None``: not one): ``relation o (NaN)``."""
    found = _DISAGREEMENT.match(line)
    return None if found is None else f"relation {found[1]} ({_DISAGREEMENT_KINDS[found[2]]})"
