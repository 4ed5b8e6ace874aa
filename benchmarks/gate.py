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

A row regresses when ``now < baseline * (1 - band)``, its band learned from repeated runs:

    band = min(tolerance, max(floor, k * spread))      spread = max_i |r_i / median(r) - 1|

over the ratios r_i of the row in the runs the baseline was written from (one JSON file per run,
at least two; ``flashprop bench --repeat N --write-baseline FILE`` makes them in fresh
processes). A quiet row gets a tight band, a noisy one a loose band, never looser than the
tolerance; a row without a recorded spread (one run, or a baseline written before spreads were
kept, as ``ci/baselines/*.json``) uses the tolerance. The table says per row which band it used.
The baseline stores the tolerance, ``k`` and the floor (``--tolerance``, ``--band-k``,
``--band-floor`` override them); defaults: tolerance 25% on CUDA, 35% on CPU (a 2x slowdown is
-50%), k = 2, floor 3% on CUDA, 10% on CPU. Baselines written from several runs keep the median
ratio of each row; ``--update`` from a single run keeps a re-measured row's spread (its noise is
the machine's and the row's, not the value's).

Each gate (not ``--update``) appends its rows to the history file (``--history``; default
``flashprop-history.jsonl`` next to the first results file; :mod:`benchmarks.history`).
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

from .history import HISTORY_NAME, Record, append, context
from .schema import rows

DEFAULT_TOLERANCE = {"cuda": 0.25, "cpu": 0.35}
DEFAULT_BAND_K = 2.0
DEFAULT_BAND_FLOOR = {"cuda": 0.05, "cpu": 0.10}
METRIC = "anchor seconds / kernel seconds, both from the same run (higher is faster)"

Ratios = dict[tuple[str, str, str], float]  # (kernel, config, anchor) -> ratio
Timings = dict[tuple[str, str], str]  # (kernel, config) -> timing protocol, where recorded
OTHER_TIMING = "other timing: re-record"


@dataclass(frozen=True)
class Band:
    """The drop a row may show before it regresses, and where that number came from."""

    value: float
    note: str


def band_for(spread: float | None, tolerance: float, k: float, floor: float) -> Band:
    """``min(tolerance, max(floor, k * spread))`` (module docstring); the tolerance when no
    spread is recorded."""
    if spread is None:
        return Band(tolerance, f"tolerance {tolerance:.0%} (no spread recorded)")
    learned = k * spread
    if max(floor, learned) >= tolerance:
        return Band(tolerance, f"tolerance {tolerance:.0%} ({k:g} x spread {spread:.1%} above it)")
    if learned < floor:
        return Band(floor, f"floor {floor:.0%} (spread {spread:.1%})")
    return Band(learned, f"{k:g} x spread {spread:.1%}")


@dataclass(frozen=True)
class Row:
    """One compared ratio: kernel, configuration, anchor, baseline and current values, and the
    row's band."""

    kernel: str
    config: str
    anchor: str
    baseline: float | None
    now: float | None
    band: Band
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
        if self.change < -self.band.value:
            return "REGRESSION"
        if self.change > self.band.value:
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
            if row.gated is False:
                continue
            if row.ratios and row.timing:
                timings[row.kernel, row.config] = row.timing
            for anchor, ratio in row.ratios.items():
                samples.setdefault((row.kernel, row.config, anchor), []).append(float(ratio))
    device = "cuda" if "cuda" in devices else "cpu"
    return {key: statistics.median(vals) for key, vals in samples.items()}, timings, device


def run_spreads(paths: list[Path]) -> Ratios:
    """Per (kernel, config, anchor) measured in at least two of the files (one file per run):
    ``max_i |r_i / median(r) - 1|`` over the files' ratios r_i (each file's median of the row)."""
    per_file: dict[tuple[str, str, str], list[float]] = {}
    for path in paths:
        ratios, _, _ = load_run([path])
        for key, value in ratios.items():
            per_file.setdefault(key, []).append(value)
    spreads = {}
    for key, values in per_file.items():
        if len(values) >= 2:
            middle = statistics.median(values)
            spreads[key] = max(abs(v / middle - 1.0) for v in values)
    return spreads


def _nested(data: dict, name: str) -> dict:
    """A ``{kernel: {config: {anchor: value}}}`` section of a baseline as a flat dict."""
    return {
        (kernel, config, anchor): value
        for kernel, configs in data.get(name, {}).items()
        for config, anchors in configs.items()
        for anchor, value in anchors.items()
    }


def load_baseline(path: Path) -> tuple[Ratios, Timings, dict]:
    data = json.loads(path.read_text())
    timings = {
        (kernel, config): protocol
        for kernel, configs in data.get("timing", {}).items()
        for config, protocol in configs.items()
    }
    return _nested(data, "entries"), timings, data


def baseline_spreads(data: dict) -> Ratios:
    """The learned spreads of a baseline's rows (none in a baseline written before them)."""
    return _nested(data, "spread")


def _grouped(values: Ratios, digits: int) -> dict[str, dict[str, dict[str, float]]]:
    out: dict[str, dict[str, dict[str, float]]] = {}
    for (kernel, config, anchor), value in sorted(values.items()):
        out.setdefault(kernel, {}).setdefault(config, {})[anchor] = round(value, digits)
    return out


def write_baseline(
    path: Path, run: Ratios, timings: Timings, device: str, tolerance: float, runs: list[str],
    spreads: Ratios | None = None, band: dict[str, float] | None = None,
):
    """Write a baseline: each row's ratio and timing protocol, its spread where learned, the
    tolerance and the band's ``k`` and floor."""
    timing: dict[str, dict[str, str]] = {}
    for kernel, config in sorted({key[:2] for key in run}):
        if (kernel, config) in timings:
            timing.setdefault(kernel, {})[config] = timings[kernel, config]
    data = {
        "metric": METRIC,
        "device": device,
        "tolerance": tolerance,
        "updated": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "runs": runs,
        "entries": _grouped(run, 4),
        "timing": timing,
    }
    if spreads:
        data["band"] = band or {}
        data["spread"] = _grouped({k: v for k, v in spreads.items() if k in run}, 5)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")


def compare(
    baseline: Ratios, run: Ratios, bands: dict[tuple[str, str, str], Band], base_timing: Timings,
    run_timing: Timings,
) -> list[Row]:
    """One row per ratio of either side, with its band; rows timed under different protocols are
    not compared (``None``, no protocol recorded, is a protocol of its own)."""
    keys = sorted(set(baseline) | set(run))
    return [
        Row(*key, baseline.get(key), run.get(key), bands[key],
            base_timing.get(key[:2]) == run_timing.get(key[:2]))
        for key in keys
    ]


def _fmt(value: float | None, pattern: str) -> str:
    return "-" if value is None else format(value, pattern)


def table(rows: list[Row]) -> list[str]:
    """A markdown table: kernel, configuration, anchor, baseline, now, change, band, status."""
    header = ("kernel", "configuration", "anchor", "baseline", "now", "change", "band", "status")
    body = [
        (
            r.kernel,
            r.config,
            r.anchor,
            _fmt(r.baseline, ".3f"),
            _fmt(r.now, ".3f"),
            _fmt(None if r.change is None else 100 * r.change, "+.1f")
            + ("%" if r.change is not None else ""),
            f"-{100 * r.band.value:.1f}% ({r.band.note})",
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
    parser.add_argument("--tolerance", type=float,
                        help="allowed drop of a row without a learned spread, and every band's cap "
                        "(0.25 = 25%%)")
    parser.add_argument("--band-k", type=float, help="a learned band is k x the row's spread (default 2)")
    parser.add_argument("--band-floor", type=float,
                        help="the narrowest learned band (default 0.05 on CUDA, 0.10 on CPU)")
    parser.add_argument("--markdown", type=Path, help="also write the table to this file")
    parser.add_argument("--history", type=Path,
                        help=f"append the gated rows to this JSON-lines file (default: {HISTORY_NAME} "
                        "next to the first results file)")
    parser.add_argument("--no-history", action="store_true", help="append nothing to a history file")


def _band_settings(args: argparse.Namespace, meta: dict, device: str) -> tuple[float, float, float]:
    """The tolerance, band k and floor: the command line's, else the baseline's, else the defaults."""
    stored = meta.get("band", {})
    return (_first(args.tolerance, meta.get("tolerance"), DEFAULT_TOLERANCE[device]),
            _first(args.band_k, stored.get("k"), DEFAULT_BAND_K),
            _first(args.band_floor, stored.get("floor"), DEFAULT_BAND_FLOOR[device]))


def _write(args: argparse.Namespace, run: Ratios, run_timing: Timings, device: str, exists: bool) -> int:
    """``--update`` / ``--replace`` / ``--init-missing``: write the baseline from the run."""
    old, old_timing, meta = load_baseline(args.baseline) if exists else ({}, {}, {})
    tolerance, k, floor = _band_settings(args, meta, device)
    # a kept row shares its (kernel, config) protocol entry with the run's rows of that
    # configuration: one timed differently from them is dropped, not relabelled
    measured = {key[:2] for key in run}
    kept = {} if args.replace else {
        key: v for key, v in old.items()
        if key not in run and (key[:2] not in measured or old_timing.get(key[:2]) == run_timing.get(key[:2]))
    }
    runs = [*(meta.get("runs", []) if kept else []), *(p.name for p in args.results)]
    timings = {**{key[:2]: old_timing[key[:2]] for key in kept if key[:2] in old_timing}, **run_timing}
    learned = run_spreads(args.results)
    old_spread = {} if args.replace else baseline_spreads(meta)
    spreads = {key: old_spread[key] for key in old_spread if key in kept}
    for key in run:  # re-measured: this run's spread, else the old one when timed alike
        if key in learned:
            spreads[key] = learned[key]
        elif key in old_spread and old_timing.get(key[:2]) == run_timing.get(key[:2]):
            spreads[key] = old_spread[key]
    write_baseline(args.baseline, {**kept, **run}, timings, device, tolerance, runs, spreads,
                   {"k": k, "floor": floor})
    verb = "updated" if exists else "created (no baseline existed)"
    bands = (f"; spreads learned for {len(learned)} rows from {len(args.results)} runs (bands "
             f"max({floor:.0%}, {k:g} x spread), at most {tolerance:.0%})" if learned else "")
    print(
        f"bench gate: baseline {args.baseline} {verb}: {len(run)} ratios from the run, "
        f"{len(kept)} kept from before, tolerance {tolerance:.0%}{bands}; commit it"
    )
    return 0


def _history(args: argparse.Namespace, rows: list[Row], device: str) -> Path | None:
    """Append the run's measured rows to the history file (module docstring); its path."""
    if args.no_history:
        return None
    path = args.history or args.results[0].parent / HISTORY_NAME
    shared = context(device)
    records = [
        Record(**shared, source="gate", kernel=r.kernel, config=r.config, metric=f"vs {r.anchor}",
               speed=r.now, band=r.band.value, status=r.status,
               detail={"baseline": r.baseline, "change": r.change, "band": r.band.note})
        for r in rows if r.now is not None
    ]
    append(path, records)
    return path


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
        return _write(args, run, run_timing, device, exists)
    if not exists:
        print(f"bench gate: no baseline {args.baseline}; create it with --update", file=sys.stderr)
        return 2
    baseline, base_timing, meta = load_baseline(args.baseline)
    tolerance, k, floor = _band_settings(args, meta, device)
    spreads = baseline_spreads(meta)
    bands = {key: band_for(spreads.get(key), tolerance, k, floor) for key in set(baseline) | set(run)}
    rows = compare(baseline, run, bands, base_timing, run_timing)
    lines = table(rows)
    bad = [r for r in rows if r.status == "REGRESSION"]
    counts = {s: sum(r.status == s for r in rows) for s in ("ok", "missing", "new", OTHER_TIMING)}
    compared = [r for r in rows if r.change is not None and r.timed_alike]
    unchecked = counts[OTHER_TIMING] and not compared
    verdict = "FAIL" if bad else "NOTHING COMPARED" if unchecked else "pass"
    learned = sum(key in spreads for key in baseline)
    summary = (
        f"bench gate {verdict}: {len(bad)} regression(s) beyond their band "
        f"of {args.baseline} "
        f"({counts['ok']} ok, {counts['new']} new, {counts['missing']} missing, "
        f"{counts[OTHER_TIMING]} timed under another protocol; metric: {METRIC}; bands: "
        f"{learned} learned from repeated runs, max({floor:.0%}, {k:g} x spread), the others "
        f"the tolerance {tolerance:.0%})"
    )
    if counts[OTHER_TIMING]:
        stale = {(r.kernel, r.config) for r in rows if r.status == OTHER_TIMING}
        none = "none recorded"
        pairs = sorted({(base_timing.get(key, none), run_timing.get(key, none)) for key in stale})
        summary += (
            "\nbench gate: rows timed under another protocol than the baseline's (baseline -> run: "
            + "; ".join(f"{a} -> {b}" for a, b in pairs)
            + f") are not compared; re-record them: flashprop gate --update {args.baseline} RUN.json"
        )
    history = _history(args, rows, device)
    if history is not None:
        summary += f"\nbench gate: rows appended to the history {history} (flashprop bench --report)"
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
