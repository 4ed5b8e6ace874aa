"""ci/fuzz_state.py on made-up tallies: which attempt of a cut-off process is kept, and the
table of a state folder (finished runs before cut-off ones, a failure fails it)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fuzz_state
from flashprop.properties import report


def _tally(path: Path, passed: int, failed: int = 0) -> Path:
    path.write_text(json.dumps([{"kernel": "k", "property": "forward", "passed": passed, "refused": 0,
                                 "failed": failed, "seconds": 1.0, "last_failure": None, "skipped": []}]))
    return path


def _kept(stem: Path) -> int:
    return fuzz_state._rank(stem.with_name(stem.name + ".partial.json"))[1]


def test_keep_prefers_failures_then_more_examples_of_the_same_command(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    stem = state / "fuzz.k.test_golden.1"
    assert fuzz_state.keep(_tally(tmp_path / "a.json", 5), stem, "cmd")
    assert not fuzz_state.keep(_tally(tmp_path / "b.json", 3), stem, "cmd")
    assert _kept(stem) == 5
    assert fuzz_state.keep(_tally(tmp_path / "c.json", 2, failed=1), stem, "cmd")
    assert not fuzz_state.keep(_tally(tmp_path / "d.json", 9), stem, "cmd")
    assert _kept(stem) == 3
    assert fuzz_state.keep(_tally(tmp_path / "e.json", 1), stem, "another cmd")  # a new campaign
    assert _kept(stem) == 1
    assert not fuzz_state.keep(tmp_path / "missing.json", stem, "another cmd")  # killed, no tally
    (tmp_path / "cut.json").write_text('[{"kernel": "k", "pro')  # killed while writing it
    assert not fuzz_state.keep(tmp_path / "cut.json", state / "fuzz.k.test_golden.2", "cmd")
    assert _kept(stem) == 1


def _table(state: Path, capsys, monkeypatch) -> tuple[int, list[list[str]]]:
    """``fuzz_state.py table`` on a fresh tally: its exit code and its rows, split."""
    monkeypatch.setattr(report, "TALLIES", type(report.TALLIES)(report.Tally))
    code = fuzz_state.main(["table", str(state), "fuzz"])
    return code, [line.split() for line in capsys.readouterr().out.splitlines()]


def test_table_takes_the_finished_run_over_a_partial_one(tmp_path, capsys, monkeypatch):
    state = tmp_path
    _tally(state / "fuzz.k.test_golden.1.json", 10)
    (state / "fuzz.k.test_golden.1.rc").write_text("0\n")
    _tally(state / "fuzz.k.test_golden.1.partial.json", 4)  # an earlier, cut-off attempt
    _tally(state / "fuzz.k.test_golden.2.partial.json", 6)
    (state / "fuzz.k.test_golden.2.rc").write_text("124\n")
    code, rows = _table(state, capsys, monkeypatch)
    assert code == 0 and ["k", "forward", "16", "16", "0", "0"] == rows[2][:6]  # 10 + 6, not + 4
    assert rows[-1][:5] == ["(1", "processes", "finished,", "1", "cut"]
    _tally(state / "fuzz.k.test_golden.3.partial.json", 1, failed=1)
    code, rows = _table(state, capsys, monkeypatch)
    assert code == 1 and ["k", "forward", "18", "17", "0", "1"] == rows[2][:6]
