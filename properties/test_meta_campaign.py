"""Meta-tests of fuzz campaigns on pytest-xdist and a shared example database (real processes).

- two workers' tallies merge into the one summary table;
- a kernel that kills its process on one problem (as a lost CUDA context or a segfault does)
  costs one worker, which xdist replaces: the problem is reported as that property's failure with
  its replay command, and every other property's tally is complete;
- two runs sharing a Redis example database (a real ``redis-server``, started and stopped here):
  the failure the first run found is the second run's first example.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.meta

ROOT = Path(__file__).resolve().parent.parent

CRASHER = textwrap.dedent('''
    import os
    import signal

    from flashprop.refimpl.blocked import attention as blocked


    def attn(q, k, v, *, causal=False, scale=None):
        """ref-blocked, except that Nq = 13 kills the process (a segfault, as a lost CUDA context)."""
        if q.shape[2] == 13:
            os.kill(os.getpid(), signal.SIGSEGV)
        return blocked(q, k, v, causal=causal, scale=scale)
''')

WRONG_AT_17 = textwrap.dedent('''
    from flashprop.refimpl.blocked import attention as blocked


    def attn(q, k, v, *, causal=False, scale=None):
        """ref-blocked, except that Nk = 17 doubles the output: a rare bug to find once."""
        o, lse = blocked(q, k, v, causal=causal, scale=scale)
        return (2 * o if k.shape[2] == 17 else o), lse
''')


def _pytest(*args: str, env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--device", "cpu", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


def test_workers_tallies_merge(tmp_path: Path):
    run = _pytest("properties/test_golden.py", "--kernel", "ref-blocked", "--hypothesis-profile", "ci",
                  "-n", "2", "--tally-json", str(tmp_path / "t.json"))
    assert run.returncode == 0, run.stdout + run.stderr
    table = run.stdout[run.stdout.index("examples per property"):]
    assert "ref-blocked  backward  15" in table and "ref-blocked  forward   20" in table, table


def test_a_dead_worker_is_replaced_and_its_problem_reported(tmp_path: Path):
    kernel = tmp_path / "crasher.py"
    kernel.write_text(CRASHER)
    run = _pytest("properties/test_golden.py::test_forward_matches_golden",
                  "properties/test_robustness.py::test_single_token", "--kernel", f"{kernel}:attn",
                  "--hypothesis-profile", "ci", "-n", "2", "--max-worker-restart", "4")
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    table = run.stdout[run.stdout.index("examples per property"):]
    assert "died" in table and "nq=13" in table and "--replay" in table, table
    rows = {line.split()[1]: line.split()[2:] for line in table.splitlines() if line.startswith(str(kernel))}
    dead = [prop for prop, cols in rows.items() if cols[3] != "0"]  # failed
    assert len(dead) == 1 and table.count(f"property '{dead[0]}' failed") == 1, table
    other = next(prop for prop in ("forward", "single-token") if prop != dead[0])
    full = {"forward": "20", "single-token": "10"}[other]  # the ci profile's 20, times the weight
    assert rows[other][:2] == [full, full], table  # the other property ran and passed all its examples


@pytest.fixture
def redis_url():
    """A real redis-server on a free port, stopped after the test."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (.ci/run installs Debian's redis-server)")
    pytest.importorskip("redis", reason="the redis client package is not installed (tox installs it)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                               "--appendonly", "no"], stdout=subprocess.DEVNULL)
    import redis

    client = redis.Redis(port=port)
    deadline = time.monotonic() + 30
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                server.kill()
                raise
            time.sleep(0.05)
    try:
        yield f"redis://127.0.0.1:{port}/0", client
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_runs_sharing_a_redis_database_replay_a_failure_first(tmp_path: Path, redis_url):
    url, client = redis_url
    kernel = tmp_path / "wrong.py"
    kernel.write_text(WRONG_AT_17)
    found = []
    for i in range(2):
        probe = tmp_path / f"probe{i}.json"
        env = {**__import__("os").environ, "FLASHPROP_PROBE_OUT": str(probe)}
        run = _pytest("properties/test_golden.py::test_forward_matches_golden", "--kernel", f"{kernel}:attn",
                      "--hypothesis-profile", "fuzz", "--max-examples", "300", "--example-db", url,
                      "-p", "mutants.probe", env=env)
        assert run.returncode == 1 and "property 'forward' failed" in run.stdout, run.stdout + run.stderr
        found.append(json.loads(probe.read_text()))
        if i == 0:
            assert client.keys("flashprop:*"), "the first run saved nothing in Redis"
    assert found[1]["examples"] == 1, found  # the saved failure is replayed first
    assert "nk=17" in found[1]["failure"], found[1]["failure"]
