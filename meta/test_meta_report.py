"""Meta-tests of the fuzz report: failures grouped by cause (harness/causes.py), the table's
asked examples and skip reasons, the markdown summary, merged tallies of older runs, and the
time box's probe that counts only the tests that draw examples (harness/timebox.py)."""

from __future__ import annotations

import json
from pathlib import Path

import flashprop.harness.report as report
import pytest
from flashprop.contract.capabilities import Capabilities
from flashprop.contract.problem import Problem
from flashprop.contract.registry import Kernel
from flashprop.harness import timebox
from flashprop.harness.causes import Failure, group, normalize
from flashprop.harness.check import failure
from flashprop.harness.report import Tally

pytestmark = pytest.mark.meta

KERNEL = Kernel(name="k", fn=lambda q, k, v, **kw: None, capabilities=Capabilities())
BIG = Problem(b=2, hq=4, hkv=4, nq=64, nk=64, d=72, dv=72)
SMALL = Problem(b=1, hq=1, hkv=1, nq=3, nk=5, d=72, dv=72)
NO_KERNEL = "the kernel raised RuntimeError: no kernel for head dim {} (smem 0x{:x})"


def _report(prop: str, problem: Problem, *details: str) -> str:
    """A failure report as the properties write it."""
    return failure(KERNEL, problem, prop, list(details))


def test_one_error_everywhere_is_one_cause_shown_on_its_smallest_problem():
    """The same exception up to numbers and addresses is one cause per kernel; its report is that
    of the least work, then the fewest variants; other errors, kernels and plain mismatches stand
    alone."""
    failures = [
        Failure("k", "forward", _report("forward", BIG, NO_KERNEL.format(72, 0xBEEF))),
        Failure("k", "backward", _report("backward", SMALL, NO_KERNEL.format(72, 0xF00D))),
        Failure("k", "window-forward", _report("window-forward", SMALL.replace(window=(2, 0)),
                                               NO_KERNEL.format(40, 1))),
        Failure("k", "gqa", _report("gqa", SMALL, "the kernel raised ValueError: no")),
        Failure("k", "empty-rows", _report("empty-rows", SMALL, "o != 0 on the empty rows 0..0")),
        Failure("other", "forward", _report("forward", SMALL, NO_KERNEL.format(72, 0xBEEF))),
    ]
    first, *rest = group(failures)
    assert (first.kernel, first.properties) == ("k", ("backward", "forward", "window-forward"))
    assert first.smallest.prop == "backward"
    assert first.headline == NO_KERNEL.format(72, 0xF00D)
    assert sorted((g.kernel, g.properties, g.cause is None) for g in rest) == [
        ("k", ("empty-rows",), True), ("k", ("gqa",), False), ("other", ("forward",), False)]


def test_a_diagnosis_is_a_cause():
    """Failures with the same diagnosis (its numbers aside) share a cause; a refusal of a declared
    problem is one too."""
    scale = "diagnosis: matches the golden with scale 1: the default scale is 1/sqrt(D) = {}"
    refused = "the kernel refused a declared problem: ValueError: head dim {} not supported"
    groups = group([
        Failure("k", "forward", _report("forward", BIG, "o: max|err| = 1", scale.format(0.125))),
        Failure("k", "backward", _report("backward", SMALL, "dq: max|err| = 2", scale.format(0.353553))),
        Failure("k", "odd-dims", _report("odd-dims", SMALL, refused.format(7))),
        Failure("k", "single", _report("single", BIG, refused.format(64))),
    ])
    assert sorted(g.properties for g in groups) == [("backward", "forward"), ("odd-dims", "single")]
    assert normalize(refused.format(7)) == normalize(refused.format(64)) != normalize(scale.format(1))


@pytest.fixture
def tallies(monkeypatch: pytest.MonkeyPatch) -> dict[tuple[str, str], Tally]:
    """A fresh tally for the test (the session's is left alone)."""
    fresh = type(report.TALLIES)(report.Tally)
    monkeypatch.setattr(report, "TALLIES", fresh)
    return fresh


def test_the_table_shows_asked_examples_causes_and_skip_reasons(tallies):
    """Rows that ran, by kernel and property, then rows only skipped, with the reason; one row for
    a kernel whose tests were all skipped for one reason; failures point to their cause, shown
    once."""
    tallies["k", "forward"] = Tally(passed=3, failed=2, seconds=1.0, asked=200,
                                    last_failure=_report("forward", BIG, NO_KERNEL.format(72, 1)))
    tallies["k", "backward"] = Tally(failed=1, seconds=1.0, asked=150,
                                     last_failure=_report("backward", SMALL, NO_KERNEL.format(72, 2)))
    tallies["k", "long-sequences"] = Tally(passed=10, seconds=2.0, asked=10)
    report.start_item()
    report.note_skip("k", "variant_forward[window]", "kernel k does not declare variant 'window'")
    report.start_item()
    report.expect("k", "precision", 100)  # a time box cut it before its first example
    report.note_skip("k", "low_precision_inputs_accumulate_in_fp32", "time box: precision's share was spent")
    for test in ("forward_matches_golden", "empty_rows"):  # a kernel that cannot run here: one row
        report.start_item()
        report.note_skip("gone", test, "unavailable: kernel gone: no GPU")
    lines = report.summary_lines()
    assert lines[0].split() == list(report.COLUMNS)
    rows = [line.split(None, 8) for line in lines[2:]]
    assert rows == [
        ["k", "backward", "1", "0", "0", "1", "1.0", "150", "failed: cause [1]"],
        ["k", "forward", "5", "3", "0", "2", "5.0", "200", "failed: cause [1]"],
        ["k", "long-sequences", "10", "10", "0", "0", "5.0", "10"],
        ["gone", "(all-2-tests)", "-", "-", "-", "-", "-", "-", "skipped: unavailable: kernel gone: no GPU"],
        ["k", "precision", "-", "-", "-", "-", "-", "100", "skipped: time box: precision's share was spent"],
        ["k", "variant_forward[window]", "-", "-", "-", "-", "-", "-",
         "skipped: kernel k does not declare variant 'window'"],
    ]
    text = "\n".join(report.failure_lines())
    assert text.count("fail with one cause") == 1 and text.count("property 'backward' failed") == 1
    assert "[1] k: 2 properties fail with one cause: " + NO_KERNEL.format(72, 2) in text
    assert "properties: backward, forward" in text and "property 'forward' failed" not in text
    markdown = "\n".join(report.markdown_lines())
    assert markdown.startswith("## flashprop on gone, k: 2 of 3 properties failed")
    assert "| k | precision | - | - | - | - | - | 100 | skipped: time box: precision's share was spent |" in (
        markdown)
    assert "<details><summary>[1] k: 2 properties fail with one cause" in markdown and "```" in markdown


def test_tallies_of_older_runs_merge_and_skips_add_up(tallies, tmp_path: Path, capsys):
    """Rows without ``asked`` (written before it existed) merge; asked examples and skip reasons
    of several processes add up; ``python -m harness.report`` prints the failures by cause."""
    old = {"kernel": "k", "property": "forward", "passed": 2, "refused": 0, "failed": 0, "seconds": 1.0,
           "last_failure": None, "skipped": []}
    new = {**old, "failed": 1, "asked": 3, "skipped": ["time box"],
           "last_failure": _report("forward", SMALL, NO_KERNEL.format(1, 1))}
    (tmp_path / "old.json").write_text(json.dumps([old]))
    (tmp_path / "new.json").write_text(json.dumps([new, {**new, "asked": 5}]))
    assert report.main([str(tmp_path / "old.json"), str(tmp_path / "new.json")]) == 1
    forward = tallies["k", "forward"]
    assert (forward.run, forward.asked, forward.skipped) == (8, 8, ["time box", "time box"])
    assert "failures by cause" in capsys.readouterr().out


def test_the_time_box_probe_counts_only_tests_that_reach_their_property():
    """A test that skips before its property, or has none, draws nothing; one that reaches it
    (where ``share`` stops it) or fails before does."""
    reached = []

    def skips() -> None:
        pytest.skip("kernel k does not declare variant 'window'")

    def reaches() -> None:
        timebox.share()
        reached.append("past its share")

    def fails_early() -> None:
        raise ValueError("a bad capability declaration")

    def no_property() -> None:
        return None

    drawn = [timebox.draws(test) for test in (skips, reaches, fails_early, no_property)]
    assert drawn == [False, True, True, False]
    assert reached == []
