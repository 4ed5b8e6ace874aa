"""A property's failure as a record: made once, where the property fails, rendered by every report
(the text report, ``--json``, JUnit, the step summary, ``flashprop replay``) and grouped by cause
(:mod:`harness.causes`) from its fields; no report text is parsed back.

A :class:`Failure` holds who failed (kernel, property), on what (the problem as
:meth:`Problem.describe` writes it: :meth:`Problem.parse` reads it back), what was seen
(``details``: the lines a reader sees, in order) and, each set by the code that knows it, what
names its cause:

- ``error``: the error that ended the example: the kernel raised, refused a declared problem,
  broke the output contract, or its worker died (rule 1 of :mod:`harness.causes`);
- ``diagnoses``: the lines of :mod:`harness.diagnosis` (rule 2), computed for the failure that is
  reported only (a shrink goes through many: :class:`harness.check.PropertyFailure`);
- ``symptom``: the :class:`~harness.symptoms.Symptom` of a comparison with the golden (rule 3);
- ``relation``: the :class:`~harness.symptoms.Relation` of two runs that disagree (rule 4);

and how to see it again: the repro script and the replay command, and a note (the time box cut
the shrink). The rendered report is::

    property 'P' failed for kernel 'K'
    problem: Problem(...)
    <error> <details> <symptom line> <diagnoses>
    repro (a Python script; ...):
        <script>
    replay this property on this problem alone:
        <command>
    <note>

How to add a failure kind: give the record a field (with ``to_dict``/``from_dict``), set it where
the failure is made (:func:`harness.check.failure`'s keyword), and give :mod:`harness.causes` the
rule that reads it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .symptoms import Relation, Symptom

#: The line of a failure report after which comes the command that replays it alone.
REPLAY_HEADER = "replay this property on this problem alone:"
#: The line above a failure's repro: a script that runs wherever flashprop imports, from the
#: folder this run started in (a kernel spec given as a path is relative to it).
REPRO_HEADER = "repro (a Python script; run it from the folder this run started in):"


@dataclass(frozen=True)
class Failure:
    """One property's failure on one kernel (see the module docstring)."""

    kernel: str
    prop: str
    problem: str
    details: tuple[str, ...] = ()
    error: str | None = None
    diagnoses: tuple[str, ...] = ()
    symptom: Symptom | None = None
    relation: Relation | None = None
    repro: str = ""
    replay: str = ""
    note: str | None = None

    def lines(self) -> list[str]:
        """What a reader sees between the problem and the repro."""
        return [*([self.error] if self.error else []), *self.details,
                *([self.symptom.line()] if self.symptom else []), *self.diagnoses]

    def render(self) -> str:
        """The report (see the module docstring)."""
        text = [f"property {self.prop!r} failed for kernel {self.kernel!r}", f"problem: {self.problem}",
                *self.lines()]
        if self.repro:
            text += [REPRO_HEADER, *("    " + line for line in self.repro.splitlines())]
        if self.replay:
            text += [REPLAY_HEADER, "    " + self.replay]
        return "\n".join([*text, *([self.note] if self.note else [])])

    __str__ = render

    def replace(self, **changes) -> Failure:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """The record as JSON-ready data (the tallies that processes hand each other)."""
        d = dataclasses.asdict(self)
        d["details"], d["diagnoses"] = list(self.details), list(self.diagnoses)
        d["symptom"] = None if self.symptom is None else self.symptom.to_dict()
        d["relation"] = None if self.relation is None else self.relation.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Failure:
        return cls(**{**d, "details": tuple(d["details"]), "diagnoses": tuple(d["diagnoses"]),
                      "symptom": None if d["symptom"] is None else Symptom.from_dict(d["symptom"]),
                      "relation": None if d["relation"] is None else Relation.from_dict(d["relation"])})
