"""Run the property suite against every planted-bug kernel: ``python -m mutants.run``.

1. The fuzz job on the unmutated kernels (``ref-blocked`` and ``triton``, CI profile, one
   subprocess each) must pass: a suite that fails correct kernels proves nothing by failing
   mutants.
2. The mutants run in a few batches, one pytest subprocess each (``--kernel`` per mutant: the
   imports and the collection are paid once per batch, not per mutant). The probe plugin
   (:mod:`mutants.probe`) stops each mutant at its first failing property (``-x`` per kernel)
   or at its time budget, and gives the property, the examples and the seconds (of that
   mutant's own tests) to the first failure, and the shrunk problem. A mutant is *caught* when a
   property fails.
3. A table (mutant, class, caught, property, examples, seconds, problem) is printed and, with
   ``--out``, written as markdown. Exit status 1 if a correct kernel fails or a mutant survives.

The default ``tox`` run's ``py`` environment runs the same CI-profile suite on the correct
kernels and leaves a pass record (``--write-pass-record``); ``tox -e mutants`` after it (as CI's
``.ci/run`` does) takes the baseline from that record instead of running it twice, provided the
record is newer than every source file and names every correct kernel. Without a current record
``tox -e mutants`` runs the baseline itself.

Property files run cheapest and most discriminating first (:data:`FIRST`), gradcheck and the
error contract last (slow, or blind to wrong arithmetic), so that time to catch stays low.
``--jobs`` batches run at once (default: one per CPU core), each with its share of the cores'
threads; there are twice as many batches as jobs, balanced by expected cost. Everything runs
on the CPU (``--device cpu``, Triton's interpreter).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from flashprop.contract.registry import CPU_KERNELS, expand_specs
from flashprop.harness.campaign import usable_cores

from flashprop.commands import property_args
from mutants.catalogue import MUTANTS, ROOT, TRITON_DECODE, Mutant, mutated_source

#: Property files that run first, in this order (cheap, and between them they see most bug
#: classes); the rest follow alphabetically, then LAST (slow, or blind to wrong arithmetic).
#: test_robustness before test_variants: its triton run is about 13 s, test_variants' 105 s (and
#: ref-blocked's both under 6 s), and its empty-rows property catches triton_bwd_empty_rows_nan
#: in about 30 s, which test_variants' window-backward caught at 90 s of its 120 s budget.
FIRST = (
    "test_golden.py",
    "test_precision.py",
    "test_robustness.py",
    "test_variants.py",
    "test_determinism.py",
)
LAST = ("test_gradcheck.py", "test_error_contract.py")
#: Property files that run first for the mutants of one target, instead of FIRST: the decode
#: module's bugs live where its entry point is checked (the dense files before them pass a decode
#: mutant for over 120 s of its budget).
FIRST_BY_TARGET = {TRITON_DECODE: ("test_fp8.py", "test_kvcache.py", "test_precision.py")}
#: The correct kernels: the default CPU run's (contract.registry.CPU_KERNELS), slowest first.
CORRECT_KERNELS = tuple(sorted(CPU_KERNELS, key=lambda name: name != "triton"))

_PROBLEM = re.compile(r"^problem: (Problem\(.*\))$", re.MULTILINE)


@dataclass
class Outcome:
    """What the suite did to one mutant."""

    mutant: Mutant
    status: str  # "caught", "survived", "timeout" or "error"
    prop: str = "-"
    examples: int | None = None
    seconds: float | None = None
    problem: str = "-"
    detail: str = ""

    @property
    def caught(self) -> bool:
        return self.status == "caught"


def property_files(first_files: tuple[str, ...] = FIRST) -> list[str]:
    """The property test files in run order, ``first_files`` first (an entry ``file::test``
    stands for its file)."""
    found = sorted(p.name for p in (ROOT / "properties").glob("test_*.py"))
    first = [f for f in dict.fromkeys(e.split("::")[0] for e in first_files) if f in found]
    last = [f for f in LAST if f in found]
    middle = [f for f in found if f not in first and f not in last]
    return [f"properties/{f}" for f in (*first, *middle, *last)]


def _env(threads: int, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONHASHSEED="0", OMP_NUM_THREADS=str(threads))
    env.update(extra or {})
    return env


def _pytest(kernels: list[str], *extra: str, first: tuple[str, ...] = FIRST) -> list[str]:
    return [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *extra,
            *property_args(kernels, profile="ci", targets=property_files(first), device="cpu")]


def first_files(mutant: Mutant) -> tuple[str, ...]:
    """The property files (and tests) that run first on ``mutant``: its own (``Mutant.first``),
    else its target's (:data:`FIRST_BY_TARGET`), else :data:`FIRST`."""
    return mutant.first or FIRST_BY_TARGET.get(mutant.target, FIRST)


def first_tests(first_files: tuple[str, ...]) -> list[str]:
    """The test functions a run order names (entries ``file::test``): :mod:`mutants.probe` runs
    them before the rest of their kernel's tests (``FLASHPROP_PROBE_FIRST``)."""
    return [e.split("::", 1)[1] for e in first_files if "::" in e]


def run_correct_kernel(kernel: str, timeout: float, threads: int) -> tuple[bool, float, str]:
    """The fuzz job on one unmutated kernel: ``(passed, seconds, output tail)``."""
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            _pytest([kernel]), cwd=ROOT, env=_env(threads), capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return False, time.perf_counter() - start, f"timed out after {timeout:.0f} s"
    output = proc.stdout + proc.stderr
    return proc.returncode == 0, time.perf_counter() - start, output[-4000:]


def run_batch(mutants: list[Mutant], budget: float, threads: int, shrink_seconds: float) -> list[Outcome]:
    """Run the suite on several mutants of one file order (:func:`first_files`) in one pytest
    subprocess (:mod:`mutants.probe` stops each at its first failing property, and at ``budget``
    seconds of its own tests)."""
    specs = {f"mutants.catalogue:{m.name}": m for m in mutants}
    with tempfile.TemporaryDirectory() as tmp:
        probe_out = Path(tmp) / "probe.json"
        env = {
            "FLASHPROP_PROBE_OUT": str(probe_out),
            "FLASHPROP_SHRINK_SECONDS": str(shrink_seconds),
            "FLASHPROP_PROBE_BUDGET": str(budget),
            "FLASHPROP_PROBE_FIRST": ",".join(first_tests(first_files(mutants[0]))),
        }
        # the probe enforces the budget between tests; the hard limit is for a test that hangs
        limit = budget * len(mutants) + 120
        try:
            proc = subprocess.run(
                _pytest(list(specs), "-p", "mutants.probe", first=first_files(mutants[0])),
                cwd=ROOT, env=_env(threads, env), capture_output=True, text=True, timeout=limit,
            )
            output = proc.stdout + proc.stderr
        except subprocess.TimeoutExpired:
            output = f"the batch's pytest process timed out after {limit:.0f} s"
        probes = json.loads(probe_out.read_text()) if probe_out.exists() else {}
    outcomes = []
    for spec, mutant in specs.items():
        probe = probes.get(spec)
        if probe is None:
            outcomes.append(Outcome(mutant, "error", detail=output.strip()[-300:]))
            continue
        problems = _PROBLEM.findall(probe.get("failure") or "")
        caught = probe["status"] == "caught"
        outcomes.append(
            Outcome(
                mutant,
                probe["status"],
                prop=probe.get("property") or "-",
                examples=probe.get("examples" if caught else "examples_total"),
                seconds=probe.get("seconds"),
                problem=problems[-1] if problems else "-",
                detail=probe.get("detail", ""),
            )
        )
    return outcomes


def batches(mutants: list[Mutant], count: int) -> list[list[Mutant]]:
    """``mutants`` in about ``count`` batches of about equal expected cost, catalogue order kept
    inside each (a Triton mutant under the interpreter costs about four ``ref-blocked`` ones);
    the mutants with first files of their own (:func:`first_files`) in a batch per order."""
    own = [m for m in mutants if first_files(m) != FIRST]
    rest = [m for m in mutants if first_files(m) == FIRST]
    count = max(1, count - len({first_files(m) for m in own}))
    loads = [0.0] * count
    split: list[list[Mutant]] = [[] for _ in range(count)]
    for mutant in sorted(rest, key=lambda m: m.kernel_family != "triton"):
        i = loads.index(min(loads))
        split[i].append(mutant)
        loads[i] += 4.0 if mutant.kernel_family == "triton" else 1.0
    split += [[m for m in own if first_files(m) == first] for first in dict.fromkeys(map(first_files, own))]
    order = {m.name: i for i, m in enumerate(mutants)}
    return [sorted(b, key=lambda m: order[m.name]) for b in split if b]


def write_pass_record(path: Path, kernels: list[str]) -> None:
    """Record that the CI-profile suite just passed on ``kernels`` (written only after it did)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"kernels": kernels, "profile": "ci"}))


def recorded_pass(path: Path) -> bool:
    """Whether ``path`` records a pass of every correct kernel, newer than every source file."""
    if not path.is_file():
        return False
    newest = max(f.stat().st_mtime for f in ROOT.rglob("*.py") if ".tox" not in f.parts)
    record = json.loads(path.read_text())
    return path.stat().st_mtime > newest and set(CORRECT_KERNELS) <= set(record.get("kernels", []))


def _fmt(value: float | int | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(outcomes: list[Outcome]) -> list[list[str]]:
    rows = [["mutant", "class", "caught", "property", "examples", "seconds", "problem"]]
    for o in outcomes:
        status = "caught" if o.caught else o.status.upper()
        rows.append(
            [
                o.mutant.name,
                o.mutant.bug_class,
                status,
                o.prop,
                _fmt(o.examples, "d"),
                _fmt(o.seconds, ".1f"),
                o.problem if o.caught else o.detail,
            ]
        )
    return rows


def markdown(rows: list[list[str]]) -> str:
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    return "\n".join([line(rows[0]), line(["---"] * len(rows[0])), *(line(r) for r in rows[1:])])


def plain(rows: list[list[str]]) -> str:
    """Fixed-width table without the (long) problem column."""
    short = [r[:-1] for r in rows]
    widths = [max(len(r[i]) for r in short) for i in range(len(short[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in short)


def summary(outcomes: list[Outcome], total: float, baseline: float | None) -> list[str]:
    """The closing lines; ``baseline`` is the slowest correct kernel's seconds (``None``: the
    baseline was not run here)."""
    caught = [o for o in outcomes if o.caught]
    times = [o.seconds for o in caught if o.seconds is not None]
    where = (
        "correct kernels not rerun"
        if baseline is None
        else f"correct-kernel fuzz job, slowest kernel: {baseline:.0f} s"
    )
    lines = [f"caught {len(caught)} of {len(outcomes)} mutants; total runtime {total:.0f} s ({where})"]
    if times:
        lines.append(
            f"median time to catch {statistics.median(times):.1f} s of the mutant's own tests "
            f"(max {max(times):.1f} s)"
        )
    survivors = [o for o in outcomes if not o.caught]
    lines += [f"NOT CAUGHT: {o.mutant.name} ({o.status}): {o.detail}" for o in survivors]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the table as markdown here")
    # 120 s of a mutant's own tests: triton_acc_fp16 needs about 106 examples of the precision
    # property (42 s on the 2-core CI machine), too close to a 60 s budget on a busy machine.
    parser.add_argument("--budget", type=float, default=120.0, help="seconds per mutant (default 120)")
    parser.add_argument(
        "--shrink-seconds",
        type=float,
        default=10.0,
        help="cap on Hypothesis shrinking per mutant (default 10)",
    )
    parser.add_argument(
        "--baseline-timeout",
        type=float,
        default=420.0,
        help="seconds for the fuzz job on each correct kernel (default 420)",
    )
    parser.add_argument("--jobs", type=int, default=usable_cores(),
                        help="subprocesses at once (default: the cores this process may use)")
    parser.add_argument("--only", nargs="*", default=None, help="run only these mutants")
    parser.add_argument(
        "--skip-baseline",
        action="store_true",
        help="skip the correct-kernel fuzz job (for debugging a mutant)",
    )
    parser.add_argument(
        "--baseline-record",
        type=Path,
        help="take the correct-kernel baseline from this pass record when it is current",
    )
    parser.add_argument(
        "--write-pass-record",
        type=Path,
        metavar="PATH",
        help="only write a pass record of --kernels to PATH (after the suite passed) and exit",
    )
    parser.add_argument("--kernels", nargs="*", default=[],
                        help="kernels a pass record names (+cpu: the default CPU run's)")
    args = parser.parse_args(argv)
    if args.write_pass_record is not None:
        write_pass_record(args.write_pass_record, expand_specs(args.kernels))
        return 0
    if args.baseline_record is not None and recorded_pass(args.baseline_record):
        print(f"correct kernels {', '.join(CORRECT_KERNELS)}: passed the same CI-profile suite "
              f"(pass record {args.baseline_record}); baseline not rerun", flush=True)
        args.skip_baseline = True
    threads = max(1, usable_cores() // args.jobs)
    selected = [m for m in MUTANTS if args.only is None or m.name in args.only]
    for mutant in selected:
        mutated_source(mutant)  # a drifted snippet fails here, before anything runs

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        baselines = {
            kernel: pool.submit(run_correct_kernel, kernel, args.baseline_timeout, threads)
            for kernel in ([] if args.skip_baseline else CORRECT_KERNELS)
        }
        futures = [
            pool.submit(run_batch, batch, args.budget, threads, args.shrink_seconds)
            for batch in batches(selected, 2 * args.jobs)
        ]
        baseline_ok, baseline_s = True, 0.0
        for kernel, future in baselines.items():
            ok, seconds, tail = future.result()
            baseline_ok, baseline_s = baseline_ok and ok, max(baseline_s, seconds)
            print(f"correct kernel {kernel}: {'pass' if ok else 'FAIL'} ({seconds:.0f} s)", flush=True)
            if not ok:
                print(tail)
        outcomes = []
        for future in futures:
            for outcome in future.result():
                outcomes.append(outcome)
                print(
                    f"  {outcome.mutant.name:34s} {outcome.status:8s} {outcome.prop:24s} "
                    f"{_fmt(outcome.seconds, '.1f'):>6s} s",
                    flush=True,
                )
    total = time.perf_counter() - start

    rows = table(outcomes)
    lines = summary(outcomes, total, None if args.skip_baseline else baseline_s)
    if not baseline_ok:
        lines.insert(0, "CORRECT KERNELS FAIL the fuzz job: the mutant results are not evidence")
    print()
    print(plain(rows))
    print("\n".join(lines))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        own: dict[tuple[str, ...], list[str]] = {}
        for o in outcomes:
            if first_files(o.mutant) != FIRST:
                own.setdefault(first_files(o.mutant), []).append(o.mutant.name)
        orders = [f"property files in run order: {', '.join(property_files())}"] + [
            f"for {', '.join(names)}: {', '.join([*first_tests(first), *property_files(first)])}"
            for first, names in own.items()
        ]
        args.out.write_text(
            "# flashprop mutants\n\n"
            + markdown(rows)
            + "\n\n"
            + "\n".join(f"- {x}" for x in [*lines, *orders])
            + "\n"
        )
    return 0 if baseline_ok and all(o.caught for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
