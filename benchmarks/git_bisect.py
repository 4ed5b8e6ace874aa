"""``flashprop bisect GOOD BAD --row ROW``: the first commit at which a benchmark row regressed,
found by A/B runs (``flashprop bench --against GOOD``, :mod:`.against`) driven by ``git bisect run``.

1. BAD is A/B-timed against GOOD on the row (``--candidate BAD``): if it shows no regression there
   is nothing to bisect (exit 1, with its table); if the A/B cannot run, exit 2.
2. ``git bisect start --no-checkout BAD GOOD`` runs in a temporary worktree, so the user's tree,
   index and any bisect of their own are left alone; ``git bisect run`` calls a step script that
   A/B-times the commit under test (``BISECT_HEAD``) against GOOD in a fresh process, from the
   folder the command was started in: ``flashprop bench --against GOOD --candidate COMMIT --row ROW
   --no-history``. Its exit status maps to git's: 0 (no regression: ok, unclear or faster) good,
   1 (REGRESSION) bad, anything else (the A/B could not run) 125, skip.
3. The first bad commit git names is printed with the A/B table measured at it.

Each step is a fresh process that imports both revisions (:mod:`.revision`), so a commit under
test needs nothing of flashprop's own: the flashprop running the steps is the one that started
the bisect. Exit status 0 when a first bad commit was found, 1 when none was (BAD does not regress,
or skipped commits left it open), 2 on a usage error.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from .against import Comparison, table
from .revision import RevisionError, commit_of, git, repository_root, worktree

_FIRST_BAD = " is the first bad commit"


def step_command(ns: argparse.Namespace, good: str) -> list[str]:
    """The A/B command of one step, less ``--candidate`` and ``--json``."""
    command = [sys.executable, "-m", "flashprop.cli", "bench", "--against", good, "--row", ns.row,
               "--no-history", "--threshold", str(ns.threshold)]
    for option, value in (("--bench-kernels", ns.kernel), ("--device", ns.device),
                          ("--rounds", ns.rounds)):
        if value is not None:
            command += [option, str(value)]
    return [*command, *ns.pytest_args]


def _step_script(command: list[str], cwd: Path, results: Path) -> str:
    """The ``git bisect run`` script: A/B the commit under test, map the exit status."""
    return f"""import subprocess, sys
commit = subprocess.run(["git", "rev-parse", "BISECT_HEAD"], capture_output=True, text=True,
                        check=True).stdout.strip()
command = {command!r} + ["--candidate", commit, "--json", {str(results)!r} + "/" + commit + ".json"]
status = subprocess.run(command, cwd={str(cwd)!r}).returncode
sys.exit({{0: 0, 1: 1}}.get(status, 125))
"""


def _ab(command: list[str], commit: str, results: Path) -> int:
    """Run one A/B of ``commit`` (its output shown); its exit status."""
    json_file = str(results / f"{commit}.json")
    return subprocess.run([*command, "--candidate", commit, "--json", json_file]).returncode


def _bisect_run(tree: Path, script: Path) -> list[str]:
    """``git bisect run`` of the step script in ``tree``, its output shown as it comes; its lines."""
    lines = []
    with subprocess.Popen(["git", "bisect", "run", sys.executable, str(script)], cwd=tree, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as proc:
        for line in proc.stdout:
            print(line, end="", flush=True)
            lines.append(line.rstrip("\n"))
    if lines and not lines[-1]:
        lines.pop()
    print()
    return lines


def _print_table(path: Path) -> None:
    data = json.loads(path.read_text())
    rows = [Comparison(**row) for row in data["rows"]]
    print("\n".join([f"A/B at it: candidate {data['candidate']} against base {data['base']}",
                     *table(rows, data["confidence"]), data["summary"]]))


def run(ns: argparse.Namespace) -> int:
    """Bisect (module docstring); the exit status."""
    cwd = Path.cwd()
    repo = repository_root(cwd)
    try:
        if repo is None:
            raise RevisionError(f"{cwd} is not in a git repository")
        good, bad = commit_of(ns.good, repo), commit_of(ns.bad, repo)
    except RevisionError as err:
        print(f"flashprop bisect: {err}", file=sys.stderr)
        return 2
    command = step_command(ns, good)
    print(f"flashprop bisect: each step runs {shlex.join(command)} --candidate COMMIT", flush=True)
    with tempfile.TemporaryDirectory(prefix="flashprop-bisect-") as tmp:
        results = Path(tmp)
        status = _ab(command, bad, results)
        if status == 0:
            print(f"flashprop bisect: {ns.bad} shows no regression against {ns.good} at {ns.row!r}: "
                  "nothing to bisect")
            return 1
        if status != 1:
            print(f"flashprop bisect: the A/B of {ns.bad} against {ns.good} did not run (exit {status})",
                  file=sys.stderr)
            return 2
        script = results / "step.py"
        script.write_text(_step_script(command, cwd, results))
        with worktree(repo, bad) as tree:
            try:
                git(["bisect", "start", "--no-checkout", bad, good], tree)
                output = _bisect_run(tree, script)
            finally:
                subprocess.run(["git", "bisect", "reset"], cwd=tree, capture_output=True)
        found = [line.split()[0] for line in output if line.endswith(_FIRST_BAD)]
        if not found:
            print("flashprop bisect: git bisect named no first bad commit (see its output above)")
            return 1
        first = git(["rev-parse", found[0]], repo)
        subject = git(["log", "-1", "--format=%h %s", first], repo)
        print(f"flashprop bisect: the first bad commit at {ns.row!r} is {first} ({subject})")
        measured = results / f"{first}.json"
        if measured.is_file():
            _print_table(measured)
        return 0
