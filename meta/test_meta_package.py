"""Meta-tests of flashprop as a package: the wheel's contents and the ``flashprop`` command, run
from the installed wheel (a folder outside the checkout, as a user's repository is).

The wheel holds ``flashprop`` and nothing else at the top level (no ``kernels``: PyPI has a
package of that name), registers the pytest plugin (``pytest11``) and the ``flashprop`` script.
``flashprop fuzz`` exits 0 on a correct kernel and 1 on a wrong one, writes JSON and JUnit XML
when asked, and ends its output with the table and each failure's cause once (the tracebacks in
a file, the markdown in ``$GITHUB_STEP_SUMMARY``); ``flashprop bench`` times a kernel against the
anchor and prints the table, and ``flashprop gate`` fails a regression.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
from flashprop.harness.failures import REPLAY_HEADER, REPRO_HEADER

from flashprop.cli import main

pytestmark = pytest.mark.meta

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built from a copy: an in-tree build leaves build/ and an egg-info (whose entry
    points other processes running from the root would see) in the working tree."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "src"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".git", ".tox", "build", "*.egg-info",
                                                                 "__pycache__", ".hypothesis"))
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp),
         str(source)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    (found,) = tmp.glob("flashprop-*.whl")
    return found


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of a process that has the wheel installed (and no checkout on its path)."""
    site = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site),
                           str(wheel)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return {**os.environ, "PYTHONPATH": str(site)}


def test_the_wheel_installs_only_the_flashprop_namespace(wheel: Path):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == {"flashprop"}, tops
    for module in ("flashprop/contract/capabilities.py", "flashprop/refimpl/golden.py",
                   "flashprop/properties/test_variants.py", "flashprop/plugin.py", "flashprop/cli.py",
                   "flashprop/kernels/cuda/flash_fwd.cuh", "flashprop/benchmarks/bench_attention.py",
                   "flashprop/benchmarks/conftest.py", "flashprop/benchmarks/gate.py",
                   "flashprop/harness/check.py", "flashprop/contract/problem.py"):
        assert module in names, module
    own_tests = [n for n in names if re.search(r"/test_meta(_\w+)?\.py$", n)]
    assert not own_tests, f"the suite's own tests (meta/) are not installed: {own_tests}"
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry).decode()
    assert "[pytest11]" in text and "flashprop = flashprop.plugin" in text, text
    assert "[console_scripts]" in text and "flashprop = flashprop.cli:main" in text, text


#: A kernel that raises the same error, its numbers aside, on every problem.
WRONG = textwrap.dedent('''
    def attn(q, k, v, *, causal=False, scale=None):
        raise RuntimeError(f"no kernel compiled for head dim {q.shape[-1]}")
''')


@pytest.mark.parametrize("spec", ["ref-blocked", "wrong"])
def test_flashprop_fuzz_exit_status_and_reports(installed: dict[str, str], tmp_path: Path, spec: str):
    kernel = spec
    if spec == "wrong":
        (tmp_path / "wrong.py").write_text(WRONG)
        kernel = "./wrong.py:attn"
    (tmp_path / "summary.md").write_text("an earlier step's summary\n")
    run = subprocess.run(
        [sys.executable, "-m", "flashprop.cli", "fuzz", kernel, "--device", "cpu", "--max-examples", "5",
         "--properties", "golden", "--json", "t.json", "--junit-xml", "t.xml", "--tracebacks-file", "tb.txt"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**installed, "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md")})
    assert run.returncode == (1 if spec == "wrong" else 0), run.stdout + run.stderr
    assert "examples per property" in run.stdout
    rows = {row["property"]: row for row in json.loads((tmp_path / "t.json").read_text())}
    assert set(rows) == {"forward", "backward"}, rows
    assert (rows["forward"]["failed"] > 0) == (spec == "wrong"), rows
    assert rows["forward"]["asked"] == 5 and rows["backward"]["asked"] == 4, rows  # weights 1 and 3/4
    assert "<testsuite" in (tmp_path / "t.xml").read_text()
    summary = (tmp_path / "summary.md").read_text()
    assert summary.startswith("an earlier step's summary\n## flashprop on "), summary
    if spec == "wrong":
        # the table and the one cause come last, after pytest's summary; the tracebacks are in the file
        tail = run.stdout.split("short test summary info")[-1]
        assert "examples per property" in tail and "Traceback" not in run.stdout, run.stdout
        assert tail.count("2 properties fail with one cause: the kernel raised RuntimeError: no kernel") == 1
        assert "properties: backward, forward" in tail, run.stdout
        assert "no kernel compiled" in (tmp_path / "tb.txt").read_text()
        assert "### Failures by cause" in summary and "2 of 2 properties failed" in summary
        _the_repro_and_the_replay_run_here(run.stdout, tmp_path, installed)


def _the_repro_and_the_replay_run_here(report: str, folder: Path, env: dict[str, str]) -> None:
    """The failure's repro, saved as a file, and its replay command both run from the user's
    folder with the user's python (no checkout there): each reproduces the kernel's error."""
    lines = report.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == REPRO_HEADER)
    end = next(i for i in range(start, len(lines)) if lines[i].strip() == REPLAY_HEADER)
    (folder / "repro.py").write_text(textwrap.dedent("\n".join(lines[start + 1:end])))
    repro = subprocess.run([sys.executable, "repro.py"], cwd=folder, capture_output=True, text=True,
                           timeout=300, env=env)
    assert "no kernel compiled for head dim" in repro.stderr, repro.stdout + repro.stderr
    command = lines[end + 1].strip()
    assert command.startswith("python -m flashprop.cli replay"), command  # no test file lies here
    replay = subprocess.run(command.replace("python", sys.executable, 1), shell=True, cwd=folder,
                            capture_output=True, text=True, timeout=300, env=env)
    assert replay.returncode == 1 and "no kernel compiled" in replay.stdout, replay.stdout + replay.stderr
    alone = re.search(r"^=* ?1 failed(, \d+ deselected)? in [\d.]+s", replay.stdout, re.M)  # that test alone
    assert alone, replay.stdout


def test_flashprop_bench_times_a_kernel_from_the_installed_package(installed: dict[str, str], tmp_path: Path):
    """``flashprop bench`` on a file kernel, from the installed package: the anchor's ratio is in
    the JSON and the table; ``flashprop gate`` passes the run against itself, fails a slower one."""
    pytest.importorskip("pytest_benchmark", reason="flashprop bench needs pytest-benchmark")
    (tmp_path / "mine.py").write_text("from flashprop.refimpl.blocked import attention as attn\n")
    run = subprocess.run(
        [sys.executable, "-m", "flashprop.cli", "bench", "--device", "cpu", "--suites", "attention",
         "--bench-kernels", "./mine.py:attn", "--bench-seqlens", "128", "--bench-modes", "fwd",
         "--bench-head-dims", "64", "--json", "run.json", "--benchmark-min-rounds", "2",
         "--benchmark-max-time", "0.05"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env=installed)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "| ./mine.py:attn | fwd | 64 | causal | fp32 | 128 |" in run.stdout, run.stdout
    data = json.loads((tmp_path / "run.json").read_text())
    base, slow = tmp_path / "base.json", tmp_path / "slow.json"
    assert main(["gate", "--update", str(base), str(tmp_path / "run.json")]) == 0
    assert main(["gate", str(base), str(tmp_path / "run.json")]) == 0
    for bench in data["benchmarks"]:
        ratios = bench["extra_info"].get("ratios", {})
        ratios.update({anchor: ratio / 3 for anchor, ratio in ratios.items()})
    slow.write_text(json.dumps(data))
    assert main(["gate", str(base), str(slow)]) == 1


@pytest.mark.parametrize(("command", "says"), [
    ("fuzz", "(200: forward 200, most 100, long-sequences 10"),
    ("bench", "--bench-kernels"),
    ("gate", "--update"),
])
def test_each_command_says_what_it_does(command: str, says: str, capsys: pytest.CaptureFixture):
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    assert says in " ".join(capsys.readouterr().out.split())
