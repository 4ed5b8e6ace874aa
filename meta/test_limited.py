"""ci/limited.py on a child that swallows interrupts: the repeated SIGINT stops one that
swallows the first (exit 124, like timeout), SIGKILL one that swallows them all (137), and its
children with it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "ci"))  # the scripts under test

import limited

pytestmark = pytest.mark.meta

SWALLOWER = """
import sys, time
swallow, got = int(sys.argv[1]), 0
while True:
    try:
        time.sleep(0.05)
    except KeyboardInterrupt:
        got += 1
        if got > swallow:
            sys.exit(3)
"""


@pytest.mark.parametrize(("swallow", "status"), [(0, 124), (1, 124), (99, 137)])
def test_interrupts_repeat_then_kill(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, swallow: int,
                                     status: int):
    monkeypatch.setattr(limited, "REPEAT_SECONDS", 0.5)
    monkeypatch.setattr(limited, "KILL_SECONDS", 2.0)
    script = tmp_path / "swallower.py"
    script.write_text(SWALLOWER)
    start = time.monotonic()
    # the first interrupt after 2 s (the child is in its loop by then), the kill 2 s later
    assert limited.stop(subprocess.Popen([sys.executable, str(script), str(swallow)]), 2.0) == status
    assert time.monotonic() - start < 10


def test_a_command_that_ends_in_time_keeps_its_status():
    assert limited.stop(subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"]), 10.0) == 3


STUBBORN = "import signal, time\\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\\ntime.sleep(60)"
PARENT = f"""
import signal, subprocess, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "{STUBBORN}"])
print(child.pid, flush=True)
child.wait()
"""


def test_the_kill_reaches_the_children(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """As with a pytest-xdist controller whose workers are stuck: a parent and a child that both
    ignore SIGINT are killed together, leaving no orphan."""
    monkeypatch.setattr(limited, "REPEAT_SECONDS", 0.5)
    monkeypatch.setattr(limited, "KILL_SECONDS", 1.0)
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    child = int(proc.stdout.readline())
    assert limited.stop(proc, 1.0) == 137
    time.sleep(0.2)
    state = Path(f"/proc/{child}/stat")
    assert not state.exists() or state.read_text().split()[2] == "Z", "the child outlived the kill"
