"""ci/campaign_scaling.py: its table's arithmetic, and a real weak-scaling run on the CPU (1 and 2
workers of ``ref-blocked``) whose examples add up as the shards promise."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "ci"))  # the scripts under test

import campaign_scaling

pytestmark = pytest.mark.meta

ROOT = Path(__file__).resolve().parent.parent


def test_the_table_derives_rate_speedup_and_efficiency():
    lines = campaign_scaling.table([(1, 100, 10.0), (2, 180, 10.0), (4, 360, 12.0)])
    assert lines[2] == "| 1 | 100 | 10.0 | 10.0 | 1.00 | 1.00 | - |"
    assert lines[3] == "| 2 | 180 | 10.0 | 18.0 | 1.80 | 0.90 | 0.90 |"
    assert lines[4] == "| 4 | 360 | 12.0 | 30.0 | 3.00 | 0.75 | 0.83 |"


def test_a_weak_scaling_run_on_the_cpu(tmp_path: Path):
    """W workers run W shards of ``--examples`` each: the 2-worker run counts twice the
    examples of the 1-worker run (per shard: forward 4, backward 4 * 3/4 = 3)."""
    run = subprocess.run([sys.executable, "ci/campaign_scaling.py", "ref-blocked", "--device", "cpu",
                          "--workers", "1", "2", "--examples", "4", "--properties", "golden",
                          "--no-warm-up", "--log", str(tmp_path / "log")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr + (tmp_path / "log").read_text()
    rows = [line.split("|")[1:3] for line in run.stdout.splitlines() if line.startswith("| ")]
    assert [(w.strip(), n.strip()) for w, n in rows[1:]] == [("1", "7"), ("2", "14")], run.stdout
