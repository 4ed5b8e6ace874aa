"""Tests of ci/gpu_check.py on the CPU (``--device cpu``): device time is scarce, so the driver's
plumbing is checked where CI runs. Its pieces (settings, the runs' commands, seeds and the state
folder, deadlines, the benchmark chunks' GPUs, the merge) are called directly; four calls run
real processes, on one property: two fuzz calls that add up (the first over two xdist workers;
the second also runs a wrong kernel's property run, which fails and is replayed), then the
benchmarks with the gate, and the gate alone against a faster baseline.

    python -m pytest meta/test_gpu_check.py
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "ci"))  # the scripts under test

import gpu_bench
import gpu_check
import gpu_runs
import replay_failures
from gpu_settings import Config, SettingError

pytestmark = pytest.mark.meta

FORWARD = "properties/test_golden.py::test_forward_matches_golden"
#: A kernel with an indexing bug that raises on every problem: its examples cost nothing, so
#: Hypothesis's search and shrinking are quick.
WRONG_KERNEL = '''
def attn(q, k, v, *, causal=False, scale=None):
    return q[:, :, q.shape[2]], None
'''


#: The environment of every call here: the CPU, one property, 2 workers, no replays.
ENVIRON = {"FLASHPROP_GPU_DEVICE": "cpu", "FLASHPROP_GPU_FILES": FORWARD, "FLASHPROP_GPU_PROFILE": "ci",
           "FLASHPROP_GPU_JOBS": "2", "FLASHPROP_GPU_REPLAYS": "0"}


def config(out: Path, *flags: str, **environ: str) -> Config:
    """The settings of a call writing into ``out`` with these flags and :data:`ENVIRON` + ``environ``."""
    return Config.parse([str(out), *flags], {**ENVIRON, **environ})


def call(out: Path, *flags: str, **environ: str) -> tuple[int, str]:
    """ci/gpu_check.py's main, as :func:`config`; its exit status and its report.md."""
    code = gpu_check.main([str(out), *flags], {**ENVIRON, **environ})
    report = out / "report.md"
    return code, report.read_text() if report.exists() else ""


def table_rows(text: str) -> set[tuple[str, ...]]:
    """(kernel, property, examples run) of every row of the per-property tables in ``text``."""
    return {tuple(line.split()[:3]) for line in text.splitlines()
            if line[:1].isalpha() and len(line.split()) > 3}


# --- the pieces, called directly -------------------------------------------------------------


def test_replays_stay_within_their_budget():
    """A failure's replays run until the budget is spent: those left are "not run", and a failure
    none of whose replays ran is said to be not replayed, not to reproduce or not."""
    failing = f"{sys.executable} -c 'import sys; sys.exit(1)'"
    assert replay_failures.replay(failing, 2, timeout=60) == ["failed", "failed"]
    assert replay_failures.verdict(["failed", "failed"]) == "reproduces"
    spent = replay_failures.replay(failing, 2, timeout=60, deadline=time.monotonic())
    assert spent == ["not run", "not run"]
    assert replay_failures.verdict(spent) == "not replayed: no time was left"
    assert replay_failures.verdict(["failed", "not run"]) == "reproduces"
    assert replay_failures.verdict(["passed", "failed"]) == "FLAKY"


def test_settings_flags_over_environment_and_refusals(tmp_path: Path):
    cfg = config(tmp_path, "--kernels", "sdpa-math@4 triton", FLASHPROP_GPU_KERNELS="cuda",
                 FLASHPROP_GPU_PHASES="gate fuzz")
    assert cfg.kernels == [("sdpa-math", 4), ("triton", None)]  # the flag wins
    assert cfg.phases == ["fuzz", "gate"]  # in the driver's order
    assert cfg.bench_chunks == ["d64", "d128", "memory"] and cfg.ids == []
    for bad, match in [({"FLASHPROP_GPU_FUZZ_SPLIT": "8 test_robustness=64"}, "FUZZ_SPLIT: a number"),
                       ({"FLASHPROP_GPU_FUZZ_SPLIT": "0"}, "at least 1"),
                       ({"FLASHPROP_GPU_KERNELS": "triton@many"}, "NAME@N"),
                       ({"FLASHPROP_GPU_PHASES": "properties lint"}, "unknown phases"),
                       ({"FLASHPROP_GPU_BENCH_CHUNKS": "d64-bf16"}, "benchmark chunks"),
                       ({"FLASHPROP_GPU_FUZZ_TIME": "soon"}, "FUZZ_TIME: not a duration"),
                       ({"FLASHPROP_GPU_FUZZ_ONLY": "cuda.test_golden.7"}, "FUZZ_ONLY is gone")]:
        with pytest.raises(SettingError, match=match):
            config(tmp_path, **bad)


def test_one_run_per_kernel_with_its_examples_and_the_fuzz_shards_seeds(tmp_path: Path):
    cfg = config(tmp_path, "--kernels", "sdpa-math@4 triton", "--fuzz-kernels", "triton cuda",
                 "--fuzz-split", "3", "--fuzz-examples", "300")
    runs = gpu_runs.property_runs(cfg)
    assert [r.name for r in runs] == ["properties.sdpa-math", "properties.triton"]
    assert runs[0].args[-2:] == ["--max-examples", "4"] and "--max-examples" not in runs[1].args
    fuzz = gpu_runs.fuzz_runs(cfg, base=7)
    assert [r.name for r in fuzz] == ["fuzz.triton.seeds7-9", "fuzz.cuda.seeds7-9"]
    assert fuzz[0].args[fuzz[0].args.index("--shards") + 1] == "3"
    assert fuzz[0].args[fuzz[0].args.index("--max-examples") + 1] == "300"
    assert fuzz[0].args[fuzz[0].args.index("--hypothesis-seed") + 1] == "7"
    assert "--time" not in fuzz[0].args  # no time box unless asked: each test runs to its count
    boxed = gpu_runs.fuzz_runs(config(tmp_path, "--fuzz-time", "7m"), base=0)
    assert boxed[0].args[-2:] == ["--time", "7m"]
    tally = tmp_path / "t.json"
    command = gpu_runs.pytest_command(cfg, runs[0], tally)
    assert command[command.index("-n"):][:4] == ["-n", "2", "--dist", "load"] and str(tally) in command
    one = config(tmp_path, FLASHPROP_GPU_JOBS="1")
    assert "-n" not in gpu_runs.pytest_command(one, runs[0], tally)  # one process, no workers


def _ran(state: gpu_runs.State, parts: Path, run: gpu_runs.Run, code: int,
         counts: dict[str, tuple[int, int, int]] | None = None) -> None:
    """``run`` as if it ran with exit status ``code``: a tally and a log in ``parts``, kept;
    ``counts``: property -> (passed, failed, asked) of its rows (default: forward passed 2)."""
    rows = [{"kernel": run.kernel, "property": prop, "passed": passed, "refused": 0, "failed": failed,
             "asked": asked, "seconds": 1.0, "last_failure": None, "skipped": []}
            for prop, (passed, failed, asked) in (counts or {"forward": (2, 0, 0)}).items()]
    (parts / f"{run.name}.json").write_text(json.dumps(rows))
    (parts / f"{run.name}.log").write_text("2 passed\n")
    run.exit = code
    state.keep(run, parts)


def test_state_folder_seeds_and_passed_property_runs(tmp_path: Path):
    parts = tmp_path / "parts"
    parts.mkdir()
    state = gpu_runs.State(tmp_path / "state", "abc")
    assert state.next_seed() == 0
    cfg = config(tmp_path, "--fuzz-split", "4", "--fuzz-kernels", "triton")
    _ran(state, parts, gpu_runs.fuzz_runs(cfg, 0)[0], 124)  # cut off: its examples count all the same
    assert state.next_seed() == 4
    with pytest.raises(SettingError, match="ran in an earlier call"):
        state.check_seeds(gpu_runs.fuzz_runs(cfg, 3))
    state.check_seeds(gpu_runs.fuzz_runs(cfg, 4))
    table = gpu_runs.state_table(state, cfg.fuzz_examples)
    assert "(runs: 1, passed: 0, failed or cut off: 1; seeds 0..3)" in table
    passed, failed = gpu_runs.property_runs(config(tmp_path, "--kernels", "sdpa-math@2 triton"))
    _ran(state, parts, passed, 0)
    _ran(state, parts, failed, 1)  # not kept: it runs again next time
    again = gpu_runs.property_runs(config(tmp_path, "--kernels", "sdpa-math@2 triton", "--jobs", "1"))
    assert state.take(again[0], tmp_path) and again[0].reused and again[0].exit == 0  # workers do not count
    assert "finished in an earlier call" in (tmp_path / "properties.sdpa-math.log").read_text()
    assert not state.take(again[1], tmp_path)
    more = gpu_runs.property_runs(config(tmp_path, "--kernels", "sdpa-math@3"))[0]
    assert not state.take(more, tmp_path)  # other arguments: it runs


def test_properties_that_reached_their_count_are_left_out_of_the_next_fuzz_call(tmp_path: Path):
    """Over two kept calls of 100 examples per property: backward (weight 0.75) reached its 75 in
    the first, forward its 100 in both together; window failed, so it runs again; a call asking
    200 leaves none out. The next call's run says which with --skip-property, and the state's
    table says where the campaign stands: the tests at their count, what each other one lacks."""
    parts = tmp_path / "parts"
    parts.mkdir()
    state = gpu_runs.State(tmp_path / "state", "abc")
    cfg = config(tmp_path, "--fuzz-kernels", "triton", "--fuzz-examples", "100", "--fuzz-split", "1")
    _ran(state, parts, gpu_runs.fuzz_runs(cfg, 0)[0], 124,
         {"forward": (60, 0, 100), "backward": (75, 0, 75), "window": (99, 1, 100)})
    assert state.complete(100) == {"triton": ["backward"]}
    assert gpu_runs.state_table(state, 100).splitlines()[-3:] == [
        "at 100 examples per property: 1 of 3 tests at their count, 235 examples run, 40 left",
        "  triton  forward: 60 of 100, 40 left", "  triton  window: failed"]
    _ran(state, parts, gpu_runs.fuzz_runs(cfg, 1)[0], 0, {"forward": (40, 0, 100), "window": (10, 0, 100)})
    assert state.complete(100) == {"triton": ["backward", "forward"]}
    assert state.complete(200) == {}
    assert gpu_runs.state_table(state, 200).splitlines()[-4:] == [
        "at 200 examples per property: 0 of 3 tests at their count, 285 examples run, 175 left",
        "  triton  backward: 75 of 150, 75 left", "  triton  forward: 100 of 200, 100 left",
        "  triton  window: failed"]
    run = gpu_runs.fuzz_runs(cfg, 2, state.complete(100))[0]
    assert " ".join(run.args).endswith("--skip-property backward --skip-property forward")


def test_a_cut_off_property_run_is_kept_as_a_part_whose_passed_tests_are_left_out(tmp_path: Path):
    """A property run that did not pass is kept only if some test passed: as a part, with those
    tests, and its tally without the properties the stop cut short (they run again; a failure
    found before the cut stays). The next call's run with the same arguments takes the part's
    tally and deselects its tests; a run with other arguments takes nothing; a second cut-off run
    is a second part."""
    parts, later = tmp_path / "parts", tmp_path / "later"
    parts.mkdir()
    later.mkdir()
    state = gpu_runs.State(tmp_path / "state", "abc")
    cfg = config(tmp_path, "--kernels", "sdpa-math")
    (run,) = gpu_runs.property_runs(cfg)
    _ran(state, parts, run, 124)  # cut off before any test passed: nothing kept
    assert state.parts(run) == [] and not list(state.folder.iterdir())
    (parts / f"{run.name}.log").write_text(f"PASSED {FORWARD}[sdpa-math]\nSKIPPED [1] stopped by signal 2\n")
    cut = "stopped by signal 2 after 3 examples (in the table)"
    rows = [{"kernel": "sdpa-math", "property": prop, "passed": n, "refused": 0, "failed": failed,
             "seconds": 1.0, "last_failure": None, "skipped": notes}
            for prop, n, failed, notes in (("forward", 100, 0, []), ("backward", 3, 0, [cut]),
                                           ("window-forward", 2, 1, [cut]))]
    (parts / f"{run.name}.json").write_text(json.dumps(rows))
    run.exit = 124
    state.keep(run, parts)
    kept = json.loads((state.folder / f"{run.name}.part1.json").read_text())
    assert [row["property"] for row in kept] == ["forward", "window-forward"]  # the cut one runs again
    (again,) = gpu_runs.property_runs(cfg)
    assert not state.take(again, later)
    assert again.done == [f"{FORWARD}[sdpa-math]"] and again.earlier == ["properties.sdpa-math.part1"]
    assert (later / "properties.sdpa-math.part1.json").is_file()
    command = gpu_runs.pytest_command(cfg, again, later / "t.json")
    assert command[command.index("--deselect") + 1] == f"{FORWARD}[sdpa-math]" and "-rsp" in command
    (other,) = gpu_runs.property_runs(config(tmp_path, "--kernels", "sdpa-math@3"))
    assert not state.take(other, later) and other.done == []
    again.exit = 124
    (later / f"{again.name}.log").write_text("PASSED properties/test_golden.py::test_lse[sdpa-math]\n")
    (later / f"{again.name}.json").write_text("[]")
    state.keep(again, later)
    assert [p["name"] for p in state.parts(run)] == [f"{run.name}.part1", f"{run.name}.part2"]


def test_with_a_state_folder_each_property_run_gets_an_even_share_of_the_pool(tmp_path: Path, monkeypatch):
    """A run taken from an earlier call costs nothing; the others split what is left evenly (each
    share taken when it starts); without a state folder each run may use the whole pool."""
    cfg = config(tmp_path / "out", "--kernels", "sdpa-math ref-blocked triton")
    cfg.out.mkdir()
    state = gpu_runs.State(tmp_path / "state", "abc")
    _ran(state, tmp_path, gpu_runs.property_runs(cfg)[0], 0)
    shares: list[tuple[str, int]] = []

    def execute(cfg, run, parts, deadline, share=1):
        shares.append((run.name, share))
        run.exit = 0

    monkeypatch.setattr(gpu_runs, "execute", execute)
    for folder, expected in ((state, [("properties.ref-blocked", 2), ("properties.triton", 1)]),
                             (None, [("properties.sdpa-math", 1), ("properties.ref-blocked", 1),
                                     ("properties.triton", 1)])):
        shares.clear()
        parts = tmp_path / f"parts-{folder is None}"
        parts.mkdir()
        runs = gpu_runs.property_runs(cfg)
        gpu_runs.run_phase(cfg, "properties", runs, parts, folder, time.monotonic() + 99)
        assert shares == expected


def test_a_kernel_whose_tests_all_passed_in_parts_is_not_run_again(tmp_path: Path, monkeypatch):
    """Call 1 runs the property (its log names the passed test: ``-rsp``); made into a part of a
    cut-off run, call 2 deselects that test, passes, and reports the part's examples."""
    monkeypatch.setattr(gpu_check, "sources_hash", lambda: "sources")
    state = tmp_path / "state"
    flags = ["--phases", "properties", "--kernels", "sdpa-math", "--state", str(state)]
    code, report = call(tmp_path / "a", *flags)
    assert code == 0, report
    (ran,) = [row for row in table_rows(report) if row[:2] == ("sdpa-math", "forward")]
    kept = state / "sources"
    assert gpu_runs.passed_tests((kept / "properties.sdpa-math.log").read_text()) == [f"{FORWARD}[sdpa-math]"]
    for suffix in (".json", ".log"):
        (kept / f"properties.sdpa-math{suffix}").rename(kept / f"properties.sdpa-math.part1{suffix}")
    record = json.loads((kept / "properties.sdpa-math.run.json").read_text())
    (kept / "properties.sdpa-math.run.json").unlink()
    (kept / "properties.sdpa-math.part1.run.json").write_text(
        json.dumps({**record, "exit": 124, "passed": [f"{FORWARD}[sdpa-math]"]}))
    code, report = call(tmp_path / "b", *flags)
    assert code == 0, report
    assert f"--deselect '{FORWARD}[sdpa-math]'" in (tmp_path / "b" / "properties.log").read_text()
    assert ran in table_rows(report)  # the part's examples
    assert "not run again: 1)" in report


def test_state_folder_is_per_version_of_the_sources(tmp_path: Path):
    (tmp_path / "kernels").mkdir()
    (tmp_path / "conftest.py").write_text("# the plugin\n")
    (tmp_path / "kernels" / "k.cu").write_text("__global__ void k() {}\n")
    (tmp_path / "kernels" / "notes.md").write_text("not a source\n")
    first = gpu_runs.sources_hash(tmp_path)
    (tmp_path / "kernels" / "notes.md").write_text("still not a source\n")
    assert gpu_runs.sources_hash(tmp_path) == first
    (tmp_path / "kernels" / "k.cu").write_text("__global__ void k() { return; }\n")
    assert gpu_runs.sources_hash(tmp_path) != first and len(first) == 16


def test_state_folder_hashes_every_package_the_properties_run():
    """Every package directory of the distribution but the benchmarks is one of the sources, so a
    change to the strategies or the contract starts a new state folder (it once hashed neither)."""
    text = (gpu_runs.ROOT / "pyproject.toml").read_text()
    section = text.split("[tool.setuptools.package-dir]", 1)[1].split("\n[", 1)[0]
    folders = set(re.findall(r'^"[\w.]+"\s*=\s*"(\w+)"', section, re.MULTILINE))
    assert "harness" in folders and "contract" in folders
    assert folders - {"benchmarks"} <= set(gpu_runs.SOURCES)
    assert {"flashprop", "conftest.py"} <= set(gpu_runs.SOURCES)


def test_a_run_past_the_deadline_is_not_started(tmp_path: Path):
    cfg = config(tmp_path, "--kernels", "sdpa-math")
    (run,) = gpu_runs.property_runs(cfg)
    gpu_runs.execute(cfg, run, tmp_path, deadline=time.monotonic() + 5)  # under LEAST_SECONDS left
    assert "not started" in (tmp_path / "properties.sdpa-math.log").read_text()
    gpu_runs.execute(cfg, run, tmp_path, deadline=time.monotonic() + 100, share=4)  # a share of 25 s
    assert run.exit == 125 and "not started (FLASHPROP_GPU_POOL_SECONDS reached)" in (
        tmp_path / "properties.sdpa-math.log").read_text()


def test_an_interrupted_call_reports_the_phases_it_finished(tmp_path: Path, monkeypatch):
    """Ctrl-C (or a time limit's SIGINT) during the benchmarks: report.md still has the property
    phase's table, and the benchmarks as interrupted (exit 130); the call fails."""

    def interrupted(self) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(gpu_check.BenchPhase, "run", interrupted)
    code, report = call(tmp_path, "--kernels", "sdpa-math@2", "--phases", "properties benchmarks gate")
    assert code == 1
    assert "| properties | 0 |" in report and "| benchmarks | 130 |" in report and "| gate |" not in report
    assert ("sdpa-math", "forward", "2") in table_rows(report)


def test_benchmark_chunks_take_the_gpus_in_turn_and_merge_in_grid_order(tmp_path: Path):
    gpu_chunks = ["d64-bf16", "d64-fp16", "d128-bf16", "d128-fp16", "memory"]
    assert gpu_bench.chunks_per_gpu(gpu_chunks, ["0", "1"]) == [
        ("0", ["d64-bf16", "d128-bf16", "memory"]), ("1", ["d64-fp16", "d128-fp16"])]
    assert gpu_bench.chunks_per_gpu(gpu_chunks, ["3"]) == [(None, gpu_chunks)]
    assert gpu_bench.chunk_args("d128-fp16") == ["benchmarks/bench_attention.py", "--bench-head-dims", "128",
                                                 "--bench-dtypes", "fp16"]
    assert gpu_bench.chunk_args("memory") == ["benchmarks/bench_memory.py", "benchmarks/bench_layer.py"]
    assert gpu_bench.warm_keys(["d128-fp16", "memory"]) == [("128", "fp16", "full"),
                                                             ("128", "fp16", "causal")]
    assert gpu_bench.chunk_args("varlen") == ["benchmarks/bench_varlen.py"]
    warm = gpu_bench.warm_commands(["d128-fp16", "memory", "decode", "varlen"])
    assert [name for name, _ in warm][:3] == ["d=128 fp16 full", "d=128 fp16 causal", "varlen d=64 bf16 full"]
    assert warm[2][1] == ["benchmarks/bench_varlen.py", "-k", "d64 and full and bf16"] and len(warm) == 2 + 8
    parts = []
    for i, d in enumerate((64, 128)):
        parts.append(tmp_path / f"{i}.json")
        parts[-1].write_text(json.dumps({"machine_info": {"run": i},
                                         "benchmarks": [{"extra_info": {"d": d}}]}))
    gpu_bench.merge_benchmarks(parts, tmp_path / "bench.json")
    merged = json.loads((tmp_path / "bench.json").read_text())
    assert merged["machine_info"] == {"run": 0}
    assert [b["extra_info"]["d"] for b in merged["benchmarks"]] == [64, 128]


def test_benchmark_chunks_past_the_deadline_are_reported_not_run(tmp_path: Path):
    out = tmp_path / "out"
    code, report = call(out, "--phases", "benchmarks gate", "--bench-seconds", "1",
                        "--baseline", str(tmp_path / "base.json"))
    assert code == 1, report
    log = (out / "bench.log").read_text()
    for chunk in ("d64", "d128", "memory"):
        assert f"benchmarks-{chunk} not run: FLASHPROP_GPU_BENCH_SECONDS reached" in log
    assert "| benchmarks | 1 |" in report and "| gate | 2 |" in report and "gate not run" in report


# --- real pytest processes ---------------------------------------------------------------------


def test_fuzz_calls_add_up_with_distinct_seeds_and_a_wrong_kernel_fails(tmp_path: Path, monkeypatch):
    """Call 1: the fuzz run of sdpa-math over 2 xdist workers, one shard each (seeds 0 and 1),
    tallies merged. Call 2, one process, in a time box: seeds 2 and 3 (fresh), the table of both
    calls adds up; its property run of a wrong kernel fails with the problem, replayed once."""
    monkeypatch.setattr(gpu_check, "sources_hash", lambda: "sources")  # the tree may change meanwhile
    state = tmp_path / "state"
    fuzz = ["--fuzz-kernels", "sdpa-math", "--fuzz-examples", "4", "--fuzz-split", "2", "--state", str(state)]
    code, report = call(tmp_path / "a", "--phases", "fuzz", *fuzz)
    assert code == 0, report
    assert ("sdpa-math", "forward", "4") in table_rows(report)
    log = (tmp_path / "a" / "fuzz.log").read_text()
    assert "--shards 2 --hypothesis-seed 0 -n 2" in log
    kernel = tmp_path / "wrong.py"
    kernel.write_text(WRONG_KERNEL)
    # call 1 ran forward to its count of 4: a call asking 4 again would leave it out, so ask 8
    code, report = call(tmp_path / "b", "--phases", "properties fuzz", "--kernels", f"{kernel}:attn@10",
                        *fuzz, "--fuzz-examples", "8", "--fuzz-time", "5m", FLASHPROP_GPU_JOBS="1",
                        FLASHPROP_GPU_REPLAYS="1")
    assert code == 1, report
    assert "| properties | 1 |" in report and "| fuzz | 0 |" in report
    assert "property 'forward' failed" in report and "repro (a Python script" in report
    assert "forward: reproduces (1 of 1 failed: failed)" in report
    this_call, every_call = report.split("## fuzz:")[1].split("every fuzz call")
    assert "--hypothesis-seed 2 --time 5m" in (tmp_path / "b" / "fuzz.log").read_text()
    assert ("sdpa-math", "forward", "8") in table_rows(this_call)
    assert ("sdpa-math", "forward", "12") in table_rows(every_call)
    assert "--skip-property" not in (tmp_path / "b" / "fuzz.log").read_text()
    assert "(runs: 2, passed: 2, failed or cut off: 0; seeds 0..1, 2..3)" in every_call
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["fuzz.log", "properties.log", "report.md"]


def test_benchmarks_on_two_gpus_then_the_gate_against_a_faster_baseline(tmp_path: Path, monkeypatch, capsys):
    """Two chunks side by side on "GPUs" 0 and 1 (on the CPU only a label), merged in grid order;
    a fresh baseline is written and passes; the gate alone (on the bench.json in the folder)
    against a baseline 3x faster fails with its table."""
    monkeypatch.setenv("FLASHPROP_BENCH_SEQLENS", "128")
    monkeypatch.setenv("FLASHPROP_BENCH_MODES", "fwd")
    baseline, out = tmp_path / "base.json", tmp_path / "out"
    bench = ["--bench-kernels", "ref-blocked", "--bench-chunks", "d64 d128", "--baseline", str(baseline),
             "--ids", "0 1"]
    code, report = call(out, "--phases", "benchmarks gate", *bench)
    assert code == 0, report + (out / "bench.log").read_text()
    assert "base.json" in {p.name for p in out.iterdir()} and "| gate | 0 |" in report
    said = capsys.readouterr().out
    assert "benchmarks-d64 on GPU 0" in said and "benchmarks-d128 on GPU 1" in said
    dims = [b["extra_info"].get("d") for b in json.loads((out / "bench.json").read_text())["benchmarks"]]
    assert dims and dims == sorted(dims) and set(dims) == {64, 128}  # d64's chunk first, whichever ran first
    data = json.loads(baseline.read_text())
    for per_config in data["entries"].values():
        for name, ratios in per_config.items():
            per_config[name] = {anchor: 3 * r for anchor, r in ratios.items()}
    baseline.write_text(json.dumps(data))
    code, report = call(out, "--phases", "gate", *bench)
    assert code == 1 and "REGRESSION" in report and "-66.7%" in report, report
