"""Bandwidth of KV-cache decode (``fn.kvcache``) on the decode grid (``benchmarks/decode.py``).

Each case times one kernel's decode entry point on one :class:`~benchmarks.decode.DecodeConfig`
under the device's clock (:data:`benchmarks.timing.CLOCKS`: CUDA events after an L2 flush and a
spin on a GPU, wall-clock time on the CPU), and records a decode row of
:class:`benchmarks.schema.Row`: the bytes it reads, its seconds and host seconds, what the kernel
says it launched (``last_launch()`` of its entry point: the triton kernel's split count and
tiles), and ``ratios``, anchor seconds / kernel seconds from the same process: ``copy`` (the
row's bytes at the copy bandwidth measured here: the fraction of it the row reaches) on every
row, and on contiguous caches the dense entry points of :data:`~benchmarks.decode.DECODE_ANCHORS`
(Flex, SDPA flash and cuDNN on a GPU; SDPA math on the CPU). ``ci/bench_gate.py`` gates them.

    python -m pytest benchmarks/bench_decode.py --device cuda --benchmark-json decode.json \\
        --bench-report out/                       # the full GPU grid; -k "B1 and L131072" narrows it

Kernels: ``--bench-kernels`` (those that declare the row's decode problem), default
:data:`~benchmarks.decode.DECODE_KERNELS`. Unavailable kernels, undeclared problems and refusals
are skipped with the reason. ``FLASHPROP_BENCH_DECODE_PLANT=one-split`` plants the slowdown the
gate must catch (:func:`benchmarks.decode.planted_splits`).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from flashprop.contract.registry import Kernel
from flashprop.contract.validate import CLEAR_ERRORS

from .conftest import BenchState, measure_row, parametrize_rows
from .decode import (
    CPU_DECODE,
    DECODE_ANCHORS,
    DECODE_KERNELS,
    GPU_DECODE,
    DecodeConfig,
    configs,
    copy_call,
    copy_seconds,
    planted_splits,
)
from .schema import Row
from .timing import CLOCKS, median_seconds


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "decode_case" in metafunc.fixturenames:
        parametrize_rows(metafunc, "decode_case", DECODE_KERNELS,
                         lambda device: configs(GPU_DECODE if device == "cuda" else CPU_DECODE, device))


def make_call(kern: Kernel, cfg: DecodeConfig, **settings: object) -> Callable[[], object]:
    """The timed callable: the kernel's decode entry point on the row's cache, under no_grad,
    with ``num_splits`` 0 (the kernel chooses) unless the planted slowdown says 1; ``settings``
    (``num_splits``, ``block_n``: ``ci/decode_tuning.py``'s sweep) replace those keywords."""
    args, kw = cfg.inputs()
    kw["num_splits"] = planted_splits(cfg)
    kw.update(settings)

    def decode() -> object:
        with torch.no_grad():
            return kern.call("kvcache", args, kw)[0]

    return decode


def anchor_call(kern: Kernel, cfg: DecodeConfig) -> Callable[[], object]:
    """An anchor's timed callable: its dense entry point on the row's attention as dense tensors."""
    q, k, v = cfg.anchor_inputs()

    def dense() -> object:
        with torch.no_grad():
            return kern(q, k, v)[0]

    return dense


def unsupported_reason(kern: Kernel | str, name: str, problem) -> str | None:
    """Why ``name`` cannot run ``problem`` (unavailable, or not declared), or ``None``."""
    if isinstance(kern, str):
        return f"unavailable: {kern}"
    reason = kern.capabilities.unsupported_reason(problem)
    return None if reason is None else f"{name} does not declare it: {reason}"


def copy_bandwidth(state: BenchState) -> float:
    """Bytes per second of the device's copy (read and written), timed once per process."""
    key = ("copy", state.device)
    if key not in state.anchor_seconds:
        call, moved = copy_call(state.device)
        state.anchor_seconds[key] = moved / median_seconds(call, state.device, state.setup)
    return state.anchor_seconds[key]


def anchor_seconds(state: BenchState, anchor: str, cfg: DecodeConfig) -> float | None:
    """The anchor's median seconds on the row's attention in this process (measured once), or
    ``None`` when it cannot run it."""
    key = (anchor, cfg.label)
    if key not in state.anchor_seconds:
        kern = state.load(anchor)
        reason = unsupported_reason(kern, anchor, cfg.anchor_problem())
        if reason is None:
            try:
                state.anchor_seconds[key] = median_seconds(anchor_call(kern, cfg), state.device, state.setup)
            except (*CLEAR_ERRORS, torch.cuda.OutOfMemoryError) as err:
                reason = f"{type(err).__name__}: {err}"
        if reason is not None:
            state.anchor_seconds[key] = reason
    value = state.anchor_seconds[key]
    return value if isinstance(value, float) else None


def test_decode_bandwidth(decode_case: tuple[str, DecodeConfig], benchmark, bench_state: BenchState) -> None:
    """Time one kernel's decode on one row; record its bytes, seconds and anchor ratios."""
    name, cfg = decode_case
    kern = bench_state.load(name)
    reason = unsupported_reason(kern, name, cfg.problem())
    if reason is not None:
        pytest.skip(f"{cfg.label}: {reason}")
    device = bench_state.device
    if device == "cuda":
        torch.cuda.empty_cache()  # the rows' caches differ in size by up to 4096x
    timed = measure_row(benchmark, bench_state, name, cfg.label, lambda: make_call(kern, cfg),
                        lambda: kern.entry("kvcache"))
    if timed is None:
        return
    seconds = timed.seconds
    ratios = {"copy": copy_seconds(cfg, copy_bandwidth(bench_state)) / seconds}
    if cfg.page_size is None:  # the kernel's cache is freed: the anchors take their own
        for anchor in DECODE_ANCHORS[device]:
            if anchor != name and (anchor_s := anchor_seconds(bench_state, anchor, cfg)) is not None:
                ratios[anchor] = anchor_s / seconds
    row = Row(
        kernel=name,
        config=cfg.label,
        device=device,
        mode="decode",
        n=cfg.length,
        d=cfg.d,
        causal=False,
        dtype=cfg.dtype,
        b=cfg.b,
        h=cfg.hq,
        hkv=cfg.hkv,
        page_size=cfg.page_size,
        bytes_read=cfg.bytes_read,
        median_s=seconds,
        host_s=timed.host_seconds,
        ratios=ratios,
        timing=CLOCKS[device].protocol,
        launch=timed.launch,
        gated=False if device == "cuda" and cfg.launch_bound else None,
    )
    benchmark.extra_info.update(row.extra_info())
