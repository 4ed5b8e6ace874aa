"""ci/limited.py on a child that swallows interrupts: the repeated SIGINT stops one that
swallows the first (exit 124, like timeout), SIGKILL one that swallows them all (137)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import limited

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


WORKER = "import time\\ntry:\\n    time.sleep(60)\\nexcept KeyboardInterrupt:\\n    raise SystemExit(3)"
PARENT = f"""
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "{WORKER}"])
print("worker exit", child.wait(), flush=True)
"""


def test_workers_first_interrupts_the_children_before_the_parent(tmp_path: Path):
    """As with a pytest-xdist controller: the child ends on the first interrupt and the parent,
    not interrupted yet, goes on to report it."""
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert limited.stop(proc, 2.0, workers_first=True) == 124
    assert proc.stdout.read().strip() == "worker exit 3"
