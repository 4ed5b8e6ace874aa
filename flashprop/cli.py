"""The ``flashprop`` command.

    flashprop fuzz KERNEL [KERNEL ...] [--max-examples N] [--time 10m] [--device cpu|cuda]
                   [-n WORKERS] [--json FILE] [--junit-xml FILE] [--example-db DIR|URL]
                   [--properties P ...] [--tracebacks | --tracebacks-file FILE] [--all-skips]
    flashprop kernels                   the registered kernels and what each declares
    flashprop replay KERNEL PROPERTY:Problem(...)   one property on one problem (failures print it)
    flashprop bench [--bench-kernels K,...] [--bench-subset NAME] [--device cpu|cuda]
                    [--suites attention memory layer suite] [--json FILE] [--out DIR]
    flashprop bench --against REV|KERNEL [--candidate REV] [--row LABEL ...] [--threshold 0.05]
    flashprop bench --repeat N --write-baseline BASELINE        learn each row's noise band
    flashprop bench --report [--history FILE] [--out DIR]      trend plot, slow-drift flags
    flashprop gate BASELINE RESULTS.json [...] [--update | --replace] [--tolerance T]
    flashprop bisect GOOD BAD --row LABEL [--kernel SPEC] [--threshold 0.05]

``fuzz`` is the main job: every applicable property on the kernel (a registered name,
``module:attr`` or ``path/to/file.py:attr``) with the ``fuzz`` Hypothesis profile; the output
ends with the per-property table and each failure's cause once, shrunk, with its repro (pytest's
tracebacks go to a file, :func:`tracebacks_file`; ``--all-skips`` lists each test that drew
nothing, with its reason); exit status 1 on any failure. It runs pytest on the installed property
modules (``flashprop.properties``). ``bench`` times kernels on the benchmark grid
(``flashprop.benchmarks``, pytest-benchmark) and prints the table; ``bench --against`` times a
kernel against its version at a git revision (or another kernel) interleaved in one process and
fails a row whose ratio's interval lies beyond the threshold; ``gate`` compares a bench run's
anchor ratios with a baseline, each row within its learned noise band, exit 1 on a regression;
``bisect`` finds the commit that slowed a row. Arguments ``fuzz`` and ``bench`` do not know, and
anything after ``--``, go to pytest (``bisect``'s to each step's ``bench --against``).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
from importlib.metadata import entry_points
from pathlib import Path
from typing import NoReturn

from flashprop.commands import property_args
from flashprop.plugin import MAX_EXAMPLES_HELP, example_count

#: The property modules, as ``fuzz --properties`` names them (``golden`` for test_golden.py).
PACKAGE = "flashprop.properties"
#: ``bench --suites``: the benchmark modules of ``flashprop.benchmarks`` (``benchmarks/``).
SUITES = {"attention": "bench_attention", "memory": "bench_memory", "layer": "bench_layer",
          "suite": "bench_suite"}
#: ``bench``'s grid options, passed on to pytest (and read by ``--against``).
GRID_OPTIONS = ("--bench-seqlens", "--bench-head-dims", "--bench-dtypes", "--bench-modes",
                "--bench-variants", "--bench-anchors")


def _plugin_args() -> list[str]:
    """Load the plugin by module unless an installed flashprop registered it already."""
    if any(ep.name == "flashprop" for ep in entry_points(group="pytest11")):
        return []
    return ["-p", "flashprop.plugin"]


def _pytest(args: list[str]) -> int:
    import pytest

    quiet = ["-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning"]
    return int(pytest.main([*_plugin_args(), *quiet, *args]))


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error said in one line (and exit status 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _duration(text: str) -> str:
    """``--time``'s value, checked (``harness.timebox.parse_duration``)."""
    from flashprop.harness.timebox import parse_duration

    try:
        parse_duration(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def property_names() -> list[str]:
    """The property modules ``fuzz --properties`` names (``golden`` for test_golden.py)."""
    import pkgutil

    package = importlib.import_module(PACKAGE)
    return sorted(m.name.removeprefix("test_") for m in pkgutil.iter_modules(package.__path__)
                  if m.name.startswith("test_"))


def usage_problem(ns: argparse.Namespace) -> str | None:
    """What is wrong with a ``fuzz`` command line before any test runs, in one line (a kernel spec
    naming nothing, an unknown property), or ``None``."""
    known = property_names()
    unknown = [name for name in ns.properties or () if name not in known]
    if unknown:
        return f"unknown property {', '.join(unknown)}; the properties are: {' '.join(known)}"
    from flashprop.contract.registry import KernelSpecError, expand_specs, spec_problem

    try:
        ns.kernel = expand_specs(ns.kernel)
    except KernelSpecError as err:
        return str(err)
    return spec_problem(ns.kernel)


def fuzz(ns: argparse.Namespace) -> int:
    """Fuzz kernels with every applicable property (the fuzz profile); the output ends with the
    table (examples run and asked per property, skip reasons) and the failures by cause; pytest's
    tracebacks go to a file unless --tracebacks. Exit status 1 on any failure, 2 on a command
    line naming no kernel or no property (said in one line, before any test runs)."""
    from flashprop.plugin import prepare_device

    prepare_device(ns.device)  # before a user's kernel module imports triton
    problem = usage_problem(ns)
    if problem:
        print(f"flashprop fuzz: {problem}", file=sys.stderr)
        return 2
    targets = [f"{PACKAGE}.test_{name}" for name in ns.properties] if ns.properties else [PACKAGE]
    args = [*property_args(ns.kernel, profile="fuzz", targets=targets, pyargs=True, device=ns.device,
                           max_examples=ns.max_examples), "-q", "-W", "ignore::RuntimeWarning"]
    if not ns.tracebacks:  # the table and the failures by cause are the report; tracebacks to a file
        args += ["--tracebacks-file", tracebacks_file(ns)]
    for option, value in (("--tally-json", ns.json), ("--junitxml", ns.junit_xml),
                          ("--example-db", ns.example_db), ("-n", ns.workers), ("--time", ns.time)):
        if value is not None:
            args += [option, str(value)]
    return _pytest([*args, *ns.pytest_args])


#: ``fuzz``'s tracebacks file: in the folder of its --json or --junit-xml file, else in
#: ``.flashprop/`` of the working folder; one name, so each run replaces the last one's.
TRACEBACKS = "flashprop-tracebacks.txt"


def tracebacks_file(ns: argparse.Namespace) -> str:
    """Where ``fuzz`` writes pytest's tracebacks: --tracebacks-file, else :data:`TRACEBACKS` next
    to the run's --json (or --junit-xml) file, else in ``.flashprop/`` here (a run without
    failures removes it)."""
    if ns.tracebacks_file:
        return ns.tracebacks_file
    beside = ns.json or ns.junit_xml
    return str(Path(beside).parent / TRACEBACKS if beside else Path(".flashprop") / TRACEBACKS)


def replay(ns: argparse.Namespace) -> int:
    """Run one property on one problem, as a failure report prints it; ``--test MODULE::FUNCTION``
    (the report gives it) collects only that property test."""
    target = f"{PACKAGE}.{ns.test}" if ns.test else PACKAGE  # --pyargs takes MODULE::FUNCTION
    args = ["--pyargs", target, "-q", "-m", "not meta", "--kernel", ns.kernel, "--replay", ns.problem]
    if ns.device:
        args += ["--device", ns.device]
    if not ns.tracebacks:  # the report is flashprop's, as fuzz prints it; the traceback to a file
        args += ["--tracebacks-file", str(Path(".flashprop") / TRACEBACKS)]
    return _pytest(args)


def _option_name(option: str) -> str:
    return option[2:].replace("-", "_")


def _grid_args(ns: argparse.Namespace) -> list[str]:
    """The grid's options as given (``--bench-kernels``, ``--bench-subset`` and GRID_OPTIONS)."""
    args = []
    for option in ("--bench-kernels", "--bench-subset", *GRID_OPTIONS):
        value = getattr(ns, _option_name(option))
        if value is not None:
            args += [option, value]
    return args


def _repeat(ns: argparse.Namespace) -> int:
    """``bench --repeat N --write-baseline FILE``: N bench runs, each in a fresh process, then
    ``flashprop gate --update FILE`` of all of them, which keeps each row's median ratio and its
    spread over the runs (the row's noise band, benchmarks/gate.py)."""
    from flashprop.benchmarks.gate import main as gate_main

    with tempfile.TemporaryDirectory(prefix="flashprop-repeat-") as tmp:
        runs = []
        for i in range(ns.repeat):
            run = Path(tmp) / f"run{i + 1}.json"
            command = [sys.executable, "-m", "flashprop.cli", "bench", "--suites", *ns.suites,
                       *(["--device", ns.device] if ns.device else []), *_grid_args(ns),
                       "--json", str(run), "--", *ns.pytest_args]
            print(f"flashprop bench: run {i + 1} of {ns.repeat}", flush=True)
            status = subprocess.run(command).returncode
            if status != 0 or not run.is_file():
                print(f"flashprop bench: run {i + 1} failed (exit {status}); no baseline written",
                      file=sys.stderr)
                return status or 2
            runs.append(str(run))
        if ns.repeat < 2:
            print("flashprop bench: one run learns no spread (its rows gate with the tolerance); "
                  "--repeat 3 or more learns each row's band")
        return gate_main(["--update", ns.write_baseline, *runs])


def _report(ns: argparse.Namespace) -> int:
    """``bench --report``: the history's trend plot and table (benchmarks/history.py); exit 1
    when a row drifts, 2 without a history."""
    from flashprop.benchmarks.history import HISTORY_NAME, load, write_report

    path = Path(ns.history) if ns.history else Path(ns.out or ".flashprop") / HISTORY_NAME
    if not path.is_file():
        print(f"flashprop bench --report: no history {path} (flashprop gate and bench --against "
              "append to it; --history FILE names another)", file=sys.stderr)
        return 2
    folder = Path(ns.out) if ns.out else path.parent
    lines, trends = write_report(load(path), folder)
    print("\n".join(lines))
    drifting = sum(t.drift for t in trends)
    print(f"flashprop bench --report: {drifting} drifting row(s); report in {folder}")
    return 1 if drifting else 0


def bench(ns: argparse.Namespace) -> int:
    """Time kernels on the benchmark grid against the anchors (sdpa-math on the CPU, SDPA flash
    and cuDNN on a GPU), with pytest-benchmark, and measure their memory growth with N; print the
    markdown table. Clocks: CUDA events on a GPU, wall-clock time on the CPU (sleeps and waits
    count; the 'suite' gate alone uses process CPU time); each table names its clock. Unavailable
    kernels and undeclared problems are skipped with the reason (in the memory table too).
    --against REV|KERNEL: an A/B run of the kernel against its version at a git revision (or
    another kernel), interleaved round by round in one process; a row fails when the interval of
    its time ratio lies wholly beyond --threshold (benchmarks/against.py, benchmarks/ab.py).
    --repeat N --write-baseline FILE: a baseline with each row's noise band. --report: the
    history's trends and slow drift (benchmarks/history.py)."""
    if ns.report:
        return _report(ns)
    if ns.against is None and importlib.util.find_spec("pytest_benchmark") is None:
        print("flashprop bench: needs pytest-benchmark (pip install 'flashprop[bench]')", file=sys.stderr)
        return 2
    from flashprop.plugin import prepare_device

    prepare_device(ns.device)  # before a user's kernel module imports triton
    from flashprop.contract.registry import spec_problem

    problem = spec_problem(ns.bench_kernels.split(",") if ns.bench_kernels else [])
    if problem:
        print(f"flashprop bench: {problem}", file=sys.stderr)
        return 2
    if ns.against is not None:
        if ns.pytest_args:
            print(f"flashprop bench --against: unrecognized arguments: {' '.join(ns.pytest_args)}",
                  file=sys.stderr)
            return 2
        from flashprop.benchmarks.against import run as against

        return against(ns)
    if ns.write_baseline:
        return _repeat(ns)
    if ns.repeat != 1:
        print("flashprop bench: --repeat N needs --write-baseline FILE (the runs become its rows and "
              "their spreads)", file=sys.stderr)
        return 2
    # files, not --pyargs: pytest reads the options of the suites' conftest only from a file's folder
    files = [importlib.util.find_spec(f"flashprop.benchmarks.{SUITES[s]}").origin for s in ns.suites]
    with tempfile.TemporaryDirectory(prefix="flashprop-bench-") as tmp:
        results = ns.json or os.path.join(tmp, "bench.json")
        out = ns.out or tmp
        # benchmarks time one process: no xdist (an inherited xdist worker's environment is
        # dropped by the benchmarks' conftest)
        args = [*files, "-q", "-rs", "-p", "no:xdist", f"--benchmark-json={results}", "--bench-report", out]
        if ns.device is not None:
            args += ["--device", ns.device]
        status = _pytest([*args, *_grid_args(ns), *ns.pytest_args])
        table = Path(out) / "bench.md"
        if table.is_file():
            print(table.read_text())
    if ns.out:
        print(f"flashprop bench: the table (and plot, with matplotlib) are in {ns.out}")
    if ns.json:
        print(f"flashprop bench: results in {ns.json}; gate them with: flashprop gate BASELINE {ns.json}")
    return status


def gate(ns: argparse.Namespace) -> int:
    """Compare the anchor ratios (anchor seconds / kernel seconds, both measured in one run) of
    pytest-benchmark JSON files with a baseline: exit 0 pass, 1 regression beyond the tolerance,
    2 nothing compared. --update writes the run into the baseline (benchmarks/gate.py)."""
    from flashprop.benchmarks.gate import run

    return run(ns)


def bisect(ns: argparse.Namespace) -> int:
    """Find the first commit between GOOD and BAD at which the benchmark row --row regressed: A/B
    runs of each commit git bisect picks against GOOD (flashprop bench --against GOOD --candidate
    COMMIT), driven by git bisect run in a temporary worktree; prints the commit and the A/B table
    at it (benchmarks/git_bisect.py). Exit 0 found, 1 none (BAD does not regress), 2 usage."""
    from flashprop.plugin import prepare_device

    prepare_device(ns.device)
    from flashprop.benchmarks.git_bisect import run

    return run(ns)


def kernels(ns: argparse.Namespace) -> int:
    """List the registered kernels, whether each runs here and what it declares; a kernel that
    cannot run here (no GPU, a package missing, its module failed to import) is a row saying why."""
    from flashprop.contract.registry import BUILTIN, KernelUnavailable, load_kernel
    from flashprop.contract.variants import NAMES

    rows = [("kernel", "dtypes", "head dims", "causal", "variants")]
    unavailable: dict[str, str] = {}
    for name in BUILTIN:
        try:
            caps = load_kernel(name).capabilities
        except KernelUnavailable as err:
            unavailable[name] = str(err).removeprefix(f"kernel {name}: ")
            continue
        dims = sorted(caps.head_dims)
        variants = [v for v in NAMES if caps.declares_variant(v)]
        rows.append((name, ",".join(str(d).removeprefix("torch.").replace("float", "f")
                                    for d in sorted(caps.dtypes, key=str)),
                     f"{dims[0]}..{dims[-1]}", caps.causal_alignment, " ".join(variants) or "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    widths[0] = width = max(widths[0], *map(len, unavailable))
    for row in rows:
        print("  ".join([*(c.ljust(w) for c, w in zip(row, widths)), row[-1]]).rstrip())
    for name, reason in unavailable.items():
        print(f"{name.ljust(width)}  unavailable: {reason}")
    return 0


def parser() -> argparse.ArgumentParser:
    from flashprop.benchmarks.gate import add_arguments

    top = _Parser(prog="flashprop", description="Property-based tests for attention kernels.")
    sub = top.add_subparsers(dest="command", required=True, parser_class=_Parser)
    f = sub.add_parser("fuzz", help="fuzz kernels with every applicable property (the main job)",
                       description=fuzz.__doc__)
    f.add_argument("kernel", nargs="+", help="registered name, module:attr or path/to/file.py:attr")
    f.add_argument("--max-examples", type=example_count, metavar="N", help=MAX_EXAMPLES_HELP)
    f.add_argument("--time", metavar="DURATION", type=_duration,
                   help="time box (600, 90s, 10m, 1h): shared by the properties that draw examples")
    f.add_argument("--device", choices=("cpu", "cuda"), help="tensor device (default: cuda if available)")
    f.add_argument("-n", "--workers", help="pytest-xdist workers (a number or 'auto')")
    f.add_argument("--json", metavar="FILE", help="write the per-property tallies as JSON")
    f.add_argument("--junit-xml", metavar="FILE", help="write JUnit XML (one case per property and kernel)")
    f.add_argument("--example-db", metavar="DIR|URL", help="shared Hypothesis example database")
    f.add_argument("--properties", nargs="*", metavar="NAME",
                   help="property modules to run (golden, variants, varlen, ...; default: all)")
    f.add_argument("--tracebacks", action="store_true",
                   help="show pytest's tracebacks of the failed tests (by default they go to a file, named "
                   "at the end, and the output ends with the table and the failures by cause)")
    f.add_argument("--tracebacks-file", metavar="FILE",
                   help=f"the tracebacks' file (default: {TRACEBACKS} in the folder of --json or "
                   "--junit-xml, else in .flashprop/ here; replaced by each run, removed by one without "
                   "failures)")
    f.set_defaults(run=fuzz)
    k = sub.add_parser("kernels", help="the registered kernels and what each declares",
                       description=kernels.__doc__)
    k.set_defaults(run=kernels)
    r = sub.add_parser("replay", help="run one property on one problem, as a failure report prints it",
                       description=replay.__doc__)
    r.add_argument("kernel")
    r.add_argument("problem", metavar="PROPERTY:Problem(...)")
    r.add_argument("--device", choices=("cpu", "cuda"))
    r.add_argument("--tracebacks", action="store_true",
                   help=f"show pytest's traceback too (by default it goes to .flashprop/{TRACEBACKS})")
    r.add_argument("--test", metavar="MODULE::FUNCTION",
                   help="the property test to collect, e.g. test_golden::test_forward_matches_golden [all]")
    r.set_defaults(run=replay)
    b = sub.add_parser("bench", help="time kernels on the benchmark grid (needs pytest-benchmark)",
                       description=bench.__doc__)
    b.add_argument("--bench-kernels", metavar="K,K",
                   help="kernels to time: registered names, module:attr or file.py:attr (default: every "
                   "registered one; with --against, triton)")
    b.add_argument("--bench-subset", metavar="NAME", help="a named subset of the grid (benchmarks/grid.py)")
    for option, example in zip(GRID_OPTIONS, ("1k,4k", "64,128", "bf16,fp16", "fwd,fwd+bwd",
                                              "dense,softcap", "sdpa-flash,sdpa-cudnn")):
        b.add_argument(option, metavar=example, help=f"the grid's {option[8:]} (benchmarks/conftest.py)")
    b.add_argument("--device", choices=("cpu", "cuda"), help="tensor device (default: cuda if available)")
    b.add_argument("--suites", nargs="+", choices=sorted(SUITES), default=["attention", "memory"],
                   help="what to time: attention (the TFLOP/s grid), memory (peak memory growth with N), "
                   "layer (a transformer block), suite (the suite's own hot paths); default: attention "
                   "memory")
    b.add_argument("--json", metavar="FILE",
                   help="keep the pytest-benchmark JSON (flashprop gate reads it); with --against, the "
                   "A/B's rows and every round's times")
    b.add_argument("--out", metavar="DIR",
                   help="write the table (bench.md) and plot (bench.png) there; with --against, ab.md; "
                   "with --report, history.md and history.png")
    ab = b.add_argument_group("A/B against a base (benchmarks/against.py)")
    ab.add_argument("--against", metavar="REV|KERNEL",
                    help="time each kernel against its version at this git revision of the working "
                    "folder's repository (a temporary worktree), or against this kernel spec")
    ab.add_argument("--candidate", metavar="REV",
                    help="the candidate at this revision instead of the working tree")
    ab.add_argument("--row", action="append", metavar="LABEL",
                    help="only this row of the grid, e.g. 'fwd d128 full N2048 bf16' (repeatable)")
    ab.add_argument("--threshold", type=float, default=0.05,
                    help="a row regresses when the interval of candidate / base time lies wholly above "
                    "1 + threshold (default 0.05)")
    ab.add_argument("--rounds", type=int, metavar="N",
                    help="timed rounds per row (default: about 1 s of timed pairs, 30..200 on CUDA, "
                    "10..200 on the CPU)")
    ab.add_argument("--history", metavar="FILE",
                    help="the history file (JSON lines) --against appends to and --report reads (default: "
                    "flashprop-history.jsonl in --out, else in .flashprop/)")
    ab.add_argument("--no-history", action="store_true", help="append nothing to the history")
    nb = b.add_argument_group("noise bands and history")
    nb.add_argument("--repeat", type=int, default=1, metavar="N",
                    help="with --write-baseline: N runs, each in a fresh process")
    nb.add_argument("--write-baseline", metavar="FILE",
                    help="write the runs into this baseline (flashprop gate --update), each row with "
                    "its spread over the runs, from which the gate sets the row's band")
    nb.add_argument("--report", action="store_true",
                    help="plot each row's trend from the history (needs matplotlib: the report extra) "
                    "and flag slow drift; exit 1 when a row drifts")
    b.set_defaults(run=bench)
    g = sub.add_parser("gate", help="compare a bench run with a baseline: exit 1 on a regression",
                       description=gate.__doc__)
    add_arguments(g)
    g.set_defaults(run=gate)
    s = sub.add_parser("bisect", help="find the commit that slowed a benchmark row (A/B runs, git bisect)",
                       description=bisect.__doc__)
    s.add_argument("good", metavar="GOOD", help="a revision where the row is fast")
    s.add_argument("bad", metavar="BAD", help="a later revision where it is slow")
    s.add_argument("--row", required=True, metavar="LABEL",
                   help="the grid row, e.g. 'fwd d128 full N2048 bf16' (other --bench-* options after --)")
    s.add_argument("--kernel", metavar="SPEC", help="the kernel (default: triton)")
    s.add_argument("--threshold", type=float, default=0.05, help="as bench --against's (default 0.05)")
    s.add_argument("--rounds", type=int, metavar="N", help="timed rounds per A/B (default: bench's)")
    s.add_argument("--device", choices=("cpu", "cuda"), help="tensor device (default: cuda if available)")
    s.set_defaults(run=bisect)
    return top


def main(argv: list[str] | None = None) -> int:
    """Run a subcommand; ``fuzz`` and ``bench`` pass the arguments they do not know (or those
    after ``--``) on to pytest."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # find my_pkg.mod:attn as `python -m` would, from here
    extra: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, extra = argv[:at], argv[at + 1 :]
    ns, unknown = parser().parse_known_args(argv)
    if unknown and ns.command not in ("fuzz", "bench", "bisect"):
        parser().error(f"unrecognized arguments: {' '.join(unknown)}")
    ns.pytest_args = [*unknown, *extra]
    return ns.run(ns)


if __name__ == "__main__":
    sys.exit(main())
