"""Meta-tests of the benchmark helpers that run on any machine: the report's host-time column
and launch column, its clock lines and memory rows, the CPU side of the timing protocol (the
CUDA side, the spin before each round, needs a GPU: ci/gpu_check.py runs it), and ``flashprop
bench`` on a user's file kernel that sleeps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from flashprop.benchmarks.report import grid_table, memory_table, split_table, write_report
from flashprop.benchmarks.schema import Row, Skipped, rows
from flashprop.benchmarks.timing import CLOCKS, GATE_CLOCK, RoundSetup, median_seconds, time_once, warm_up

pytestmark = pytest.mark.meta

ROOT = Path(__file__).resolve().parent.parent
NAP_SECONDS = 0.002
#: A user's kernel: sleeps NAP_SECONDS per call and returns o = 0 (little CPU time of its own, so
#: a clock that leaves the sleep out times it well under NAP_SECONDS).
NAPPING_KERNEL = f"""
import time

import torch


def attn(q, k, v, causal=False):
    time.sleep({NAP_SECONDS})
    return torch.zeros_like(q)
"""


def _info(median_s: float, host_s: float | None, **extra) -> Row:
    fields = dict(kernel="k", config="fwd d64 full N512 bf16", mode="fwd", d=64, causal=False,
                  dtype="bfloat16", n=512, tflops=1.0, peak_mem_bytes=0)
    return Row(**{**fields, "median_s": median_s, "host_s": host_s, **extra})


def test_host_time_beyond_gpu_time_is_flagged_launch_bound() -> None:
    rows = grid_table([_info(1e-3, 2e-3), _info(2e-3, 1e-3)])
    by_ms = {row.split(" | ")[6]: row for row in rows[2:]}
    assert "2.000 (launch-bound)" in by_ms["1.000"]
    assert "launch-bound" not in by_ms["2.000"]


def test_host_and_launch_columns() -> None:
    head, _, row = grid_table([_info(1e-3, None, launch={"fwd": "128x64 w8 s3 (tuned)"})])
    assert "host ms" in head and head.rstrip(" |").endswith("launch")
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[7] == "-"  # no host time on the CPU
    assert cells[-1] == "fwd: 128x64 w8 s3 (tuned)"


def test_cpu_warm_up_has_no_host_time_and_no_spin() -> None:
    setup = RoundSetup("cpu")
    calls = []
    warm = warm_up(lambda: calls.append(1), "cpu", setup)
    assert warm.host_seconds is None and warm.seconds >= 0
    assert setup.hold_seconds == 0 and setup.buffer is None
    assert calls == [1]


def test_backward_alone_is_fwd_plus_bwd_minus_fwd_for_kernel_and_anchor() -> None:
    """Kernel: fwd 1 ms, fwd+bwd 4 ms -> bwd 3 ms. Anchor: fwd 2 ms (ratio 2.0), fwd+bwd 8 ms
    (ratio 2.0) -> bwd 6 ms, so the kernel's backward is 2.00x the anchor's."""
    fwd = _info(1e-3, None, ratios={"flash": 2.0})
    both = _info(4e-3, None, ratios={"flash": 2.0}, mode="fwd+bwd")
    lines = split_table([fwd, both])
    assert len(lines) == 3
    assert "| 1.000 | 3.000 | flash: fwd 2.00x, bwd 2.00x |" in lines[2]
    assert split_table([fwd]) == []  # no fwd+bwd row: nothing to subtract


def test_a_row_comes_back_as_written_and_unset_fields_are_not_written() -> None:
    row = _info(1e-3, None, ratios={"sdpa-flash": 1.5}, launch={"fwd": "64x64 w4 s2 (fixed)"})
    info = row.extra_info()
    assert "host_s" not in info and "mem_exponent" not in info
    assert rows({"benchmarks": [{"extra_info": {**info, "unknown": 1}}, {"extra_info": {}}]}) == [row]


def test_the_cpu_protocol_times_a_sleeping_call_in_wall_clock_time() -> None:
    """A call that sleeps 2 ms takes >= 2 ms by the CPU grid's protocol: one call, the median
    over warm-up and rounds, and the timer pytest-benchmark is given. (Process CPU time, the
    gate's clock, leaves the sleep out: a clock choice, not a speed goal.)"""
    setup = RoundSetup("cpu")
    nap = lambda: time.sleep(NAP_SECONDS)  # noqa: E731
    assert time_once(nap, "cpu", setup) >= NAP_SECONDS
    assert median_seconds(nap, "cpu", setup) >= NAP_SECONDS
    timer = CLOCKS["cpu"].timer
    start = timer()
    nap()
    assert timer() - start >= NAP_SECONDS


def test_each_timed_table_says_its_clock(tmp_path: Path) -> None:
    grid = _info(1e-3, None, timing=CLOCKS["cpu"].protocol)
    gate = Row(kernel="golden", config="fwd 1x2x1024x64 float64", median_s=0.1,
               ratios={"dense-f64 large": 1.0}, timing=GATE_CLOCK.protocol)
    write_report({"benchmarks": [{"extra_info": r.extra_info()} for r in (grid, gate)]}, tmp_path)
    text = (tmp_path / "bench.md").read_text()
    kernels, hot_paths = text.split("## Kernels")[1], text.split("## Suite hot paths")[1]
    assert f"Clock: {CLOCKS['cpu'].counts}. Protocol: `{CLOCKS['cpu'].protocol}`." in kernels
    assert "time.perf_counter" in kernels.split("##")[0] and "process_time" not in kernels.split("##")[0]
    assert f"Clock: {GATE_CLOCK.counts}. Protocol: `{GATE_CLOCK.protocol}`." in hot_paths


def test_a_kernel_not_measured_has_a_memory_row_with_the_reason() -> None:
    measured = Row(kernel="golden", config="memory N=1024 vs N=4096", mem_n=[1024, 4096],
                   mem_peak_bytes=[2**20, 4 * 2**20], mem_exponent=1.0)
    not_measured = Skipped("memory", "./mine.py:attn", "unavailable: no GPU")
    head, _, row, skip = memory_table([measured], [not_measured])
    assert head.endswith("| note |") and row.startswith("| golden | 1024 / 4096 | 1.0 / 4.0 | 1.00 |")
    assert skip == "| ./mine.py:attn | - | - | - | not measured: unavailable: no GPU |"


def test_flashprop_bench_times_a_sleeping_file_kernel_and_measures_its_memory(tmp_path: Path) -> None:
    """``flashprop bench --bench-kernels ./nap.py:attn`` on the CPU, as a user runs it (one grid
    configuration): the kernel's 2 ms sleep is in its median, the table names the clock, and
    the memory table has the kernel's row."""
    pytest.importorskip("pytest_benchmark", reason="flashprop bench needs pytest-benchmark")
    (tmp_path / "nap.py").write_text(NAPPING_KERNEL)
    grid = ["--bench-anchors", "sdpa-math", "--bench-seqlens", "128", "--bench-modes", "fwd",
            "-k", "not causal"]
    run = subprocess.run(
        [sys.executable, "-m", "flashprop.cli", "bench", "--device", "cpu",
         "--bench-kernels", "./nap.py:attn", *grid, "--json", "run.json"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stdout + run.stderr
    results = rows(json.loads((tmp_path / "run.json").read_text()))
    timed = [r for r in results if r.kernel == "./nap.py:attn" and r.tflops is not None]
    assert [r.config for r in timed] == ["fwd d64 full N128 fp32"], results
    assert timed[0].median_s >= NAP_SECONDS and timed[0].timing == CLOCKS["cpu"].protocol
    assert f"Clock: {CLOCKS['cpu'].counts}." in run.stdout, run.stdout
    memory = [r for r in results if r.kernel == "./nap.py:attn" and r.mem_exponent is not None]
    assert len(memory) == 1 and memory[0].mem_n == [1024, 4096], results
    assert "\n| ./nap.py:attn | 1024 / 4096 | " in run.stdout, run.stdout


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the triton kernel on the CPU needs "
                    "TRITON_INTERPRET=1 (set by tox)")
def test_the_triton_kernels_last_launch_is_the_last_calls_passes() -> None:
    """A forward after a forward and backward reports its one pass, not the earlier backward's
    (a fwd row of the benchmark table listed the bwd tiles of the row before it)."""
    from flashprop.kernels.triton_attention import attention, last_launch

    q, k, v = (torch.randn(1, 1, 16, 16, requires_grad=True) for _ in range(3))
    attention(q, k, v)[0].sum().backward()
    assert set(last_launch()) == {"fwd", "bwd_dkdv", "bwd_dq"}
    with torch.no_grad():
        attention(q, k, v)
    assert set(last_launch()) == {"fwd"}


@pytest.mark.parametrize("variant", ["softcap", "alibi", "sinks", "window"])
def test_a_variant_row_times_its_anchors_on_its_dense_twin(variant: str) -> None:
    """SDPA has no softcap or sinks, and a mask-emulated window times the mask: every variant
    row's anchors run the same shape dense, so each row has a ratio the gate can track."""
    from dataclasses import replace

    from flashprop.benchmarks.grid import CPU_GRID, configs

    rows = configs(replace(CPU_GRID, variants=("dense", variant), modes=("fwd",)), "cpu")
    dense = {(c.n, c.d, c.causal, c.mode) for c in rows if c.variant == "dense"}
    twins = [c.anchor_config for c in rows if c.variant == variant]
    assert twins and all(t.variant == "dense" and (t.n, t.d, t.causal, t.mode) in dense for t in twins)
