"""Meta-tests of fuzz campaigns on pytest-xdist and a shared example database (real processes).

- two workers' tallies merge into the one summary table;
- a kernel that kills its process on one problem (as a lost CUDA context or a segfault does)
  costs one worker, which xdist replaces: the problem is reported as that property's failure with
  its replay command, and every other property's tally is complete; so does a fault a failed call
  leaves behind, which surfaces outside the kernel's call;
- two runs sharing a Redis example database (a real ``redis-server``, started and stopped here):
  the failure the first run found is the second run's first example;
- ``--shards``: the shards of a property draw from consecutive seeds, different problems, and
  their examples add up to the property's; a worker reported down twice is merged once;
- a stop signal (Ctrl-C or GNU timeout to the process group, a CI runner's SIGTERM to pytest)
  winds the workers down: the run ends soon with its table and pytest's interrupted status.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from flashprop.harness import campaign
from flashprop.harness.run_context import RunContext

pytestmark = pytest.mark.meta

ROOT = Path(__file__).resolve().parent.parent

CRASHER = textwrap.dedent('''
    import os
    import signal

    from flashprop.refimpl.blocked import attention as blocked


    def attn(q, k, v, *, causal=False, scale=None):
        """ref-blocked, except that Nq > 4 with Nk > 4 kills the process (a segfault, as a lost CUDA
        context): the forward property draws such a problem early, the single-token one never."""
        if q.shape[2] > 4 and k.shape[2] > 4:
            os.kill(os.getpid(), signal.SIGSEGV)
        return blocked(q, k, v, causal=causal, scale=scale)
''')

CONTEXT_BREAKER = textwrap.dedent('''
    from flashprop.refimpl.blocked import attention as blocked


    def attn(q, k, v, *, causal=False, scale=None):
        """ref-blocked, except that Nq > 4 with Nk > 4 raises what a lost CUDA context raises."""
        if q.shape[2] > 4 and k.shape[2] > 4:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return blocked(q, k, v, causal=causal, scale=scale)
''')

FAULT_LEFT_BEHIND = textwrap.dedent('''
    from flashprop.contract.problem import Problem
    from flashprop.refimpl.blocked import attention as blocked


    def _lost(*args, **kwargs):
        raise RuntimeError("CUDA error: misaligned address")


    def attn(q, k, v, *, causal=False, scale=None):
        """ref-blocked, except that Nq > 4 with Nk > 4 raises a plain RuntimeError and leaves a fault
        behind, as cuDNN's backward on a misaligned dO did: from then on, making a problem's inputs
        in this process raises what a lost CUDA context raises."""
        if q.shape[2] > 4 and k.shape[2] > 4:
            Problem.kernel_inputs = _lost
            raise RuntimeError("Expected mha_graph.execute(handle, variant_pack, workspace) to be true")
        return blocked(q, k, v, causal=causal, scale=scale)
''')

WRONG_AT_17 = textwrap.dedent('''
    from flashprop.refimpl.blocked import attention as blocked


    def attn(q, k, v, *, causal=False, scale=None):
        """ref-blocked, except that Nk = 17 doubles the output: a rare bug to find once."""
        o, lse = blocked(q, k, v, causal=causal, scale=scale)
        return (2 * o if k.shape[2] == 17 else o), lse
''')


RECORDER = textwrap.dedent('''
    import json
    import os

    import hypothesis.core
    from flashprop.refimpl.blocked import attention as blocked


    def attn(q, k, v, *, causal=False, scale=None):
        """ref-blocked, noting each call's shard seed (the seed Hypothesis is forced to while its
        shard runs) and problem (shapes, mask, first input)."""
        with open(os.environ["FLASHPROP_RECORD"], "a") as f:
            f.write(json.dumps([hypothesis.core.global_force_seed, list(q.shape), list(k.shape), causal,
                                q.flatten()[:1].tolist()]) + "\\n")
        return blocked(q, k, v, causal=causal, scale=scale)
''')


AT_WORK = textwrap.dedent('''
    import os
    from pathlib import Path

    from flashprop.refimpl.blocked import attention as blocked


    CALLS = [0]


    def attn(q, k, v, *, causal=False, scale=None):
        CALLS[0] += 1
        if CALLS[0] == 3:  # the first examples are done (the first call is the registry's probe)
            Path(os.environ["FLASHPROP_MARK"], str(os.getpid())).touch()
        return blocked(q, k, v, causal=causal, scale=scale)
''')


THREADS = textwrap.dedent('''
    import os

    import torch
    from flashprop.refimpl.blocked import attention as blocked


    def attn(q, k, v, *, causal=False, scale=None):
        """ref-blocked, noting torch's intra-op threads in an xdist worker."""
        if "PYTEST_XDIST_WORKER" in os.environ:
            with open(os.environ["FLASHPROP_RECORD"], "a") as f:
                f.write(f"{os.getpid()} {torch.get_num_threads()}\\n")
        return blocked(q, k, v, causal=causal, scale=scale)
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


def test_worker_threads_share_the_cores():
    """Each of N workers gets cores // N threads, at least one; a set OMP_NUM_THREADS stands."""
    assert campaign.worker_threads(16, 16, {}) == 1
    assert campaign.worker_threads(4, 16, {}) == 4
    assert campaign.worker_threads(32, 16, {"OMP_NUM_THREADS": ""}) == 1
    assert campaign.worker_threads(4, 16, {"OMP_NUM_THREADS": "2"}) is None


@pytest.mark.parametrize("files, cgroups, expected", [
    ({"cpu.max": "150000 100000"}, "0::/\n", 2),  # v2 at the root: 1.5 cores rounds up
    ({"cpu.max": "max 100000"}, "0::/\n", None),
    ({"ci.slice/cpu.max": "400000 100000", "cpu.max": "max 100000"}, "0::/ci.slice\n", 4),  # own cgroup
    ({"cpu/cpu.cfs_quota_us": "200000", "cpu/cpu.cfs_period_us": "100000"}, "1:cpu,cpuacct:/\n", 2),  # v1
    ({"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"}, "1:cpu:/\n0::/\n", None),
    ({}, "", None),  # nothing readable
])
def test_a_cgroup_cpu_quota_caps_the_cores(tmp_path: Path, files: dict, cgroups: str, expected: int | None):
    """The quota of cgroup v2 (``cpu.max``) or v1 (``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``),
    in the process's own cgroup or at the root, as whole cores: what :func:`usable_cores` caps
    the affinity's count with (a container's ``--cpus 2`` on a large host)."""
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text + "\n")
    assert campaign.quota_cores(tmp_path, cgroups) == expected


@pytest.mark.parametrize("workers, omp", [(2, None), (1, "1")])
def test_each_worker_runs_torch_on_its_share_of_the_cores(tmp_path: Path, workers: int, omp: str | None):
    """Over N xdist workers, every kernel call sees torch with cores // N threads (at least one),
    or OMP_NUM_THREADS's when the caller sets it (one worker would otherwise take every core)."""
    kernel, record = tmp_path / "kernel.py", tmp_path / "threads.txt"
    kernel.write_text(THREADS)
    env = {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"}
    env["FLASHPROP_RECORD"] = str(record)
    if omp:
        env["OMP_NUM_THREADS"] = omp
    run = _pytest("properties/test_robustness.py::test_single_token",
                  "properties/test_golden.py::test_forward_matches_golden", "--kernel", f"{kernel}:attn",
                  "--hypothesis-profile", "ci", "-n", str(workers), env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    seen = {tuple(map(int, line.split())) for line in record.read_text().splitlines()}
    expected = int(omp) if omp else max(1, campaign.usable_cores() // workers)
    assert len({pid for pid, _ in seen}) == workers and {threads for _, threads in seen} == {expected}, seen


def _two_properties(tmp_path: Path, source: str, workers: int, restarts: int) -> tuple[str, dict]:
    """Run the forward and single-token properties on the kernel in ``source`` over ``workers``
    xdist workers, expecting a failure: the summary table and its rows (property -> columns)."""
    kernel = tmp_path / "kernel.py"
    kernel.write_text(source)
    run = _pytest("properties/test_golden.py::test_forward_matches_golden",
                  "properties/test_robustness.py::test_single_token", "--kernel", f"{kernel}:attn",
                  "--hypothesis-profile", "ci", "-n", str(workers), "--max-worker-restart", str(restarts))
    assert run.returncode == 1, run.stdout + run.stderr
    table = run.stdout[run.stdout.index("examples per property"):]
    rows = {line.split()[1]: line.split()[2:] for line in table.splitlines() if line.startswith(str(kernel))}
    return table, rows


@pytest.mark.parametrize("source, cause", [(CRASHER, None), (CONTEXT_BREAKER, "RuntimeError: CUDA error")],
                         ids=["segfault", "broken-cuda-context"])
def test_a_dead_worker_is_replaced_and_its_problem_reported(tmp_path: Path, source: str, cause: str | None):
    """A worker that segfaults, or whose CUDA context breaks (it then ends itself), is replaced;
    its problem is reported once, with the cause when there is one, and the campaign goes on."""
    table, rows = _two_properties(tmp_path, source, workers=2, restarts=4)
    assert "died" in table and "--replay" in table, table
    assert cause is None or f"the kernel raised {cause}" in table, table
    nq, nk = map(int, re.search(r"problem: Problem\(.*?nq=(\d+), nk=(\d+)", table).groups())
    assert nq > 4 and nk > 4, table  # the problem the worker died on
    dead = [prop for prop, cols in rows.items() if cols[3] != "0"]  # failed
    assert len(dead) == 1 and table.count(f"property '{dead[0]}' failed") == 1, table
    other = next(prop for prop in ("forward", "single-token") if prop != dead[0])
    full = {"forward": "20", "single-token": "10"}[other]  # the ci profile's 20, times the weight
    assert rows[other][:2] == [full, full], table  # the other property ran and passed all its examples


def test_a_fault_left_behind_ends_the_worker_and_spares_the_next_test(tmp_path: Path):
    """A call that raises a plain error and leaves a fault behind: the fault surfaces outside the
    kernel's call (the next inputs made). The worker ends itself there, reporting the lost context,
    and the next test, on the fresh worker xdist starts, passes all its examples instead of failing
    on the lost context (one worker, so both tests would otherwise share it)."""
    table, rows = _two_properties(tmp_path, FAULT_LEFT_BEHIND, workers=1, restarts=2)
    assert "lost outside the kernel's call (RuntimeError: CUDA error: misaligned address)" in table, table
    assert "died" in table, table
    assert rows["forward"][3] != "0", table
    assert rows["single-token"][:2] == ["10", "10"] and rows["single-token"][3] == "0", table


def test_a_failed_gpu_call_reports_the_fault_it_left(monkeypatch: pytest.MonkeyPatch):
    """After a failed call on a CUDA problem, synchronizing surfaces a fault its work left behind as
    that call's (a lost context); a fault that does not lose the context, a CPU problem or an
    uninitialised CUDA report none."""
    import torch
    from flashprop.contract.problem import Problem
    from flashprop.harness import check

    p = Problem(b=1, hq=1, hkv=1, nq=4, nk=4, d=8, dv=8, dtype=torch.float16, device="cuda")

    def fault(message: str):
        def synchronize() -> None:
            raise RuntimeError(message)
        return synchronize

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", fault("CUDA error: misaligned address"))
    assert check._fault_after(p) == "RuntimeError: CUDA error: misaligned address"
    assert check._fault_after(p.replace(device="cpu")) is None
    monkeypatch.setattr(torch.cuda, "synchronize", fault("some other error"))
    assert check._fault_after(p) is None
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "synchronize", fault("CUDA error: misaligned address"))
    assert check._fault_after(p) is None


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
        env = {**os.environ, "FLASHPROP_PROBE_OUT": str(probe)}
        run = _pytest("properties/test_golden.py::test_forward_matches_golden", "--kernel", f"{kernel}:attn",
                      "--hypothesis-profile", "fuzz", "--max-examples", "1000", "--example-db", url,
                      "-p", "mutants.probe", env=env)
        assert run.returncode == 1 and "property 'forward' failed" in run.stdout, run.stdout + run.stderr
        found.append(json.loads(probe.read_text())[f"{kernel}:attn"])  # the probe's entry of the kernel
        if i == 0:
            assert client.keys("flashprop:*"), "the first run saved nothing in Redis"
    assert found[1]["examples"] == 1, found  # the saved failure is replayed first
    assert "nk=17" in found[1]["failure"], found[1]["failure"]


#: A planted bug the forward property finds within its first examples, never on its simplest
#: problem (Hq = Hkv), and the correct kernel it is derived from.
GQA_BUG, CORRECT = "mutants.catalogue:blocked_gqa_head_modulo", "ref-blocked"


def _fuzz_forward(kernel: str, examples: int, folder: Path, database: str | None = None,
                  *pytest_args: str) -> subprocess.CompletedProcess:
    """``flashprop fuzz KERNEL --properties golden`` (its forward test only) in ``folder``, with the
    fuzz profile's own directory database there or ``--example-db database``."""
    cmd = [sys.executable, "-m", "flashprop.cli", "fuzz", kernel, "--properties", "golden", "--device", "cpu",
           "--max-examples", str(examples), "--tracebacks-file", str(folder / "tracebacks.txt"),
           *(["--example-db", database] if database else []), "--", "-k", "forward", *pytest_args]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FLASHPROP_PROBE_OUT": str(folder / "probe.json")}
    run = subprocess.run(cmd, cwd=folder, capture_output=True, text=True, timeout=240, env=env)
    assert run.returncode in (0, 1), run.stdout + run.stderr
    return run


def _probed(kernel: str, examples: int, folder: Path, database: str | None) -> dict:
    """:func:`_fuzz_forward` under ``mutants.probe``: its entry of the kernel (its status, and
    the examples up to its first failure)."""
    _fuzz_forward(kernel, examples, folder, database, "-p", "mutants.probe")
    return json.loads((folder / "probe.json").read_text())[kernel]


def _saved(folder: Path, client) -> set:
    """Every example saved in the database: (key, value) pairs of the Redis ``client``, else the
    files of the fuzz profile's directory database in ``folder``."""
    if client is not None:
        return {(key, value) for key in client.keys("flashprop:*") for value in client.smembers(key)}
    return {p.relative_to(folder) for p in (folder / ".hypothesis" / "examples").rglob("*") if p.is_file()}


@pytest.mark.parametrize("where", ["directory", "redis"])
def test_the_example_database_is_per_kernel(tmp_path: Path, where: str, request: pytest.FixtureRequest):
    """A failing kernel, then a passing one, then the failing one with one example, each a fresh
    ``flashprop fuzz`` process on the same database (the fuzz profile's ``.hypothesis/`` in the
    folder they run in, or a real Redis server): the passing kernel's run deletes none of the
    other's saved examples, and the third run's one example is the saved failure."""
    database, client = request.getfixturevalue("redis_url") if where == "redis" else (None, None)
    first = _probed(GQA_BUG, 100, tmp_path, database)
    assert first["status"] == "caught" and first["examples"] > 1, first  # found by drawing, not first
    saved = _saved(tmp_path, client)
    assert saved, "the failing kernel's run saved nothing"
    correct = _probed(CORRECT, 20, tmp_path, database)
    assert correct["status"] == "survived" and correct["examples_total"] == 20, correct
    assert saved <= _saved(tmp_path, client), "the passing kernel's run deleted the other's examples"
    again = _probed(GQA_BUG, 1, tmp_path, database)
    assert again["status"] == "caught" and again["examples"] == 1, again  # the saved failure, replayed
    assert "hq=4, hkv=2" in again["failure"], again["failure"]


#: A declaration whose text a careless digest would write differently in each process: sets of
#: strings (their order follows PYTHONHASHSEED) and a limit's predicate (its repr is an address).
DECLARATION = textwrap.dedent('''
    import torch
    from flashprop.contract.capabilities import Capabilities, KVCache, Limit
    from flashprop.contract.registry import Kernel
    from flashprop.harness.campaign import database_key

    CAPS = Capabilities(devices=frozenset({"cpu", "cuda"}), alibi=frozenset({"head", "batch-head"}),
                        dtypes=frozenset({torch.float16, torch.bfloat16}), head_dims={64, 128, 32},
                        kvcache=KVCache(page_sizes=(16,)), limits=(Limit("odd Nk", lambda p: p.nk % 2 == 1),))
    KEY = database_key(Kernel("my.py:attn", lambda q, k, v: q, CAPS), "forward", "test_golden::test_forward")
''')


def test_the_profiles_are_the_same_inside_a_ci_runner():
    """Hypothesis makes its own ``ci`` profile (derandomized, no database) the default where a
    ``CI`` variable is set, as GitHub Actions and GitLab set it: flashprop's profiles are the same
    there as on a laptop, and the fuzz profile draws at random and saves its failures."""
    show = ("import flashprop.plugin; from hypothesis import settings; "
            "print(*(settings.get_profile(n) for n in ('ci', 'dev', 'fuzz', 'gpu')), sep=chr(10))")
    runs = {}
    for ci in ("", "true"):
        env = {k: v for k, v in os.environ.items() if k != "CI"} | ({"CI": ci} if ci else {})
        runs[ci] = subprocess.run([sys.executable, "-c", show], cwd=ROOT, capture_output=True,
                                  text=True, check=True, env=env).stdout
    assert runs["true"] == runs[""]
    fuzz = runs["true"].splitlines()[2]
    assert "derandomize=False" in fuzz and "DirectoryBasedExampleDatabase" in fuzz, fuzz


def test_database_keys_tell_kernels_declarations_tests_and_properties_apart():
    """The same key in every process (whatever PYTHONHASHSEED); another for another kernel spec,
    declaration (a field, a limit's reason), test case or property."""
    from dataclasses import replace

    from flashprop.contract.capabilities import Limit
    from flashprop.contract.registry import Kernel

    keys = set()
    for seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", DECLARATION + "print(KEY.decode())"], capture_output=True,
                             text=True, check=True, env={**os.environ, "PYTHONHASHSEED": seed}).stdout
        keys.add(out.strip())
    namespace: dict = {}
    exec(DECLARATION, namespace)
    key, caps = namespace["KEY"], namespace["CAPS"]
    assert keys == {key.decode()}, keys
    assert json.loads(key)["kernel"] == "my.py:attn"

    def other(name="my.py:attn", declaration=caps, prop="forward", case="test_golden::test_forward"):
        return campaign.database_key(Kernel(name, lambda q, k, v: q, declaration), prop, case)

    assert other() == key  # another lambda with the same reason: the same declaration
    others = [other(name="other.py:attn"), other(declaration=replace(caps, causal=False)),
              other(declaration=replace(caps, limits=(Limit("even Nk", lambda p: p.nk % 2 == 0),))),
              other(declaration=replace(caps, limits=())), other(prop="backward"),
              other(case="test_golden::test_forward[corruption=x]")]
    assert len({key, *others}) == 1 + len(others)


class _Item:
    """What campaign.case_of reads of a pytest item."""

    def __init__(self, module: str, params: dict):
        self.module, self.originalname = type(sys)(module), "test_x"
        self.name, self.callspec = "test_x[...]", type("CallSpec", (), {"params": params})()


def test_a_test_case_is_its_module_function_and_parameters_but_kernel_and_shard():
    cases = []
    for module, params in [("properties.test_golden", {"kernel": "a", "corruption": "nan"}),
                           ("flashprop.properties.test_golden", {"kernel": "b", "flashprop_shard": 3,
                                                                 "corruption": "nan"}),
                           ("flashprop.properties.test_golden", {"kernel": "a", "corruption": "inf"})]:
        cases.append(campaign.case_of(_Item(module, params)))
    assert cases[0] == cases[1] == "test_golden::test_x[corruption=nan]", cases  # checkout, installed, shard
    assert cases[2] == "test_golden::test_x[corruption=inf]"


def test_the_shards_of_a_property_replay_its_saved_failure(tmp_path: Path):
    """The shards of a property test share its database key with the unsharded test, and their
    seeds leave the database in use (Hypothesis leaves it off under a forced seed): after a run
    that found the failure, two shards of one example each fail both."""
    assert "1 failed" in _fuzz_forward(GQA_BUG, 100, tmp_path).stdout
    sharded = _fuzz_forward(GQA_BUG, 2, tmp_path, None, "--shards", "2")
    assert "2 failed" in sharded.stdout, sharded.stdout  # a shard's one example passes unless replayed


def test_shards_draw_different_problems_from_consecutive_seeds(tmp_path: Path):
    """Under the derandomized ci profile too: the shards' seeds override it."""
    kernel, record = tmp_path / "recorder.py", tmp_path / "calls.jsonl"
    kernel.write_text(RECORDER)
    env = {**os.environ, "FLASHPROP_RECORD": str(record)}
    base = 40
    run = _pytest("properties/test_golden.py::test_forward_matches_golden", "--kernel", f"{kernel}:attn",
                  "--hypothesis-profile", "ci", "--shards", "3", "--max-examples", "10",
                  "--hypothesis-seed", str(base), env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    table = run.stdout[run.stdout.index("examples per property"):]
    assert f"{kernel}:attn  forward   10 " in table, table  # 4 + 3 + 3
    calls: dict[int, set[str]] = {}
    for line in record.read_text().splitlines():
        seed, *problem = json.loads(line)
        calls.setdefault(seed, set()).add(json.dumps(problem))
    assert sorted(calls) == [base, base + 1, base + 2]
    assert len(calls[base] | calls[base + 1] | calls[base + 2]) > max(map(len, calls.values()))  # different


class _Config:
    """What campaign.seed_base reads of a pytest config."""

    def __init__(self, seed: str | None = None, workerinput: dict | None = None):
        self.stash, self.option = pytest.Stash(), {"--hypothesis-seed": seed, "--shards": 4}
        if workerinput is not None:
            self.workerinput = workerinput

    def getoption(self, name: str, default=None):
        return self.option.get(name, default)


def test_shard_seeds_and_shares():
    assert campaign.seed_base(_Config(seed="12")) == 12
    assert campaign.seed_base(_Config(workerinput={"flashprop_seed_base": 99})) == 99  # the controller's
    drawn = _Config()
    assert campaign.seed_base(drawn) == campaign.seed_base(drawn)  # random, drawn once per run
    with pytest.raises(pytest.UsageError, match="integer --hypothesis-seed"):
        campaign.seed_base(_Config(seed="abc"))
    for examples in (4, 7, 100):
        shares = [campaign.Shard(i, 4, i).share("forward", examples) for i in range(4)]
        assert sum(shares) == examples and max(shares) - min(shares) <= 1
    with pytest.raises(pytest.skip.Exception, match="went to the shards before it"):
        campaign.Shard(3, 4, 3).share("forward", 2)


class _Node:
    def __init__(self, worker: str, rows: list[dict]):
        self.workerinput, self.workeroutput = {"workerid": worker}, {"flashprop_tallies": rows}


def test_an_interrupted_worker_reported_down_twice_is_merged_once():
    """xdist reports an interrupted worker down twice (finished, then down with an error)."""
    run = RunContext()
    row = {"kernel": "k", "property": "forward", "passed": 5, "refused": 0, "failed": 0, "seconds": 1.0,
           "last_failure": None, "skipped": []}
    node = _Node("gw-interrupted", [row])
    campaign.collect_node(run.campaign, run.tallies, node, None)
    campaign.collect_node(run.campaign, run.tallies, node, "keyboard-interrupt")
    assert run.tallies["k", "forward"].passed == 5 and run.tallies["k", "forward"].failed == 0


@pytest.mark.parametrize("to_group, signum", [(True, signal.SIGINT), (False, signal.SIGTERM)],
                         ids=["sigint-to-the-group", "sigterm-to-the-controller"])
def test_a_stop_signal_winds_the_workers_down(tmp_path: Path, to_group: bool, signum: int):
    """Once both workers run examples, one signal (to the whole process group, as Ctrl-C and
    GNU timeout send it, or to the controller alone): the run ends soon, each property stopped
    at its running example with its examples in the table, and the exit status is pytest's
    for an interrupted run. (Workers ended by KeyboardInterrupt were replaced by xdist and ran
    their tests again from the start.)"""
    (tmp_path / "kernel.py").write_text(AT_WORK)
    marks = tmp_path / "marks"
    marks.mkdir()
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--device", "cpu",
           "properties/test_golden.py", "--kernel", f"{tmp_path / 'kernel.py'}:attn",
           "--hypothesis-profile", "fuzz", "--max-examples", "100000", "-n", "2"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=dict(os.environ, FLASHPROP_MARK=str(marks)),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while len(list(marks.iterdir())) < 2 and time.monotonic() < deadline:  # both workers at work
            time.sleep(0.2)
        if to_group:
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)
        out, _ = proc.communicate(timeout=60)
    finally:
        os.killpg(proc.pid, signal.SIGKILL) if proc.poll() is None else None
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
    assert f"stopped by signal {int(signum)}: each property ended at its running example" in out, out
    table = out[out.index("examples per property"):]
    rows = [line.split() for line in table.splitlines() if line.startswith(f"{tmp_path}")]
    assert {r[1] for r in rows} == {"forward", "backward"}, table
    assert all(r[2].isdigit() and 0 < int(r[2]) < int(r[7]) for r in rows), table  # run, asked
