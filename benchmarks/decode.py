"""The decode benchmark rows: KV-cache decode (``fn.kvcache``) at serving shapes, judged by the
memory bandwidth it reaches.

Decode reads the whole cache for a query or a few: it is bound by memory, not by FLOPs, so its
yardstick is bytes. A row's bytes are those a decode must read, each once: the K and V of every
cached key, ``B * L * Hkv * (D + Dv) * itemsize``, and on a paged cache the block-table entries
of its pages, ``B * ceil(L / page_size) * 4`` (:attr:`DecodeConfig.bytes_read`). Its bandwidth
is bytes / seconds, reported as a fraction of the device's copy bandwidth measured in the same
process (:func:`copy_seconds`: a large ``dst.copy_(src)``, counting each byte read and written,
``2 * bytes / seconds``). That fraction is the ratio of the ``copy`` anchor, whose seconds for a
row are the row's bytes at the copy bandwidth: ``copy`` seconds / kernel seconds, gated like any
other anchor ratio (``benchmarks/gate.py``).

GPU grid (:data:`GPU_DECODE`): bf16, D = Dv = 128, one query per sequence (Nq = 1), Hkv = 8,
Hq = 32 and 64, B in 1, 8, 32, 128, cache lengths L in 1k, 8k, 32k, 128k (every sequence L
keys, so B * L keys are read) with B * L <= 2^22 (at most 17 GB of K and V), the cache
contiguous, paged in pages of 16 and of 256 keys behind a shuffled block table.
CPU grid (:data:`CPU_DECODE`, the interpreter): fp32, D = 16, Hq = 4, Hkv = 2, B in 1, 2,
L in 64, 256, contiguous and pages of 16: seconds, so that a CPU run covers the code.

Same-process anchors besides ``copy``, on the contiguous rows: the registered kernels
:data:`DECODE_ANCHORS` called through their dense entry point on the same problem as dense
tensors, q (B, Hq, 1, D) against k, v (B, Hkv, L, D): FlexAttention (compiled; its decoding
kernel serves short queries) and SDPA's flash and cuDNN backends (GQA through ``enable_gqa``).
The issue's bar is the faster of the two SDPA ones (:func:`best_sdpa`). A row reading less than
:data:`LAUNCH_BOUND_BYTES` is marked launch-bound in the table: its time, not its bandwidth, is
what it shows. On a GPU such a row is not gated (``Row.gated``): its time is mostly the host's
latency, which moved by a third between two processes of the same code on the H200 (B = 8, 1k keys:
7.8% and 11.7% of the copy bandwidth, session 30), more than the gate's tolerance.

Planted slowdown (``FLASHPROP_BENCH_DECODE_PLANT=one-split``, :func:`planted_splits`): every
row whose cache holds at least :data:`PLANT_FROM` keys per sequence calls the kernel with
``num_splits=1`` instead of letting it choose, so a B = 1 row streams 128k keys through one
program per kv head; the gate must catch it (on a GPU: the splits are what fill it).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from flashprop.contract.problem import DTYPES_BY_NAME, Problem

from .grid import SHORT_DTYPE
from .plotting import MISSING, pyplot
from .schema import Row

#: Below this many bytes read per call a row is launch-bound (the issue's threshold: 256 MB).
LAUNCH_BOUND_BYTES = 256 * 10**6
#: The copy that measures the device's bandwidth: this many bytes copied (and as many read).
COPY_BYTES = {"cuda": 2 * 2**30, "cpu": 64 * 2**20}
#: The anchors of the contiguous rows: registered kernels' dense entry points.
DECODE_ANCHORS = {"cuda": ("flex", "sdpa-flash", "sdpa-cudnn"), "cpu": ("sdpa-math",)}
#: The SDPA anchors, of which the faster is the issue's bar.
SDPA_ANCHORS = ("sdpa-flash", "sdpa-cudnn")
#: The kernels timed unless ``--bench-kernels`` names others.
DECODE_KERNELS = ("triton",)
#: The planted slowdown's variable and value, and the cache length from which it forces one split.
PLANT_ENV, PLANT_VALUE = "FLASHPROP_BENCH_DECODE_PLANT", "one-split"
PLANT_FROM = {"cuda": 8192, "cpu": 256}
#: Layouts of the cache: ``None`` contiguous, else a page size.
Layout = int | None


@dataclass(frozen=True)
class DecodeGrid:
    """The axes of a decode grid (every combination with ``b * length <= max_keys``)."""

    heads: tuple[int, ...]
    kv_heads: int
    batches: tuple[int, ...]
    lengths: tuple[int, ...]
    layouts: tuple[Layout, ...]
    d: int
    dtype: str
    max_keys: int


GPU_DECODE = DecodeGrid(heads=(32, 64), kv_heads=8, batches=(1, 8, 32, 128),
                        lengths=(1024, 8192, 32768, 131072), layouts=(None, 16, 256), d=128,
                        dtype="bfloat16", max_keys=2**22)
CPU_DECODE = DecodeGrid(heads=(4,), kv_heads=2, batches=(1, 2), lengths=(64, 256), layouts=(None, 16),
                        d=16, dtype="float32", max_keys=2**10)


@dataclass(frozen=True)
class DecodeConfig:
    """One decode row: B sequences of ``length`` cached keys each, one query each."""

    hq: int
    hkv: int
    b: int
    length: int
    page_size: Layout
    d: int
    dtype: str
    device: str

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES_BY_NAME[self.dtype]

    @property
    def layout(self) -> str:
        return "contiguous" if self.page_size is None else f"page{self.page_size}"

    @property
    def label(self) -> str:
        """Stable key, e.g. ``decode hq32 hkv8 d128 B1 L131072 page16 bf16``."""
        return (f"decode hq{self.hq} hkv{self.hkv} d{self.d} B{self.b} L{self.length} {self.layout} "
                f"{SHORT_DTYPE[self.dtype]}")

    @property
    def pages(self) -> int:
        """Pages per sequence (0 for a contiguous cache)."""
        return 0 if self.page_size is None else math.ceil(self.length / self.page_size)

    @property
    def bytes_read(self) -> int:
        """What one decode must read: every cached key's K and V, and the block-table entries."""
        kv = self.b * self.length * self.hkv * 2 * self.d * self.torch_dtype.itemsize
        return kv + self.b * self.pages * 4

    @property
    def launch_bound(self) -> bool:
        return self.bytes_read < LAUNCH_BOUND_BYTES

    def problem(self) -> Problem:
        """The decode :class:`Problem` a kernel's capabilities are asked about."""
        capacity = self.length if self.page_size is None else self.pages * self.page_size
        return Problem(b=self.b, hq=self.hq, hkv=self.hkv, nq=1, nk=capacity, d=self.d, dv=self.d,
                       dtype=self.torch_dtype, device=self.device, cache=(self.length,) * self.b,
                       page_size=self.page_size)

    def anchor_problem(self) -> Problem:
        """The same attention as a dense problem (one query against ``length`` keys)."""
        return Problem(b=self.b, hq=self.hq, hkv=self.hkv, nq=1, nk=self.length, d=self.d, dv=self.d,
                       dtype=self.torch_dtype, device=self.device)

    def inputs(self, seed: int = 0) -> tuple[tuple[torch.Tensor, ...], dict[str, object]]:
        """The kernel's decode arguments, drawn on the device: q (B, 1, Hq, D); the cache (B, L,
        Hkv, D), or pages (B * pages, page_size, Hkv, D) behind a shuffled int32 block table;
        ``cache_seqlens`` all L."""
        g = torch.Generator(device=self.device).manual_seed(seed)

        def randn(*shape: int) -> torch.Tensor:
            return torch.randn(shape, generator=g, device=self.device, dtype=self.torch_dtype)

        q = randn(self.b, 1, self.hq, self.d)
        kw: dict[str, object] = {
            "cache_seqlens": torch.full((self.b,), self.length, dtype=torch.int32, device=self.device)
        }
        if self.page_size is None:
            cache = tuple(randn(self.b, self.length, self.hkv, self.d) for _ in range(2))
        else:
            count = self.b * self.pages
            cache = tuple(randn(count, self.page_size, self.hkv, self.d) for _ in range(2))
            order = torch.randperm(count, generator=g, device=self.device)
            kw["block_table"] = order.view(self.b, self.pages).to(torch.int32)
        return (q, *cache), kw

    def anchor_inputs(self, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Contiguous dense q (B, Hq, 1, D), k, v (B, Hkv, L, D) for the anchors' dense entry points."""
        g = torch.Generator(device=self.device).manual_seed(seed)
        shapes = ((self.b, self.hq, 1, self.d), *((self.b, self.hkv, self.length, self.d),) * 2)
        return tuple(torch.randn(s, generator=g, device=self.device, dtype=self.torch_dtype) for s in shapes)


def configs(grid: DecodeGrid, device: str) -> list[DecodeConfig]:
    """Every row of ``grid``, in a stable order."""
    return [
        DecodeConfig(hq, grid.kv_heads, b, length, layout, grid.d, grid.dtype, device)
        for hq in grid.heads
        for layout in grid.layouts
        for b in grid.batches
        for length in grid.lengths
        if b * length <= grid.max_keys
    ]


def planted_splits(cfg: DecodeConfig) -> int:
    """``num_splits`` of the row's call: 0 (the kernel chooses), or 1 on rows of at least
    :data:`PLANT_FROM` keys per sequence when the planted slowdown is on (:data:`PLANT_ENV`)."""
    plant = os.environ.get(PLANT_ENV, "")
    if plant and plant != PLANT_VALUE:
        raise ValueError(f"{PLANT_ENV}={plant!r}: the one planted slowdown is {PLANT_VALUE!r}")
    return 1 if plant and cfg.length >= PLANT_FROM[cfg.device] else 0


def copy_call(device: str) -> tuple[Callable[[], object], int]:
    """The copy that measures the bandwidth (``dst.copy_(src)`` of :data:`COPY_BYTES`) and the bytes
    it moves, read and written."""
    count = COPY_BYTES[device] // 4
    src = torch.ones(count, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    return (lambda: dst.copy_(src)), 2 * count * 4


def copy_seconds(cfg: DecodeConfig, copy_bytes_per_s: float) -> float:
    """The ``copy`` anchor's seconds for a row: its bytes at the measured copy bandwidth."""
    return cfg.bytes_read / copy_bytes_per_s


def best_sdpa(ratios: dict[str, float]) -> tuple[str, float] | None:
    """The faster SDPA anchor of a row (its smaller ratio: anchor seconds / kernel seconds) and
    that ratio, or ``None`` when neither ran."""
    timed = [(ratios[a], a) for a in SDPA_ANCHORS if a in ratios]
    return None if not timed else min(timed)[::-1]


def decode_rows(results: Iterable[Row]) -> list[Row]:
    """The decode rows of a run (those that record the bytes they read)."""
    return [r for r in results if r.bytes_read is not None]


def decode_table(results: Iterable[Row]) -> list[str]:
    """Markdown rows of the decode grid: time, bytes, bandwidth and its fraction of the copy's,
    the speed against every other anchor and against the faster SDPA backend (higher is faster)."""
    rows = sorted(decode_rows(results), key=lambda r: (r.dtype, r.h, r.page_size or 0, r.b, r.n, r.kernel))
    if not rows:
        return []
    anchors = sorted({a for r in rows for a in r.ratios} - {"copy"})
    sdpa = any(a in SDPA_ANCHORS for a in anchors)
    head = ["kernel", "Hq/Hkv", "B", "L", "cache", "ms", "host ms", "MB read", "GB/s", "of copy",
            *(f"vs {a}" for a in anchors), *(["vs faster SDPA"] if sdpa else []), "note", "launch"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        best = best_sdpa(r.ratios)
        bound = r.bytes_read < LAUNCH_BOUND_BYTES
        cells = [
            r.kernel, f"{r.h}/{r.hkv}", str(r.b), str(r.n),
            "contiguous" if r.page_size is None else f"page {r.page_size}",
            f"{1e3 * r.median_s:.3f}", "-" if r.host_s is None else f"{1e3 * r.host_s:.3f}",
            f"{r.bytes_read / 1e6:.1f}", f"{r.bytes_read / r.median_s / 1e9:.4g}",
            f"{100 * r.ratios['copy']:.3g}%" if "copy" in r.ratios else "-",
            *(f"{r.ratios[a]:.2f}x" if a in r.ratios else "-" for a in anchors),
            *([f"{best[1]:.2f}x ({best[0]})" if best else "-"] if sdpa else []),
            f"launch-bound (< {LAUNCH_BOUND_BYTES // 10**6} MB)" if bound else "",
            "; ".join(f"{k}: {v}" for k, v in (r.launch or {}).items()),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def plot(results: Iterable[Row], path: Path) -> str | None:
    """Write the fraction of the copy bandwidth against L, one line per (kernel, cache layout), one
    panel per (Hq, B); returns why not when matplotlib is missing or nothing is to be plotted."""
    rows = [r for r in decode_rows(results) if "copy" in r.ratios]
    if not rows:
        return "no decode rows to plot"
    plt = pyplot()
    if plt is None:
        return MISSING
    panels = sorted({(r.h, r.b) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    for ax, (h, b) in zip(axes[0], panels):
        cell = [r for r in rows if (r.h, r.b) == (h, b)]
        for kernel, page in sorted({(r.kernel, r.page_size or 0) for r in cell}):
            line = [r for r in cell if (r.kernel, r.page_size or 0) == (kernel, page)]
            pts = sorted((r.n, r.ratios["copy"]) for r in line)
            ax.plot(*zip(*pts), marker="o", label=f"{kernel} {'contiguous' if not page else f'page {page}'}")
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 1.05)
        ax.set_title(f"decode Hq={h} B={b}", fontsize=9)
        ax.set_xlabel("cache length L")
        ax.set_ylabel("fraction of copy bandwidth")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return None
