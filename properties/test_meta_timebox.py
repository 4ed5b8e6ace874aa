"""Meta-tests of the time box (``--time``), and of SIGTERM ending a run with its table."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from flashprop.properties.timebox import parse_duration

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


def test_a_time_box_stops_every_property_at_its_share(tmp_path: Path):
    """With 100,000 examples asked and a 6 s box over two properties, each stops at its share
    (reported as a time-box skip with its examples in the table) and the run ends."""
    run = subprocess.run([*RUN, "--time", "6s", "--max-examples", "100000", "properties/test_golden.py"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("time box: forward's share") + run.stdout.count("time box: backward's share") == 2
    assert "flashprop: time box 0.1 min: 2 properties stopped" in run.stdout, run.stdout


def test_sigterm_ends_the_run_with_its_table(tmp_path: Path):
    proc = subprocess.Popen([*RUN, "--max-examples", "100000", "properties/test_golden.py"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(6)  # collected and running forward's examples
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert "examples per property" in out and "ref-blocked  forward" in out, out
