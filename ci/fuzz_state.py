#!/usr/bin/env python3
"""What ``FLASHPROP_GPU_STATE`` holds of unfinished processes, and the tallies of all calls.

ci/gpu-check keeps a finished property/fuzz process (exit 0) in the state folder as
``NAME.{json,log,rc,args}`` and does not run it again. A process cut off by its time limit
still ran and checked examples; its tally is kept beside as ``NAME.partial.json`` (with
``NAME.partial.args``, the command), so that repeated calls, and calls on another machine that
the folder was carried to, add up::

    python ci/fuzz_state.py keep PARTS/NAME.json STATE/NAME ARGS   # after a cut-off process
    python ci/fuzz_state.py table STATE fuzz                        # the cumulative tallies

A repeated process has the same command (file, kernel, seed, examples), so it draws the same
examples again before new ones: attempts of one process are not added, the one that ran the
most examples is kept (one with a failure before any without). ``table`` merges, per process,
its finished tally or else its best partial one; it exits 1 when any example failed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flashprop.properties import report


def _rank(path: Path) -> tuple[int, int]:
    """(examples failed, examples run) of a tally file: the order in which attempts are kept."""
    rows = json.loads(path.read_text())
    return (sum(r["failed"] for r in rows),
            sum(r["passed"] + r["refused"] + r["failed"] for r in rows))


def keep(tally: Path, stem: Path, args: str) -> bool:
    """Store ``tally`` as ``stem.partial.json`` unless the one there, from the same command,
    ranks higher; True when stored."""
    kept, kept_args = stem.with_name(stem.name + ".partial.json"), stem.with_name(stem.name + ".partial.args")
    try:
        rank = _rank(tally)
    except (OSError, ValueError):  # killed before or while pytest wrote it
        return False
    same = kept.is_file() and kept_args.is_file() and kept_args.read_text().strip() == args.strip()
    if same and _rank(kept) >= rank:
        return False
    kept.write_text(tally.read_text())
    kept_args.write_text(args.strip() + "\n")
    return True


def tallies(state: Path, phase: str) -> tuple[list[Path], int, int]:
    """Per process of ``phase`` in ``state``: its finished tally, else its partial one; and how
    many of each."""
    finished = {p.name[: -len(".rc")] for p in state.glob(f"{phase}.*.rc") if p.read_text().strip() == "0"}
    partial = {p.name[: -len(".partial.json")] for p in state.glob(f"{phase}.*.partial.json")}
    paths = [state / f"{n}.json" for n in sorted(finished)]
    paths += [state / f"{n}.partial.json" for n in sorted(partial - finished)]
    return paths, len(finished), len(partial - finished)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    k = sub.add_parser("keep", help="keep a cut-off process's tally if it ran the most examples")
    k.add_argument("tally", type=Path)
    k.add_argument("stem", type=Path, help="STATE/NAME")
    k.add_argument("args", help="the process's command line, as stored in NAME.args")
    t = sub.add_parser("table", help="the tallies of every process in the state folder, merged")
    t.add_argument("state", type=Path)
    t.add_argument("phase", choices=("properties", "fuzz"))
    args = parser.parse_args(argv)
    if args.command == "keep":
        keep(args.tally, args.stem, args.args)
        return 0
    paths, n_finished, n_partial = tallies(args.state, args.phase)
    if not paths:
        print(f"no {args.phase} process in {args.state}")
        return 0
    code = report.main([str(p) for p in paths])  # the merged table, each failure, exit 1 if any
    print(f"({n_finished} processes finished, {n_partial} cut off: their most examples)")
    return code


if __name__ == "__main__":
    sys.exit(main())
