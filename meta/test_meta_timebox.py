"""Meta-tests of the time box (``--time``), and of SIGTERM ending a run with its table."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from flashprop.harness.timebox import parse_duration

pytestmark = pytest.mark.meta

ROOT = Path(__file__).resolve().parent.parent
RUN = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", "--device", "cpu",
       "--kernel", "ref-blocked", "--hypothesis-profile", "fuzz", "-W", "ignore"]


@pytest.mark.parametrize(("text", "seconds"), [("600", 600), ("90s", 90), ("10m", 600), ("1h30m", 5400),
                                                 ("2.5m", 150)])
def test_durations(text: str, seconds: float):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "ten minutes", "10x", "m"])
def test_bad_durations_are_refused(text: str):
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


NO_BACKWARD = textwrap.dedent("""
    from flashprop import Capabilities
    from flashprop.refimpl.blocked import attention


    def attn(q, k, v, *, causal=False, scale=None):
        return attention(q, k, v, causal=causal, scale=scale)


    attn.capabilities = Capabilities(backward=False, devices=frozenset({"cpu"}))
""")


def test_a_time_box_stops_every_property_at_its_share(tmp_path: Path):
    """With 100,000 examples asked and a 6 s box over two kernels' forward and backward, of which
    one kernel declares no backward, the box is shared by the three properties that draw (the
    skipped one gets no share); each stops at its share (a pass, its examples in the table, its
    row noted time-boxed), and the run ends."""
    (tmp_path / "nobwd.py").write_text(NO_BACKWARD)
    run = subprocess.run([*RUN, "--kernel", f"{tmp_path}/nobwd.py:attn", "--time", "6s", "--max-examples",
                          "100000", "properties/test_golden.py"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    table = run.stdout.split("examples per property")[-1]
    rows = table.replace("\n    ", "  ").splitlines()  # a note that did not fit beside its row is under it
    cut = [line.split()[1] for line in rows if line.endswith("  time-boxed")]
    assert sorted(cut) == ["backward", "forward", "forward"], table
    assert "nobwd.py:attn 1 test: does not declare backward" in " ".join(table.split()), table
    assert "time box 0.1 min, shared by 3 properties (1 skipped before drawing got none): 3 stopped" in table


def test_a_property_left_out_by_skip_property_gets_no_share():
    """``--skip-property backward``: the backward property skips before drawing, saying why, and
    the box goes whole to the forward property, which still stops at its share."""
    run = subprocess.run([*RUN, "--skip-property", "backward", "--skip-property", "bakward", "--time", "3s",
                          "--max-examples", "100000", "--all-skips", "properties/test_golden.py"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    table = " ".join(run.stdout.split("examples per property")[-1].split())
    assert "left out by --skip-property backward" in table, table
    # a name that left nothing out (a typo) says so in one line
    assert "flashprop: --skip-property bakward matched no property of this run" in run.stdout
    assert "--skip-property backward matched" not in run.stdout
    assert "time box 0.1 min, shared by 1 properties (1 skipped before drawing got none): 1 stopped" in table


def test_xdist_workers_box_their_part(tmp_path: Path):
    """Under pytest-xdist each worker boxes the properties it runs (one worker here, the cheapest
    run that has one): both stop at their share."""
    run = subprocess.run([*RUN, "-n", "1", "--time", "2s", "--max-examples", "100000",
                          "properties/test_golden.py"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    table = run.stdout.split("examples per property")[-1]
    rows = table.replace("\n    ", "  ").splitlines()
    cut = [line.split()[1] for line in rows if line.endswith("  time-boxed")]
    assert sorted(cut) == ["backward", "forward"], run.stdout


def test_sigterm_ends_the_run_with_its_table(tmp_path: Path):
    tally = tmp_path / "tally.json"
    proc = subprocess.Popen([*RUN, "--max-examples", "100000", "--tally-json", str(tally),
                             "properties/test_golden.py"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not tally.exists() and time.monotonic() < deadline:  # saved at forward's first example
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert "examples per property" in out and "ref-blocked  forward" in out, out


LOST_SIGNAL = textwrap.dedent("""
    import os
    import signal

    from flashprop import Capabilities
    from flashprop.refimpl.blocked import attention


    class Finalized:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(3):  # the handler runs here, inside the finalizer: its exception is lost
                pass


    def attn(q, k, v, *, causal=False, scale=None):
        Finalized()
        return attention(q, k, v, causal=causal, scale=scale)


    attn.capabilities = Capabilities(backward=False, devices=frozenset({"cpu"}))
""")


def test_a_signal_lost_in_a_finalizer_still_stops_the_run(tmp_path: Path):
    """A SIGTERM whose handler runs inside a finalizer (here: at the kernel's first call) loses
    its KeyboardInterrupt; the run stops at the next example all the same, with its table."""
    (tmp_path / "lost.py").write_text(LOST_SIGNAL)
    cmd = [part for part in RUN if part not in ("--kernel", "ref-blocked")]
    run = subprocess.run([*cmd, "--kernel", f"{tmp_path}/lost.py:attn", "--max-examples", "200",
                          "properties/test_golden.py::test_forward_matches_golden"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == pytest.ExitCode.INTERRUPTED, run.stdout + run.stderr
    row = next(line for line in run.stdout.splitlines() if "lost.py:attn  forward" in line)
    assert row.split()[2] == "1", run.stdout  # run: the example that lost the signal, no other


SIGNAL_KILLS_A_COMPILER = textwrap.dedent("""
    import os
    import signal

    from flashprop import Capabilities
    from flashprop.refimpl.blocked import attention

    CALLS = [0]


    def attn(q, k, v, *, causal=False, scale=None):
        CALLS[0] += 1
        if CALLS[0] == 3:
            os.killpg(os.getpgrp(), signal.SIGTERM)  # GNU timeout signals the whole group ...
            raise RuntimeError("PTXAS error: ptxas failed with error code -15")  # ... its compiler too
        return attention(q, k, v, causal=causal, scale=scale)


    attn.capabilities = Capabilities(backward=False, devices=frozenset({"cpu"}))
""")


def test_a_call_the_stop_signal_broke_is_not_a_failure(tmp_path: Path):
    """An xdist worker whose kernel call fails because the stop signal (GNU timeout's, to the
    whole process group) also killed the compiler the call was waiting for: the run stops there
    with its table, the example not counted and no failure reported. (Session 43, on an H100: a
    ptxas killed by the signal was reported as the kernel's failure.)"""
    (tmp_path / "sig.py").write_text(SIGNAL_KILLS_A_COMPILER)
    cmd = [part for part in RUN if part not in ("--kernel", "ref-blocked")]
    run = subprocess.run([*cmd, "--kernel", f"{tmp_path}/sig.py:attn", "--max-examples", "200", "-n", "1",
                          "properties/test_golden.py::test_forward_matches_golden"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, start_new_session=True)
    assert run.returncode == pytest.ExitCode.INTERRUPTED, run.stdout + run.stderr
    assert "stopped by signal 15" in run.stdout, run.stdout
    assert "failures by cause" not in run.stdout and "error code -15" not in run.stdout, run.stdout
    row = next(line for line in run.stdout.splitlines() if "sig.py:attn  forward" in line)
    assert row.split()[4] == "0", run.stdout  # failed
