"""The benchmarks' history: every gated run appends its rows to a JSON-lines file, and
``flashprop bench --report`` plots each row's trend and flags slow drift.

A record (one line, :class:`Record`) is one row of one run: when (``date``, UTC), where
(``machine``: the GPU's name, else the CPU's model; ``device``; the ``torch`` and ``triton``
versions), what (``revision``: ``git describe --always --tags --dirty`` of the working folder's
repository; ``source``: ``gate`` for ``flashprop gate``, ``ab`` for ``flashprop bench
--against``; ``kernel``, ``config``, ``metric``), the row's ``speed`` (higher is faster), the
``band`` its check allowed and its ``status``, and ``detail`` (the gate's baseline and change; the
A/B's times, ratio and interval).

Speed and band per source:

    gate  speed = the anchor ratio (anchor seconds / kernel seconds, same run), metric
          ``vs ANCHOR``; band = the row's gate band (a drop beyond it fails the gate)
    ab    speed = 1 / the candidate's median seconds, metric ``1/s``; band = t / (1 + t) for
          the A/B threshold t (a speed drop beyond it is a time ratio beyond 1 + t)

A series is the records of one (source, machine, kernel, config, metric), in file order. Its
reference is the median speed of its first DRIFT_RUNS runs; it **drifts** when it has at least
2 x DRIFT_RUNS runs and each of its last DRIFT_RUNS runs is slower than the reference by more than
the first run's band: ``speed_j / reference < 1 - band``. A gate run compares with a baseline that
is re-recorded from time to time, an A/B run with a base that moves with every merge, so a
kernel that loses 2% per merge passes each of them and is caught here. The report also gives each
series' least-squares trend, ``exp(slope) - 1`` per run of ``ln(speed)`` against the run's
index (information, not a flag).
"""

from __future__ import annotations

import datetime
import json
import math
import platform
import statistics
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

from .plotting import MISSING, pyplot

#: The history file's name in a results folder.
HISTORY_NAME = "flashprop-history.jsonl"
PLOT_NAME, TABLE_NAME = "history.png", "history.md"
DRIFT_RUNS = 3


@dataclass(frozen=True)
class Record:
    """One row of one gated run (module docstring)."""

    date: str
    source: str
    revision: str | None
    machine: str
    device: str
    torch: str
    triton: str | None
    kernel: str
    config: str
    metric: str
    speed: float
    band: float
    status: str
    detail: dict[str, object] = field(default_factory=dict)

    @property
    def series(self) -> tuple[str, str, str, str, str]:
        return (self.source, self.machine, self.kernel, self.config, self.metric)


def machine_name(device: str) -> str:
    """The GPU's name on CUDA (when torch sees one), else the CPU's model."""
    if device == "cuda":
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown"


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def context(device: str) -> dict[str, object]:
    """The fields every record of this run shares: date, revision, machine, device, versions."""
    from .revision import describe, repository_root

    repo = repository_root(Path.cwd())
    import torch

    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "revision": describe(repo) if repo else None,
        "machine": machine_name(device),
        "device": device,
        "torch": torch.__version__,
        "triton": _version("triton"),
    }


def append(path: Path, records: Iterable[Record]) -> int:
    """Append ``records`` to the history file (created with its folder); returns how many."""
    lines = [json.dumps(asdict(r), sort_keys=True) for r in records]
    if lines:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write("\n".join(lines) + "\n")
    return len(lines)


def load(path: Path) -> list[Record]:
    """The records of a history file, in order (a line that is not a record raises ValueError
    naming it)."""
    records = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                records.append(Record(**json.loads(line)))
            except (TypeError, json.JSONDecodeError) as err:
                raise ValueError(f"{path}:{number}: not a history record ({err})") from None
    return records


@dataclass(frozen=True)
class Trend:
    """One series: its key, speeds, reference, band, least-squares trend and drift flag."""

    key: tuple[str, str, str, str, str]
    speeds: tuple[float, ...]
    reference: float
    band: float
    per_run: float | None
    drift: bool

    @property
    def last_change(self) -> float:
        return self.speeds[-1] / self.reference - 1.0


def _per_run(speeds: tuple[float, ...]) -> float | None:
    """``exp(slope) - 1`` of the least-squares line of ln(speed) over the run index."""
    n = len(speeds)
    if n < 2:
        return None
    logs = [math.log(s) for s in speeds]
    mean_x, mean_y = (n - 1) / 2, sum(logs) / n
    sxx = sum((i - mean_x) ** 2 for i in range(n))
    slope = sum((i - mean_x) * (y - mean_y) for i, y in enumerate(logs)) / sxx
    return math.exp(slope) - 1.0


def trends(records: Iterable[Record], runs: int = DRIFT_RUNS) -> list[Trend]:
    """Every series of ``records`` with its reference, trend and drift flag (module docstring)."""
    series: dict[tuple, list[Record]] = {}
    for record in records:
        series.setdefault(record.series, []).append(record)
    out = []
    for key, points in sorted(series.items()):
        speeds = tuple(p.speed for p in points)
        reference = statistics.median(speeds[:runs])
        band = points[0].band
        drift = len(speeds) >= 2 * runs and all(s / reference < 1 - band for s in speeds[-runs:])
        out.append(Trend(key, speeds, reference, band, _per_run(speeds), drift))
    return out


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:+.1f}%"


def table(found: list[Trend]) -> list[str]:
    """A markdown table of the series: runs, reference, last speed and change, trend, band, flag."""
    lines = ["| source | machine | kernel | configuration | metric | runs | reference | last | change "
             "| trend per run | band | flag |", "|" + "---|" * 12]
    for t in found:
        source, machine, kernel, config, metric = t.key
        flag = f"DRIFT: last {DRIFT_RUNS} runs beyond the band" if t.drift else ""
        lines.append(f"| {source} | {machine} | {kernel} | {config} | {metric} | {len(t.speeds)} | "
                     f"{t.reference:.4g} | {t.speeds[-1]:.4g} | {_pct(t.last_change)} | "
                     f"{_pct(t.per_run)} | -{100 * t.band:.1f}% | {flag} |")
    return lines


def plot(found: list[Trend], path: Path) -> str | None:
    """Each series' speed relative to its reference against the run index, one panel per
    (source, machine, kernel, metric), a drifting series marked; returns why not when matplotlib
    is missing or there is nothing to plot."""
    if not found:
        return "no history to plot"
    plt = pyplot()
    if plt is None:
        return MISSING
    panels: dict[tuple, list[Trend]] = {}
    for t in found:
        source, machine, kernel, _, metric = t.key
        panels.setdefault((source, machine, kernel, metric), []).append(t)
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 3.2 * len(panels)), squeeze=False)
    for ax, ((source, machine, kernel, metric), series) in zip(axes[:, 0], panels.items()):
        for t in series:
            change = [100 * (s / t.reference - 1) for s in t.speeds]
            label = t.key[3] + (" DRIFT" if t.drift else "")
            ax.plot(range(1, len(change) + 1), change, marker="x" if t.drift else "o",
                    linewidth=2.5 if t.drift else 1.2, label=label)
        ax.axhline(-100 * statistics.median(t.band for t in series), color="grey", linestyle="--",
                   linewidth=1, label="band")
        ax.axhline(0, color="black", linewidth=0.6)
        ax.set_title(f"{source}: {kernel} {metric} on {machine}", fontsize=9)
        ax.set_xlabel("run")
        ax.set_ylabel("speed vs reference (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return None


def write_report(records: list[Record], folder: Path) -> tuple[list[str], list[Trend]]:
    """Write ``history.md`` (and ``history.png``) into ``folder``; when the folder holds a
    benchmark report (``bench.md``), its History section points at them. Returns the markdown
    lines and the series."""
    from .report import TABLE_NAME as BENCH_TABLE

    folder.mkdir(parents=True, exist_ok=True)
    found = trends(records)
    why_not = plot(found, folder / PLOT_NAME)
    drifting = [t for t in found if t.drift]
    lines = ["## History", "",
             f"{len(records)} records, {len(found)} series; {len(drifting)} drifting (each of the last "
             f"{DRIFT_RUNS} runs slower than the median of the first {DRIFT_RUNS} by more than the band)",
             "", f"![speed against run]({PLOT_NAME})" if why_not is None else f"(no plot: {why_not})",
             "", *table(found), ""]
    (folder / TABLE_NAME).write_text("\n".join(["# flashprop benchmark history", "", *lines]))
    bench = folder / BENCH_TABLE
    if bench.is_file():
        text = bench.read_text().split("\n## History\n")[0].rstrip("\n")
        bench.write_text(text + "\n\n" + "\n".join(lines))
    return lines, found
