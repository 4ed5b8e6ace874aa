"""Tests of ci/gpu-check, run on the CPU (``FLASHPROP_GPU_DEVICE=cpu``): device time is scarce,
so the script's plumbing (parallel jobs, merged tallies, exit codes, deadline, benchmark chunks
and gate) is checked where CI runs.

    python -m pytest ci/test_gpu_check.py
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

WRONG_KERNEL = '''
import torch
from flashprop.refimpl import attention_golden


def attn(q, k, v, *, causal=False, scale=None):
    """Right everywhere except that it drops the last key (a tail-masking bug)."""
    o, lse = attention_golden(q, k[:, :, :-1], v[:, :, :-1], causal=causal, scale=scale) \\
        if k.shape[2] > 1 else attention_golden(q, k, v, causal=causal, scale=scale)
    return o.to(q.dtype), lse.float()
'''


def gpu_check(out: Path, **env: str) -> tuple[subprocess.CompletedProcess, str]:
    """Run ci/gpu-check into ``out`` on the CPU; its process and its report.md ("" if none)."""
    full_env = {
        **os.environ,
        "PYTHON": sys.executable,
        "FLASHPROP_GPU_DEVICE": "cpu",
        "FLASHPROP_GPU_PROFILE": "ci",
        "FLASHPROP_GPU_JOBS": "2",
        "FLASHPROP_GPU_FILES": "properties/test_golden.py",
        "FLASHPROP_GPU_REPLAYS": "0",
        **env,
    }
    run = subprocess.run(
        ["bash", str(ROOT / "ci" / "gpu-check"), str(out)],
        cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=600,
    )
    report = out / "report.md"
    return run, report.read_text() if report.exists() else ""


def table_rows(report: str) -> set[tuple[str, ...]]:
    """(kernel, property, examples run) of every row of the report's per-property tables."""
    return {tuple(line.split()[:3]) for line in report.splitlines() if line[:1].isalpha()}


def test_properties_and_fuzz_merge_and_pass(tmp_path: Path):
    run, report = gpu_check(
        tmp_path / "out",
        FLASHPROP_GPU_PHASES="properties fuzz",
        FLASHPROP_GPU_KERNELS="sdpa-math@4",
        FLASHPROP_GPU_FUZZ_KERNELS="ref-blocked",
        FLASHPROP_GPU_FUZZ_EXAMPLES="6",
        FLASHPROP_GPU_FUZZ_SPLIT="2",
    )
    assert run.returncode == 0, run.stdout + run.stderr + report
    rows = table_rows(report)
    assert ("sdpa-math", "forward", "4") in rows  # --max-examples from NAME@N
    assert ("ref-blocked", "forward", "6") in rows  # two seeds x 3 examples, merged
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["fuzz.log", "properties.log", "report.md"]


def test_fuzz_only_runs_the_named_processes(tmp_path: Path):
    """FLASHPROP_GPU_FUZZ_ONLY (finishing a cut-off run) starts only the KERNEL.FILE.SEED named."""
    run, report = gpu_check(
        tmp_path / "out",
        FLASHPROP_GPU_PHASES="fuzz",
        FLASHPROP_GPU_FUZZ_KERNELS="ref-blocked sdpa-math",
        FLASHPROP_GPU_FUZZ_EXAMPLES="6",
        FLASHPROP_GPU_FUZZ_SPLIT="2",
        FLASHPROP_GPU_FUZZ_ONLY="sdpa-math.test_golden.2",
    )
    assert run.returncode == 0, run.stdout + run.stderr + report
    rows = table_rows(report)
    assert ("sdpa-math", "forward", "3") in rows  # one seed of two
    assert not any(row[0] == "ref-blocked" for row in rows)
    assert "(1 processes, 0 of them taken from an earlier call)" in report


def test_fuzz_split_per_file(tmp_path: Path):
    """FLASHPROP_GPU_FUZZ_SPLIT="1 test_golden=2": golden in two processes of half the examples
    each, the other file in one."""
    run, report = gpu_check(
        tmp_path / "out",
        FLASHPROP_GPU_PHASES="fuzz",
        FLASHPROP_GPU_FILES="properties/test_golden.py properties/test_precision.py",
        FLASHPROP_GPU_FUZZ_KERNELS="sdpa-math",
        FLASHPROP_GPU_FUZZ_EXAMPLES="4",
        FLASHPROP_GPU_FUZZ_SPLIT="1 test_golden=2",
    )
    assert run.returncode == 0, run.stdout + run.stderr + report
    assert ("sdpa-math", "forward", "4") in table_rows(report)  # 2 x 2
    assert ("sdpa-math", "precision", "2") in table_rows(report)  # 1 x 4, weight 0.5
    assert "(3 processes, 0 of them taken from an earlier call)" in report
    log = (tmp_path / "out" / "fuzz.log").read_text()
    assert log.count("test_golden.py") >= 2 and "--max-examples 2 " in log
    assert "test_precision.py" in log and "--max-examples 4 " in log


def test_state_keeps_finished_processes_for_the_next_call(tmp_path: Path):
    """With FLASHPROP_GPU_STATE a second identical call runs no process again and reports the
    same tallies; a different command (more examples) runs again."""
    env = {"FLASHPROP_GPU_PHASES": "fuzz", "FLASHPROP_GPU_FUZZ_KERNELS": "sdpa-math",
           "FLASHPROP_GPU_FUZZ_EXAMPLES": "4", "FLASHPROP_GPU_FUZZ_SPLIT": "2",
           "FLASHPROP_GPU_STATE": str(tmp_path / "state")}
    first, report_a = gpu_check(tmp_path / "a", **env)
    second, report_b = gpu_check(tmp_path / "b", **env)
    assert first.returncode == 0 and second.returncode == 0, first.stdout + second.stdout
    assert table_rows(report_a) == table_rows(report_b)
    assert ("sdpa-math", "forward", "4") in table_rows(report_b)
    assert "(2 processes, 0 of them taken from an earlier call)" in report_a
    assert "(2 processes, 2 of them taken from an earlier call)" in report_b
    third, report = gpu_check(tmp_path / "c", **{**env, "FLASHPROP_GPU_FUZZ_EXAMPLES": "6"})
    assert third.returncode == 0 and ("sdpa-math", "forward", "6") in table_rows(report)
    assert "(2 processes, 0 of them taken from an earlier call)" in report


def test_state_keeps_the_tally_of_a_cut_off_process(tmp_path: Path):
    """A fuzz process cut off by its time limit (30 s, the least one that starts) fails the
    phase, but its examples are kept in the state folder and counted in the table of all calls."""
    state = tmp_path / "state"
    run, report = gpu_check(tmp_path / "out", FLASHPROP_GPU_PHASES="fuzz",
                            FLASHPROP_GPU_FUZZ_KERNELS="sdpa-math",
                            FLASHPROP_GPU_FUZZ_EXAMPLES="100000", FLASHPROP_GPU_FUZZ_SPLIT="1",
                            FLASHPROP_PROPERTY_TIMEOUT="30", FLASHPROP_GPU_STATE=str(state))
    log = (tmp_path / "out" / "fuzz.log").read_text() if (tmp_path / "out" / "fuzz.log").exists() else ""
    assert run.returncode == 1, run.stdout + run.stderr + report
    assert "fuzz.sdpa-math.test_golden.1: exit 124" in report, f"{report}\n--- fuzz.log:\n{log}"
    (partial,) = state.glob("*/fuzz.sdpa-math.test_golden.1.partial.json")
    run_so_far = sum(r["passed"] for r in json.loads(partial.read_text()) if r["property"] == "forward")
    assert run_so_far > 0
    assert ("sdpa-math", "forward", str(run_so_far)) in table_rows(report.split("every call")[1])
    assert "(0 processes finished, 1 cut off: their most examples)" in report


def test_a_wrong_kernel_fails_with_its_problem(tmp_path: Path):
    kernel = tmp_path / "wrong.py"
    kernel.write_text(WRONG_KERNEL)
    run, report = gpu_check(tmp_path / "out", FLASHPROP_GPU_PHASES="properties",
                            FLASHPROP_GPU_KERNELS=f"{kernel}:attn@10", FLASHPROP_GPU_REPLAYS="2")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "property 'forward' failed" in report and "repro (run from the flashprop root)" in report
    assert "forward: reproduces (2 of 2 failed: failed, failed)" in report


def test_jobs_past_the_pool_deadline_are_reported_not_run(tmp_path: Path):
    run, report = gpu_check(tmp_path / "out", FLASHPROP_GPU_PHASES="properties",
                            FLASHPROP_GPU_KERNELS="sdpa-math", FLASHPROP_GPU_POOL_SECONDS="1")
    assert run.returncode == 1
    assert "properties.sdpa-math.test_golden.-: exit 125" in report


def test_benchmarks_then_gate_against_a_faster_baseline(tmp_path: Path):
    """A fresh baseline is written and passes; gating the same run (phase ``gate`` alone, on the
    bench.json already in the folder) against a baseline 3x faster fails with a table."""
    baseline, out = tmp_path / "base.json", tmp_path / "out"
    env = {"FLASHPROP_GPU_BENCH_KERNELS": "ref-blocked", "FLASHPROP_GPU_BASELINE": str(baseline),
           "FLASHPROP_BENCH_SEQLENS": "128"}
    first, _ = gpu_check(out, FLASHPROP_GPU_PHASES="benchmarks gate", **env)
    assert first.returncode == 0, first.stdout + first.stderr
    written = {"bench.json", "bench.md", "base.json"}
    if importlib.util.find_spec("matplotlib"):  # the plot is skipped without it (tox's py env)
        written.add("bench.png")
    assert written <= {p.name for p in out.iterdir()}
    data = json.loads(baseline.read_text())
    for per_config in data["entries"].values():
        for config, ratios in per_config.items():
            per_config[config] = {anchor: 3 * r for anchor, r in ratios.items()}
    baseline.write_text(json.dumps(data))
    gate, report = gpu_check(out, FLASHPROP_GPU_PHASES="gate", **env)
    assert gate.returncode == 1, gate.stdout + gate.stderr + report
    assert "REGRESSION" in report and "-66.7%" in report


def test_processes_and_benchmark_chunks_take_the_gpus_in_turn(tmp_path: Path):
    """FLASHPROP_GPU_IDS="0 1" (on the CPU only a label): property processes alternate between
    the two, benchmark chunks run on both at once (d64 and memory on GPU 0, d128 on GPU 1) and
    their results are merged in grid order."""
    out = tmp_path / "out"
    run, report = gpu_check(out, FLASHPROP_GPU_PHASES="properties benchmarks", FLASHPROP_GPU_IDS="0 1",
                            FLASHPROP_GPU_KERNELS="sdpa-math@2 ref-blocked@2",
                            FLASHPROP_GPU_BENCH_KERNELS="ref-blocked", FLASHPROP_BENCH_SEQLENS="128")
    assert run.returncode == 0, run.stdout + run.stderr + report
    assert "2 pytest jobs, 2 at a time on 2 GPU(s)" in run.stdout
    for chunk, gpu in (("d64", 0), ("d128", 1), ("memory", 0)):
        assert f"benchmarks-{chunk} on GPU {gpu}" in run.stdout
    dims = [b["extra_info"].get("d") for b in json.loads((out / "bench.json").read_text())["benchmarks"]]
    assert 64 in dims and 128 in dims
    assert dims.index(128) > max(i for i, d in enumerate(dims) if d == 64)  # grid order


def test_benchmark_chunks_past_the_deadline_are_reported_not_run(tmp_path: Path):
    out = tmp_path / "out"
    run, report = gpu_check(out, FLASHPROP_GPU_PHASES="benchmarks gate", FLASHPROP_GPU_BENCH_SECONDS="1",
                            FLASHPROP_GPU_BENCH_KERNELS="ref-blocked", FLASHPROP_BENCH_SEQLENS="128",
                            FLASHPROP_GPU_BASELINE=str(tmp_path / "base.json"))
    assert run.returncode == 1, run.stdout + run.stderr
    log = (out / "bench.log").read_text()
    for chunk in ("d64", "d128", "memory"):
        assert f"benchmarks-{chunk} not run: FLASHPROP_GPU_BENCH_SECONDS reached" in log
    assert "gate not run" in report
