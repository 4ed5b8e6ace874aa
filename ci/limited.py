#!/usr/bin/env python3
"""Run a command under a time limit, stopping it as Ctrl-C would.

    python ci/limited.py SECONDS CMD [ARG...]

At SECONDS the command gets SIGINT, so pytest still writes its summary, its tally JSON and
pytest-benchmark's JSON. The interrupt is sent again every REPEAT_SECONDS while the command
runs, because one can be lost: a KeyboardInterrupt raised inside a finalizer is only printed
("Exception ignored in ..."). KILL_SECONDS after the first one the command gets SIGKILL.
``timeout -s INT`` sends one interrupt, and a second ``timeout`` around it does not pass its
own on to the command.

Exit status: the command's own if it ends in time, 124 if the limit was reached (as with
timeout(1)), 137 if it had to be killed. SIGTERM sent to this script goes to the command;
SIGINT does not (Ctrl-C in a terminal reaches the command itself).

A pytest-xdist controller passes the first interrupt on to its workers, which wind down and hand
their tallies over (``harness/campaign.py``); the interrupts after it reach workers stuck in
an example. The kill reaches the command's children (the workers) too.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from flashprop.harness.campaign import child_pids, signal_pids

REPEAT_SECONDS, KILL_SECONDS = 10.0, 30.0


def stop(proc: subprocess.Popen, limit: float) -> int:
    """Wait up to ``limit`` seconds for ``proc``, then interrupt it, again and again, and kill it
    and its children at last; the exit status as described above."""
    try:
        return proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        pass
    kill_at = time.monotonic() + KILL_SECONDS
    while (left := kill_at - time.monotonic()) > 0:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=min(REPEAT_SECONDS, left))
            return 124
        except subprocess.TimeoutExpired:
            continue
    signal_pids(child_pids(proc.pid), signal.SIGKILL)
    proc.kill()
    proc.wait()
    return 137


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    proc = subprocess.Popen(argv[1:])
    signal.signal(signal.SIGTERM, lambda signum, _frame: proc.send_signal(signum))
    signal.signal(signal.SIGINT, lambda _signum, _frame: None)  # a terminal's Ctrl-C reaches both
    return stop(proc, float(argv[0]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
