"""Markdown table and TFLOP/s plot of a benchmark run (pytest-benchmark JSON).

    python -m benchmarks.report results.json [more.json ...] --out DIR

writes ``DIR/bench.md`` and, when matplotlib is installed, ``DIR/bench.png``: TFLOP/s against N,
one line per kernel (anchors dashed), one panel per (head dim, causal), one row of panels per
(mode, dtype). The same files are written at the end of a bench run given ``--bench-report DIR``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from pathlib import Path

from benchmarks.grid import SHORT_DTYPE

PLOT_NAME, TABLE_NAME = "bench.png", "bench.md"
ANCHOR_STYLE = {"sdpa-flash", "sdpa-cudnn", "sdpa-math"}


def _infos(output_json: dict) -> list[dict]:
    return [b["extra_info"] for b in output_json.get("benchmarks", []) if b.get("extra_info")]


def _grid_key(info: dict) -> tuple:
    return (info["dtype"], info["mode"], info["d"], info["causal"], info["n"], info["kernel"])


def _host_cell(info: dict) -> str:
    """Host milliseconds per call, flagged when they exceed the GPU time (launch-bound)."""
    host = info.get("host_s")
    if host is None:
        return "-"
    bound = " (launch-bound)" if host > info["median_s"] else ""
    return f"{1e3 * host:.3f}{bound}"


def grid_table(infos: Iterable[dict]) -> list[str]:
    """Rows of the TFLOP/s grid: one per kernel and configuration."""
    grid = sorted((i for i in infos if "tflops" in i), key=_grid_key)
    if not grid:
        return []
    anchors = sorted({a for i in grid for a in i.get("ratios", {})})
    head = ["kernel", "mode", "d", "mask", "dtype", "N", "ms", "host ms", "TFLOP/s"]
    head += [f"vs {a}" for a in anchors] + ["peak extra MiB", "launch"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i in grid:
        ratios = i.get("ratios", {})
        cells = [
            i["kernel"],
            i["mode"],
            str(i["d"]),
            "causal" if i["causal"] else "full",
            SHORT_DTYPE.get(i["dtype"], i["dtype"]),
            str(i["n"]),
            f"{1e3 * i['median_s']:.3f}",
            _host_cell(i),
            f"{i['tflops']:.3g}",
            *(f"{ratios[a]:.2f}x" if a in ratios else "-" for a in anchors),
            f"{i['peak_mem_bytes'] / 2**20:.0f}",
            "; ".join(f"{k}: {v}" for k, v in i.get("launch", {}).items()),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def split_table(infos: Iterable[dict]) -> list[str]:
    """Rows of forward and backward-only speed against each anchor, per kernel and
    configuration timed in both modes: backward seconds = (fwd+bwd) - fwd, the anchors' from
    their ratios in the same run (anchor seconds = ratio x kernel seconds)."""
    timed = {(i["kernel"], i["mode"], i["d"], i["causal"], i["dtype"], i["n"]): i
             for i in infos if "tflops" in i}
    lines: list[str] = []
    for (kernel, mode, d, causal, dtype, n), fwd in sorted(timed.items(), key=lambda kv: kv[0]):
        both = timed.get((kernel, "fwd+bwd", d, causal, dtype, n))
        if mode != "fwd" or both is None:
            continue
        bwd_s = both["median_s"] - fwd["median_s"]
        cells = []
        for anchor in sorted(set(fwd["ratios"]) & set(both["ratios"])):
            anchor_bwd = both["ratios"][anchor] * both["median_s"] - fwd["ratios"][anchor] * fwd["median_s"]
            bwd = f"{anchor_bwd / bwd_s:.2f}x" if bwd_s > 0 and anchor_bwd > 0 else "-"
            cells.append(f"{anchor}: fwd {fwd['ratios'][anchor]:.2f}x, bwd {bwd}")
        if cells:
            mask = "causal" if causal else "full"
            lines.append(f"| {kernel} | d{d} {mask} {SHORT_DTYPE.get(dtype, dtype)} | {n} | "
                         f"{1e3 * fwd['median_s']:.3f} | {1e3 * bwd_s:.3f} | {'; '.join(cells)} |")
    if not lines:
        return []
    return ["| kernel | configuration | N | fwd ms | bwd ms ((fwd+bwd) - fwd) | against anchors |",
            "|---|---|---|---|---|---|", *lines]


def calibrated_table(infos: Iterable[dict]) -> list[str]:
    """Rows of the CPU gate: speed relative to the calibration anchor (anchor s / benchmark s)."""
    rows = [i for i in infos if "tflops" not in i and "mem_exponent" not in i and "median_s" in i]
    if not rows:
        return []
    lines = [
        "| benchmark | configuration | median ms | anchor | anchor s / benchmark s | note |",
        "|---|---|---|---|---|---|",
    ]
    for i in rows:
        anchor, ratio = next(iter(i.get("ratios", {}).items()), ("-", None))
        note = f"{i['examples_per_s']:.1f} examples/s" if "examples_per_s" in i else ""
        vs = "-" if ratio is None else f"{ratio:.3f}"
        ms = f"{1e3 * i['median_s']:.2f}"
        lines.append(f"| {i['kernel']} | {i['config']} | {ms} | {anchor} | {vs} | {note} |")
    return lines


def memory_table(infos: Iterable[dict]) -> list[str]:
    """Rows of the memory-growth check: peak extra memory at N and 4N, growth exponent."""
    rows = [i for i in infos if "mem_exponent" in i]
    if not rows:
        return []
    lines = ["| kernel | N | peak extra MiB | growth exponent |", "|---|---|---|---|"]
    for i in rows:
        n = " / ".join(map(str, i["mem_n"]))
        mib = " / ".join(f"{b / 2**20:.1f}" for b in i["mem_peak_bytes"])
        lines.append(f"| {i['kernel']} | {n} | {mib} | {i['mem_exponent']:.2f} |")
    return lines


def plot(infos: Iterable[dict], path: Path) -> str | None:
    """Write the TFLOP/s plot; returns why not when matplotlib is missing or nothing to plot."""
    grid = [i for i in infos if "tflops" in i]
    if not grid:
        return "no TFLOP/s results to plot"
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed"
    rows = sorted({(i["mode"], i["dtype"]) for i in grid})
    cols = sorted({(i["d"], i["causal"]) for i in grid})
    fig, axes = plt.subplots(
        len(rows), len(cols), figsize=(4.2 * len(cols), 3.4 * len(rows)), squeeze=False
    )
    for r, (mode, dtype) in enumerate(rows):
        for c, (d, causal) in enumerate(cols):
            ax = axes[r][c]
            cell = [
                i
                for i in grid
                if (i["mode"], i["dtype"], i["d"], i["causal"]) == (mode, dtype, d, causal)
            ]
            for kernel in sorted({i["kernel"] for i in cell}):
                pts = sorted((i["n"], i["tflops"]) for i in cell if i["kernel"] == kernel)
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
    infos = _infos(output_json)
    written = []
    png = folder / PLOT_NAME
    why_not = plot(infos, png)
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
    for title, body in (
        ("Kernels (TFLOP/s)", grid_table(infos)),
        ("Forward and backward against the anchors (higher is faster)", split_table(infos)),
        ("Memory growth (exponent: 1 = O(N), 2 = O(N^2))", memory_table(infos)),
        ("Suite hot paths (CPU gate)", calibrated_table(infos)),
    ):
        if body:
            lines += [f"## {title}", "", *body, ""]
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
