"""The benchmark gate: compare a run's anchor ratios with the committed baseline of the machine.

A run is one or more pytest-benchmark ``--benchmark-json`` files from ``benchmarks/``. Every
gated benchmark has ``extra_info["ratios"] = {anchor: anchor seconds / kernel seconds}``, the
anchor being measured in the same run (SDPA flash and cuDNN on a GPU, the plain float64
calibration workload on a CPU), so the ratio does not move with the machine, only with the code.

    flashprop gate ci/baselines/cpu.json results.json               # gate: exit 1 on regression
    flashprop gate --update ci/baselines/cpu.json r1.json r2.json   # write the baseline

(``python ci/bench_gate.py ...`` in a checkout is the same command.)

``--update`` replaces the rows the run measured and keeps the baseline's other rows (a run cut
short by a deadline does not drop what it did not reach; a row of a configuration the run timed
under another protocol is dropped); ``--replace`` writes the run alone.

Each gated benchmark also names its timing protocol (``extra_info["timing"]``: a
``benchmarks.timing.Clock``'s) and the baseline keeps it per row: a row timed under another
protocol than the baseline's (or with none recorded) is not compared but reported for
re-recording, since a change of protocol moves ratios with no change of code (with the spin
kernel, session 12, the triton forward at d128 causal fp16 N = 2k went from 0.69 to 0.34 ms on
the H200). A run that leaves nothing to compare for that reason exits 2.

A row regresses when ``now < baseline * (1 - tolerance)``. The tolerance is stored in the
baseline (``--tolerance`` overrides it); defaults: 25% on CUDA, 35% on CPU (a 2x slowdown is
-50%). Baselines written from several runs keep the median ratio of each row.
Exit codes: 0 pass, 1 regression, 2 usage error (no baseline, no gated benchmark in the run,
no row timed under the baseline's protocol).
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from .schema import rows

DEFAULT_TOLERANCE = {"cuda": 0.25, "cpu": 0.35}
METRIC = "anchor seconds / kernel seconds, both from the same run (higher is faster)"

Ratios = dict[tuple[str, str, str], float]  # (kernel, config, anchor) -> ratio
Timings = dict[tuple[str, str], str]  # (kernel, config) -> timing protocol, where recorded
OTHER_TIMING = "other timing: re-record"


@dataclass(frozen=True)
class Row:
    """One compared ratio: kernel, configuration, anchor, baseline and current values."""

    kernel: str
    config: str
    anchor: str
    baseline: float | None
    now: float | None
    tolerance: float
    timed_alike: bool = True

    @property
    def change(self) -> float | None:
        if self.baseline is None or self.now is None:
            return None
        return self.now / self.baseline - 1.0

    @property
    def status(self) -> str:
        if self.now is None:
            return "missing"
        if self.baseline is None:
            return "new"
        if not self.timed_alike:
            return OTHER_TIMING
        if self.change < -self.tolerance:
            return "REGRESSION"
        if self.change > self.tolerance:
            return "faster (update baseline?)"
        return "ok"


def load_run(paths: list[Path]) -> tuple[Ratios, Timings, str]:
    """Median ratio per (kernel, config, anchor) over the given JSON files, the timing protocol
    per (kernel, config) where the benchmark names one, and the device."""
    samples: dict[tuple[str, str, str], list[float]] = {}
    timings: Timings = {}
    devices = set()
    for path in paths:
        for row in rows(json.loads(path.read_text())):
            devices.add(row.device or "cpu")
            if row.ratios and row.timing:
                timings[row.kernel, row.config] = row.timing
            for anchor, ratio in row.ratios.items():
                samples.setdefault((row.kernel, row.config, anchor), []).append(float(ratio))
    device = "cuda" if "cuda" in devices else "cpu"
    return {key: statistics.median(vals) for key, vals in samples.items()}, timings, device


def load_baseline(path: Path) -> tuple[Ratios, Timings, dict]:
    data = json.loads(path.read_text())
    ratios = {
        (kernel, config, anchor): value
        for kernel, configs in data["entries"].items()
        for config, anchors in configs.items()
        for anchor, value in anchors.items()
    }
    timings = {
        (kernel, config): protocol
        for kernel, configs in data.get("timing", {}).items()
        for config, protocol in configs.items()
    }
    return ratios, timings, data


def write_baseline(
    path: Path, run: Ratios, timings: Timings, device: str, tolerance: float, runs: list[str]
):
    entries: dict[str, dict[str, dict[str, float]]] = {}
    timing: dict[str, dict[str, str]] = {}
    for (kernel, config, anchor), value in sorted(run.items()):
        entries.setdefault(kernel, {}).setdefault(config, {})[anchor] = round(value, 4)
        if (kernel, config) in timings:
            timing.setdefault(kernel, {})[config] = timings[kernel, config]
    data = {
        "metric": METRIC,
        "device": device,
        "tolerance": tolerance,
        "updated": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "runs": runs,
        "entries": entries,
        "timing": timing,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")


def compare(
    baseline: Ratios, run: Ratios, tolerance: float, base_timing: Timings, run_timing: Timings
) -> list[Row]:
    """One row per ratio of either side; rows timed under different protocols are not compared
    (``None``, no protocol recorded, is a protocol of its own)."""
    keys = sorted(set(baseline) | set(run))
    return [
        Row(*key, baseline.get(key), run.get(key), tolerance,
            base_timing.get(key[:2]) == run_timing.get(key[:2]))
        for key in keys
    ]


def _fmt(value: float | None, pattern: str) -> str:
    return "-" if value is None else format(value, pattern)


def table(rows: list[Row]) -> list[str]:
    """A markdown table: kernel, configuration, anchor, baseline, now, change, status."""
    header = ("kernel", "configuration", "anchor", "baseline", "now", "change", "status")
    body = [
        (
            r.kernel,
            r.config,
            r.anchor,
            _fmt(r.baseline, ".3f"),
            _fmt(r.now, ".3f"),
            _fmt(None if r.change is None else 100 * r.change, "+.1f")
            + ("%" if r.change is not None else ""),
            r.status,
        )
        for r in rows
    ]
    widths = [max(len(line[i]) for line in (header, *body)) for i in range(len(header))]

    def line(cells) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

    return [line(header), line("-" * w for w in widths), *(line(cells) for cells in body)]


def _first(*values: float | None) -> float:
    return next(v for v in values if v is not None)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The gate's command line (``flashprop gate`` and ``python ci/bench_gate.py``)."""
    parser.add_argument("baseline", type=Path, help="the machine's baseline, e.g. ci/baselines/cpu.json")
    parser.add_argument("results", type=Path, nargs="+", help="pytest-benchmark JSON file(s)")
    parser.add_argument("--update", action="store_true",
                        help="write the run's rows into the baseline, keeping rows it lacks")
    parser.add_argument("--replace", action="store_true",
                        help="write the baseline from the run alone")
    parser.add_argument(
        "--init-missing",
        action="store_true",
        help="if the baseline does not exist, write it from the run and pass",
    )
    parser.add_argument("--tolerance", type=float, help="allowed drop (0.25 = 25%%)")
    parser.add_argument("--markdown", type=Path, help="also write the table to this file")


def run(args: argparse.Namespace) -> int:
    """Gate (or with ``--update``/``--replace``/``--init-missing``, write) the baseline; the exit
    status: 0 pass, 1 regression, 2 nothing to compare."""

    run, run_timing, device = load_run(args.results)
    if not run:
        print(
            f"bench gate: no gated benchmark (extra_info.ratios) in {args.results}", file=sys.stderr
        )
        return 2
    exists = args.baseline.is_file()
    if args.update or args.replace or (args.init_missing and not exists):
        old, old_timing, meta = load_baseline(args.baseline) if exists else ({}, {}, {})
        tolerance = _first(args.tolerance, meta.get("tolerance"), DEFAULT_TOLERANCE[device])
        # a kept row shares its (kernel, config) protocol entry with the run's rows of that
        # configuration: one timed differently from them is dropped, not relabelled
        measured = {k[:2] for k in run}
        kept = {} if args.replace else {
            k: v for k, v in old.items()
            if k not in run and (k[:2] not in measured or old_timing.get(k[:2]) == run_timing.get(k[:2]))
        }
        runs = [*(meta.get("runs", []) if kept else []), *(p.name for p in args.results)]
        timings = {**{k[:2]: old_timing[k[:2]] for k in kept if k[:2] in old_timing}, **run_timing}
        write_baseline(args.baseline, {**kept, **run}, timings, device, tolerance, runs)
        verb = "updated" if exists else "created (no baseline existed)"
        print(
            f"bench gate: baseline {args.baseline} {verb}: {len(run)} ratios from the run, "
            f"{len(kept)} kept from before, tolerance {tolerance:.0%}; commit it"
        )
        return 0
    if not exists:
        print(f"bench gate: no baseline {args.baseline}; create it with --update", file=sys.stderr)
        return 2
    baseline, base_timing, meta = load_baseline(args.baseline)
    tolerance = _first(args.tolerance, meta.get("tolerance"), DEFAULT_TOLERANCE[device])
    rows = compare(baseline, run, tolerance, base_timing, run_timing)
    lines = table(rows)
    bad = [r for r in rows if r.status == "REGRESSION"]
    counts = {s: sum(r.status == s for r in rows) for s in ("ok", "missing", "new", OTHER_TIMING)}
    compared = [r for r in rows if r.change is not None and r.timed_alike]
    unchecked = counts[OTHER_TIMING] and not compared
    verdict = "FAIL" if bad else "NOTHING COMPARED" if unchecked else "pass"
    summary = (
        f"bench gate {verdict}: {len(bad)} regression(s) beyond -{tolerance:.0%} "
        f"of {args.baseline} "
        f"({counts['ok']} ok, {counts['new']} new, {counts['missing']} missing, "
        f"{counts[OTHER_TIMING]} timed under another protocol; metric: {METRIC})"
    )
    if counts[OTHER_TIMING]:
        stale = {(r.kernel, r.config) for r in rows if r.status == OTHER_TIMING}
        none = "none recorded"
        pairs = sorted({(base_timing.get(k, none), run_timing.get(k, none)) for k in stale})
        summary += (
            "\nbench gate: rows timed under another protocol than the baseline's (baseline -> run: "
            + "; ".join(f"{a} -> {b}" for a, b in pairs)
            + f") are not compared; re-record them: flashprop gate --update {args.baseline} RUN.json"
        )
    print("\n".join(lines))
    print(summary)
    if args.markdown:
        args.markdown.write_text("\n".join([*lines, "", summary, ""]))
    return 1 if bad else 2 if unchecked else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
