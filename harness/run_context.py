"""The run context: what one pytest session's properties run under, passed, never global.

The plugin (``flashprop/plugin.py``, ``pytest_configure``) builds one :class:`RunContext` from the
command line and keeps it in ``config.stash[RUN]``; the ``run`` fixture hands it to each property
test, which passes it to :func:`harness.check.run_property`. Following ``--max-examples``: the
plugin's ``run_context(config)`` sets :attr:`RunContext.max_examples`, and
:meth:`RunContext.hypothesis_settings` lays it over the loaded Hypothesis profile where ``run_property``
builds the property's settings.

The options are frozen fields. What a session accumulates belongs to objects the context owns,
made fresh with it: the tallies (:class:`harness.report.Tallies`), the time box and its progress
lines (:class:`harness.timebox.TimeBox`), the campaign's signals, workers and shards
(:class:`harness.campaign.Campaign`), the kernels that broke the CUDA context (:attr:`broken`)
and the running test (:class:`Running`). A meta-test that drives ``run_property`` itself makes a
``RunContext()`` of its own, so that its stand-in kernels stay out of the session's summary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import pytest
from hypothesis import Phase, settings

from ..contract.problem import Problem
from .campaign import Campaign
from .failures import Failure
from .report import Tallies
from .timebox import SHRINK_SECONDS, TimeBox


class Replay(NamedTuple):
    """``--replay PROPERTY:Problem(...)``: run only ``prop``, on only ``problem``."""

    prop: str
    problem: Problem


@dataclass
class Running:
    """The running test, as the plugin notes it at each test's setup."""

    #: Its case (``harness.campaign.case_of``): its example database key and the key of its
    #: failure in its property's tally.
    case: str | None = None


#: ``RunContext.database``'s default: the loaded profile's example database.
PROFILE_DATABASE = "profile"


@dataclass(frozen=True)
class RunContext:
    """One session's options (frozen) and the per-session objects it owns (see the module
    docstring). Every field has the default of a plain run: ``RunContext()`` is the context of a
    session without flashprop's options."""

    #: ``--max-examples``: examples per property, times its weight (None: the profile's number).
    max_examples: int | None = None
    #: ``--example-db`` as a Hypothesis database, None for none (:data:`PROFILE_DATABASE`: the
    #: profile's).
    database: object = PROFILE_DATABASE
    #: The Hypothesis phases to run (None: the profile's); meta-tests that need no shrinking set it.
    phases: tuple[Phase, ...] | None = None
    #: ``--replay``: the one property and problem to run.
    replay: Replay | None = None
    #: ``--shrink-seconds``: the longest a property shrinks its failure.
    shrink_seconds: float = SHRINK_SECONDS
    #: ``--skip-property``: properties left out (skipped at their start, before drawing).
    skip_properties: frozenset[str] = frozenset()
    #: ``--kernel`` (its sets expanded; none: the default kernel) and ``--device`` (default: cuda
    #: if available), as the plugin parametrizes the tests with them.
    kernels: tuple[str, ...] = ()
    device: str = "cpu"
    #: (kernel spec, device) -> the kernel as the tests get it, or why they are skipped: each
    #: loaded once per session (the plugin's ``kernel`` fixture and the time box's probe).
    loaded: dict[tuple[str, str], object] = field(default_factory=dict, compare=False)
    #: ``--tally-json``: where the tallies are written (during the run too), and ``--all-skips``.
    tally_json: str | None = None
    all_skips: bool = False
    #: The session's time box and progress lines (boxed by the plugin once the tests are collected).
    time_box: TimeBox = field(default_factory=TimeBox, compare=False)
    #: The session's tallies.
    tallies: Tallies = field(default_factory=Tallies, compare=False)
    #: Kernels that broke the CUDA context: name -> the failure of the problem that did it. The
    #: context is the process's, so once it is broken every later GPU test of any kernel is
    #: skipped, saying why.
    broken: dict[str, Failure] = field(default_factory=dict, compare=False)
    #: The running test (noted by the plugin).
    running: Running = field(default_factory=Running, compare=False)
    #: Stop signals, xdist workers and shards.
    campaign: Campaign = field(default_factory=Campaign, compare=False)

    def hypothesis_settings(self) -> settings:
        """The loaded Hypothesis profile (``settings.default``) with what the command line sets
        over it: applied when each property runs, whatever order the plugins loaded their
        profiles in."""
        overrides: dict[str, object] = {}
        if self.max_examples is not None:
            overrides["max_examples"] = self.max_examples
        if self.database is not PROFILE_DATABASE:
            overrides["database"] = self.database
        if self.phases is not None:
            overrides["phases"] = list(self.phases)
        return settings(settings.default, **overrides)


#: Where the plugin keeps the session's context (``config.stash[RUN]``).
RUN = pytest.StashKey[RunContext]()
