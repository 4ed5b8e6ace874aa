"""Fuzz campaigns over pytest-xdist workers and a shared Hypothesis example database.

- :func:`example_database`: ``--example-db`` as a Hypothesis database: a directory
  (``DirectoryBasedExampleDatabase``, safe to share between processes on one machine) or a Redis
  server (``RedisExampleDatabase``) that workers on several machines share, so a failure found by
  one is replayed first by the others and by the next run.
- :func:`database_key`: where a property test keeps its examples in any database (those two, or
  the profile's own ``.hypothesis/examples``): one key per kernel spec, declaration
  (:func:`declaration_digest`), test case (:func:`case_of`) and property, the same in every
  process, so a run of one kernel neither replays nor deletes another's examples.
- :func:`configure_worker`: a worker ``gwI`` takes its share of the cores for torch's threads
  (:func:`worker_threads`) and CUDA device ``I mod count`` (of the devices
  ``CUDA_VISIBLE_DEVICES`` leaves visible), and notes its examples and tallies in files the
  controller reads.
- :func:`collect_node`: the controller merges each worker's tallies into the summary table
  (from the worker's output, or from its last saved tally if it died), adds its Triton compile
  statistics to the controller's line (``harness/compile_locks.py``), and reports the example
  a dead worker was running as a failure of that property, with the command that replays it.
- :class:`Shard` (``--shards K``): each property test runs as K shards, shard ``i`` drawing its
  share of the property's examples with Hypothesis seed ``BASE + i`` (:func:`seed_base`), so K
  workers explore K different parts of the space on one property, and runs with disjoint seed
  ranges add up.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import hashlib
import json
import math
import os
import random
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import hypothesis.core
import pytest

from ..contract.capabilities import Capabilities, Limit
from .compile_locks import CompileStats
from .failures import Failure

if TYPE_CHECKING:  # pragma: no cover
    from ..contract.registry import Kernel
    from .report import Tallies

#: The folder, shared by the controller and its workers, where each worker keeps its files.
_FOLDER = "flashprop_campaign_dir"
#: The first shard's seed, chosen by the controller and handed to its workers.
_SEED_BASE = "flashprop_seed_base"
#: The signal that asked the campaign to stop, handed to workers started after it.
_STOP = "flashprop_stop_signal"
_BASE_KEY = pytest.StashKey[int]()


def example_database(spec: str):
    """The Hypothesis example database named by ``--example-db``."""
    from hypothesis.database import DirectoryBasedExampleDatabase

    if spec.startswith(("redis://", "rediss://", "unix://")):
        try:
            import redis
            from hypothesis.extra.redis import RedisExampleDatabase
        except ImportError as err:
            raise ValueError(f"--example-db {spec}: Redis needs the redis package ({err})") from err
        return RedisExampleDatabase(redis.Redis.from_url(spec), key_prefix=b"flashprop:")
    return DirectoryBasedExampleDatabase(spec)


#: The test parameters that do not set the case apart: the kernel is a key of its own, and the
#: shards of one property test share its examples.
_NOT_THE_CASE = frozenset({"kernel", "flashprop_shard"})


def case_of(item: pytest.Item) -> str | None:
    """The case of test ``item`` as ``MODULE::FUNCTION[name=value, ...]``: the last part of its
    module's name (the same in a checkout and in the installed ``flashprop.properties``), its
    function, and its parameters but the kernel and the shard (``None``: not a Python test)."""
    module = getattr(item, "module", None)
    if module is None:
        return None
    params = item.callspec.params if hasattr(item, "callspec") else {}
    case = ", ".join(f"{name}={value}" for name, value in sorted(params.items()) if name not in _NOT_THE_CASE)
    name = getattr(item, "originalname", item.name)
    return f"{module.__name__.rpartition('.')[2]}::{name}" + (f"[{case}]" if case else "")


def _canonical(value: object) -> str:
    """``value`` as text that every process writes alike: a dataclass by its fields, a set with
    its items sorted, a :class:`Limit` by its reason, ``raises`` and ``backward`` (its predicate is
    code, whose repr is an address; the reason names the limit), anything else by its repr."""
    if isinstance(value, Limit):
        return f"Limit({value.reason!r}, raises={value.raises}, backward={value.backward})"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = (f"{f.name}={_canonical(getattr(value, f.name))}" for f in dataclasses.fields(value))
        return f"{type(value).__name__}({', '.join(fields)})"
    if isinstance(value, set | frozenset):
        return "{" + ", ".join(sorted(map(_canonical, value))) + "}"
    if isinstance(value, list | tuple):
        return "(" + ", ".join(map(_canonical, value)) + ")"
    return repr(value)


def declaration_digest(capabilities: Capabilities) -> str:
    """The first 16 hex digits of the SHA-256 of the declaration's canonical text: the same in
    every process (whatever ``PYTHONHASHSEED``), and another when any field or limit changes."""
    return hashlib.sha256(_canonical(capabilities).encode()).hexdigest()[:16]


def database_key(kernel: Kernel, prop: str, case: str | None) -> bytes:
    """The example database key of property ``prop`` in test ``case`` (:func:`case_of`) on
    ``kernel``: its spec, its declaration's digest, the case and the property, as JSON. Hypothesis
    derives its secondary and pareto keys from it by suffixes. A changed declaration draws other
    problems (and refuses others), so its examples start afresh; the shards of one test share
    one key."""
    return json.dumps({"kernel": kernel.name, "declaration": declaration_digest(kernel.capabilities),
                       "test": case, "property": prop}).encode()


def configure_node(campaign: Campaign, node) -> None:
    """Controller side: a folder for the worker's files (one per controller, made once, removed
    at exit) and the shards' seed base, the same for every worker."""
    if campaign.folder is None:
        campaign.folder = tempfile.mkdtemp(prefix="flashprop-workers-")
        atexit.register(shutil.rmtree, campaign.folder, ignore_errors=True)
    node.workerinput[_FOLDER] = campaign.folder
    if campaign.stop_signals:
        node.workerinput[_STOP] = campaign.stop_signals[0]
    if node.config.getoption("--shards") > 1:
        node.workerinput[_SEED_BASE] = seed_base(node.config)


def _files(folder: str, worker: str) -> tuple[Path, Path]:
    return Path(folder) / f"{worker}.tally.json", Path(folder) / f"{worker}.current.json"


def worker_threads(workers: int, cores: int, environ: Mapping[str, str]) -> int | None:
    """The intra-op threads of torch in one of ``workers`` xdist workers sharing ``cores`` cores:
    an even share, at least one; ``None`` when ``OMP_NUM_THREADS`` is set (the caller's choice
    stands).

    Left alone, torch starts a thread per core in every process: 16 workers on 16 cores run 256
    threads that preempt each other in every CPU op (drawing values, the references' loops). On
    an H100 machine of 16 cores (session 47, same tests, same call), sdpa-cudnn's properties ran
    at 0.1-0.3 examples/s per worker so, and at 2.2-11.5 with one thread each."""
    if environ.get("OMP_NUM_THREADS"):
        return None
    return max(1, cores // max(1, workers))


#: Where Linux mounts the cgroup hierarchies.
CGROUP_ROOT = Path("/sys/fs/cgroup")


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def quota_cores(root: Path = CGROUP_ROOT, cgroups: str | None = None) -> int | None:
    """The cores the CPU quota of this process's cgroup allows, rounded up; None without a quota.

    cgroup v2: ``cpu.max`` holds "QUOTA PERIOD" ("max PERIOD": no quota); v1: ``cpu.cfs_quota_us``
    over ``cpu.cfs_period_us`` (-1: no quota). Each is read in the process's own cgroup (from
    ``cgroups``, the text of ``/proc/self/cgroup``), then at the hierarchy's root (a container
    sees its own cgroup there). A container started with ``--cpus 2`` on a 64-core host has
    such a quota while its affinity lists all 64 cores."""
    if cgroups is None:
        cgroups = _read(Path("/proc/self/cgroup"))
    own_v2 = own_v1 = ""
    for line in cgroups.splitlines():
        _, controllers, path = line.split(":", 2)
        if not controllers:
            own_v2 = path.lstrip("/")
        elif "cpu" in controllers.split(","):
            own_v1 = path.lstrip("/")
    for folder in dict.fromkeys([root / own_v2, root]):
        limit = _read(folder / "cpu.max").split()
        if len(limit) == 2:
            return None if limit[0] == "max" else math.ceil(int(limit[0]) / int(limit[1]))
    for folder in dict.fromkeys([root / "cpu" / own_v1, root / "cpu"]):
        quota, period = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
        if quota and period:
            return None if int(quota) < 0 else math.ceil(int(quota) / int(period))
    return None


def usable_cores() -> int:
    """The cores this process may use: its affinity where the OS tells it, capped by its cgroup's
    CPU quota (:func:`quota_cores`)."""
    affinity = getattr(os, "sched_getaffinity", None)
    cores = len(affinity(0)) if affinity else os.cpu_count() or 1
    quota = quota_cores()
    return max(1, min(cores, quota)) if quota else cores


def configure_worker(campaign: Campaign, tallies: Tallies, workerinput: dict, device: str) -> None:
    """Worker side: its share of the cores (:func:`worker_threads`), its CUDA device, and where it
    saves its tally and notes its current example."""
    worker = workerinput.get("workerid", "gw0")
    threads = worker_threads(int(workerinput.get("workercount", 1)), usable_cores(), os.environ)
    import torch  # the worker runs the kernels through it anyway

    if threads is not None:
        torch.set_num_threads(threads)
    if device == "cuda":
        if torch.cuda.is_available():
            torch.cuda.set_device(int(worker.removeprefix("gw") or 0) % torch.cuda.device_count())
    if _STOP in workerinput:  # started after the campaign was asked to stop
        campaign.winding_at = time.monotonic()
        campaign.stop_signals.append(workerinput[_STOP])
    folder = workerinput.get(_FOLDER)
    if folder:
        tally, current = _files(folder, worker)
        tallies.autosave(str(tally))
        tallies.note_current(str(current))


def child_pids(pid: int) -> list[int]:
    """The process ids of ``pid``'s children (Linux ``/proc``; none once it has ended)."""
    try:
        return [int(child) for task in Path(f"/proc/{pid}/task").iterdir()
                for child in (task / "children").read_text().split()]
    except OSError:
        return []


def signal_pids(pids: list[int], signum: int) -> None:
    """Send ``signum`` to each of ``pids``; one that has ended meanwhile is skipped."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


#: How the skip note of a property that a stop signal cut begins (its tally row keeps the note).
STOPPED = "stopped by signal"

#: Seconds after a stop signal during which more signals are the same request: GNU timeout
#: signals the controller and its whole process group, and the controller forwards its own.
GRACE = 10.0


class Campaign:
    """One session's campaign state, owned by its :class:`harness.run_context.RunContext`: the
    signals that asked this process to stop (a lone run, a worker) or its workers to (a
    controller), when this worker began to wind down, the workers' folder and the workers whose
    tallies were merged (a controller), and the running shard (``--shards``).

    :meth:`interrupt` and :meth:`wind_down` are the SIGINT and SIGTERM handlers of a lone run and
    of an xdist worker, :class:`WorkersFirst` a controller's (the plugin installs them)."""

    def __init__(self) -> None:
        self.stop_signals: list[int] = []
        self.winding_at: float | None = None
        self.folder: str | None = None
        #: Workers whose tallies were merged (xdist reports an interrupted worker down twice),
        #: and their Triton compile statistics, summed.
        self.collected: set[str] = set()
        self.workers_compiled = CompileStats()
        self._shards: list[Shard] = []

    def interrupt(self, signum: int, frame) -> NoReturn:
        """SIGINT and SIGTERM handler of a lone run: stop as Ctrl-C does, with the table. The
        request sticks: Python runs a signal handler at its next bytecode, and when that is inside
        a finalizer the garbage collector called (a ``__del__``, a weakref callback), the
        KeyboardInterrupt is printed as ignored and lost, and the run would go on to its last
        example. :meth:`stop_if_asked` raises it again at the next example and the next test."""
        self.stop_signals.append(signum)
        raise KeyboardInterrupt(f"signal {signum}")

    def wind_down(self, signum: int, frame) -> None:
        """SIGINT and SIGTERM handler of an xdist worker. The first signal winds the worker down:
        the running property stops at its next example and the tests left skip
        (:meth:`stop_if_asked`), so the worker ends as usual and hands its tallies over. (A worker
        ended by KeyboardInterrupt is replaced by xdist, and its replacement runs its tests anew: a
        run stopped by a CI timeout would start over.) Signals in the next :data:`GRACE` seconds
        are the same request; a later one interrupts the worker (an example that does not end)."""
        now = time.monotonic()
        if self.winding_at is None:
            self.winding_at = now
            self.stop_signals.append(signum)
        elif now - self.winding_at >= GRACE:
            self.interrupt(signum, frame)

    def stop_if_asked(self, examples: int | None = None) -> None:
        """At an example's start (``examples``: how many its property ran) or a test's: stop when
        a signal asked to. A lone run raises KeyboardInterrupt; a winding-down worker skips, its
        examples kept in the table."""
        if not self.stop_signals:
            return
        if self.winding_at is None:
            raise KeyboardInterrupt(f"signal {self.stop_signals[0]}")
        ran = "" if examples is None else f" after {examples} example{'s' * (examples != 1)} (in the table)"
        pytest.skip(f"{STOPPED} {self.stop_signals[0]}{ran}")

    def stopped_line(self) -> str | None:
        """The summary's line when a signal stopped the run, else ``None``."""
        if not self.stop_signals:
            return None
        return (f"{STOPPED} {self.stop_signals[0]}: each property ended at its running "
                "example; the table holds every example run")

    @contextmanager
    def running(self, config: pytest.Config, index: int) -> Iterator[Shard]:
        """Shard ``index`` is the running test's while the context lasts (:meth:`current_shard`):
        Hypothesis draws from its seed (``hypothesis.core.global_force_seed``, what
        ``--hypothesis-seed`` sets; the property turns ``derandomize`` off, which would override
        it). The example database stays in use (Hypothesis leaves it off under a forced seed, but
        not for a test that carries its key, as ``run_property``'s do: :func:`database_key`), and
        the property's source, from which a derandomized run's examples are drawn, is left as it
        is."""
        shard = Shard(index, config.getoption("--shards"), seed_base(config) + index)
        previous = hypothesis.core.global_force_seed
        self._shards.append(shard)
        hypothesis.core.global_force_seed = shard.seed
        try:
            yield shard
        finally:
            self._shards.remove(shard)
            hypothesis.core.global_force_seed = previous

    def current_shard(self) -> Shard | None:
        """The running test's shard, or ``None`` when the run is not sharded."""
        return self._shards[-1] if self._shards else None


class WorkersFirst:
    """An xdist controller's SIGINT and SIGTERM handler. The first signal goes on to the workers
    alone: each winds down (:meth:`Campaign.wind_down`) and hands its tallies over, and the controller,
    left running, merges them, prints the table and ends with pytest's status for an interrupted
    run (2). A worker xdist starts after it (replacing one that died) winds down at once
    (:func:`configure_node`). Signals in the next :data:`GRACE` seconds are ignored; a later
    one interrupts the workers and the controller. Interrupted together, the controller would stop
    before the workers' tallies reached it."""

    def __init__(self, campaign: Campaign) -> None:
        self.campaign = campaign
        self.forwarded_at: float | None = None

    def __call__(self, signum: int, frame) -> None:
        if self.forwarded_at is None:
            workers = child_pids(os.getpid())
            if workers:
                self.forwarded_at = time.monotonic()
                self.campaign.stop_signals.append(signum)  # workers xdist starts from now on wind down
                signal_pids(workers, signal.SIGINT)
                return
        elif time.monotonic() - self.forwarded_at < GRACE:
            return
        signal_pids(child_pids(os.getpid()), signal.SIGINT)  # their second: workers stuck in an example
        self.campaign.interrupt(signum, frame)


def end_worker(tallies: Tallies, cause: str) -> NoReturn:
    """Worker side, its CUDA context broken (``cause``): save the tallies, note the cause with
    the current example and exit, so that xdist starts a fresh worker for the tests left and
    the controller reports this example once (:func:`collect_node`)."""
    tallies.save_now()
    tallies.note_cause(cause)
    os._exit(3)


def collect_node(campaign: Campaign, tallies: Tallies, node, error) -> None:
    """Controller side: merge the worker's tallies; a dead worker's last example is a failure."""
    worker = node.workerinput.get("workerid", "?")
    if worker in campaign.collected:  # an interrupted worker: finished (merged then), and down again
        return
    campaign.collected.add(worker)
    folder = node.workerinput.get(_FOLDER)
    found = getattr(node, "workeroutput", {}).get("flashprop_tallies")
    tally, current = _files(folder, worker) if folder else (None, None)
    if found is None and tally is not None and tally.exists():
        found = json.loads(tally.read_text())
    tallies.merge_rows(found or [])
    compiled = getattr(node, "workeroutput", {}).get("flashprop_compile", {})
    campaign.workers_compiled += CompileStats(**compiled)
    if error is not None and current is not None and current.exists():
        last = json.loads(current.read_text())
        why = str(error).strip().splitlines()[-1] if error else ""
        died = f"the worker {worker} running it died ({why}); xdist replaced it and the campaign went on"
        raised = last.get("cause")
        found = Failure(last["kernel"], last["property"], last["problem"], (died,) if raised else (),
                        error=raised or died, replay=last["replay"])
        tallies.record(last["kernel"], last["property"], "failed", 0.0, found)
    for path in (tally, current):
        if path is not None and path.exists():
            os.unlink(path)


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count`` of one property test (``--shards``): it runs
    ``examples // count`` of the property's examples, one more for the first ``examples % count``
    shards (so the shares add up to the property's examples), drawn from Hypothesis seed
    ``seed``."""

    index: int
    count: int
    seed: int

    def __str__(self) -> str:
        return f"shard {self.index} of {self.count} (seed {self.seed})"

    def share(self, prop: str, examples: int) -> int:
        """This shard's part of ``prop``'s ``examples``; a shard left without any is skipped."""
        mine = examples // self.count + (self.index < examples % self.count)
        if not mine:
            pytest.skip(f"{self}: {prop}'s {examples} examples all went to the shards before it")
        return mine


def seed_base(config: pytest.Config) -> int:
    """The seed of shard 0 (shard ``i`` draws from ``base + i``): ``--hypothesis-seed`` (an
    integer), else the controller's (a worker's ``workerinput``), else a random one, drawn once
    per run and shown in the header."""
    if _BASE_KEY not in config.stash:
        given = config.getoption("--hypothesis-seed", None)
        worker = getattr(config, "workerinput", {})
        if given is not None:
            try:
                config.stash[_BASE_KEY] = int(given)
            except ValueError as err:
                raise pytest.UsageError(f"--shards needs an integer --hypothesis-seed: {given!r}") from err
        elif _SEED_BASE in worker:
            config.stash[_BASE_KEY] = worker[_SEED_BASE]
        else:
            config.stash[_BASE_KEY] = random.SystemRandom().randrange(2**32)
    return config.stash[_BASE_KEY]


def header(config: pytest.Config) -> str | None:
    """The run's header line about its shards (``None`` without ``--shards``)."""
    count = config.getoption("--shards")
    if count <= 1:
        return None
    base = seed_base(config)
    return (f"flashprop: {count} shards per property test, Hypothesis seeds {base}..{base + count - 1} "
            f"(--hypothesis-seed {base} draws them again)")
