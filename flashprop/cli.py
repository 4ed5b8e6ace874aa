"""The ``flashprop`` command.

    flashprop fuzz KERNEL [KERNEL ...] [--max-examples N] [--device cpu|cuda] [-n WORKERS]
                   [--json FILE] [--junit-xml FILE] [--example-db DIR|URL] [--properties P ...]
    flashprop kernels                   the registered kernels and what each declares
    flashprop replay KERNEL PROPERTY:Problem(...)   one property on one problem (failures print it)

``fuzz`` is the main job: every applicable property on the kernel (a registered name,
``module:attr`` or ``path/to/file.py:attr``) with the ``fuzz`` Hypothesis profile, the
per-property table, each failure shrunk with its repro; exit status 1 on any failure. It runs
pytest on the installed property modules (``flashprop.properties``); arguments it does not
know, and anything after ``--``, go to pytest.
"""

from __future__ import annotations

import argparse
import os
import sys
from importlib.metadata import entry_points

#: The property modules, as ``fuzz --properties`` names them (``golden`` for test_golden.py).
PACKAGE = "flashprop.properties"


def _plugin_args() -> list[str]:
    """Load the plugin by module unless an installed flashprop registered it already."""
    if any(ep.name == "flashprop" for ep in entry_points(group="pytest11")):
        return []
    return ["-p", "flashprop.plugin"]


def _pytest(args: list[str]) -> int:
    import pytest

    quiet = ["-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning"]
    return int(pytest.main([*_plugin_args(), *quiet, *args]))


def fuzz(ns: argparse.Namespace) -> int:
    targets = [f"{PACKAGE}.test_{name}" for name in ns.properties] if ns.properties else [PACKAGE]
    args = ["--pyargs", *targets, "-q", "-m", "not meta", "--hypothesis-profile", "fuzz", "-W",
            "ignore::RuntimeWarning"]
    for kernel in ns.kernel:
        args += ["--kernel", kernel]
    for option, value in (("--max-examples", ns.max_examples), ("--device", ns.device),
                          ("--tally-json", ns.json), ("--junitxml", ns.junit_xml),
                          ("--example-db", ns.example_db), ("-n", ns.workers)):
        if value is not None:
            args += [option, str(value)]
    return _pytest([*args, *ns.pytest_args])


def replay(ns: argparse.Namespace) -> int:
    args = ["--pyargs", PACKAGE, "-q", "-m", "not meta", "--kernel", ns.kernel, "--replay", ns.problem]
    if ns.device:
        args += ["--device", ns.device]
    return _pytest(args)


def kernels(ns: argparse.Namespace) -> int:
    from flashprop.kernels.registry import BUILTIN, KernelUnavailable, load_kernel

    rows = [("kernel", "here", "dtypes", "head dims", "causal", "variants")]
    for name in BUILTIN:
        try:
            caps = load_kernel(name).capabilities
        except KernelUnavailable as err:
            rows.append((name, "no: " + str(err).split(": ", 1)[-1], "", "", "", ""))
            continue
        dims = sorted(caps.head_dims)
        variants = [v for v in ("window", "softcap", "alibi", "sinks", "varlen", "kvcache", "paged", "splits")
                    if caps.declares_variant(v)]
        rows.append((name, "yes", ",".join(str(d).removeprefix("torch.").replace("float", "f")
                                           for d in sorted(caps.dtypes, key=str)),
                     f"{dims[0]}..{dims[-1]}", caps.causal_alignment, " ".join(variants) or "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return 0


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="flashprop", description="Property-based tests for attention kernels.")
    sub = top.add_subparsers(dest="command", required=True)
    f = sub.add_parser("fuzz", help="fuzz kernels with every applicable property (the main job)",
                       description=fuzz.__doc__ or __doc__.split("\n\n")[1])
    f.add_argument("kernel", nargs="+", help="registered name, module:attr or path/to/file.py:attr")
    f.add_argument("--max-examples", type=int,
                   help="examples per property, times its weight (forward 1, backward 3/4, most others 1/2)")
    f.add_argument("--device", choices=("cpu", "cuda"), help="tensor device (default: cuda if available)")
    f.add_argument("-n", "--workers", help="pytest-xdist workers (a number or 'auto')")
    f.add_argument("--json", metavar="FILE", help="write the per-property tallies as JSON")
    f.add_argument("--junit-xml", metavar="FILE", help="write JUnit XML (one case per property and kernel)")
    f.add_argument("--example-db", metavar="DIR|URL", help="shared Hypothesis example database")
    f.add_argument("--properties", nargs="*", metavar="NAME",
                   help="property modules to run (golden, variants, varlen, ...; default: all)")
    f.set_defaults(run=fuzz)
    k = sub.add_parser("kernels", help="the registered kernels and what each declares")
    k.set_defaults(run=kernels)
    r = sub.add_parser("replay", help="run one property on one problem, as a failure report prints it")
    r.add_argument("kernel")
    r.add_argument("problem", metavar="PROPERTY:Problem(...)")
    r.add_argument("--device", choices=("cpu", "cuda"))
    r.set_defaults(run=replay)
    return top


def main(argv: list[str] | None = None) -> int:
    """Run a subcommand; ``fuzz`` passes the arguments it does not know (or those after ``--``)
    on to pytest."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # find my_pkg.mod:attn as `python -m` would, from here
    extra: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, extra = argv[:at], argv[at + 1 :]
    ns, unknown = parser().parse_known_args(argv)
    if unknown and ns.command != "fuzz":
        parser().error(f"unrecognized arguments: {' '.join(unknown)}")
    ns.pytest_args = [*unknown, *extra]
    return ns.run(ns)


if __name__ == "__main__":
    sys.exit(main())
