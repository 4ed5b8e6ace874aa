"""TFLOP/s and peak memory of every registered kernel on the benchmark grid.

Each case times one kernel on one :class:`~benchmarks.grid.Config` (forward, or forward and
backward through autograd). On CUDA the rounds are CUDA-event timed after an L2 flush and a
spin that hides the host's launch latency, on the CPU in wall-clock time (the clocks:
:data:`benchmarks.timing.CLOCKS`); ``extra_info``
carries the TFLOP/s, the host seconds per call (``host_s``), the peak extra memory, what the
kernel says it launched when it can tell (``launch``: a kernel function's optional
``last_launch()``, e.g. the autotuner's tiles), and ``ratios``: the kernel's speed over each
anchor's (``anchor seconds / kernel seconds``) measured in the same run, which is what
``ci/bench_gate.py`` compares with the baseline, and ``timing``, the protocol that timed them
(``CLOCKS[device].protocol``): a grid row of :class:`benchmarks.schema.Row`.

Unavailable kernels and undeclared problems are skipped with the reason.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from flashprop.contract.registry import Kernel
from flashprop.contract.validate import CLEAR_ERRORS

from .conftest import (
    BenchState,
    anchor_names,
    bench_device,
    bench_subset,
    grid_spec,
    kernel_names,
    measure_row,
)
from .grid import Config, configs, size_limit_reason
from .memory import peak_extra_bytes
from .schema import Row
from .timing import CLOCKS, median_seconds


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "case" not in metafunc.fixturenames:
        return
    config = metafunc.config
    device = bench_device(config)
    anchors = anchor_names(config, device)
    names = anchors + tuple(k for k in kernel_names(config) if k not in anchors)
    params = []
    for cfg in configs(grid_spec(config, device), device, bench_subset(config)):
        mark = pytest.mark.benchmark(group=cfg.label, timer=CLOCKS[device].timer)
        for name in names:
            label = f"{name}:{cfg.label.replace(' ', '-')}"
            params.append(pytest.param((name, cfg), marks=mark, id=label))
    metafunc.parametrize("case", params)


def make_call(kern: Kernel, cfg: Config) -> Callable[[], object]:
    """The timed callable: forward under no_grad, or forward and ``autograd.grad`` (with the
    row's variant keywords, :meth:`Config.variant_kwargs`)."""
    q, k, v, do = cfg.inputs()
    variant = cfg.variant_kwargs()
    if cfg.mode == "fwd":

        def forward() -> torch.Tensor:
            with torch.no_grad():
                return kern(q, k, v, causal=cfg.causal, **variant)[0]

        return forward
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))

    def forward_backward() -> tuple[torch.Tensor, ...]:
        o = kern(q, k, v, causal=cfg.causal, **variant)[0]
        return torch.autograd.grad(o, (q, k, v), do)

    return forward_backward


def unsupported_reason(kern: Kernel | str, name: str, cfg: Config) -> str | None:
    """Why ``name`` cannot run ``cfg`` (unavailable, or not declared), or ``None``."""
    if isinstance(kern, str):
        return f"unavailable: {kern}"
    caps = kern.capabilities
    reason = caps.unsupported_reason(cfg.problem())
    if reason is None and cfg.mode == "fwd+bwd" and not caps.backward:
        reason = "backward not declared"
    return None if reason is None else f"{name} does not declare {cfg.label}: {reason}"


def skip_reason(kern: Kernel | str, name: str, cfg: Config) -> str | None:
    """Why ``name`` is not timed at ``cfg``, or ``None``."""
    return unsupported_reason(kern, name, cfg) or size_limit_reason(name, cfg)


def anchor_seconds(state: BenchState, anchor: str, cfg: Config) -> float | None:
    """The anchor's median seconds at ``cfg``'s dense twin (:attr:`Config.anchor_config`) in
    this run, measured now if not yet."""
    cfg = cfg.anchor_config
    key = (anchor, cfg)
    if key not in state.anchor_seconds:
        kern = state.load(anchor)
        reason = skip_reason(kern, anchor, cfg)
        if reason is None:
            try:
                state.anchor_seconds[key] = median_seconds(
                    make_call(kern, cfg), state.device, state.setup
                )
            except (*CLEAR_ERRORS, torch.cuda.OutOfMemoryError) as err:
                reason = f"{type(err).__name__}: {err}"
        if reason is not None:
            state.anchor_seconds[key] = reason
    value = state.anchor_seconds[key]
    return value if isinstance(value, float) else None


def test_attention_speed(
    case: tuple[str, Config], benchmark, bench_state: BenchState, request: pytest.FixtureRequest
) -> None:
    """Time one kernel at one configuration; record TFLOP/s, peak memory and anchor ratios."""
    name, cfg = case
    kern = bench_state.load(name)
    reason = skip_reason(kern, name, cfg)
    if reason is not None:
        pytest.skip(reason)
    device = bench_state.device
    # peak memory after the warm-up's compilation and autotuning
    timed = measure_row(benchmark, bench_state, name, cfg.label, lambda: make_call(kern, cfg),
                        lambda: kern.fn, lambda call: peak_extra_bytes(call, device))
    if timed is None:
        return
    seconds = timed.seconds
    bench_state.anchor_seconds.setdefault((name, cfg), seconds)
    ratios = {}
    for anchor in anchor_names(request.config, device):
        if anchor != name and (anchor_s := anchor_seconds(bench_state, anchor, cfg)) is not None:
            ratios[anchor] = anchor_s / seconds
    row = Row(
        kernel=name,
        config=cfg.label,
        device=device,
        mode=cfg.mode,
        n=cfg.n,
        d=cfg.d,
        causal=cfg.causal,
        dtype=cfg.dtype,
        b=cfg.b,
        h=cfg.h,
        flops=cfg.flops,
        median_s=seconds,
        host_s=timed.host_seconds,
        tflops=cfg.flops / seconds / 1e12,
        peak_mem_bytes=timed.probed,
        ratios=ratios,
        timing=CLOCKS[device].protocol,
        launch=timed.launch,
    )
    benchmark.extra_info.update(row.extra_info())
