"""The property and fuzz phases of ``ci/gpu_check.py``: one pytest-xdist run per kernel, the
state folder that makes calls add up, and each phase's report.

A property run cut off by its time limit is kept in the state folder as a part: its tally, and
the tests that passed (pytest's ``-rp`` summary). A later call's run with the same arguments
deselects those tests and reports the parts' tallies with its own, so a kernel's property suite
advances over calls shorter than it, as the fuzz phase's examples do.

A fuzz run splits each property test into ``fuzz_split`` shards (the plugin's ``--shards``),
shard ``i`` drawing its share of the examples with Hypothesis seed ``BASE + i``
(``harness/campaign.py``): the workers take different shards, so they fuzz one property in
different parts of the space. A call's ``BASE`` is the first seed no kept call ran
(:meth:`State.next_seed`), so the calls' examples are distinct and their tallies add up.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import re
import shlex
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import limited
import replay_failures
from flashprop.harness import campaign, compile_locks, report
from gpu_settings import LEAST_SECONDS, NOT_STARTED, ROOT, Config, SettingError, say

from flashprop.commands import property_args

#: Sources whose version decides the results: the state folder is keyed by their hash. Every
#: package of the distribution but the benchmarks (``pyproject.toml``'s package-dir), and the
#: plugin's conftest: a change to the strategies (``harness``) or the tolerance model and the
#: declarations (``contract``) changes what a property run checks as much as a kernel's.
SOURCES = ("conftest.py", "flashprop", "contract", "harness", "kernels", "properties", "refimpl")


def sources_hash(root: Path = ROOT) -> str:
    """16 hex digits of the SHA-256 of :data:`SOURCES`' Python and CUDA files, in path order."""
    tops = [root / name for name in SOURCES]
    files = sorted(p for top in tops for p in ([top] if top.is_file() else top.rglob("*"))
                   if p.suffix in (".py", ".cu", ".cuh") and p.is_file())
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def build_cuda_kernel() -> None:
    """The ``cuda`` kernel's extension, built (or found built) once, by one process, before
    parallel processes race for it."""
    code = ("from flashprop.kernels.cuda_attention import unavailable_reason as r; "
            "print('cuda kernel:', r() or 'built')")
    print(subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True).stdout,
          end="", flush=True)


def tag(kernel: str) -> str:
    """A kernel spec as part of a file name."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", kernel)


@dataclass
class Run:
    """One pytest run of the property or fuzz phase. ``args``: what decides its results (the
    state folder's key); the workers and the tally file are added when it runs."""

    phase: str
    kernel: str
    args: list[str]
    seeds: tuple[int, int] | None = None
    exit: int | None = None
    seconds: float = 0.0
    reused: bool = False
    #: Tests that passed in earlier calls' parts of this run (deselected), and those parts' names.
    done: list[str] = field(default_factory=list)
    earlier: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        seeds = f".seeds{self.seeds[0]}-{self.seeds[1]}" if self.seeds else ""
        return f"{self.phase}.{tag(self.kernel)}{seeds}"


#: A test that passed, as pytest's short summary (``-rp``) names it.
_PASSED = re.compile(r"^PASSED (.+)$", re.MULTILINE)


def passed_tests(log: str) -> list[str]:
    """The node ids of the tests that passed, from a run's output."""
    return sorted(set(_PASSED.findall(log)))


def property_runs(cfg: Config) -> list[Run]:
    """One run per kernel of the property phase (``--max-examples`` from NAME@N)."""
    return [Run("properties", kernel, property_args([kernel], profile=cfg.profile, targets=cfg.files,
                                                    device=cfg.device, max_examples=examples or None))
            for kernel, examples in cfg.kernels]


def fuzz_runs(cfg: Config, base: int, complete: dict[str, list[str]] | None = None) -> list[Run]:
    """One run per fuzz kernel: the fuzz profile, each property test in ``fuzz_split`` shards
    with seeds ``base .. base + fuzz_split - 1``, in the time box ``fuzz_time`` when one is set,
    leaving out (``--skip-property``) the kernel's ``complete`` properties: those that earlier
    calls ran to their count (:meth:`State.complete`)."""
    shards = ["--shards", str(cfg.fuzz_split), "--hypothesis-seed", str(base)]
    shards += ["--time", cfg.fuzz_time] if cfg.fuzz_time else []
    left_out = {kernel: [a for prop in props for a in ("--skip-property", prop)]
                for kernel, props in (complete or {}).items()}
    return [Run("fuzz", kernel, [*property_args([kernel], profile="fuzz", targets=cfg.files,
                                                device=cfg.device, max_examples=cfg.fuzz_examples), *shards,
                                 *left_out.get(kernel, [])],
                (base, base + cfg.fuzz_split - 1))
            for kernel in cfg.fuzz_kernels]


@dataclass(frozen=True)
class Progress:
    """Where a campaign stands on one property of one kernel: the examples its kept fuzz calls
    ran, the count it is to reach (None: no kept call gave one), and whether one of them failed."""

    kernel: str
    prop: str
    ran: int
    count: int | None
    failed: bool

    @property
    def left(self) -> int | None:
        """The examples still short of its count; None where it has no count or failed."""
        return None if self.count is None or self.failed else max(0, self.count - self.ran)

    @property
    def done(self) -> bool:
        """At its count without a failure: the next call leaves it out."""
        return self.left == 0


class State:
    """``FLASHPROP_GPU_STATE``: per version of the sources (:func:`sources_hash`), each kept run's
    tally (``NAME.json``), output (``NAME.log``) and record (``NAME.run.json``: its kernel,
    arguments, exit status, seconds and seeds). A property run that passed is taken from here by
    a later call with the same arguments; every fuzz run that left a tally is kept (cut off or
    failed too: its examples ran), each with its own seeds, and they add up. The folder is small:
    carried to another machine, a later call goes on while the sources are the same."""

    def __init__(self, root: Path, sources: str):
        self.folder = root / sources
        self.folder.mkdir(parents=True, exist_ok=True)

    def _kept(self, pattern: str) -> list[dict]:
        """The records of the kept runs whose names match ``pattern``, each with its ``name``."""
        return [{**json.loads(path.read_text()), "name": path.name.removesuffix(".run.json")}
                for path in sorted(self.folder.glob(f"{pattern}.run.json"))]

    def records(self, phase: str) -> list[dict]:
        """The kept runs of ``phase``, each record with its ``name``."""
        return self._kept(f"{phase}.*")

    def next_seed(self) -> int:
        """The first seed after every kept fuzz run's (0 in a new folder)."""
        return max((r["seeds"][1] + 1 for r in self.records("fuzz")), default=0)

    def progress(self, examples: int) -> list[Progress]:
        """Each (kernel, property) the kept fuzz calls ran or asked for (a row of skips alone is
        not one): the examples they ran between them, the count a call of ``examples`` examples
        per property asks of it (its weight applied: a kept call's ``asked`` scaled by
        ``examples`` over its own ``--max-examples``; None where no kept call says), and whether
        one of them failed it."""
        ran: dict[tuple[str, str], int] = defaultdict(int)
        target: dict[tuple[str, str], float] = {}
        failed: set[tuple[str, str]] = set()
        for record in self.records("fuzz"):
            args = record["args"]
            own = int(args[args.index("--max-examples") + 1]) if "--max-examples" in args else None
            for row in json.loads((self.folder / f"{record['name']}.json").read_text()):
                key = (row["kernel"], row["property"])
                ran[key] += sum(row[outcome] for outcome in report.OUTCOMES)
                if row["failed"]:
                    failed.add(key)
                if own and row.get("asked"):
                    target[key] = max(target.get(key, 0.0), row["asked"] * examples / own)
        return [Progress(kernel, prop, count,
                         math.ceil(target[kernel, prop]) if (kernel, prop) in target else None,
                         (kernel, prop) in failed)
                for (kernel, prop), count in sorted(ran.items())
                if count or (kernel, prop) in target]  # not a row of skips only

    def complete(self, examples: int) -> dict[str, list[str]]:
        """Kernel -> the properties whose kept fuzz calls ran, between them, at least their count
        at ``examples`` examples per property (:meth:`progress`), without a failure. Leaving them
        out of the next call gives its time to the properties still short of their count, the
        slow ones (a time box shares a call evenly among those it runs)."""
        found: dict[str, list[str]] = defaultdict(list)
        for row in self.progress(examples):
            if row.done:
                found[row.kernel].append(row.prop)
        return dict(found)

    def check_seeds(self, runs: list[Run]) -> None:
        """Refuse seeds a kept run of the same kernel ran (they would draw its examples again)."""
        for run in runs:
            for record in self.records("fuzz"):
                first, last = record["seeds"]
                if record["kernel"] == run.kernel and first <= run.seeds[1] and run.seeds[0] <= last:
                    raise SettingError(f"fuzz seeds {run.seeds[0]}..{run.seeds[1]} of {run.kernel}: "
                                       f"{first}..{last} ran in an earlier call ({self.folder}); "
                                       "leave FLASHPROP_GPU_FUZZ_SEED unset to take fresh ones")

    def parts(self, run: Run) -> list[dict]:
        """The kept parts of property run ``run`` (earlier calls' cut-off runs with its arguments)."""
        return [r for r in self._kept(f"{run.name}.part*") if r["args"] == run.args]

    def take(self, run: Run, parts: Path) -> bool:
        """Copy a passed run with the same arguments into ``parts``; True if there was one. Else
        the run's kept parts: their tallies and logs into ``parts``, their passed tests into
        ``run.done`` (this call's run deselects them)."""
        for part in self.parts(run):
            for suffix in (".json", ".log"):
                kept = self.folder / f"{part['name']}{suffix}"
                (parts / kept.name).write_text(kept.read_text())
            run.earlier.append(part["name"])
            run.done = sorted({*run.done, *part["passed"]})
        record = self.folder / f"{run.name}.run.json"
        if not record.is_file():
            return False
        kept = json.loads(record.read_text())
        if kept["exit"] != 0 or kept["args"] != run.args:
            return False
        (parts / f"{run.name}.json").write_text((self.folder / f"{run.name}.json").read_text())
        log = (self.folder / f"{run.name}.log").read_text()
        (parts / f"{run.name}.log").write_text(
            f"=== {run.phase}: finished in an earlier call (FLASHPROP_GPU_STATE {self.folder})\n{log}")
        run.exit, run.seconds, run.reused = 0, kept["seconds"], True
        return True

    def keep(self, run: Run, parts: Path) -> None:
        """Keep a run that ran: a property run that passed, a fuzz run that left a tally, a property
        run that did not pass but passed some tests (a part: those tests are not run again)."""
        tally = parts / f"{run.name}.json"
        if run.reused or not tally.is_file():
            return
        name, extra, rows = run.name, {}, json.loads(tally.read_text())
        if run.phase == "properties" and run.exit != 0:
            passed = passed_tests((parts / f"{run.name}.log").read_text(errors="replace"))
            if not passed:
                return
            name = f"{run.name}.part{len(self._kept(f'{run.name}.part*')) + 1}"
            extra = {"passed": passed}
            # the properties the stop cut run again in the next call: their partial counts and
            # notes would be added to that run's (a failure found before the cut stays)
            rows = [row for row in rows if row["failed"] or not any(
                note.startswith(campaign.STOPPED) for note in row.get("skipped", []))]
        (self.folder / f"{name}.json").write_text(json.dumps(rows))
        (self.folder / f"{name}.log").write_text((parts / f"{run.name}.log").read_text())
        (self.folder / f"{name}.run.json").write_text(json.dumps(
            {"kernel": run.kernel, "args": run.args, "exit": run.exit, "seconds": round(run.seconds, 1),
             "seeds": run.seeds, **extra}, indent=1))


def pytest_command(cfg: Config, run: Run, tally: Path) -> list[str]:
    """The run's command: its arguments, the tests it leaves out (passed in earlier calls), the
    xdist workers (when ``jobs`` > 1), the tally file; the summary names the passed tests."""
    workers = ["-n", str(cfg.jobs), "--dist", "load"] if cfg.jobs > 1 else []
    done = [arg for test in run.done for arg in ("--deselect", test)]
    return [sys.executable, "-m", "pytest", *run.args, *done, *workers, "-p", "no:cacheprovider", "-q",
            "-rsp", "--tally-json", str(tally)]


def execute(cfg: Config, run: Run, parts: Path, deadline: float, share: int = 1) -> None:
    """Run ``run`` within ``property_timeout`` and the deadline, and within ``1 / share`` of the
    time left to it (exit 125 when less than LEAST_SECONDS is left: not started); its output in
    ``parts/NAME.log``, its tally beside."""
    command = pytest_command(cfg, run, parts / f"{run.name}.json")
    log = parts / f"{run.name}.log"
    limit = min(cfg.property_timeout, (deadline - time.monotonic()) / share)
    if limit < LEAST_SECONDS:
        log.write_text(f"=== {run.phase}: not started (FLASHPROP_GPU_POOL_SECONDS reached): "
                       f"{shlex.join(command)}\n")
        run.exit = NOT_STARTED
        return
    # the workers compile each Triton kernel variant once between them (harness/compile_locks.py)
    env = dict(os.environ, FLASHPROP_TRITON_COMPILE_LOCKS=str(parts / "compile-locks"))
    if cfg.ids_given:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(cfg.ids)
    say(f"{run.name}: {shlex.join(command[1:])}")
    start = time.monotonic()
    with log.open("w") as out:
        out.write(f"=== {run.phase}: {shlex.join(command)}\n")
        out.flush()
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        code = limited.stop(proc, limit)
        run.exit = 0 if code == 5 else code  # 5: every collected test deselected (meta-tests only)
        run.seconds = time.monotonic() - start
        out.write(f"=== exit {run.exit} after {run.seconds:.0f} s\n")
    say(f"{run.name}: exit {run.exit} after {run.seconds:.0f} s")


def merged_table(tallies: list[Path]) -> str:
    """``python -m flashprop.harness.report`` of the tallies (run in this process): the merged table
    and each failure."""
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        report.main([str(p) for p in tallies])
    return text.getvalue().rstrip()


def run_phase(cfg: Config, phase: str, runs: list[Run], parts: Path, state: State | None,
              deadline: float) -> tuple[int, str]:
    """Run the phase's runs (a property run that passed in an earlier call is taken from the
    state folder, and with one each property run gets at most an even share of the time left),
    write ``OUT/PHASE.log``; the phase's exit status (1 if a run did not pass) and
    its report: the merged table, the runs that did not pass, the replays, and with a state
    folder the fuzz table of every call."""
    resumable = phase == "properties" and state is not None
    to_run = [run for run in runs if not (resumable and state.take(run, parts))]
    for left, run in zip(range(len(to_run), 0, -1), to_run):
        # a property run that resumes in the next call gets an even share of what is left, so
        # that every kernel advances in a call shorter than their suites
        execute(cfg, run, parts, deadline, share=left if resumable else 1)
        if state is not None:
            state.keep(run, parts)
    logs = [parts / f"{r.name}.log" for r in runs]
    (cfg.out / f"{phase}.log").write_text("".join(p.read_text() for p in logs if p.is_file()))
    tallies = [parts / f"{name}.json" for r in runs for name in (*r.earlier, r.name)
               if (parts / f"{name}.json").is_file()]
    lines = [merged_table(tallies) if tallies else "no tallies", ""]
    failed = [r for r in runs if r.exit != 0]
    if failed:
        lines.append(f"runs with a non-zero exit (124: time limit, {NOT_STARTED}: not started, 137: killed "
                     "after ignoring the interrupts):")
        lines += [f"  {r.name}: exit {r.exit}" for r in failed]
    lines.append(f"(runs: {len(runs)}, taken from an earlier call: {sum(r.reused for r in runs)}; tests "
                 f"passed in earlier calls' cut-off runs, not run again: {sum(len(r.done) for r in runs)})")
    compiled = compile_locks.summary([p.read_text(errors="replace") for p in logs if p.is_file()])
    if compiled:  # with compile locks: on the GPU
        lines.append(compiled)
    if cfg.replays > 0 and tallies:
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            replay_failures.main(["--times", str(cfg.replays), "--budget",  # the pool bounds them too
                                  str(max(0.0, deadline - time.monotonic())), *map(str, tallies)])
        lines += ["", text.getvalue().rstrip()]
    if phase == "fuzz" and state is not None:
        lines += ["", state_table(state, cfg.fuzz_examples)]
    return int(bool(failed)), "\n".join(lines)


def state_table(state: State, examples: int) -> str:
    """The fuzz tallies of every kept call, merged, with their count and seeds; then where the
    campaign of ``examples`` examples per property stands: how many tests are at their count, and
    each other one with the examples it still needs (or that it failed)."""
    records = state.records("fuzz")
    if not records:
        return f"no fuzz run kept in {state.folder}"
    seeds = sorted({tuple(r["seeds"]) for r in records})
    rows = state.progress(examples)
    short = [row for row in rows if not row.done]
    left = sum(row.left or 0 for row in short)
    lines = [
        f"every fuzz call with these sources ({state.folder}):",
        merged_table([state.folder / f"{r['name']}.json" for r in records]),
        f"(runs: {len(records)}, passed: {sum(r['exit'] == 0 for r in records)}, failed or cut off: "
        f"{sum(r['exit'] != 0 for r in records)}; seeds "
        f"{', '.join(f'{a}..{b}' for a, b in seeds)})",
        f"at {examples} examples per property: {len(rows) - len(short)} of {len(rows)} tests at their "
        f"count, {sum(row.ran for row in rows)} examples run"
        + (f", {left} left" if short else "; the campaign is done"),
    ]
    for row in short:
        said = ("failed" if row.failed else "no count (no kept call asked it)" if row.count is None
                else f"{row.ran} of {row.count}, {row.left} left")
        lines.append(f"  {row.kernel}  {row.prop}: {said}")
    return "\n".join(lines)
