#!/usr/bin/env python3
"""Replay each failure of a property run in fresh processes: does it reproduce on its own?

A failure found while many processes share a GPU may be the kernel's (a wrong answer it gives
every time, or a race it loses now and then) or the machine's. This reads the tally files that
``pytest --tally-json`` wrote, takes the replay command each failure report carries (``pytest
<test> --kernel K --replay PROPERTY:Problem(...)``) and runs it ``--times`` times, one process
after another, then prints per failure how often it came back:

    python ci/replay_failures.py --times 3 tallies/*.json
    python ci/replay_failures.py --times 3 --budget 60 tallies/*.json   # what 60 s allow; the rest "not run"

Exit status 0 (the verdicts are information; the property run's own status stands).
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import subprocess
import sys
import time
from pathlib import Path

#: The outcome of a replay that found the budget spent.
NOT_RUN = "not run"


def replay_commands(paths: list[Path]) -> dict[tuple[str, str], str]:
    """(kernel, property) -> the replay command of its last failure (its record's)."""
    found = {}
    for path in paths:
        for row in json.loads(path.read_text()):
            record = row.get("failure") or {}
            if row["failed"] and record.get("replay"):
                found[(row["kernel"], row["property"])] = record["replay"]
    return found


def replay(command: str, times: int, timeout: float, deadline: float = math.inf) -> list[str]:
    """Outcomes of ``times`` runs: "failed", "passed", "timeout" or "error (exit N)", and "not run"
    for those that find ``deadline`` (``time.monotonic()``) passed; each run is limited to the
    smaller of ``timeout`` and the time left."""
    argv = shlex.split(command)
    if argv[0] == "python":
        argv[0] = sys.executable
    outcomes = []
    for _ in range(times):
        left = deadline - time.monotonic()
        if left <= 0:
            outcomes.append(NOT_RUN)
            continue
        try:
            rc = subprocess.run(argv, capture_output=True, timeout=min(timeout, left)).returncode
        except subprocess.TimeoutExpired:
            outcomes.append("timeout")
            continue
        outcomes.append({0: "passed", 1: "failed"}.get(rc, f"error (exit {rc})"))
    return outcomes


def replays_run(outcomes: list[str]) -> list[str]:
    """The outcomes of the replays that ran (those the budget left out dropped)."""
    return [o for o in outcomes if o != NOT_RUN]


def verdict(outcomes: list[str]) -> str:
    """What the replays that ran say: every one failed, some did, none did, or none ran."""
    ran = replays_run(outcomes)
    failed = ran.count("failed")
    if not ran:
        return "not replayed: no time was left"
    return "reproduces" if failed == len(ran) else "FLAKY" if failed else "does not reproduce"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tallies", nargs="+", type=Path)
    parser.add_argument("--times", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per replay")
    parser.add_argument("--budget", type=float, default=math.inf,
                        help="seconds for all the replays; those left when it is spent are not run")
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.budget
    commands = replay_commands(args.tallies)
    if not commands:
        print("replays: no failure to replay")
        return 0
    print(f"replays: each failure's problem alone, in {args.times} fresh processes")
    for (kernel, prop), command in sorted(commands.items()):
        outcomes = replay(command, args.times, args.timeout, deadline)
        ran = replays_run(outcomes)
        print(f"  {kernel} / {prop}: {verdict(outcomes)} ({ran.count('failed')} of {len(ran)} failed: "
              f"{', '.join(outcomes)})")
        print(f"    {command}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
