"""The symptom of a failed comparison with the golden: which quantities are off, and how.

A :class:`Symptom` is made where the comparison is (:func:`harness.check.assert_close_to_golden`,
and the properties that compare with the golden themselves: long-golden, the spread and huge
layouts, precision), kept in the failure's record (:mod:`harness.failures`) and printed as

    off the golden: o (both ways), lse (above it); within budget: dq, dk, dv

naming each tensor off its budget with the kind of its error: ``NaN`` (NaN where the golden is
finite), ``inf`` (an inf pattern that differs), ``missing`` (no gradient), ``dtype``, ``shape``,
or the direction of the elements off the budget: ``above it`` (kernel > golden at all of them),
``below it``, ``both ways``; ``off`` where only the largest error is known (a comparison without
its tensors: :meth:`Symptom.of` given none).

The symptom is also the cause key of an undiagnosed mismatch (:mod:`harness.causes`),
:meth:`Symptom.key`: when the forward is off, its first tensor off (o, else lse) and that
error's kind (the gradients of a wrong forward are wrong with it, and the backward properties
judge o without lse); when only gradients are off, the set of them with their kinds. A direction
is part of the key for lse only: a bug that adds to or drops a term of lse moves it one way on
every problem, while o and the gradients are off both ways or one way by the chance of the signs
of the values. A key without lse's direction is :func:`undirected` of one with it.

A property that compares two runs of the kernel (:func:`harness.agreement.disagreement`: a
metamorphic relation) makes a :class:`Relation` of its first disagreement: the tensor and the
kind (``NaN``, ``inf``, ``off``, ``shape``), key ``relation o (NaN)``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from .tolerance import Comparison

PREFIX = "off the golden: "
_WITHIN = "; within budget: "
FORWARD = ("o", "lse")
#: A reason of :meth:`Comparison.outright` or :func:`tolerance.compare`, by its start (after the
#: tensor's name, as :func:`contract.outputs.mismatch` writes it: ``o dtype ...``) -> kind.
_REASONS = {"NaN": "NaN", "inf": "inf", "no gradient": "missing", "dtype": "dtype", "shape": "shape"}
_DIRECTIONS = ("above it", "below it", "both ways")


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


def error_kind(error: float) -> str:
    """The kind of a finite-or-not error measured without its tensors (a mean error)."""
    return "NaN" if error != error else "inf" if error == float("inf") else "off"


@dataclass(frozen=True)
class Symptom:
    """The tensors off the golden (``off``: name and kind, in the order judged) and those within
    budget (``within``)."""

    off: tuple[tuple[str, str], ...]
    within: tuple[str, ...] = ()

    @classmethod
    def of(cls, results: Sequence[Comparison], actual: Mapping[str, torch.Tensor | None] | None = None,
           golden: Mapping[str, torch.Tensor | None] | None = None) -> Symptom | None:
        """The symptom of ``results`` (``None`` when none failed); the kinds of finite errors from
        the judged tensors ``actual`` and ``golden`` when given, else ``off``. A tensor compared
        twice is off when either comparison is."""
        actual, golden = actual or {}, golden or {}
        off: dict[str, str] = {}
        for r in results:
            if not r.ok:
                off.setdefault(r.name, kind(r, actual.get(r.name), golden.get(r.name)))
        within = tuple(dict.fromkeys(r.name for r in results if r.ok and r.name not in off))
        return cls(tuple(off.items()), within) if off else None

    def line(self) -> str:
        """The line the reports print (see the module docstring)."""
        return (PREFIX + ", ".join(f"{name} ({found})" for name, found in self.off)
                + (_WITHIN + ", ".join(self.within) if self.within else ""))

    def key(self) -> str:
        """The cause key: ``forward o (NaN)``, ``forward lse (below it)``, ``backward dk (off),
        dv (NaN)``."""
        off = dict(self.off)
        for name in FORWARD:
            if name in off:
                found = off[name]
                return f"forward {name} ({'off' if name == 'o' and found in _DIRECTIONS else found})"
        grads = (f"{name} ({'off' if found in _DIRECTIONS else found})"
                 for name, found in sorted(off.items()))
        return "backward " + ", ".join(grads)

    def to_dict(self) -> dict:
        return {"off": [list(pair) for pair in self.off], "within": list(self.within)}

    @classmethod
    def from_dict(cls, d: dict) -> Symptom:
        return cls(tuple((name, found) for name, found in d["off"]), tuple(d["within"]))


def undirected(key: str) -> str:
    """``key`` with the direction of lse's error (the one direction a key holds) read as ``off``."""
    return re.sub(r"\((?:" + "|".join(_DIRECTIONS) + r")\)", "(off)", key)


@dataclass(frozen=True)
class Relation:
    """The first disagreement of two runs of the kernel: the tensor, the kind (``NaN``, ``inf``,
    ``off``, ``shape``) and the line that says it."""

    tensor: str
    kind: str
    line: str

    def key(self) -> str:
        return f"relation {self.tensor} ({self.kind})"

    def to_dict(self) -> dict:
        return {"tensor": self.tensor, "kind": self.kind, "line": self.line}

    @classmethod
    def from_dict(cls, d: dict) -> Relation:
        return cls(d["tensor"], d["kind"], d["line"])
