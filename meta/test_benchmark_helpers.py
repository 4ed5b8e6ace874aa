"""Meta-tests of the benchmark helpers that run on any machine: the report's host-time column
and launch column, and the CPU side of the timing protocol (the CUDA side, the spin before each
round, needs a GPU: ci/gpu_check.py runs it)."""

from __future__ import annotations

import pytest
from flashprop.benchmarks.report import grid_table, split_table
from flashprop.benchmarks.schema import Row, rows
from flashprop.benchmarks.timing import RoundSetup, warm_up

pytestmark = pytest.mark.meta


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
