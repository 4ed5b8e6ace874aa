"""A transformer block's forward and backward with ``kernels.layer.FlashAttention`` (GPU only).

The block is pre-norm, causal self-attention and a GELU MLP, in bf16::

    x = x + attn(LayerNorm(x));   y = x + W_2 GELU(W_1 LayerNorm(x) + b_1) + b_2     (W_1: d -> 4d)

Each row times ``y`` and ``autograd.grad`` of it for x and every parameter, with the attention
on one kernel: the layer on ``triton`` (eager: the kernel's own backward), and the same block
with the same weights (same seed) whose attention runs SDPA cuDNN or SDPA flash (the layer on
the ``sdpa-cudnn`` / ``sdpa-flash`` adapters, which call ``F.scaled_dot_product_attention``
pinned to that backend, with SDPA's own backward). Same projections, same layout (the kernels
read (B, H, N, D) views of the (B, N, H, D) projections), so the rows differ only in the
attention kernel; the anchors are the SDPA rows, timed in the same process.

Timing follows :mod:`benchmarks.timing` (CUDA events after an L2 flush and a launch-hiding
spin, ``rounds_for`` rounds). ``extra_info``: the block's shape, ``median_s``, ``host_s``,
``block_tflops`` (projections, MLP and attention FLOPs of forward and backward over the
median), ``peak_mem_bytes``, ``ratios`` (each SDPA anchor's seconds over the row's, measured
in this run: what ``ci/bench_gate.py`` compares) and ``timing`` (the protocol). On a machine
without CUDA every row is skipped with the reason "needs CUDA".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from flashprop.contract.registry import BENCH_ANCHORS
from flashprop.kernels.layer import FlashAttention
from torch import Tensor, nn

from .conftest import BenchState, measure_row
from .memory import peak_extra_bytes
from .schema import Row
from .timing import CLOCKS, cuda_event_timer, median_seconds

ANCHORS = BENCH_ANCHORS["cuda"]
KERNELS = (*ANCHORS, "triton")  # anchors first: a kernel row finds their times measured


@dataclass(frozen=True)
class Shape:
    """One block configuration: batch, sequence length, heads, head dim (d_model = heads * d)."""

    b: int
    n: int
    heads: int
    d: int

    @property
    def width(self) -> int:
        return self.heads * self.d

    @property
    def label(self) -> str:
        return f"block b{self.b} n{self.n} h{self.heads} d{self.d} bf16 causal fwd+bwd"

    @property
    def flops(self) -> float:
        """Forward + backward: 3x the forward's matmuls (4 projections, MLP) and 3.5x the
        causal attention's forward (the benchmark grid's factor)."""
        tokens = self.b * self.n
        linear = 2 * tokens * (4 * self.width**2 + 8 * self.width**2)
        attention = 4 * self.b * self.heads * self.n**2 * self.d / 2
        return 3 * linear + 3.5 * attention


SHAPES = (Shape(b=4, n=2048, heads=16, d=128), Shape(b=2, n=4096, heads=16, d=64))


class Block(nn.Module):
    """Pre-norm transformer block whose causal self-attention is the layer on ``kernel``."""

    def __init__(self, width: int, heads: int, kernel: str) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = FlashAttention(width, heads, causal=True, kernel=kernel)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


def make_call(name: str, shape: Shape) -> Callable[[], tuple[Tensor, ...]]:
    """Forward and backward of the block on ``name``; weights and data from fixed seeds."""
    torch.manual_seed(0)
    block = Block(shape.width, shape.heads, name).to("cuda", torch.bfloat16)
    g = torch.Generator("cuda").manual_seed(1)
    x, dy = (
        torch.randn(shape.b, shape.n, shape.width, device="cuda", dtype=torch.bfloat16, generator=g)
        for _ in range(2)
    )
    x.requires_grad_(True)
    inputs = (x, *block.parameters())

    def forward_backward() -> tuple[Tensor, ...]:
        return torch.autograd.grad(block(x), inputs, dy)

    return forward_backward


#: Median seconds per (kernel, shape) in this run, or why the row could not be timed.
_SECONDS: dict[tuple[str, Shape], float | str] = {}


def seconds_of(state: BenchState, name: str, shape: Shape) -> float | None:
    """``name``'s median seconds at ``shape`` in this run (measured now if not yet)."""
    if (name, shape) not in _SECONDS:
        kern = state.load(name)
        try:
            _SECONDS[name, shape] = (
                kern if isinstance(kern, str) else median_seconds(make_call(name, shape), "cuda", state.setup)
            )
        except (ValueError, TypeError, NotImplementedError, torch.cuda.OutOfMemoryError) as err:
            _SECONDS[name, shape] = f"{type(err).__name__}: {err}"
    value = _SECONDS[name, shape]
    return value if isinstance(value, float) else None


@pytest.mark.parametrize(
    "shape",
    [pytest.param(s, marks=pytest.mark.benchmark(group=s.label, timer=cuda_event_timer)) for s in SHAPES],
    ids=lambda s: s.label.replace(" ", "-"),
)
@pytest.mark.parametrize("name", KERNELS)
def test_block_speed(name: str, shape: Shape, benchmark, bench_state: BenchState) -> None:
    """Time the block's forward and backward with attention on ``name``; ratios to SDPA."""
    if bench_state.device != "cuda":
        pytest.skip("needs CUDA")
    kern = bench_state.load(name)
    if isinstance(kern, str):
        pytest.skip(kern)
    timed = measure_row(benchmark, bench_state, name, shape.label, lambda: make_call(name, shape),
                        probe=lambda call: peak_extra_bytes(call, "cuda"))
    if timed is None:
        return
    seconds = timed.seconds
    _SECONDS.setdefault((name, shape), seconds)
    ratios = {
        anchor: anchor_s / seconds
        for anchor in ANCHORS
        if anchor != name and (anchor_s := seconds_of(bench_state, anchor, shape)) is not None
    }
    row = Row(
        kernel=name,
        config=shape.label,
        device="cuda",
        mode="fwd+bwd",
        n=shape.n,
        d=shape.d,
        causal=True,
        dtype="bfloat16",
        b=shape.b,
        h=shape.heads,
        d_model=shape.width,
        flops=shape.flops,
        median_s=seconds,
        host_s=timed.host_seconds,
        block_tflops=shape.flops / seconds / 1e12,
        peak_mem_bytes=timed.probed,
        ratios=ratios,
        timing=CLOCKS["cuda"].protocol,
    )
    benchmark.extra_info.update(row.extra_info())
