"""ci/bench_gate.py on made-up runs: a drop beyond the tolerance fails, ``--update`` keeps the
baseline's rows a partial run lacks, ``--replace`` does not, rows timed under another protocol
are not compared."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "ci"))  # the scripts under test

import bench_gate

pytestmark = pytest.mark.meta


def _run(path: Path, ratios: dict[str, float], timing: str | None = None) -> Path:
    """A pytest-benchmark JSON file with one gated triton row per configuration, timed under
    ``timing`` (none recorded if None)."""
    benchmarks = [
        {"extra_info": {"device": "cuda", "kernel": "triton", "config": config,
                        "ratios": {"sdpa-flash": ratio}, **({"timing": timing} if timing else {})}}
        for config, ratio in ratios.items()
    ]
    path.write_text(json.dumps({"benchmarks": benchmarks}))
    return path


def _entries(path: Path) -> dict[str, float]:
    data = json.loads(path.read_text())
    return {config: a["sdpa-flash"] for config, a in data["entries"]["triton"].items()}


def test_gate_fails_only_beyond_the_tolerance(tmp_path):
    base = tmp_path / "base.json"
    full = _run(tmp_path / "full.json", {"fwd N2048": 1.2, "fwd N4096": 1.3})
    assert bench_gate.main(["--update", str(base), str(full)]) == 0
    within = _run(tmp_path / "within.json", {"fwd N2048": 1.0, "fwd N4096": 1.3})
    assert bench_gate.main([str(base), str(within)]) == 0  # -17% of 1.2, tolerance 25%
    beyond = _run(tmp_path / "beyond.json", {"fwd N2048": 0.8, "fwd N4096": 1.3})
    assert bench_gate.main([str(base), str(beyond)]) == 1  # -33%


def test_update_keeps_rows_the_run_lacks_and_replace_drops_them(tmp_path):
    base = tmp_path / "base.json"
    assert bench_gate.main(["--update", str(base),
                            str(_run(tmp_path / "a.json", {"x": 1.0, "y": 2.0}))]) == 0
    partial = _run(tmp_path / "b.json", {"y": 3.0, "z": 4.0})
    assert bench_gate.main(["--update", str(base), str(partial)]) == 0
    assert _entries(base) == {"x": 1.0, "y": 3.0, "z": 4.0}
    assert json.loads(base.read_text())["runs"] == ["a.json", "b.json"]
    assert bench_gate.main(["--replace", str(base), str(partial)]) == 0
    assert _entries(base) == {"y": 3.0, "z": 4.0}
    assert json.loads(base.read_text())["runs"] == ["b.json"]


def test_rows_timed_under_another_protocol_are_not_compared(tmp_path, capsys):
    base = tmp_path / "base.json"
    assert bench_gate.main(["--update", str(base), str(_run(tmp_path / "a.json", {"x": 1.0}))]) == 0
    assert bench_gate.main(["--update", str(base), str(_run(tmp_path / "b.json", {"y": 1.0}, "spin"))]) == 0
    assert json.loads(base.read_text())["timing"] == {"triton": {"y": "spin"}}  # x: none recorded
    capsys.readouterr()
    # x halves under the new protocol: not a regression, a row to re-record; y is compared
    assert bench_gate.main([str(base), str(_run(tmp_path / "c.json", {"x": 0.5, "y": 1.0}, "spin"))]) == 0
    out = capsys.readouterr().out
    assert "other timing: re-record" in out and "none recorded -> spin" in out and "1 ok" in out
    # ... and fails when it is timed as its baseline row was
    assert bench_gate.main([str(base), str(_run(tmp_path / "d.json", {"x": 0.5}))]) == 1
    # a run with nothing timed under the baseline's protocols checks nothing: exit 2
    assert bench_gate.main([str(base), str(_run(tmp_path / "e.json", {"x": 1.0, "y": 1.0}, "v3"))]) == 2
    # re-recording takes the run's protocol
    assert bench_gate.main(["--update", str(base), str(_run(tmp_path / "f.json", {"x": 0.5}, "spin"))]) == 0
    assert json.loads(base.read_text())["timing"] == {"triton": {"x": "spin", "y": "spin"}}
    # a row of a configuration the run timed anew, under another protocol, is not kept
    data = json.loads(base.read_text())
    data["entries"]["triton"]["x"]["sdpa-cudnn"] = 0.7
    base.write_text(json.dumps(data))
    assert bench_gate.main(["--update", str(base), str(_run(tmp_path / "g.json", {"x": 0.6}, "v3"))]) == 0
    assert json.loads(base.read_text())["entries"]["triton"]["x"] == {"sdpa-flash": 0.6}


def test_rows_marked_ungated_are_neither_recorded_nor_compared(tmp_path):
    """A launch-bound decode row (``gated: False``) may halve without failing the gate, and an
    update does not put it in the baseline."""
    base = tmp_path / "base.json"
    assert bench_gate.main(["--update", str(base), str(_run(tmp_path / "a.json", {"x": 1.0, "y": 1.0}))]) == 0
    halved = _run(tmp_path / "b.json", {"x": 1.0, "y": 0.5})
    data = json.loads(halved.read_text())
    data["benchmarks"][1]["extra_info"]["gated"] = False
    halved.write_text(json.dumps(data))
    assert bench_gate.main([str(base), str(halved)]) == 0
    fresh = tmp_path / "fresh.json"
    assert bench_gate.main(["--update", str(fresh), str(halved)]) == 0
    assert _entries(fresh) == {"x": 1.0}
