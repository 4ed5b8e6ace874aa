"""Meta-tests of the fuzz report: failures grouped by cause (harness/causes.py), the table
(within 100 columns, its asked examples, causes and time-box stops, the tests that drew nothing
folded per reason), the markdown summary, merged tallies of older runs, the time box's probe
that counts only the tests that draw examples (harness/timebox.py) and its stop (a pass, in the
explicit phase too; never of a failing property), the JUnit XML of a run (a testcase per kernel
test with its examples, flashprop's report on a failure) and where the tracebacks go."""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import flashprop.harness.report as report
import pytest
from flashprop.contract.capabilities import Capabilities
from flashprop.contract.problem import Problem
from flashprop.contract.registry import Kernel
from flashprop.harness.causes import group, normalize
from flashprop.harness.check import PropertyFailure, failure, run_property
from flashprop.harness.failures import REPLAY_HEADER, REPRO_HEADER, Failure
from flashprop.harness.report import Tallies, Tally
from flashprop.harness.run_context import RunContext
from flashprop.harness.timebox import TimeBox
from hypothesis import strategies as st

from flashprop.cli import TRACEBACKS, tracebacks_file
from flashprop.plugin import _write_tracebacks

pytestmark = pytest.mark.meta

KERNEL = Kernel(name="k", fn=lambda q, k, v, **kw: None, capabilities=Capabilities())
BIG = Problem(b=2, hq=4, hkv=4, nq=64, nk=64, d=72, dv=72)
SMALL = Problem(b=1, hq=1, hkv=1, nq=3, nk=5, d=72, dv=72)
NO_KERNEL = "the kernel raised RuntimeError: no kernel for head dim {} (smem 0x{:x})"


def _report(prop: str, problem: Problem, *lines: str, kernel: str = "k") -> Failure:
    """A failure as the properties make it: a line naming an error is its error, a diagnosis
    line a diagnosis, the others its details."""
    errors = ("the kernel raised", "the kernel refused")
    error = next((line for line in lines if line.startswith(errors)), None)
    diagnoses = tuple(line for line in lines if line.startswith("diagnosis: "))
    details = [line for line in lines if line != error and line not in diagnoses]
    made = failure(Kernel(kernel, KERNEL.fn, KERNEL.capabilities), problem, prop, details, error=error)
    return made.replace(diagnoses=diagnoses)


def test_one_error_everywhere_is_one_cause_shown_on_its_smallest_problem():
    """The same exception up to numbers and addresses is one cause per kernel; its report is that
    of the least work, then the fewest variants; other errors, kernels and plain mismatches stand
    alone."""
    failures = [
        _report("forward", BIG, NO_KERNEL.format(72, 0xBEEF)),
        _report("backward", SMALL, NO_KERNEL.format(72, 0xF00D)),
        _report("window-forward", SMALL.replace(window=(2, 0)), NO_KERNEL.format(40, 1)),
        _report("gqa", SMALL, "the kernel raised ValueError: no"),
        _report("empty-rows", SMALL, "o != 0 on the empty rows 0..0"),
        _report("forward", SMALL, NO_KERNEL.format(72, 0xBEEF), kernel="other"),
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
        _report("forward", BIG, "o: max|err| = 1", scale.format(0.125)),
        _report("backward", SMALL, "dq: max|err| = 2", scale.format(0.353553)),
        _report("odd-dims", SMALL, refused.format(7)),
        _report("single", BIG, refused.format(64)),
    ])
    assert sorted(g.properties for g in groups) == [("backward", "forward"), ("odd-dims", "single")]
    assert normalize(refused.format(7)) == normalize(refused.format(64)) != normalize(scale.format(1))


@pytest.fixture
def tallies() -> Tallies:
    """Fresh tallies for the test (the session's are left alone)."""
    return Tallies()


def test_the_table_shows_asked_examples_causes_and_skip_reasons(tallies):
    """Rows that ran, by kernel and property, with the failures' cause numbers (each cause shown
    once) and a time box's stop; one row for a kernel whose tests were all skipped for one reason;
    the tests that drew nothing on one line per reason after the table."""
    tallies.by_property["k", "forward"] = Tally(passed=3, failed=2, seconds=1.0, asked=200,
                                                last_failure=_report("forward", BIG, NO_KERNEL.format(72, 1)))
    tallies.by_property["k", "backward"] = Tally(
        failed=1, seconds=1.0, asked=150, last_failure=_report("backward", SMALL, NO_KERNEL.format(72, 2)))
    tallies.by_property["k", "long-sequences"] = Tally(passed=10, seconds=2.0, asked=10, cut=1)
    tallies.start_item()
    tallies.note_skip("k", "variant_forward[window]", "kernel k does not declare variant 'window'")
    tallies.start_item()
    tallies.expect("k", "precision", 100)  # asked, then it found nothing declared to draw
    tallies.note_skip("k", "low_precision_inputs_accumulate_in_fp32",
                     "declares none of the problems precision needs (fp16)")
    for test in ("forward_matches_golden", "empty_rows"):  # a kernel that cannot run here: one row
        tallies.start_item()
        tallies.note_skip("gone", test, "unavailable: kernel gone: no GPU")
    lines = tallies.summary_lines()
    assert lines[0].split() == list(report.COLUMNS)
    rows = [line.split(None, 8) for line in lines[2:6]]
    assert rows[:3] == [
        ["k", "backward", "1", "0", "0", "1", "1.0", "150", "cause [1]"],
        ["k", "forward", "5", "3", "0", "2", "5.0", "200", "cause [1]"],
        ["k", "long-sequences", "10", "10", "0", "0", "5.0", "10", "time-boxed"],
    ]
    assert rows[3][:8] == ["gone", "(all-2-tests)", *("-",) * 6]  # its note wraps in its column
    column = lines[5].index("skipped: ")
    assert lines[6][:column].isspace() and len(lines[5]) <= report.WIDTH
    assert f"{lines[5][column:]} {lines[6].strip()}" == "skipped: unavailable: kernel gone: no GPU"
    assert lines[7:] == [
        "skipped before drawing: 2 tests (--all-skips lists each with its reason)",
        "  k  1 test: does not declare variant 'window'",
        "  k  1 test: declares none of the problems precision needs (fp16)",
    ]
    assert tallies.summary_lines(all_skips=True)[8:] == [
        "  k  precision: declares none of the problems precision needs (fp16)",
        "  k  variant_forward[window]: does not declare variant 'window'",
    ]
    text = "\n".join(tallies.failure_lines())
    assert text.count("fail with one cause") == 1 and text.count("property 'backward' failed") == 1
    assert "[1] k: 2 properties fail with one cause: " + NO_KERNEL.format(72, 2) in text
    assert "properties: backward, forward" in text and "property 'forward' failed" not in text
    markdown = "\n".join(tallies.markdown_lines())
    assert markdown.startswith("## flashprop on gone, k: 2 of 3 properties failed")
    assert "| k | long-sequences | 10 | 10 | 0 | 0 | 5.0 | 10 | time-boxed |" in markdown
    assert "<summary>k: 1 tests: declares none of the problems precision needs (fp16)</summary>" in markdown
    assert "<details><summary>[1] k: 2 properties fail with one cause" in markdown and "```" in markdown


#: A user's kernel as they name it, which declares no variant (the dense kernel of a first fuzz).
USER = "./my_kernel.py:attn"
#: The tests that drew nothing on such a kernel (its fuzz run: 46 of 72 tests), by the variant
#: they need; the others with their reasons (as the properties give them).
NEEDS_VARIANT = {
    "window": ["variant_forward_matches_golden[window]", "variant_backward_matches_golden[window]",
               "window_wider_than_sequence", "window_left_unbounded_right_zero_is_causal",
               "malformed_variant_inputs_raise_clear_error[window_size below -1]"],
    "softcap": ["variant_forward_matches_golden[softcap]", "variant_backward_matches_golden[softcap]",
                "huge_softcap_is_no_softcap", "malformed_variant_inputs_raise_clear_error[softcap negative]"],
    "alibi": ["variant_forward_matches_golden[alibi]", "variant_backward_matches_golden[alibi]",
              "zero_alibi_slopes_are_no_alibi",
              "malformed_variant_inputs_raise_clear_error[alibi_slopes of the wrong length]"],
    "sinks": ["variant_forward_matches_golden[sinks]", "variant_backward_matches_golden[sinks]",
              "sinks_at_minus_infinity_are_no_sinks", "sinks_shift_lse_by_logaddexp",
              "malformed_variant_inputs_raise_clear_error[sinks of the wrong length]"],
    "varlen": ["variant_forward_matches_golden[varlen]", "variant_backward_matches_golden[varlen]",
               *(f"malformed_variant_inputs_raise_clear_error[{case}]" for case in (
                   "cu_seqlens int64", "cu_seqlens not monotone", "cu_seqlens_k not ending at Tk",
                   "cu_seqlens_q and cu_seqlens_k lengths differ", "cu_seqlens_q not starting at 0",
                   "max_seqlen_q below a sequence's length"))],
    "kvcache": ["variant_forward_matches_golden[kvcache]",
                *(f"malformed_variant_inputs_raise_clear_error[cache_seqlens {case}]"
                  for case in ("above capacity", "int64", "negative"))],
    "paged": ["variant_forward_matches_golden[paged]",
              "malformed_variant_inputs_raise_clear_error[block_table negative]",
              "malformed_variant_inputs_raise_clear_error[block_table past the last page]"],
    "splits": ["variant_forward_matches_golden[splits]"],
}
HUGE = ("dense tensors of 2^31 elements (4 GiB each in fp16, 30 GiB and more a problem) are for a GPU; "
        "on the CPU test_spread_layouts reaches the same offsets")
OTHER_SKIPS = {
    "decode_consistency": f"kernel {USER} does not declare KV-cache decode",
    "paged_equals_contiguous": f"kernel {USER} does not declare a paged KV cache",
    "split_kv_invariance": f"kernel {USER} does not declare split-KV (max_splits > 1)",
    **{name: f"kernel {USER} does not declare varlen"
       for name in ("varlen_isolation", "varlen_permutation", "varlen_sequence_alone")},
    "gradgradcheck": "backward is not differentiable (kernel does not support double backward): its "
                     "gradients are not connected to q, k, v or dO",
    **{f"huge_independence[{axis}]": HUGE for axis in ("batch", "heads", "rows", "varlen")},
    "scale_error_contract": f"kernel {USER} declares no max_elements: it claims every size, which "
                            "test_huge_independence and test_spread_layouts hold it to",
}
#: The 26 properties that ran, as the fuzz profile asks them (500 examples times the weight).
RAN = {"forward": 500, "backward": 375, "batch-independence": 250, "causal-future": 250,
       "deterministic-backward": 250, "deterministic-forward": 250, "empty-rows": 250,
       "error-contract": 125, "extreme-logits": 250, "gqa-consistency": 250, "gradcheck": 125,
       "head-independence": 250, "kv-permutation": 250, "long-golden": 15, "long-sequences": 25,
       "odd-head-dims": 250, "poisoned-views": 250, "precision": 250, "scale-folding": 250,
       "shift-invariance": 250, "single-token": 250, "split-kv-merge": 250, "spread-batch": 250,
       "spread-heads": 250, "spread-rows": 250, "variant-error-contract": 125}


def _a_first_fuzz(tallies) -> dict[str, str]:
    """A dense user kernel's tallies after a time-boxed fuzz run: 26 properties ran (two failed
    with one cause, two stopped by the time box), 46 tests drew nothing; their reasons by test."""
    for i, (prop, asked) in enumerate(RAN.items()):
        tallies.by_property[USER, prop] = Tally(passed=asked // 10 + i, refused=i % 3, seconds=3.7 + i,
                                                asked=asked, cut=int(prop in ("long-golden", "precision")))
    for prop in ("forward", "backward"):
        tallies[USER, prop].failed = 12
        tallies[USER, prop].last_failure = _report(prop, SMALL, "o: max|err| = 0.5 > budget 0.01",
                                                   "diagnosis: matches the golden with scale 1/D",
                                                   kernel=USER)
    skips = {name: f"kernel {USER} does not declare variant {variant!r}"
             for variant, names in NEEDS_VARIANT.items() for name in names}
    skips.update(OTHER_SKIPS)
    for name, reason in skips.items():
        tallies.start_item()
        tallies.note_skip(USER, name, reason)
    return skips


def test_the_table_fits_100_columns_and_folds_the_tests_that_drew_nothing(tallies):
    """On a first fuzz of a dense kernel: every line within 100 columns, a row per property that
    ran, and the 46 tests that drew nothing in 4 entries (the undeclared features with their
    counts in one, then each other reason); --all-skips lists each of them once, within 100
    columns too."""
    skips = _a_first_fuzz(tallies)
    assert len(skips) == 46
    lines = tallies.summary_lines()
    assert max(map(len, lines)) <= report.WIDTH == 100, "\n".join(lines)
    rows = [line.split()[1] for line in lines[2:] if line.startswith(USER)]
    assert sorted(rows) == sorted(RAN)
    notes = {line.split()[1]: line.split(None, 8)[8] for line in lines[2:] if line.startswith(USER)
             and len(line.split()) > 8}
    assert notes == {"forward": "cause [1]", "backward": "cause [1]", "long-golden": "time-boxed",
                     "precision": "time-boxed"}
    folded = lines[2 + len(RAN):]
    assert folded[0] == "skipped before drawing: 46 tests (--all-skips lists each with its reason)"
    entries = [line for line in folded[1:] if line.startswith(f"  {USER}  ")]
    assert len(entries) == 4 and len(folded) <= 12, "\n".join(folded)
    undeclared = " ".join(line.strip() for line in folded[1:]).split(f"{USER}  ")[1]
    assert undeclared.startswith("40 tests: does not declare variant 'varlen' (8), ")
    assert "variant 'window' (5)" in undeclared and "varlen (3), KV-cache decode (1)" in undeclared
    assert not any(name in "\n".join(folded) for name in skips)

    listed = tallies.summary_lines(all_skips=True)
    assert max(map(len, listed)) <= report.WIDTH, "\n".join(listed)
    assert listed[:2 + len(RAN)] == lines[:2 + len(RAN)]
    words = " ".join(" ".join(listed[2 + len(RAN):]).split())  # the lines unwrapped
    for name, reason in skips.items():
        assert words.count(" ".join(f"{USER} {name}: {reason.removeprefix(f'kernel {USER} ')}".split())) == 1


def test_a_skip_reason_keeps_its_first_line(tallies):
    """What Hypothesis appends to a skip raised inside it (its failing example, a note per
    line) stays out of the table."""
    tallies.start_item()
    tallies.note_skip("k-notes", "probe",
                      "out of device memory at N=8k\nFailing explicit example: ...\n  x=1")
    assert tallies["k-notes", "probe"].skipped == ["out of device memory at N=8k"]


def test_tallies_of_older_runs_merge_and_skips_add_up(tallies, tmp_path: Path, capsys):
    """Rows without ``asked`` (written before it existed) merge; asked examples and skip reasons
    of several processes add up; ``python -m flashprop.harness.report`` prints the failures by cause."""
    old = {"kernel": "k", "property": "forward", "passed": 2, "refused": 0, "failed": 0, "seconds": 1.0,
           "last_failure": None, "skipped": []}
    new = {**old, "failed": 1, "asked": 3, "skipped": ["time box"],
           "failure": _report("forward", SMALL, NO_KERNEL.format(1, 1)).to_dict()}
    (tmp_path / "old.json").write_text(json.dumps([old]))
    (tmp_path / "new.json").write_text(json.dumps([new, {**new, "asked": 5}]))
    assert report.main([str(tmp_path / "old.json"), str(tmp_path / "new.json")]) == 1
    tallies.merge([str(tmp_path / "old.json"), str(tmp_path / "new.json")])
    forward = tallies["k", "forward"]
    assert (forward.run, forward.asked, forward.skipped) == (8, 8, ["time box", "time box"])
    assert "failures by cause" in capsys.readouterr().out


def test_the_time_box_probe_counts_only_tests_that_reach_their_property():
    """A test that skips before its property, or has none, draws nothing; one that reaches it
    (where ``share`` stops it) or fails before does."""
    reached = []
    box = TimeBox()

    def skips() -> None:
        pytest.skip("kernel k does not declare variant 'window'")

    def reaches() -> None:
        box.share()
        reached.append("past its share")

    def fails_early() -> None:
        raise ValueError("a bad capability declaration")

    def no_property() -> None:
        return None

    drawn = [box.draws(test) for test in (skips, reaches, fails_early, no_property)]
    assert drawn == [False, True, True, False]
    assert reached == []


# --- the time box's stop ----------------------------------------------------------------------

#: A stand-in kernel for run_property (its checks below never call it).
BOXED = Kernel(name="meta-boxed", fn=lambda q, k, v, **kw: None, capabilities=Capabilities())
#: Problems that differ only in their seed (enough of them that Hypothesis does not run out).
SEEDS = st.integers(0, 10**6).map(lambda seed: SMALL.replace(seed=seed))


@pytest.fixture
def boxed() -> RunContext:
    """A run context of its own (the session's left alone) with a time box of 0.2 s for one
    property."""
    run = RunContext()
    run.time_box.start(0.2, 1)
    return run


def _slow(kernel: Kernel, problem: Problem) -> None:
    time.sleep(0.3)  # past the box's 0.2 s at once


def test_a_time_box_stop_is_a_pass_with_its_examples_in_the_explicit_phase_too(boxed, capsys):
    """The box runs out during the explicit examples: the property ends there as a pass (no skip,
    no 'Failing explicit example' note from Hypothesis anywhere), its one example counted and its
    stop noted on its row."""
    run_property(boxed, BOXED, "meta-boxed", SEEDS, _slow, explicit=(SMALL, SMALL.replace(seed=1)))
    tally = boxed.tallies[BOXED.name, "meta-boxed"]
    assert (tally.run, tally.passed, tally.cut, tally.skipped) == (1, 1, 1, [])
    assert "Failing explicit example" not in "".join(capsys.readouterr())
    assert next(r for r in boxed.tallies.table_rows() if r[0] == BOXED.name)[-1] == "time-boxed"


def test_a_time_box_spent_before_a_property_starts_still_runs_its_first_example(boxed):
    """A property whose share is spent when it starts (the ones before it overran the box) runs
    one example and passes time-boxed: every property of a boxed run is tried."""
    time.sleep(0.25)
    run_property(boxed, BOXED, "meta-boxed", SEEDS, _slow)
    tally = boxed.tallies[BOXED.name, "meta-boxed"]
    assert (tally.run, tally.passed, tally.cut) == (1, 1, 1)


def test_a_failing_property_is_not_stopped_by_the_time_box(boxed):
    """A property that failed goes on past its share and fails: in the explicit phase (where
    Hypothesis would report a stop's skip instead of the failure before it), and while shrinking
    (here until the shrink limit); so does one whose check raised something else (Hypothesis
    shrinks that as a failure too)."""
    run = dataclasses.replace(boxed, shrink_seconds=0.5)  # its time box and tallies, shrinking 0.5 s

    def fails_on_odd_seeds(kernel: Kernel, problem: Problem) -> None:
        time.sleep(0.3 if problem.seed == 1 else 0.05)  # seed 1 spends the share
        if problem.seed % 2:
            raise PropertyFailure(Failure(BOXED.name, "meta-boxed", problem.describe()))

    with pytest.raises(PropertyFailure):
        run_property(run, BOXED, "meta-explicit", SEEDS, fails_on_odd_seeds,
                     explicit=(SMALL.replace(seed=1), SMALL.replace(seed=2)))
    assert run.tallies[BOXED.name, "meta-explicit"].run == 2
    for prop in ("meta-shrinks", "meta-raises"):
        run.time_box.start(0.2, 1)
        calls = []

        def fails(kernel: Kernel, problem: Problem, prop=prop, calls=calls) -> None:
            calls.append(time.monotonic())
            if len(calls) == 1:
                time.sleep(0.15)  # a pass, then failures; shrinking them spends the share
                return
            time.sleep(0.05)
            if prop == "meta-shrinks":
                raise PropertyFailure(Failure(BOXED.name, prop, problem.describe()))
            raise ZeroDivisionError("a bug in the check, not the kernel's failure")

        with pytest.raises(PropertyFailure if prop == "meta-shrinks" else ZeroDivisionError):
            run_property(run, BOXED, prop, SEEDS, fails)
        assert calls[-1] - calls[0] > 0.3, prop  # it shrank past its share
    assert not any(run.tallies[BOXED.name, p].cut for p in ("meta-explicit", "meta-shrinks", "meta-raises"))


# --- a run's JUnit XML and tracebacks ---------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
KERNEL_SOURCE = textwrap.dedent("""
    from flashprop import Capabilities
    from flashprop.refimpl.blocked import attention


    def attn(q, k, v, *, causal=False, scale=None):
        o, lse = attention(q, k, v, causal=causal, scale=scale)
        return o * FACTOR, lse


    attn.capabilities = Capabilities(devices=frozenset({"cpu"}), backward=BACKWARD)
""")


def test_junit_has_a_testcase_per_kernel_test_with_its_examples_and_flashprops_report(tmp_path: Path):
    """A 4 s box over three kernels' forward and backward: a wrong one (output 1.5x), a right one
    and one without a backward (its backward skipped, saying why). One testcase per kernel
    test; each one that ran has its property's examples as properties, equal to the tally; the
    right kernels' properties stopped by the box pass, saying so; the wrong kernel's failures carry
    flashprop's report (problem, repro, replay command), not pytest's traceback, which goes to
    the tracebacks file (its folder made); pytest's FAILED lines are left out (the causes say
    more)."""
    # the wrong kernel first, its shrinking short: it takes its own shares, not the others'
    kernels = {"wrong": ("1.5", "True"), "right": ("1.0", "True"), "nobwd": ("1.0", "False")}
    specs = {}
    for name, (factor, backward) in kernels.items():
        source = KERNEL_SOURCE.replace("FACTOR", factor).replace("BACKWARD", backward)
        (tmp_path / f"{name}.py").write_text(source)
        specs[name] = f"{tmp_path}/{name}.py:attn"
    xml, tally, tracebacks = tmp_path / "run.xml", tmp_path / "tally.json", tmp_path / "out" / "tb.txt"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--device", "cpu", "-W", "ignore",
         "--hypothesis-profile", "ci", "--time", "4s", "--max-examples", "100000", "--shrink-seconds", "0.5",
         *(arg for spec in specs.values() for arg in ("--kernel", spec)), "properties/test_golden.py",
         "--junitxml", str(xml), "--tally-json", str(tally), "--tracebacks-file", str(tracebacks)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "2 failed, 3 passed, 1 skipped" in run.stdout, run.stdout
    assert "FAILED properties/" not in run.stdout, run.stdout
    cases = ET.parse(xml).getroot().findall(".//testcase")
    assert len(cases) == 6
    rows = {(r["kernel"], r["property"]): r for r in json.loads(tally.read_text())}
    ran = {}
    for case in cases:
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        if not props:
            assert case.find("skipped").get("message") == f"kernel {specs['nobwd']} does not declare backward"
            continue
        row = rows[props["kernel"], props["property"]]
        assert [int(props[key]) for key in ("examples", "passed", "refused", "failed", "asked")] == [
            row["passed"] + row["refused"] + row["failed"], row["passed"], row["refused"], row["failed"],
            row["asked"]]
        ran[props["kernel"], props["property"]] = case, props
    assert len(ran) == 5 == sum(r["passed"] + r["refused"] + r["failed"] > 0 for r in rows.values())
    for name in ("right", "nobwd"):
        case, props = ran[specs[name], "forward"]
        assert case.find("failure") is None and case.find("skipped") is None
        assert int(props["examples"]) > 0 and props["time_box"].startswith("its share was spent after")
    for prop in ("forward", "backward"):
        failed = ran[specs["wrong"], prop][0].find("failure")
        assert failed.get("message") == f"property {prop!r} failed for kernel {specs['wrong']!r}"
        assert failed.text.startswith(failed.get("message") + "\nproblem: Problem(")
        assert REPRO_HEADER in failed.text and REPLAY_HEADER in failed.text and "def " not in failed.text
    written = tracebacks.read_text()
    assert "test_forward_matches_golden[" in written and "def test_forward_matches_golden(" in written


def test_tracebacks_go_next_to_the_runs_files_else_to_one_file_here(tmp_path: Path):
    """``flashprop fuzz``'s tracebacks file: the one named, else beside --json (or --junit-xml),
    else .flashprop/ of the working folder, the same name each run; a run without failures
    removes the last run's."""
    def where(**given: str) -> str:
        return tracebacks_file(argparse.Namespace(**{"tracebacks_file": None, "json": None, "junit_xml": None,
                                                      **given}))

    assert where() == str(Path(".flashprop") / TRACEBACKS)
    assert where(junit_xml="out/run.xml") == f"out/{TRACEBACKS}"
    assert where(json="a/t.json", junit_xml="b/r.xml") == f"a/{TRACEBACKS}"
    assert where(tracebacks_file="tb.txt", json="a/t.json") == "tb.txt"
    stale = tmp_path / TRACEBACKS
    stale.write_text("an earlier run's tracebacks")
    assert _write_tracebacks(SimpleNamespace(stats={"passed": [object()]}), str(stale)) == 0
    assert not stale.exists()


#: Declares a window and a softcap and answers both malformed: a side below -1 (read as -1) and a
#: negative softcap (its absolute value taken).
UNCHECKED = textwrap.dedent("""
    from flashprop import Capabilities
    from flashprop.refimpl.blocked import attention


    def attn(q, k, v, *, window_size=None, softcap=0.0, **kw):
        if window_size is not None:
            window_size = tuple(max(side, -1) for side in window_size)
        return attention(q, k, v, window_size=window_size, softcap=abs(softcap), **kw)


    attn.capabilities = Capabilities(devices=frozenset({"cpu"}), backward=False, window=True, softcap=True)
""")


def test_each_test_case_of_a_property_keeps_its_failure(tmp_path: Path):
    """malformed-inputs is one property in a test per malformed input: a kernel answering two of
    them fails two tests, and the report shows both causes (the tallies keep the last failure of
    each test case, not of the property), one table row pointing at both, the JSON row both."""
    (tmp_path / "unchecked.py").write_text(UNCHECKED)
    tally = tmp_path / "tally.json"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--device", "cpu", "-W", "ignore",
         "--hypothesis-profile", "ci", "--max-examples", "3", "--kernel", "./unchecked.py:attn",
         f"{ROOT}/properties/test_error_contract.py", "-k", "malformed", "--tally-json", str(tally),
         "--tracebacks-file", str(tmp_path / "tb.txt")],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 1 and "2 failed, " in run.stdout, run.stdout + run.stderr
    causes = run.stdout[run.stdout.index("failures by cause"):]
    for corruption in ("window_size below -1", "softcap negative"):
        assert causes.count(f"malformed input ({corruption}) was answered instead of refused") == 1, causes
    assert "[2] " in causes and "[3] " not in causes, causes
    (row,) = [line for line in run.stdout.splitlines() if " malformed-inputs " in line]
    assert row.endswith("causes [1], [2]"), run.stdout
    (found,) = [r for r in json.loads(tally.read_text()) if r["property"] == "malformed-inputs"]
    test = "test_error_contract::test_malformed_variant_inputs_raise_clear_error"
    assert sorted(found["failures"]) == [f"{test}[corruption=softcap negative]",
                                         f"{test}[corruption=window_size below -1]"]
