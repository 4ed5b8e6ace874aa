"""Meta-tests of the decode benchmark (``benchmarks/decode.py``, ``benchmarks/bench_decode.py``) on
the CPU: the bytes a row counts, the grids' bounds, the planted slowdown's split count, the table
(launch-bound rows, the faster SDPA anchor, decode rows kept out of the CPU gate's table), and one
CPU row benchmarked end to end with the slowdown planted (the ``triton`` kernel, interpreted).

Whether the gate catches the planted slowdown needs a GPU: interpreted, a split is one more
program run after the others, so one split is faster on the CPU, not slower (the commands of
``docs/benchmarks.md`` run it on the H200)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from flashprop.benchmarks.decode import (
    CPU_DECODE,
    GPU_DECODE,
    LAUNCH_BOUND_BYTES,
    PLANT_ENV,
    PLANT_FROM,
    PLANT_VALUE,
    DecodeConfig,
    best_sdpa,
    configs,
    decode_table,
    planted_splits,
)
from flashprop.benchmarks.report import gate_rows
from flashprop.benchmarks.schema import Row, rows

pytestmark = pytest.mark.meta

ROOT = Path(__file__).resolve().parent.parent


def _row(**fields) -> Row:
    base = dict(kernel="triton", config="decode", device="cuda", mode="decode", n=131072, d=128,
                dtype="bfloat16", b=1, h=32, hkv=8, page_size=None, bytes_read=2 * 131072 * 8 * 128 * 2,
                median_s=1e-4, ratios={"copy": 0.8})
    return Row(**{**base, **fields})


def test_a_row_counts_k_v_and_the_table_entries_of_its_pages() -> None:
    paged = DecodeConfig(hq=32, hkv=8, b=4, length=1000, page_size=16, d=128, dtype="bfloat16", device="cuda")
    assert paged.pages == 63  # ceil(1000 / 16)
    assert paged.bytes_read == 4 * 1000 * 8 * (128 + 128) * 2 + 4 * 63 * 4
    contiguous = DecodeConfig(32, 8, 4, 1000, None, 128, "bfloat16", "cuda")
    assert contiguous.bytes_read == 4 * 1000 * 8 * 256 * 2 and contiguous.layout == "contiguous"
    problem = paged.problem()
    assert (problem.cache, problem.page_size, problem.nk, problem.nq) == ((1000,) * 4, 16, 63 * 16, 1)


def test_the_grids_stay_within_their_key_budget() -> None:
    gpu = configs(GPU_DECODE, "cuda")
    assert all(c.b * c.length <= GPU_DECODE.max_keys for c in gpu)
    assert {(c.b, c.length) for c in gpu} >= {(1, 131072), (32, 131072), (128, 32768), (128, 1024)}
    assert {c.layout for c in gpu} == {"contiguous", "page16", "page256"} and {c.hq for c in gpu} == {32, 64}
    assert len({c.label for c in gpu}) == len(gpu)
    assert all(c.launch_bound for c in configs(CPU_DECODE, "cpu"))


def test_the_planted_slowdown_forces_one_split_on_long_caches_only(monkeypatch) -> None:
    long, short = (DecodeConfig(32, 8, 1, n, None, 128, "bfloat16", "cuda")
                   for n in (PLANT_FROM["cuda"], 1024))
    assert planted_splits(long) == planted_splits(short) == 0
    monkeypatch.setenv(PLANT_ENV, PLANT_VALUE)
    assert (planted_splits(long), planted_splits(short)) == (1, 0)
    monkeypatch.setenv(PLANT_ENV, "two-splits")
    with pytest.raises(ValueError, match=PLANT_VALUE):
        planted_splits(long)


def test_the_table_marks_launch_bound_rows_and_takes_the_faster_sdpa() -> None:
    big = _row(ratios={"copy": 0.81, "sdpa-flash": 1.3, "sdpa-cudnn": 1.1, "flex": 1.5})
    small = _row(n=1024, bytes_read=LAUNCH_BOUND_BYTES - 1, ratios={"copy": 0.1})
    assert best_sdpa(big.ratios) == ("sdpa-cudnn", 1.1) and best_sdpa(small.ratios) is None
    head, _, first, second = decode_table([big, small])
    assert "vs faster SDPA" in head and "vs flex" in head
    assert "launch-bound" in first and "1.10x (sdpa-cudnn)" not in first  # sorted by L: the 1k row first
    assert "1.10x (sdpa-cudnn)" in second and "81%" in second and "launch-bound" not in second
    assert gate_rows([big, small]) == []  # decode rows are not the CPU gate's


def test_a_cpu_row_with_the_slowdown_planted_runs_one_split(tmp_path: Path) -> None:
    """bench_decode on one CPU row (interpreted triton) with the slowdown planted: a decode row with
    its bytes, the copy and SDPA-math ratios, and one split where the heuristic chooses two."""
    pytest.importorskip("pytest_benchmark", reason="the decode benchmark needs pytest-benchmark")
    row = DecodeConfig(4, 2, 1, PLANT_FROM["cpu"], None, 16, "float32", "cpu")
    out = tmp_path / "decode.json"
    env = {**os.environ, "TRITON_INTERPRET": "1", PLANT_ENV: PLANT_VALUE, "PYTHONPATH": str(ROOT)}
    env.pop("PYTEST_XDIST_WORKER", None)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "benchmarks/bench_decode.py", "-p", "no:cacheprovider", "-q",
         "-p", "no:xdist", "--device", "cpu", "-k", row.label.replace(" ", "-"), f"--benchmark-json={out}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    (result,) = rows(json.loads(out.read_text()))
    assert (result.config, result.bytes_read, result.mode) == (row.label, row.bytes_read, "decode")
    assert set(result.ratios) == {"copy", "sdpa-math"} and result.ratios["copy"] > 0
    assert result.launch["decode"].startswith("1 split x"), result.launch
    from flashprop.kernels.triton_decode import INTERPRETER_BLOCK_N, choose_splits

    assert choose_splits(1, 2, 1, row.length, INTERPRETER_BLOCK_N, 132) == 2  # what the plant overrides


def test_decode_tuning_marks_each_rows_best_setting_and_refuses_unknown_rows() -> None:
    """``ci/decode_tuning.py``'s pure parts: the rows chosen by label words (an unknown one lists
    the grid), the values parsed ('auto': the kernel's tile), the best setting per row with its
    gain over the kernel's own choice, a refused setting shown with its reason."""
    sys.path.insert(0, str(ROOT / "ci"))
    try:
        import decode_tuning as dt
    finally:
        sys.path.remove(str(ROOT / "ci"))
    assert [c.label for c in dt.rows_for(["B2 L256 page16"], "cpu")] == [
        "decode hq4 hkv2 d16 B2 L256 page16 fp32"]
    with pytest.raises(SystemExit, match="no row of the cpu grid matches"):
        dt.rows_for(["B3"], "cpu")
    assert dt.parse_ints("auto,16", allow_default=True) == [None, 16]
    with pytest.raises(SystemExit, match="not a whole number"):
        dt.parse_ints("auto,16")
    own = dt.Setting("r", 0, None, 2e-3, 10**6, 0.5, "")
    fast = dt.Setting("r", 8, 64, 1e-3, 10**6, 1.0, "")
    refused = dt.Setting("r", 4, 512, None, 10**6, None, "", "ValueError: block_n=512")
    lines = dt.table([own, fast, refused])
    assert lines[3].endswith("| best, 2.00x the kernel's own |") and "| 8 | 64 | 1.000 |" in lines[3]
    assert lines[4].endswith("| ValueError: block_n=512 |") and lines[2].endswith("|  |")
