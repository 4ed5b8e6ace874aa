"""The varlen benchmark rows: packs of sequences of mixed lengths (``fn.varlen``), in TFLOP/s of
the real work.

A row packs sequences whose lengths follow a Zipf-like law (:func:`zipf_lengths`: a power law of
exponent :data:`ZIPF_EXPONENT` between a shortest and a longest length, many short sequences and
a few long ones, drawn with a fixed seed) until they hold the grid's ``tokens`` tokens (16k on a
GPU, like the dense grid's B*N), with H = hidden // D heads (H*D = 2048), bf16 and fp16, D = 64
and 128, causal or not, forward or forward+backward. Its FLOPs count only the real work, each
sequence as ``benchmarks.grid`` counts a dense row: sum_s 4 H N_s^2 D (N_s^2 / 2 when causal),
times the mode's factor; no padding.

Anchors timed in the same process, each in ``ratios`` as the anchor's seconds for the row's real
work over the kernel's seconds (higher is faster):

- ``<kernel> dense``: the kernel's own dense entry point at the same total tokens and the mean
  length, B = tokens // N, N = the pack's mean length (a ``benchmarks.grid.Config``); it does
  other work than the row, so its seconds are scaled by the row's FLOPs over its own, and the
  ratio is the row's TFLOP/s over the dense call's.
- ``<anchor> padded``: the grid's first anchor (SDPA flash on a GPU, SDPA math on the CPU) on the
  padded batch, every sequence padded to the longest (B = the number of sequences, N = the
  longest): its seconds as they are, padding included (the work varlen saves).

The CPU grid (:data:`CPU_VARLEN`) keeps the rules at interpreter sizes (256 tokens, H*D = 128,
D = 64, float32, lengths 8..128): seconds, so that a CPU run covers the code.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from flashprop.contract.problem import DTYPES_BY_NAME, Problem

from .grid import MODE_FLOP_FACTOR, MODES, SHORT_DTYPE, Config
from .schema import Row

#: The power law's exponent: P(N >= n) ~ n^-ZIPF_EXPONENT between the shortest and the longest.
ZIPF_EXPONENT = 1.0
#: The seed of the lengths (every row of a grid packs the same sequences).
LENGTHS_SEED = 0


@dataclass(frozen=True)
class VarlenGrid:
    """The axes of a varlen grid and the pack every row shares."""

    head_dims: tuple[int, ...]
    dtypes: tuple[str, ...]
    tokens: int
    hidden: int
    shortest: int
    longest: int
    causal: tuple[bool, ...] = (False, True)
    modes: tuple[str, ...] = MODES


GPU_VARLEN = VarlenGrid(head_dims=(64, 128), dtypes=("bfloat16", "float16"), tokens=16384, hidden=2048,
                        shortest=64, longest=8192)
CPU_VARLEN = VarlenGrid(head_dims=(64,), dtypes=("float32",), tokens=256, hidden=128, shortest=8,
                        longest=128)


def zipf_lengths(tokens: int, shortest: int, longest: int, seed: int = LENGTHS_SEED) -> tuple[int, ...]:
    """Sequence lengths summing to ``tokens``: draws ``shortest * u^(-1 / ZIPF_EXPONENT)`` (u
    uniform in (0, 1], a Pareto law), rounded and capped at ``longest``, until the pack is full;
    the last one is cut to what is left."""
    g = torch.Generator().manual_seed(seed)
    lengths: list[int] = []
    while sum(lengths) < tokens:
        u = 1.0 - float(torch.rand((), generator=g))
        n = min(longest, round(shortest * u ** (-1.0 / ZIPF_EXPONENT)))
        lengths.append(min(n, tokens - sum(lengths)))
    return tuple(lengths)


@dataclass(frozen=True)
class VarlenConfig:
    """One varlen row: a pack of ``lengths`` (queries and keys alike), H heads of head dim D."""

    lengths: tuple[int, ...]
    d: int
    causal: bool
    dtype: str
    mode: str
    hidden: int
    device: str

    @property
    def tokens(self) -> int:
        return sum(self.lengths)

    @property
    def h(self) -> int:
        return max(1, self.hidden // self.d)

    @property
    def mean(self) -> int:
        """The pack's mean length, rounded (the dense anchor's N)."""
        return max(1, round(self.tokens / len(self.lengths)))

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES_BY_NAME[self.dtype]

    @property
    def flops(self) -> float:
        """The real work: sum_s 4 H pairs_s D (pairs_s = N_s^2, halved when causal), times the
        mode's factor (``benchmarks.grid``'s count, sequence by sequence)."""
        pairs = sum(n * n for n in self.lengths) / (2 if self.causal else 1)
        return 4.0 * self.h * pairs * self.d * MODE_FLOP_FACTOR[self.mode]

    @property
    def label(self) -> str:
        """Stable key, e.g. ``varlen fwd d64 causal T16384 bf16`` (the gate's)."""
        mask = "causal" if self.causal else "full"
        return f"varlen {self.mode} d{self.d} {mask} T{self.tokens} {SHORT_DTYPE[self.dtype]}"

    def dense(self) -> Config:
        """The dense anchor's row: the same tokens at the mean length."""
        return Config(self.mean, self.d, self.causal, self.dtype, self.mode, self.tokens, self.hidden,
                      self.device)

    def padded(self) -> Config:
        """The padded anchor's row: every sequence padded to the longest."""
        longest = max(self.lengths)
        return Config(longest, self.d, self.causal, self.dtype, self.mode, longest * len(self.lengths),
                      self.hidden, self.device)

    def problem(self) -> Problem:
        """The varlen :class:`Problem` a kernel's capabilities are asked about."""
        longest = max(self.lengths)
        return Problem(b=len(self.lengths), hq=self.h, hkv=self.h, nq=longest, nk=longest, d=self.d,
                       dv=self.d, dtype=self.torch_dtype, causal=self.causal, device=self.device,
                       seqlens=tuple((n, n) for n in self.lengths))

    def inputs(self, seed: int = 0) -> tuple[tuple[object, ...], torch.Tensor]:
        """The varlen arguments (contiguous token-major q, k, v (T, H, D), int32 cu_seqlens for
        queries and keys, the longest length twice) and dO, drawn on the device."""
        g = torch.Generator(device=self.device).manual_seed(seed)
        q, k, v, do = (torch.randn((self.tokens, self.h, self.d), generator=g, device=self.device,
                                   dtype=self.torch_dtype) for _ in range(4))
        cu = torch.tensor([0, *self.lengths], dtype=torch.int64).cumsum(0).to(torch.int32).to(self.device)
        longest = max(self.lengths)
        return (q, k, v, cu, cu, longest, longest), do


def configs(grid: VarlenGrid, device: str) -> list[VarlenConfig]:
    """Every row of ``grid``, in a stable order (the same pack in each)."""
    lengths = zipf_lengths(grid.tokens, grid.shortest, grid.longest)
    return [
        VarlenConfig(lengths, d, causal, dtype, mode, grid.hidden, device)
        for dtype in grid.dtypes
        for d in grid.head_dims
        for causal in grid.causal
        for mode in grid.modes
    ]


def varlen_rows(results: Iterable[Row]) -> list[Row]:
    """The varlen rows of a run (those that record their sequence lengths)."""
    return [r for r in results if r.lengths is not None]


def varlen_table(results: Iterable[Row]) -> list[str]:
    """Markdown rows of the varlen grid: the pack, time, TFLOP/s of the real work and the speed
    against each anchor (higher is faster)."""
    rows = sorted(varlen_rows(results), key=lambda r: (r.dtype, r.mode, r.d, r.causal, r.kernel))
    if not rows:
        return []
    anchors = sorted({a for r in rows for a in r.ratios})
    head = ["kernel", "mode", "d", "mask", "dtype", "sequences", "tokens", "mean / longest", "ms",
            "host ms", "TFLOP/s", *(f"vs {a}" for a in anchors), "launch"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [
            r.kernel, r.mode, str(r.d), "causal" if r.causal else "full", SHORT_DTYPE.get(r.dtype, r.dtype),
            str(len(r.lengths)), str(sum(r.lengths)), f"{r.n} / {max(r.lengths)}",
            f"{1e3 * r.median_s:.3f}", "-" if r.host_s is None else f"{1e3 * r.host_s:.3f}",
            f"{r.tflops:.3g}", *(f"{r.ratios[a]:.2f}x" if a in r.ratios else "-" for a in anchors),
            "; ".join(f"{k}: {v}" for k, v in (r.launch or {}).items()),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines
