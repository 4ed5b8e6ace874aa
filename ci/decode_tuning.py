#!/usr/bin/env python3
"""The ``triton`` decode kernel's split count and key tile against the bandwidth it reaches, on
chosen rows of the decode grid: the measurements a split heuristic is chosen from.

    python ci/decode_tuning.py --rows "hq32 B1 L131072 contiguous" "hq32 B32 L8192 page16" \\
        --splits 0,16,33,66,132 --block-n 32,64,128 --json tuning.json
    python ci/decode_tuning.py --rows "hq32 B8 L8192 contiguous" --splits 0 --block-n auto \\
        --warps 1,2,4,8 --stages 2,3,4

A row is every label of the benchmark's decode grid (``benchmarks.decode``: the GPU grid on a GPU,
the interpreter's tiny one on the CPU) that holds each given word. For each row and each
(``num_splits``, ``block_n``) the decode entry point is timed by the benchmarks' protocol
(``benchmarks.timing.median_seconds``: warm-up, L2 flush, a spin over the launch, CUDA events) and
reported as bytes read over time, the fraction of the copy bandwidth measured in the same process
(``benchmarks.decode.copy_call``), and the launch the kernel reports (``last_launch``: splits,
tiles, warps, stages). ``num_splits`` 0 is the kernel's own choice (``choose_splits``); a
``block_n`` of ``auto`` leaves the tile to the kernel. The best setting of each row is marked, with
its gain over the kernel's own choice. A setting the kernel refuses is a row saying why.
``--warps`` and ``--stages`` also sweep the partial kernel's launch options, which the entry point
does not take: the tool replaces the kernel's choice (``kernels.triton_decode._tiles``) for those
timings only, to learn what the kernel should choose.

On the CPU (``TRITON_INTERPRET=1``) the same code runs on the tiny grid, to check the tool, not
to measure: interpreted times say nothing of a GPU's.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flashprop.contract.registry import load_kernel
from flashprop.contract.validate import CLEAR_ERRORS
from flashprop.kernels import triton_decode

from benchmarks.bench_decode import make_call
from benchmarks.conftest import reported_launch
from benchmarks.decode import CPU_DECODE, GPU_DECODE, DecodeConfig, configs, copy_call
from benchmarks.timing import RoundSetup, median_seconds

KERNEL = "triton"


@dataclass(frozen=True)
class Setting:
    """One timed setting of one row (``seconds`` ``None``: refused, ``note`` says why)."""

    row: str
    splits: int
    block_n: int | None
    seconds: float | None
    bytes_read: int
    fraction: float | None
    launch: str
    note: str = ""
    warps: int | None = None
    stages: int | None = None


def parse_ints(text: str, *, allow_default: bool = False) -> list[int | None]:
    """``"0,16,33"`` -> [0, 16, 33]; with ``allow_default``, ``auto`` is ``None`` (the kernel's own)."""
    values: list[int | None] = []
    for word in text.split(","):
        word = word.strip()
        if allow_default and word == "auto":
            values.append(None)
            continue
        if not word.isdigit():
            raise SystemExit(f"decode_tuning: {word!r} is not a whole number (in {text!r})")
        values.append(int(word))
    return values


def rows_for(words: list[str], device: str) -> list[DecodeConfig]:
    """The grid's rows whose label holds every word of one of ``words`` (all rows when empty)."""
    grid = configs(GPU_DECODE if device == "cuda" else CPU_DECODE, device)
    if not words:
        return grid
    chosen = [cfg for cfg in grid if any(all(w in cfg.label.split() for w in spec.split()) for spec in words)]
    if not chosen:
        labels = "\n  ".join(cfg.label for cfg in grid)
        raise SystemExit(f"decode_tuning: no row of the {device} grid matches {words}; its rows:\n  {labels}")
    return chosen


@contextlib.contextmanager
def launch_options(warps: int | None, stages: int | None) -> Iterator[None]:
    """The partial kernel launched with ``warps`` and ``stages`` (``None``: the kernel's own) while
    inside: :func:`kernels.triton_decode._tiles`, which chooses them, wrapped and restored."""
    chosen = triton_decode._tiles
    if warps is None and stages is None:
        yield
        return

    def tiles(*args, **kwargs) -> tuple[int, int, int, int]:
        block_m, block_n, own_warps, own_stages = chosen(*args, **kwargs)
        return block_m, block_n, warps or own_warps, stages or own_stages

    triton_decode._tiles = tiles
    try:
        yield
    finally:
        triton_decode._tiles = chosen


def time_setting(kern, cfg: DecodeConfig, splits: int, block_n: int | None, copy_bps: float,
                 device: str, setup: RoundSetup, warps: int | None = None,
                 stages: int | None = None) -> Setting:
    """Time the decode entry point on ``cfg`` with ``num_splits=splits`` (and ``block_n``; the
    partial kernel's ``warps`` and ``stages``: :func:`launch_options`)."""
    tile = {} if block_n is None else {"block_n": block_n}
    options = {"warps": warps, "stages": stages}
    try:
        with launch_options(warps, stages):
            seconds = median_seconds(make_call(kern, cfg, num_splits=splits, **tile), device, setup)
    except (*CLEAR_ERRORS, torch.cuda.OutOfMemoryError) as err:
        reason = f"{type(err).__name__}: {err}"
        return Setting(cfg.label, splits, block_n, None, cfg.bytes_read, None, "", reason, **options)
    launch = "; ".join(reported_launch(kern.entry("kvcache")).values())
    return Setting(cfg.label, splits, block_n, seconds, cfg.bytes_read,
                   cfg.bytes_read / seconds / copy_bps, launch, **options)


def table(settings: list[Setting]) -> list[str]:
    """Markdown lines: every setting, the best of each row marked with its gain over the kernel's
    own choice (``num_splits`` 0 with the kernel's tile) when that was timed."""
    head = ["row", "num_splits", "block_n", "ms", "GB/s", "of copy", "launch", "note"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in dict.fromkeys(s.row for s in settings):
        mine = [s for s in settings if s.row == row]
        timed = [s for s in mine if s.seconds is not None]
        best = min(timed, key=lambda s: s.seconds, default=None)
        own = next((s for s in timed if s.splits == 0 and s.block_n is None and s.warps is None
                    and s.stages is None), None)
        for s in mine:
            note = s.note
            if s is best:
                gain = "" if own is None or own is s else f", {own.seconds / s.seconds:.2f}x the kernel's own"
                note = f"best{gain}"
            cells = [row, "kernel's" if s.splits == 0 else str(s.splits), "kernel's" if s.block_n is None else
                     str(s.block_n), "-" if s.seconds is None else f"{s.seconds * 1e3:.3f}",
                     "-" if s.seconds is None else f"{s.bytes_read / s.seconds / 1e9:.0f}",
                     "-" if s.fraction is None else f"{100 * s.fraction:.1f}%", s.launch, note]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", nargs="*", default=[], metavar="WORDS",
                        help="rows by words of their labels, e.g. 'hq32 B1 L131072 contiguous' (default all)")
    parser.add_argument("--splits", default="0,8,16,33,66,132",
                        help="num_splits values; 0 is the kernel's choice (default %(default)s)")
    parser.add_argument("--block-n", default="auto,32,64,128",
                        help="key tiles; 'auto' is the kernel's (default %(default)s)")
    parser.add_argument("--warps", default="auto", help="the partial kernel's num_warps ('auto': its own)")
    parser.add_argument("--stages", default="auto", help="the partial kernel's num_stages ('auto': its own)")
    parser.add_argument("--device", choices=("cpu", "cuda"),
                        default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", type=Path, help="also write every setting here")
    args = parser.parse_args(argv)
    kern = load_kernel(KERNEL)
    splits, tiles = parse_ints(args.splits), parse_ints(args.block_n, allow_default=True)
    options = list(itertools.product(parse_ints(args.warps, allow_default=True),
                                     parse_ints(args.stages, allow_default=True)))
    setup = RoundSetup(args.device)
    copy, moved = copy_call(args.device)
    copy_bps = moved / median_seconds(copy, args.device, setup)
    del copy
    print(f"decode_tuning: {args.device}, copy {copy_bps / 1e9:.0f} GB/s (read + written)", flush=True)
    settings = []
    for cfg in rows_for(args.rows, args.device):
        for s, bn, (warps, stages) in itertools.product(splits, tiles, options):
            settings.append(time_setting(kern, cfg, s, bn, copy_bps, args.device, setup, warps, stages))
        if args.device == "cuda":
            torch.cuda.empty_cache()
    print("\n".join(table(settings)))
    if args.json:
        found = {"copy_bytes_per_s": copy_bps, "settings": [asdict(s) for s in settings]}
        args.json.write_text(json.dumps(found, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
