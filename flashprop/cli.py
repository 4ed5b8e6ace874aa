"""The ``flashprop`` command.

    flashprop fuzz KERNEL [KERNEL ...] [--max-examples N] [--time 10m] [--device cpu|cuda]
                   [-n WORKERS] [--json FILE] [--junit-xml FILE] [--example-db DIR|URL]
                   [--properties P ...] [--tracebacks | --tracebacks-file FILE] [--all-skips]
    flashprop kernels                   the registered kernels and what each declares
    flashprop replay KERNEL PROPERTY:Problem(...)   one property on one problem (failures print it)
    flashprop bench [--bench-kernels K,...] [--bench-subset NAME] [--device cpu|cuda]
                    [--suites attention memory layer suite] [--json FILE] [--out DIR]
    flashprop gate BASELINE RESULTS.json [...] [--update | --replace] [--tolerance T]

``fuzz`` is the main job: every applicable property on the kernel (a registered name,
``module:attr`` or ``path/to/file.py:attr``) with the ``fuzz`` Hypothesis profile; the output
ends with the per-property table and each failure's cause once, shrunk, with its repro (pytest's
tracebacks go to a file, :func:`tracebacks_file`; ``--all-skips`` lists each test that drew
nothing, with its reason); exit status 1 on any failure. It runs pytest on the installed property
modules (``flashprop.properties``). ``bench`` times kernels on the benchmark grid
(``flashprop.benchmarks``, pytest-benchmark) and prints the table; ``gate`` compares a bench
run's anchor ratios with a baseline, exit 1 on a regression. Arguments ``fuzz`` and ``bench``
do not know, and anything after ``--``, go to pytest.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
from importlib.metadata import entry_points
from pathlib import Path
from typing import NoReturn

from flashprop.plugin import MAX_EXAMPLES_HELP, example_count

#: The property modules, as ``fuzz --properties`` names them (``golden`` for test_golden.py).
PACKAGE = "flashprop.properties"
#: ``bench --suites``: the benchmark modules of ``flashprop.benchmarks`` (``benchmarks/``).
SUITES = {"attention": "bench_attention", "memory": "bench_memory", "layer": "bench_layer",
          "suite": "bench_suite"}


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
    from flashprop.contract.registry import spec_problem

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
    args = ["--pyargs", *targets, "-q", "-m", "not meta", "--hypothesis-profile", "fuzz", "-W",
            "ignore::RuntimeWarning"]
    if not ns.tracebacks:  # the table and the failures by cause are the report; tracebacks to a file
        args += ["--tracebacks-file", tracebacks_file(ns)]
    for kernel in ns.kernel:
        args += ["--kernel", kernel]
    for option, value in (("--max-examples", ns.max_examples), ("--device", ns.device),
                          ("--tally-json", ns.json), ("--junitxml", ns.junit_xml),
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


def bench(ns: argparse.Namespace) -> int:
    """Time kernels on the benchmark grid against the anchors (sdpa-math on the CPU, SDPA flash
    and cuDNN on a GPU), with pytest-benchmark, and measure their memory growth with N; print the
    markdown table. Clocks: CUDA events on a GPU, wall-clock time on the CPU (sleeps and waits
    count; the 'suite' gate alone uses process CPU time); each table names its clock. Unavailable
    kernels and undeclared problems are skipped with the reason (in the memory table too)."""
    if importlib.util.find_spec("pytest_benchmark") is None:
        print("flashprop bench: needs pytest-benchmark (pip install 'flashprop[bench]')", file=sys.stderr)
        return 2
    from flashprop.plugin import prepare_device

    prepare_device(ns.device)  # before a user's kernel module imports triton
    from flashprop.contract.registry import spec_problem

    problem = spec_problem(ns.bench_kernels.split(",") if ns.bench_kernels else [])
    if problem:
        print(f"flashprop bench: {problem}", file=sys.stderr)
        return 2
    # files, not --pyargs: pytest reads the options of the suites' conftest only from a file's folder
    files = [importlib.util.find_spec(f"flashprop.benchmarks.{SUITES[s]}").origin for s in ns.suites]
    with tempfile.TemporaryDirectory(prefix="flashprop-bench-") as tmp:
        results = ns.json or os.path.join(tmp, "bench.json")
        out = ns.out or tmp
        # benchmarks time one process: no xdist (an inherited xdist worker's environment is
        # dropped by the benchmarks' conftest)
        args = [*files, "-q", "-rs", "-p", "no:xdist", f"--benchmark-json={results}", "--bench-report", out]
        for option, value in (("--device", ns.device), ("--bench-kernels", ns.bench_kernels),
                              ("--bench-subset", ns.bench_subset)):
            if value is not None:
                args += [option, value]
        status = _pytest([*args, *ns.pytest_args])
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


def kernels(ns: argparse.Namespace) -> int:
    """List the registered kernels, whether each runs here and what it declares; a kernel that
    cannot run here (no GPU, a package missing, its module failed to import) is a row saying why."""
    from flashprop.contract.registry import BUILTIN, KernelUnavailable, load_kernel

    rows = [("kernel", "dtypes", "head dims", "causal", "variants")]
    unavailable: dict[str, str] = {}
    for name in BUILTIN:
        try:
            caps = load_kernel(name).capabilities
        except KernelUnavailable as err:
            unavailable[name] = str(err).removeprefix(f"kernel {name}: ")
            continue
        dims = sorted(caps.head_dims)
        variants = [v for v in ("window", "softcap", "alibi", "sinks", "varlen", "kvcache", "paged", "splits")
                    if caps.declares_variant(v)]
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
                   "registered one); other --bench-* options (seqlens, head-dims, dtypes, modes, anchors) "
                   "go to pytest as they are")
    b.add_argument("--bench-subset", metavar="NAME", help="a named subset of the grid (benchmarks/grid.py)")
    b.add_argument("--device", choices=("cpu", "cuda"), help="tensor device (default: cuda if available)")
    b.add_argument("--suites", nargs="+", choices=sorted(SUITES), default=["attention", "memory"],
                   help="what to time: attention (the TFLOP/s grid), memory (peak memory growth with N), "
                   "layer (a transformer block), suite (the suite's own hot paths); default: attention "
                   "memory")
    b.add_argument("--json", metavar="FILE", help="keep the pytest-benchmark JSON (flashprop gate reads it)")
    b.add_argument("--out", metavar="DIR", help="write the table (bench.md) and plot (bench.png) there")
    b.set_defaults(run=bench)
    g = sub.add_parser("gate", help="compare a bench run with a baseline: exit 1 on a regression",
                       description=gate.__doc__)
    add_arguments(g)
    g.set_defaults(run=gate)
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
    if unknown and ns.command not in ("fuzz", "bench"):
        parser().error(f"unrecognized arguments: {' '.join(unknown)}")
    ns.pytest_args = [*unknown, *extra]
    return ns.run(ns)


if __name__ == "__main__":
    sys.exit(main())
