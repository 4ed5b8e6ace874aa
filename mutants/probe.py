"""A pytest plugin for :mod:`mutants.run`: which property caught each mutant, and when.

Loaded with ``-p mutants.probe``; it does nothing unless ``FLASHPROP_PROBE_OUT`` names a file.
One pytest session checks several mutants (``--kernel mutants.catalogue:A --kernel ...``): the
kernel fixture is session-scoped, so pytest runs every test of one kernel before the next, in
the property files' order. For each kernel the probe counts the examples (it wraps the ``record``
of the session's tallies, ``RunContext.tallies``, through which every example of every property
passes) and the seconds spent in that kernel's tests; a kernel is *caught* by its first failing
test, after which the rest of its tests are skipped (``-x`` per kernel), as they are once its
time budget (``FLASHPROP_PROBE_BUDGET`` seconds) is spent. At the end of the session it writes JSON to the
file: per kernel spec, ``status`` (``caught``, ``survived``, ``timeout`` or ``error``),
``property`` (the first failing property), ``examples`` (examples of that kernel up to and
including the first failing one), ``seconds`` (time in that kernel's tests up to the failure,
shrinking included), ``examples_total`` and ``failure`` (the kernel's last failure message: after
shrinking, the minimal problem) or ``detail``.

``FLASHPROP_PROBE_FIRST`` (test function names, comma-separated) moves those tests ahead of the
rest of their kernel's tests, in the order named, the kernels' grouping and every other order
kept: a mutant whose bug only a late test of a file sees (a backward property after all the
forward ones) is reached within its budget.

``FLASHPROP_SHRINK_SECONDS`` caps the time Hypothesis spends shrinking a failure (its private
``MAX_SHRINKING_SECONDS``, 300 s by default), so a slow kernel cannot spend its budget shrinking.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from flashprop.harness.failures import Failure

OUT_ENV = "FLASHPROP_PROBE_OUT"
SHRINK_ENV = "FLASHPROP_SHRINK_SECONDS"
BUDGET_ENV = "FLASHPROP_PROBE_BUDGET"
FIRST_ENV = "FLASHPROP_PROBE_FIRST"


@dataclass
class KernelProbe:
    """What the session did to one kernel."""

    status: str = "survived"
    property: str | None = None
    examples: int | None = None
    seconds: float | None = None
    examples_total: int = 0
    spent: float = 0.0
    failure: str | None = None
    detail: str = "every property passed"


class Probe:
    """Per kernel spec: examples, time, first and last failure; skips a kernel once caught."""

    def __init__(self, out: Path, budget: float | None) -> None:
        self.out = out
        self.budget = budget
        self.kernels: dict[str, KernelProbe] = {}
        self.current: str | None = None
        self.started = 0.0

    def of(self, spec: str) -> KernelProbe:
        return self.kernels.setdefault(spec, KernelProbe())

    def wrap(self, record: Callable[..., None]) -> Callable[..., None]:
        def probed(kernel: str, prop: str, outcome: str, seconds: float,
                   failure: Failure | None = None) -> None:
            if self.current is not None:
                probe = self.of(self.current)
                probe.examples_total += 1
                if outcome == "failed":
                    if probe.property is None:
                        probe.property, probe.examples = prop, probe.examples_total
                    probe.failure = None if failure is None else failure.render()
            record(kernel, prop, outcome, seconds, failure)

        return probed

    def skip_reason(self, spec: str) -> str | None:
        probe = self.of(spec)
        if probe.status == "caught":
            return "mutant already caught"
        if probe.status == "error":
            return "mutant errored"
        if self.budget is not None and probe.spent > self.budget:
            probe.status, probe.detail = "timeout", f"no property failed within {self.budget:.0f} s"
            return "mutant's time budget spent"
        return None

    def finish_test(self, spec: str, report: pytest.TestReport, name: str) -> None:
        probe = self.of(spec)
        probe.spent += report.duration
        if not report.failed or probe.status in ("caught", "error"):
            return
        if report.when == "call":
            probe.status, probe.seconds = "caught", probe.spent
            probe.property = probe.property or name
            probe.examples = probe.examples or probe.examples_total
            probe.failure = probe.failure or str(report.longrepr)[-2000:]
        else:
            probe.status, probe.detail = "error", f"{report.when} of {name}: {str(report.longrepr)[-300:]}"

    def write(self) -> None:
        self.out.write_text(json.dumps({spec: asdict(p) for spec, p in self.kernels.items()}))


_PROBE: Probe | None = None


def _spec(item: pytest.Item) -> str | None:
    callspec = getattr(item, "callspec", None)
    return None if callspec is None else callspec.params.get("kernel")


def pytest_configure(config: pytest.Config) -> None:
    """Cap Hypothesis' shrinking time when ``FLASHPROP_SHRINK_SECONDS`` is set."""
    seconds = os.environ.get(SHRINK_ENV)
    if seconds:
        from hypothesis.internal.conjecture import engine

        engine.MAX_SHRINKING_SECONDS = float(seconds)


@pytest.hookimpl(trylast=True)  # after pytest's own reordering, which groups a kernel's tests
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Move the tests ``FLASHPROP_PROBE_FIRST`` names ahead of the rest of their kernel's tests."""
    names = [name for name in os.environ.get(FIRST_ENV, "").split(",") if name]
    if not names:
        return
    groups: dict[str | None, int] = {}
    for item in items:
        groups.setdefault(_spec(item), len(groups))

    def rank(item: pytest.Item) -> int:
        name = getattr(item, "originalname", item.name)
        return names.index(name) if name in names else len(names)

    items.sort(key=lambda item: (groups[_spec(item)], rank(item)))  # stable: other orders kept


def pytest_collection_finish(session: pytest.Session) -> None:
    """Hook the ``record`` of the session's tallies (``harness.run_context.RunContext.tallies``)."""
    global _PROBE
    out = os.environ.get(OUT_ENV)
    if not out:
        return
    from flashprop.harness.run_context import RUN

    budget = os.environ.get(BUDGET_ENV)
    _PROBE = Probe(Path(out), float(budget) if budget else None)
    tallies = session.config.stash[RUN].tallies
    tallies.record = _PROBE.wrap(tallies.record)
    for item in session.items:
        spec = _spec(item)
        if spec is not None:
            _PROBE.of(spec)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip the tests of a kernel already caught (or out of budget)."""
    spec = _spec(item)
    if _PROBE is None or spec is None:
        return
    _PROBE.current = spec
    reason = _PROBE.skip_reason(spec)
    if reason is not None:
        pytest.skip(reason)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if _PROBE is None or _PROBE.current is None:
        return
    _PROBE.finish_test(_PROBE.current, report, report.nodeid.split("::")[-1].split("[")[0])


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _PROBE is not None:
        _PROBE.write()
