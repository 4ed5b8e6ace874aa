"""TFLOP/s of varlen (``fn.varlen``) on the varlen grid (``benchmarks/varlen.py``): packs of
Zipf-like sequence lengths, the real work only, against the same kernel's dense call at the mean
length and the grid's first anchor on the padded batch, all timed in this process.

    python -m pytest benchmarks/bench_varlen.py --device cuda --benchmark-json varlen.json \\
        --bench-report out/                       # the GPU grid; -k "d128 and bf16" narrows it

Each case times one kernel on one :class:`~benchmarks.varlen.VarlenConfig` under the device's
clock (:data:`benchmarks.timing.CLOCKS`) and records a varlen row of
:class:`benchmarks.schema.Row`: the pack's lengths, FLOPs of the real work, seconds, TFLOP/s, what
the kernel says it launched (``last_launch()``) and ``ratios`` (``benchmarks.varlen``'s
anchors), which ``ci/bench_gate.py`` gates. Kernels: ``--bench-kernels`` (those that declare the
row's varlen problem; default :data:`VARLEN_KERNELS`); the padded anchor is the first of
``--bench-anchors`` (default SDPA flash on CUDA, SDPA math on the CPU). Unavailable kernels,
undeclared problems and refusals are skipped with the reason.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from flashprop.contract.registry import Kernel
from flashprop.contract.validate import CLEAR_ERRORS

from .bench_attention import make_call as dense_call
from .bench_attention import skip_reason as dense_skip_reason
from .conftest import BenchState, anchor_names, measure_row, parametrize_rows
from .grid import Config
from .schema import Row
from .timing import CLOCKS, median_seconds
from .varlen import CPU_VARLEN, GPU_VARLEN, VarlenConfig, configs

#: The kernels timed unless ``--bench-kernels`` names others.
VARLEN_KERNELS = ("triton",)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "varlen_case" in metafunc.fixturenames:
        parametrize_rows(metafunc, "varlen_case", VARLEN_KERNELS,
                         lambda device: configs(GPU_VARLEN if device == "cuda" else CPU_VARLEN, device))


def make_call(kern: Kernel, cfg: VarlenConfig) -> Callable[[], object]:
    """The timed callable: the kernel's varlen entry point on the pack, forward under no_grad, or
    forward and ``autograd.grad``."""
    args, do = cfg.inputs()
    if cfg.mode == "fwd":

        def forward() -> torch.Tensor:
            with torch.no_grad():
                return kern.call("varlen", args, {}, causal=cfg.causal)[0]

        return forward
    q, k, v = (t.requires_grad_(True) for t in args[:3])

    def forward_backward() -> tuple[torch.Tensor, ...]:
        o = kern.call("varlen", (q, k, v, *args[3:]), {}, causal=cfg.causal)[0]
        return torch.autograd.grad(o, (q, k, v), do)

    return forward_backward


def anchor_seconds(state: BenchState, kern: Kernel | str, name: str, cfg: Config) -> float | None:
    """A dense anchor's median seconds at ``cfg`` in this run (measured once), or ``None`` when
    it cannot run it."""
    key = (name, cfg)
    if key not in state.anchor_seconds:
        reason = dense_skip_reason(kern, name, cfg)
        if reason is None:
            try:
                state.anchor_seconds[key] = median_seconds(dense_call(kern, cfg), state.device, state.setup)
            except (*CLEAR_ERRORS, torch.cuda.OutOfMemoryError) as err:
                reason = f"{type(err).__name__}: {err}"
        if reason is not None:
            state.anchor_seconds[key] = reason
    value = state.anchor_seconds[key]
    return value if isinstance(value, float) else None


def test_varlen_speed(varlen_case: tuple[str, VarlenConfig], benchmark, bench_state: BenchState,
                      request: pytest.FixtureRequest) -> None:
    """Time one kernel's varlen call on one pack; record TFLOP/s of the real work and the anchors'
    ratios."""
    name, cfg = varlen_case
    kern = bench_state.load(name)
    if isinstance(kern, str):
        pytest.skip(f"unavailable: {kern}")
    reason = kern.capabilities.unsupported_reason(cfg.problem())
    if reason is not None:
        pytest.skip(f"{name} does not declare {cfg.label}: {reason}")
    device = bench_state.device
    timed = measure_row(benchmark, bench_state, name, cfg.label, lambda: make_call(kern, cfg),
                        lambda: kern.fn)  # its launch, before the anchors'
    if timed is None:
        return
    seconds = timed.seconds
    ratios = {}
    dense = cfg.dense()
    if (dense_s := anchor_seconds(bench_state, kern, name, dense)) is not None:
        ratios[f"{name} dense"] = dense_s * (cfg.flops / dense.flops) / seconds
    padded_by = anchor_names(request.config, device)[0]
    padded_s = anchor_seconds(bench_state, bench_state.load(padded_by), padded_by, cfg.padded())
    if padded_s is not None:
        ratios[f"{padded_by} padded"] = padded_s / seconds
    row = Row(
        kernel=name,
        config=cfg.label,
        device=device,
        mode=cfg.mode,
        n=cfg.mean,
        d=cfg.d,
        causal=cfg.causal,
        dtype=cfg.dtype,
        b=len(cfg.lengths),
        h=cfg.h,
        lengths=list(cfg.lengths),
        flops=cfg.flops,
        median_s=seconds,
        host_s=timed.host_seconds,
        tflops=cfg.flops / seconds / 1e12,
        ratios=ratios,
        timing=CLOCKS[device].protocol,
        launch=timed.launch,
    )
    benchmark.extra_info.update(row.extra_info())
