"""Markdown table and TFLOP/s plot of a benchmark run (pytest-benchmark JSON).

    python -m benchmarks.report results.json [more.json ...] --out DIR

writes ``DIR/bench.md`` and, when matplotlib is installed, ``DIR/bench.png``: TFLOP/s against N,
one line per kernel (anchors dashed), one panel per (head dim, causal), one row of panels per
(mode, dtype); with decode rows also ``DIR/decode.png``, their fraction of the copy bandwidth
against the cache length (``benchmarks.decode``); varlen rows (``benchmarks.varlen``) get a table of
their own. The same files are written at the end of a
bench run given ``--bench-report DIR``.
Above each timed table a line says which clock timed it and what that clock counts (from the
rows' protocols, :mod:`benchmarks.timing`); the memory table has a row for every kernel its
suite was given, a skipped one with the reason.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from pathlib import Path

from flashprop.contract.registry import BENCH_ANCHORS

from . import decode, varlen
from .grid import SHORT_DTYPE
from .plotting import MISSING, pyplot
from .schema import Row, Skipped, rows, skipped
from .timing import clock_counts

PLOT_NAME, TABLE_NAME = "bench.png", "bench.md"
DECODE_PLOT_NAME = "decode.png"
#: Kernels drawn dashed: the anchors of every device.
ANCHOR_STYLE = {anchor for anchors in BENCH_ANCHORS.values() for anchor in anchors}


def _is_grid(row: Row) -> bool:
    """A row of the dense TFLOP/s grid (varlen rows have TFLOP/s too, and a table of their own)."""
    return row.tflops is not None and row.lengths is None


def _grid_key(row: Row) -> tuple:
    return (row.dtype, row.mode, row.d, row.causal, row.n, row.kernel)


def _host_cell(row: Row) -> str:
    """Host milliseconds per call, flagged when they exceed the GPU time (launch-bound)."""
    if row.host_s is None:
        return "-"
    bound = " (launch-bound)" if row.host_s > row.median_s else ""
    return f"{1e3 * row.host_s:.3f}{bound}"


def grid_table(results: Iterable[Row]) -> list[str]:
    """Rows of the TFLOP/s grid: one per kernel and configuration."""
    grid = sorted((r for r in results if _is_grid(r)), key=_grid_key)
    if not grid:
        return []
    anchors = sorted({a for r in grid for a in r.ratios})
    head = ["kernel", "mode", "d", "mask", "dtype", "N", "ms", "host ms", "TFLOP/s"]
    head += [f"vs {a}" for a in anchors] + ["peak extra MiB", "launch"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in grid:
        cells = [
            r.kernel,
            r.mode,
            str(r.d),
            "causal" if r.causal else "full",
            SHORT_DTYPE.get(r.dtype, r.dtype),
            str(r.n),
            f"{1e3 * r.median_s:.3f}",
            _host_cell(r),
            f"{r.tflops:.3g}",
            *(f"{r.ratios[a]:.2f}x" if a in r.ratios else "-" for a in anchors),
            f"{r.peak_mem_bytes / 2**20:.0f}",
            "; ".join(f"{k}: {v}" for k, v in (r.launch or {}).items()),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def split_table(results: Iterable[Row]) -> list[str]:
    """Rows of forward and backward-only speed against each anchor, per kernel and
    configuration timed in both modes: backward seconds = (fwd+bwd) - fwd, the anchors' from
    their ratios in the same run (anchor seconds = ratio x kernel seconds)."""
    timed = {(r.kernel, r.mode, r.d, r.causal, r.dtype, r.n): r for r in results if _is_grid(r)}
    lines: list[str] = []
    for (kernel, mode, d, causal, dtype, n), fwd in sorted(timed.items(), key=lambda kv: kv[0]):
        both = timed.get((kernel, "fwd+bwd", d, causal, dtype, n))
        if mode != "fwd" or both is None:
            continue
        bwd_s = both.median_s - fwd.median_s
        cells = []
        for anchor in sorted(set(fwd.ratios) & set(both.ratios)):
            anchor_bwd = both.ratios[anchor] * both.median_s - fwd.ratios[anchor] * fwd.median_s
            bwd = f"{anchor_bwd / bwd_s:.2f}x" if bwd_s > 0 and anchor_bwd > 0 else "-"
            cells.append(f"{anchor}: fwd {fwd.ratios[anchor]:.2f}x, bwd {bwd}")
        if cells:
            mask = "causal" if causal else "full"
            lines.append(f"| {kernel} | d{d} {mask} {SHORT_DTYPE.get(dtype, dtype)} | {n} | "
                         f"{1e3 * fwd.median_s:.3f} | {1e3 * bwd_s:.3f} | {'; '.join(cells)} |")
    if not lines:
        return []
    return ["| kernel | configuration | N | fwd ms | bwd ms ((fwd+bwd) - fwd) | against anchors |",
            "|---|---|---|---|---|---|", *lines]


def gate_rows(results: Iterable[Row]) -> list[Row]:
    """The CPU gate's rows (and its anchors'): timed, with no TFLOP/s, no memory growth and no
    bytes read (decode rows)."""
    return [r for r in results if r.median_s is not None
            and r.tflops is None and r.mem_exponent is None and r.bytes_read is None]


def calibrated_table(results: Iterable[Row]) -> list[str]:
    """Rows of the CPU gate: speed relative to the calibration anchor (anchor s / benchmark s)."""
    gate = gate_rows(results)
    if not gate:
        return []
    lines = [
        "| benchmark | configuration | median ms | anchor | anchor s / benchmark s | note |",
        "|---|---|---|---|---|---|",
    ]
    for r in gate:
        anchor, ratio = next(iter(r.ratios.items()), ("-", None))
        note = "" if r.examples_per_s is None else f"{r.examples_per_s:.1f} examples/s"
        vs = "-" if ratio is None else f"{ratio:.3f}"
        lines.append(f"| {r.kernel} | {r.config} | {1e3 * r.median_s:.2f} | {anchor} | {vs} | {note} |")
    return lines


def memory_table(results: Iterable[Row], skips: Iterable[Skipped] = ()) -> list[str]:
    """Rows of the memory-growth check: peak extra memory at N and 4N, growth exponent; then a
    row per kernel not measured, with the reason."""
    memory = [r for r in results if r.mem_exponent is not None]
    skips = list(skips)
    if not memory and not skips:
        return []
    lines = ["| kernel | N | peak extra MiB | growth exponent | note |", "|---|---|---|---|---|"]
    for r in memory:
        n = " / ".join(map(str, r.mem_n))
        mib = " / ".join(f"{b / 2**20:.1f}" for b in r.mem_peak_bytes)
        lines.append(f"| {r.kernel} | {n} | {mib} | {r.mem_exponent:.2f} |  |")
    for skip in skips:
        lines.append(f"| {skip.kernel} | - | - | - | not measured: {skip.reason} |")
    return lines


def clock_lines(timed: Iterable[Row]) -> list[str]:
    """One line per timing protocol among ``timed``: what its clock counts, and its name."""
    protocols = sorted({r.timing for r in timed if r.timing})
    return [f"Clock: {clock_counts(p)}. Protocol: `{p}`." for p in protocols]


def plot(results: Iterable[Row], path: Path) -> str | None:
    """Write the TFLOP/s plot; returns why not when matplotlib is missing or nothing to plot."""
    grid = [r for r in results if _is_grid(r)]
    if not grid:
        return "no TFLOP/s results to plot"
    plt = pyplot()
    if plt is None:
        return MISSING
    panel_rows = sorted({(r.mode, r.dtype) for r in grid})
    panel_cols = sorted({(r.d, r.causal) for r in grid})
    fig, axes = plt.subplots(
        len(panel_rows), len(panel_cols), figsize=(4.2 * len(panel_cols), 3.4 * len(panel_rows)),
        squeeze=False,
    )
    for i, (mode, dtype) in enumerate(panel_rows):
        for j, (d, causal) in enumerate(panel_cols):
            ax = axes[i][j]
            cell = [r for r in grid if (r.mode, r.dtype, r.d, r.causal) == (mode, dtype, d, causal)]
            for kernel in sorted({r.kernel for r in cell}):
                pts = sorted((r.n, r.tflops) for r in cell if r.kernel == kernel)
                style = "--" if kernel in ANCHOR_STYLE else "-"
                ax.plot(*zip(*pts), style, marker="o", label=kernel)
            ax.set_xscale("log", base=2)
            ax.set_title(
                f"{mode} {SHORT_DTYPE.get(dtype, dtype)} d={d} {'causal' if causal else 'full'}",
                fontsize=9,
            )
            ax.set_xlabel("N")
            ax.set_ylabel("TFLOP/s")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return None


def write_report(output_json: dict, folder: Path) -> list[Path]:
    """Write ``bench.md`` (and ``bench.png``) for one run into ``folder``; returns the paths."""
    folder.mkdir(parents=True, exist_ok=True)
    results = rows(output_json)
    written = []
    png = folder / PLOT_NAME
    why_not = plot(results, png)
    lines = ["# flashprop benchmarks", ""]
    machine = output_json.get("machine_info", {})
    if machine:
        cpu = machine.get("cpu", {}).get("brand_raw", "")
        lines += [f"machine: {machine.get('node', '?')} {cpu}".rstrip(), ""]
    if why_not is None:
        lines += [f"![TFLOP/s against N]({PLOT_NAME})", ""]
        written.append(png)
    else:
        lines += [f"(no plot: {why_not})", ""]
    grid = [r for r in results if _is_grid(r)]
    gate = gate_rows(results)
    decoded = decode.decode_table(results)
    if decoded:
        why_not = decode.plot(results, folder / DECODE_PLOT_NAME)
        if why_not is None:
            written.append(folder / DECODE_PLOT_NAME)
        decoded = [f"![fraction of the copy bandwidth against L]({DECODE_PLOT_NAME})" if why_not is None
                   else f"(no plot: {why_not})", "", *decoded]
    for title, body, timed in (
        ("Kernels (TFLOP/s)", grid_table(results), grid),
        ("KV-cache decode (bytes of K, V and block table over time, against the copy bandwidth)", decoded,
         decode.decode_rows(results)),
        ("Varlen (TFLOP/s of the real work; anchors at the same tokens: the dense call at the mean length, "
         "SDPA on the padded batch)", varlen.varlen_table(results), varlen.varlen_rows(results)),
        ("Forward and backward against the anchors (higher is faster)", split_table(results), grid),
        ("Memory growth (exponent: 1 = O(N), 2 = O(N^2))",
         memory_table(results, skipped(output_json, "memory")), []),
        ("Suite hot paths (CPU gate)", calibrated_table(results), gate),
    ):
        if body:
            clock = clock_lines(timed)
            lines += [f"## {title}", "", *clock, *([""] if clock else []), *body, ""]
    md = folder / TABLE_NAME
    md.write_text("\n".join(lines))
    written.append(md)
    return written


def merge(paths: Iterable[Path]) -> dict:
    """Several pytest-benchmark JSON files as one (benchmarks concatenated)."""
    merged: dict = {"benchmarks": []}
    for path in paths:
        data = json.loads(Path(path).read_text())
        merged.setdefault("machine_info", data.get("machine_info", {}))
        merged["benchmarks"] += data.get("benchmarks", [])
        merged["skipped"] = merged.get("skipped", []) + data.get("skipped", [])
    return merged


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, nargs="+", help="pytest-benchmark JSON file(s)")
    parser.add_argument("--out", type=Path, required=True, help="folder for bench.md/bench.png")
    args = parser.parse_args(argv)
    for path in write_report(merge(args.results), args.out):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
