"""Meta-tests of the regression tracking: the A/B statistics (the bootstrap interval covers the true
ratio, is seeded, and a verdict needs the whole interval beyond the threshold); ``flashprop bench
--against`` in a scratch git repository (a kernel against itself passes, a planted 4x copy fails:
4x, so that a loaded CI runner cannot blur it into "unclear", as a 2x copy once was);
a flashprop kernel imported from a worktree of this checkout next to the working tree's; the
gate's noise bands learned from repeated runs (old baselines without spreads keep their
tolerance); the history and its drift flag; ``flashprop bisect`` naming the planted commit of 8.

The kernels are ``ref-blocked`` on the CPU grid's smallest row (about a millisecond a call); the
planted slowdowns are a repeat of the work (2x) and a 20 ms sleep, far above this shared CPU's
noise, which the wall clock of the CPU grid counts."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from flashprop.benchmarks.ab import FASTER, OK, REGRESSION, UNCLEAR, Interval, ratio_interval, verdict
from flashprop.benchmarks.history import Record, append, load, trends
from flashprop.benchmarks.revision import (
    RevisionError,
    import_kernel_at,
    modules_under,
    repository_root,
    worktree,
)

from flashprop.cli import main

pytestmark = pytest.mark.meta

ROOT = Path(__file__).resolve().parent.parent
ROW = "fwd d64 full N128 fp32"
KERNEL = """from flashprop.refimpl.blocked import attention as blocked

REPEAT = 1


def attn(q, k, v, *, causal=False, scale=None):
    for _ in range(REPEAT):
        out = blocked(q, k, v, causal=causal, scale=scale)
    return out
"""
SLEEPING = """import time

from flashprop.refimpl.blocked import attention as blocked


def attn(q, k, v, *, causal=False, scale=None):
    time.sleep(0.02)
    return blocked(q, k, v, causal=causal, scale=scale)
"""
_GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t.invalid", "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t.invalid"}


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True,
                          env={**os.environ, **_GIT_ENV}).stdout.strip()


def _scratch(path: Path, source: str = KERNEL) -> Path:
    """A git repository holding ``kern.py`` (``source``), one commit."""
    path.mkdir()
    _git(path, "init", "-q")
    (path / "kern.py").write_text(source)
    _git(path, "add", "kern.py")
    _git(path, "commit", "-qm", "kernel")
    return path


@pytest.fixture
def in_process(monkeypatch):
    """``flashprop.cli.main`` run in this process: sys.path and the modules it imports put back."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith(("flashprop_user_", "flashprop_ab_")):
            del sys.modules[name]


needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


# ---- the statistics ---------------------------------------------------------------------------

def _rounds(rng: np.random.Generator, ratio: float, n: int, sigma: float = 0.08) -> tuple[list, list]:
    """Synthetic paired rounds: each call's time log-normal about its kernel's level; a round-wide
    factor (the machine's drift) that pairing cancels."""
    drift = np.exp(rng.normal(0, 0.3, n))
    base = 1e-3 * drift * np.exp(rng.normal(0, sigma, n))
    cand = ratio * 1e-3 * drift * np.exp(rng.normal(0, sigma, n))
    return list(cand), list(base)


def test_the_bootstrap_interval_covers_the_true_ratio_at_its_confidence() -> None:
    rng = np.random.default_rng(1)
    true, trials = 1.07, 200
    hits = 0
    for _ in range(trials):
        interval = ratio_interval(*_rounds(rng, true, 40))
        hits += interval.lo <= true <= interval.hi
    # nominal 95%; the percentile bootstrap of a median runs a little narrow at n = 40
    assert hits / trials >= 0.88, hits


def test_the_interval_is_seeded_and_one_stalled_round_does_not_move_the_verdict() -> None:
    rng = np.random.default_rng(2)
    cand, base = _rounds(rng, 1.0, 30)
    assert ratio_interval(cand, base) == ratio_interval(cand, base)
    assert ratio_interval(cand, base, seed=5) != ratio_interval(cand, base)
    stalled = list(base)
    stalled[3] *= 10  # a neighbour's burst in one round of the base
    assert verdict(ratio_interval(cand, stalled)) == verdict(ratio_interval(cand, base)) == OK
    slower = [2 * c for c in cand]
    interval = ratio_interval(slower, base)
    assert verdict(interval) == REGRESSION and interval.lo > 1.05
    assert math.isclose(interval.ratio, 2 * ratio_interval(cand, base).ratio, rel_tol=1e-9)


@pytest.mark.parametrize(("interval", "expected"), [
    (Interval(1.06, 1.051, 1.07, 0.95), REGRESSION),
    (Interval(1.06, 1.049, 1.07, 0.95), UNCLEAR),  # reaches past the threshold, not wholly beyond
    (Interval(1.00, 0.98, 1.02, 0.95), OK),
    (Interval(0.90, 0.85, 0.94, 0.95), FASTER),
])
def test_a_row_fails_only_when_its_whole_interval_lies_beyond_the_threshold(interval, expected) -> None:
    assert verdict(interval, 0.05) == expected


def test_bad_rounds_are_refused() -> None:
    with pytest.raises(ValueError, match="one time per round"):
        ratio_interval([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="positive"):
        ratio_interval([1.0, 0.0], [1.0, 1.0])
    with pytest.raises(ValueError, match="threshold must be positive"):
        verdict(Interval(1, 1, 1, 0.95), 0)


# ---- flashprop bench --against ----------------------------------------------------------------

def test_the_table_says_when_the_two_sides_launched_other_tiles() -> None:
    """An autotuner that picks other tiles for one of the two imports moves the ratio by more than
    the interval covers (the H200's fwd+bwd rows, 2%): the verdict cell names the passes."""
    from flashprop.benchmarks.against import Comparison, table

    same = {"fwd": "64x64 w4 s3 (tuned)", "bwd_dq": "128x64 w8 s3 (tuned)"}
    row = dict(kernel="triton", config="fwd+bwd", base="triton", verdict=OK, rounds=9, base_s=1.0,
               candidate_s=1.02, ratio=1.02, lo=1.01, hi=1.03)
    other = Comparison(**row, candidate_launch={**same, "bwd_dq": "64x64 w4 s3 (tuned)"}, base_launch=same)
    lines = table([Comparison(**row, candidate_launch=same, base_launch=same), other, Comparison(**row)])
    assert lines[2].endswith("| ok |") and lines[4].endswith("| ok |")
    assert lines[3].endswith("| ok; launches differ: bwd_dq base 128x64 w8 s3 (tuned), candidate 64x64 w4 s3 "
                             "(tuned) |"), lines[3]



@needs_git
def test_a_kernel_against_itself_passes_and_a_4x_copy_fails(tmp_path, monkeypatch, in_process,
                                                            capsys) -> None:
    repo = _scratch(tmp_path / "repo")
    monkeypatch.chdir(repo)
    ab = ["bench", "--device", "cpu", "--against", "HEAD", "--bench-kernels", "./kern.py:attn",
          "--row", ROW, "--rounds", "40", "--history", str(tmp_path / "h.jsonl")]
    assert main([*ab, "--json", str(tmp_path / "same.json")]) == 0, capsys.readouterr().out
    same = json.loads((tmp_path / "same.json").read_text())
    assert same["base_commit"] == _git(repo, "rev-parse", "HEAD") and same["status"] == 0
    assert [r["verdict"] for r in same["rows"]] in (["ok"], ["unclear"])
    assert len(same["rows"][0]["candidate_times"]) == len(same["rows"][0]["base_times"]) == 40
    # the base came from the worktree, under its own module name, and the worktree is gone
    base_module = sys.modules["flashprop_ab_base_kern"]
    assert base_module is not sys.modules["flashprop_user_kern"]
    assert not Path(base_module.__file__).exists() and _git(repo, "worktree", "list").count("\n") == 0

    (repo / "kern.py").write_text(KERNEL.replace("REPEAT = 1", "REPEAT = 4"))  # the working tree
    capsys.readouterr()
    assert main([*ab, "--json", str(tmp_path / "slow.json")]) == 1
    out = capsys.readouterr().out
    row = json.loads((tmp_path / "slow.json").read_text())["rows"][0]
    assert row["verdict"] == REGRESSION and row["lo"] > 1.05, row
    assert f"| ./kern.py:attn | {ROW} | " in out and "| REGRESSION |" in out and "1 regression(s)" in out
    assert f"{row['lo']:.4f} .. {row['hi']:.4f}" in out  # the table shows the interval
    history = load(tmp_path / "h.jsonl")
    assert [(r.source, r.status) for r in history] == [("ab", same["rows"][0]["verdict"]), ("ab", REGRESSION)]


@needs_git
def test_against_refuses_what_it_cannot_compare(tmp_path, monkeypatch, in_process, capsys) -> None:
    repo = _scratch(tmp_path / "repo")
    monkeypatch.chdir(repo)
    base = ["bench", "--device", "cpu", "--bench-kernels", "./kern.py:attn", "--no-history"]
    assert main([*base, "--against", "nosuchrev", "--row", ROW]) == 2
    assert "'nosuchrev' names no commit" in capsys.readouterr().err
    assert main([*base, "--against", "HEAD", "--row", "fwd d64 full N999 fp32"]) == 2
    assert "is not a row of the cpu grid" in capsys.readouterr().err
    assert main(["bench", "--device", "cpu", "--against", "HEAD", "--bench-kernels", "ref-blocked",
                 "--row", ROW, "--no-history"]) == 2  # flashprop's kernel is not in this repository
    assert "not in the checkout of ref-blocked@HEAD" in capsys.readouterr().err


@pytest.mark.skipif(repository_root(ROOT) != ROOT, reason="needs this checkout to be a git repository")
def test_a_flashprop_kernel_is_imported_from_a_worktree_next_to_the_working_trees(tmp_path,
                                                                                  in_process) -> None:
    """What an A/B of the triton kernel against a revision of flashprop does, on ref-blocked: every
    flashprop module the kernel imports comes from the worktree, the working tree's are put back."""
    import flashprop.refimpl.blocked as candidate

    with worktree(ROOT, "HEAD") as tree:
        kernel = import_kernel_at("ref-blocked", tree, ROOT, "flashprop_ab_test", "ref-blocked@HEAD")
        assert Path(kernel.fn.__code__.co_filename).is_relative_to(tree)
        assert kernel.fn is not candidate.attention and sys.modules["flashprop.refimpl.blocked"] is candidate
        base_registry = sys.modules["flashprop_ab_test.flashprop.contract.registry"]
        assert Path(base_registry.__file__).is_relative_to(tree)
        assert base_registry is not sys.modules["flashprop.contract.registry"]
        left = [name for name in modules_under(tree) if not name.startswith("flashprop_ab_test.")]
        assert left == [], left  # no module of the worktree under a working-tree name
        q = torch.randn(1, 1, 8, 4, dtype=torch.float64)
        torch.testing.assert_close(kernel(q, q, q)[0], candidate.attention(q, q, q)[0])
        outside = tmp_path / "outside.py"
        outside.write_text("def attn(q, k, v, causal=False):\n    return q\n")
        with pytest.raises(RevisionError, match="lies outside the repository"):
            import_kernel_at(f"{outside}:attn", tree, ROOT, "flashprop_ab_test", "outside")
    assert not tree.exists()


@needs_git
def test_a_package_the_revision_lacks_stays_shared(tmp_path, monkeypatch, in_process) -> None:
    """A virtual environment inside the repository (untracked) is not the revision's: its modules
    are shared by both sides, never imported twice."""
    repo = _scratch(tmp_path / "repo", "import venv_helper\n\n\ndef attn(q, k, v, causal=False):\n"
                    "    return venv_helper.same(q)\n")
    site = repo / ".venv" / "site"
    site.mkdir(parents=True)
    (site / "venv_helper.py").write_text("def same(x):\n    return x\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.chdir(repo)
    import venv_helper

    with worktree(repo, "HEAD") as tree:
        kernel = import_kernel_at("./kern.py:attn", tree, repo, "flashprop_ab_test", "kern@HEAD")
        assert kernel.fn.__globals__["venv_helper"] is venv_helper is sys.modules["venv_helper"]
        assert Path(kernel.fn.__code__.co_filename).is_relative_to(tree)
    del sys.modules["venv_helper"]


# ---- noise bands ------------------------------------------------------------------------------

def _gate_run(path: Path, ratios: dict[str, float]) -> Path:
    benchmarks = [{"extra_info": {"device": "cuda", "kernel": "triton", "config": config,
                                  "ratios": {"sdpa-flash": ratio}, "timing": "t1"}}
                  for config, ratio in ratios.items()]
    path.write_text(json.dumps({"benchmarks": benchmarks}))
    return path


def test_the_gate_learns_a_band_per_row_from_repeated_runs(tmp_path, capsys) -> None:
    from flashprop.benchmarks.gate import main as gate

    runs = [_gate_run(tmp_path / f"r{i}.json", {"quiet": q, "mid": m, "noisy": n})
            for i, (q, m, n) in enumerate([(1.00, 1.00, 1.00), (1.01, 1.03, 1.20), (0.99, 0.98, 0.85)])]
    base = tmp_path / "base.json"
    assert gate(["--update", str(base), *map(str, runs)]) == 0
    data = json.loads(base.read_text())
    spread = data["spread"]["triton"]
    assert spread["quiet"]["sdpa-flash"] == 0.01 and spread["mid"]["sdpa-flash"] == 0.03
    assert data["band"] == {"k": 2.0, "floor": 0.05}
    capsys.readouterr()
    # quiet: floor 5%; mid: 2 x 3% = 6%; noisy: 2 x 20% above the 25% tolerance
    now = _gate_run(tmp_path / "now.json", {"quiet": 0.90, "mid": 0.95, "noisy": 0.80})
    assert gate([str(base), str(now), "--no-history"]) == 1
    out = capsys.readouterr().out
    cells = {line.split("|")[2].strip(): [c.strip() for c in line.split("|")[6:9]]
             for line in out.splitlines() if line.startswith("| triton ")}
    assert cells == {"quiet": ["-10.0%", "-5.0% (floor 5% (spread 1.0%))", "REGRESSION"],
                     "mid": ["-5.0%", "-6.0% (2 x spread 3.0%)", "ok"],
                     "noisy": ["-20.0%", "-25.0% (tolerance 25% (2 x spread 20.0% above it))", "ok"]}, out
    assert "1 regression(s) beyond their band" in out and "3 learned from repeated runs" in out
    # one more run, alone: the rows keep the spread they learned
    assert gate(["--update", str(base), str(_gate_run(tmp_path / "r4.json", {"quiet": 1.0}))]) == 0
    assert json.loads(base.read_text())["spread"]["triton"]["quiet"]["sdpa-flash"] == 0.01


@pytest.mark.parametrize("name", ["cpu.json", "h200.json"])
def test_the_committed_baselines_gate_with_their_tolerance(name, tmp_path, capsys) -> None:
    """A baseline written before spreads were kept: every row falls back to its tolerance."""
    from flashprop.benchmarks.gate import load_baseline
    from flashprop.benchmarks.gate import main as gate

    path = ROOT / "ci" / "baselines" / name
    ratios, timings, meta = load_baseline(path)
    benchmarks = [{"extra_info": {"device": meta["device"], "kernel": k, "config": c, "ratios": {a: v * 0.9},
                                  **({"timing": timings[k, c]} if (k, c) in timings else {})}}
                  for (k, c, a), v in ratios.items()]
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"benchmarks": benchmarks}))
    assert gate([str(path), str(run), "--no-history"]) == 0  # -10% is within 25% / 35%
    out = capsys.readouterr().out
    assert f"(tolerance {meta['tolerance']:.0%} (no spread recorded))" in out and "0 learned" in out


# ---- history ----------------------------------------------------------------------------------

def _record(speed: float, config: str = "fwd N4k", band: float = 0.03) -> Record:
    return Record(date="2026-12-01T00:00:00Z", source="gate", revision="abc", machine="H200", device="cuda",
                  torch="2.13", triton="3.6", kernel="triton", config=config, metric="vs sdpa-flash",
                  speed=speed, band=band, status="ok")


def test_slow_drift_is_flagged_where_each_run_passed(tmp_path) -> None:
    drifting = [1.0, 1.01, 0.99, 0.98, 0.965, 0.955, 0.945, 0.935]  # at most -1.5% a run
    steady = [1.0, 1.01, 0.99, 1.0, 0.995, 1.005, 0.99, 1.0]
    one_slow = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.9]
    path = tmp_path / "h.jsonl"
    for speeds, config in ((drifting, "drift"), (steady, "steady"), (one_slow, "one slow")):
        append(path, [_record(s, config) for s in speeds])
    found = {t.key[3]: t for t in trends(load(path))}
    assert [found[c].drift for c in ("drift", "steady", "one slow")] == [True, False, False]
    assert found["drift"].per_run < -0.005 < found["steady"].per_run
    short = trends([_record(s) for s in drifting[:5]])  # fewer than 2 x 3 runs: no verdict yet
    assert not short[0].drift


def test_gate_runs_append_history_and_the_report_flags_the_drift(tmp_path, monkeypatch, capsys) -> None:
    """Eight gates, each within its 3% band of a baseline re-recorded after it; the report flags
    the row that lost 1.5% a run over them (and says so when matplotlib is missing)."""
    from flashprop.benchmarks.gate import main as gate

    base, history = tmp_path / "base.json", tmp_path / "h.jsonl"
    gate(["--update", str(base), str(_gate_run(tmp_path / "r0.json", {"slow": 1.0, "flat": 1.0}))])
    for i in range(1, 9):
        run = _gate_run(tmp_path / f"r{i}.json", {"slow": 0.985**i, "flat": 1.0})
        assert gate([str(base), str(run), "--history", str(history), "--tolerance", "0.03"]) == 0
        gate(["--update", str(base), str(run)])
    records = load(history)
    assert len(records) == 16 and {r.source for r in records} == {"gate"} and records[0].machine
    out = tmp_path / "report"
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    capsys.readouterr()
    assert main(["bench", "--report", "--history", str(history), "--out", str(out)]) == 1
    text = (out / "history.md").read_text()
    assert "(no plot: matplotlib is not installed (pip install 'flashprop[report]'))" in text
    assert "| gate | " in text and "| slow | vs sdpa-flash | 8 |" in text and "DRIFT" in text
    assert text.count("DRIFT") == 1 and "1 drifting row(s)" in capsys.readouterr().out


def test_the_history_plot_is_in_the_benchmark_report(tmp_path) -> None:
    pytest.importorskip("matplotlib", reason="the plot needs matplotlib (the report extra)")
    from flashprop.benchmarks.history import write_report

    (tmp_path / "bench.md").write_text("# flashprop benchmarks\n\n## Kernels\n")
    write_report([_record(s) for s in (1.0, 0.99, 1.0, 0.95, 0.94, 0.93)], tmp_path)
    write_report([_record(s) for s in (1.0, 0.99, 1.0, 0.95, 0.94, 0.93)], tmp_path)  # replaced, not added
    bench = (tmp_path / "bench.md").read_text()
    assert (tmp_path / "history.png").stat().st_size > 0 and bench.count("## History") == 1
    assert bench.startswith("# flashprop benchmarks") and "![speed against run](history.png)" in bench


# ---- flashprop bisect -------------------------------------------------------------------------

@needs_git
def test_bisect_names_the_planted_commit_of_eight(tmp_path) -> None:
    repo = _scratch(tmp_path / "repo")
    commits = [_git(repo, "rev-parse", "HEAD")]
    for i in range(2, 9):
        if i == 5:
            (repo / "kern.py").write_text(SLEEPING)
        else:
            with (repo / "notes.txt").open("a") as notes:
                notes.write(f"{i}\n")
            _git(repo, "add", "notes.txt")
        _git(repo, "commit", "-qam", f"commit {i}")
        commits.append(_git(repo, "rev-parse", "HEAD"))
    done = subprocess.run(
        [sys.executable, "-m", "flashprop.cli", "bisect", commits[0], "HEAD", "--row", ROW,
         "--kernel", "./kern.py:attn", "--device", "cpu", "--rounds", "30"],
        cwd=repo, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"the first bad commit at {ROW!r} is {commits[4]} (" in done.stdout, done.stdout
    table = done.stdout.split("A/B at it:")[1]
    assert f"| ./kern.py:attn@{commits[4][:12]} | {ROW} | " in table and "| REGRESSION |" in table
    assert _git(repo, "status", "--porcelain") == "" and _git(repo, "worktree", "list").count("\n") == 0
