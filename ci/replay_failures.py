#!/usr/bin/env python3
"""Replay each failure of a property run in fresh processes: does it reproduce on its own?

A failure found while many processes share a GPU may be the kernel's (a wrong answer it gives
every time, or a race it loses now and then) or the machine's. This reads the tally files that
``pytest --tally-json`` wrote, takes the replay command each failure report carries (``pytest
<test> --kernel K --replay PROPERTY:Problem(...)``) and runs it ``--times`` times, one process
after another, then prints per failure how often it came back:

    python ci/replay_failures.py --times 3 tallies/*.json

Exit status 0 (the verdicts are information; the property run's own status stands).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path


def replay_commands(paths: list[Path]) -> dict[tuple[str, str], str]:
    """(kernel, property) -> the replay command of its last failure (its record's)."""
    found = {}
    for path in paths:
        for row in json.loads(path.read_text()):
            record = row.get("failure") or {}
            if row["failed"] and record.get("replay"):
                found[(row["kernel"], row["property"])] = record["replay"]
    return found


def replay(command: str, times: int, timeout: float) -> list[str]:
    """Outcomes of ``times`` runs: "failed", "passed", "timeout" or "error (exit N)"."""
    argv = shlex.split(command)
    if argv[0] == "python":
        argv[0] = sys.executable
    outcomes = []
    for _ in range(times):
        try:
            rc = subprocess.run(argv, capture_output=True, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            outcomes.append("timeout")
            continue
        outcomes.append({0: "passed", 1: "failed"}.get(rc, f"error (exit {rc})"))
    return outcomes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tallies", nargs="+", type=Path)
    parser.add_argument("--times", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per replay")
    args = parser.parse_args(argv)
    commands = replay_commands(args.tallies)
    if not commands:
        print("replays: no failure to replay")
        return 0
    print(f"replays: each failure's problem alone, in {args.times} fresh processes")
    for (kernel, prop), command in sorted(commands.items()):
        outcomes = replay(command, args.times, args.timeout)
        failed = outcomes.count("failed")
        verdict = "reproduces" if failed == args.times else "FLAKY" if failed else "does not reproduce"
        print(f"  {kernel} / {prop}: {verdict} ({failed} of {args.times} failed: {', '.join(outcomes)})")
        print(f"    {command}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
