"""flashprop's pytest plugin: which kernels, which device, which Hypothesis profile.

Options:
    --kernel NAME|module:attr|path.py:attr   kernel under test (repeatable; default: triton)
    --device cpu|cuda                         where tensors live (default: cuda if available)
    --max-examples N                          override the profile's examples per property
    --max-n N                                 largest sequence length drawn
    --tally-json PATH                         write the per-property tallies as JSON too, also
                                              during the run (merged by ``python -m
                                              properties.report``)
    --replay PROPERTY:Problem(...)            run one property on one problem (failures print it)
    --known-failures PATH                     tests expected to fail, with reasons
                                              (``properties/known_failures.py``)
    --example-db DIR|redis://HOST:PORT/N      Hypothesis example database shared by every
                                              worker and run (a directory, or Redis)
    --time 10m                                time box: spread over the properties still to
                                              run, each stops when its share is spent
                                              (``properties/timebox.py``); the fuzz profile
                                              on the CPU with the default kernel is boxed at
                                              DEFAULT_CPU_BOX unless --time or --max-examples

Long runs print a progress line now and then; SIGTERM (a CI timeout) stops the run like SIGINT,
with the table.

Parallel runs (pytest-xdist, ``-n N``): worker i takes CUDA device i mod the visible count; the
workers' tallies are merged into the one summary table; a worker that dies (segfault, lost CUDA
context) is replaced by xdist and the example it was running is reported as that property's
failure, with its replay command.
Profiles (``--hypothesis-profile``): ``ci`` (bounded, derandomized, no deadline, no database),
``dev`` (the default), ``fuzz`` (many examples, example database on) and ``gpu``.

Tests that take a ``kernel`` argument run once per ``--kernel``; a kernel that cannot run here,
or that does not declare the device, is skipped with the reason.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, settings

_SLOW_OK = [
    HealthCheck.too_slow,
    HealthCheck.data_too_large,
    HealthCheck.filter_too_much,
    HealthCheck.function_scoped_fixture,
]
#: What every profile shares: no deadline (kernels compile on first call), slow examples allowed.
_BASE = settings(deadline=None, suppress_health_check=_SLOW_OK, print_blob=True)
settings.register_profile("ci", _BASE, max_examples=20, derandomize=True, database=None)
settings.register_profile("dev", _BASE, max_examples=30)
settings.register_profile("fuzz", _BASE, max_examples=500, phases=list(Phase))
settings.register_profile("gpu", _BASE, max_examples=100, derandomize=True, database=None)
settings.load_profile(os.environ.get("FLASHPROP_PROFILE", "dev"))
#: The time box of the fuzz profile's main job on the CPU with the default kernel (the Triton
#: interpreter): a first table within minutes; --time or --max-examples go deeper.
DEFAULT_CPU_BOX = 240.0
#: The --known-failures entries, and those that matched no collected test.
_KNOWN = pytest.StashKey[list]()
_UNMATCHED = pytest.StashKey[list]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("flashprop")
    group.addoption("--kernel", action="append", default=[], help="kernel under test (repeatable)")
    group.addoption("--device", default=None, choices=("cpu", "cuda"), help="tensor device")
    group.addoption(
        "--max-examples",
        type=int,
        default=None,
        help="examples per property, times the property's weight: forward 1, backward 3/4, most others "
        "1/2, malformed inputs 1/4, long sequences less (the table shows what each ran)",
    )
    group.addoption("--max-n", type=int, default=None, help="largest sequence length drawn")
    group.addoption(
        "--tally-json", default=None, help="also write the per-property tallies to this JSON file"
    )
    group.addoption(
        "--replay",
        default=None,
        metavar="PROPERTY:Problem(...)",
        help="run only PROPERTY, on only this problem (as a failure report prints it)",
    )
    group.addoption(
        "--example-db",
        default=None,
        metavar="DIR|redis://HOST:PORT/N",
        help="Hypothesis example database: a directory, or a Redis URL (needs the redis package); "
        "failures found by any worker or run are replayed first by the others",
    )
    group.addoption(
        "--time",
        default=None,
        metavar="DURATION",
        help="time box for the whole run (600, 90s, 10m, 1h): each property gets its share",
    )
    group.addoption(
        "--known-failures",
        default=None,
        metavar="PATH",
        help="a file of tests expected to fail, one node id and ' # reason' per line: they run "
        "as strict xfails",
    )


def _device(config: pytest.Config) -> str:
    dev = config.getoption("--device")
    if dev is None:
        import torch

        dev = "cuda" if torch.cuda.is_available() else "cpu"
    return dev


@pytest.hookimpl(trylast=True)  # after Hypothesis's plugin has loaded --hypothesis-profile
def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)  # a CI timeout ends the run as Ctrl-C does: with the table
    config.addinivalue_line("markers", "meta: tests of flashprop's own helpers (kernel-independent)")
    config.addinivalue_line("markers", "slow: expensive properties")
    if _device(config) == "cpu":
        # Triton kernels run on CPU tensors only under the interpreter; set before triton loads.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    else:
        from flashprop.properties.compile_locks import install_from_environment

        install_from_environment()
    replay = config.getoption("--replay")
    if replay:
        import flashprop.properties.check
        from flashprop.properties.problem import Problem

        prop, _, text = replay.partition(":")
        flashprop.properties.check.REPLAY = (prop, Problem.parse(text))
    if config.getoption("--tally-json"):
        from flashprop.properties.report import autosave

        autosave(config.getoption("--tally-json"))
    known = config.getoption("--known-failures")
    if known:
        from flashprop.properties.known_failures import parse

        try:
            config.stash[_KNOWN] = parse(Path(known))
        except (OSError, ValueError) as err:
            raise pytest.UsageError(f"--known-failures: {err}") from err
    overrides = {}
    n = config.getoption("--max-examples")
    if n is not None:
        overrides["max_examples"] = n
    if config.getoption("--example-db"):
        from flashprop.properties.campaign import example_database

        overrides["database"] = example_database(config.getoption("--example-db"))
    if overrides:  # applied by each property on top of the profile Hypothesis loaded
        import flashprop.properties.check

        flashprop.properties.check.OVERRIDES.update(overrides)
    worker = getattr(config, "workerinput", None)
    if worker is not None:
        from flashprop.properties.campaign import configure_worker

        configure_worker(worker, _device(config))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """xdist controller: tell each worker where to note its examples and tallies."""
    from flashprop.properties.campaign import configure_node

    configure_node(node)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """xdist controller: merge a worker's tallies; report the example a dead worker was running."""
    from flashprop.properties.campaign import collect_node

    collect_node(node, error)


def pytest_sessionfinish(session: pytest.Session) -> None:
    worker_output = getattr(session.config, "workeroutput", None)
    if worker_output is not None:
        from flashprop.properties.report import rows

        worker_output["flashprop_tallies"] = rows()


def _time_box(config: pytest.Config) -> float | None:
    """Seconds of the run's time box: ``--time``, or DEFAULT_CPU_BOX for the fuzz profile's
    main job on the CPU with the default kernel (no --kernel, no --max-examples)."""
    from flashprop.properties.timebox import parse_duration

    if config.getoption("--time"):
        try:
            return parse_duration(config.getoption("--time"))
        except ValueError as err:
            raise pytest.UsageError(f"--time: {err}") from err
    default_main_job = (
        config.getoption("--hypothesis-profile", None) == "fuzz"
        and _device(config) == "cpu"
        and not config.getoption("--kernel")
        and config.getoption("--max-examples") is None
    )
    return DEFAULT_CPU_BOX if default_main_job else None


def pytest_collection_finish(session: pytest.Session) -> None:
    from flashprop.properties import timebox

    config = session.config
    seconds = _time_box(config)
    if seconds is not None and getattr(config, "workerinput", None) is None:
        properties = [i for i in session.items if "kernel" in getattr(i, "fixturenames", ())]
        timebox.start(seconds, len(properties))
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and getattr(config, "workerinput", None) is None:
        timebox.follow(reporter.write_line, reporter.isatty)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _KNOWN in config.stash:
        from flashprop.properties.known_failures import mark

        config.stash[_UNMATCHED] = mark(items, config.stash[_KNOWN])


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "kernel" in metafunc.fixturenames:
        from flashprop.kernels.registry import default_kernel

        specs = metafunc.config.getoption("--kernel") or [default_kernel(_device(metafunc.config))]
        metafunc.parametrize("kernel", specs, indirect=True, scope="session")


_LOADED: dict[str, object] = {}


@pytest.fixture(scope="session")
def device(request: pytest.FixtureRequest) -> str:
    return _device(request.config)


@pytest.fixture(scope="session")
def kernel(request: pytest.FixtureRequest, device: str):
    from flashprop.kernels.registry import KernelUnavailable, load_kernel, observe_outputs

    spec = request.param
    if spec not in _LOADED:
        try:
            _LOADED[spec] = load_kernel(spec)
        except KernelUnavailable as err:
            _LOADED[spec] = str(err)
    loaded = _LOADED[spec]
    if isinstance(loaded, str):
        pytest.skip(f"unavailable: {loaded}")
    if device not in loaded.capabilities.devices:
        pytest.skip(
            f"kernel {spec} does not declare device {device} (declares {sorted(loaded.capabilities.devices)})"
        )
    return observe_outputs(loaded, device)


@pytest.fixture(scope="session")
def sizes(request: pytest.FixtureRequest, device: str):
    """Size bounds: small under the Triton interpreter / on CPU, larger on a GPU."""
    from flashprop.properties.strategies import device_sizes

    return device_sizes(device, request.config.getoption("--max-n"))


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    from flashprop.properties.report import TALLIES, dump, summary_lines

    if config.getoption("--tally-json"):
        dump(config.getoption("--tally-json"))
    from flashprop.properties import compile_locks

    if compile_locks.installed():
        terminalreporter.write_line(f"flashprop: {compile_locks.STATS.line()}")
    for entry in config.stash.get(_UNMATCHED, []):
        terminalreporter.write_line(
            f"flashprop: known failure {entry.node_id} ({entry.where}) matched no collected test"
        )
    lines = summary_lines()
    if not lines:
        return
    terminalreporter.section("flashprop: examples per property")
    for line in lines:
        terminalreporter.write_line(line)
    from flashprop.properties import timebox

    if timebox.summary():
        terminalreporter.write_line(f"flashprop: {timebox.summary()}")
    failed = [(k, t) for k, t in sorted(TALLIES.items()) if t.last_failure]
    if failed:
        terminalreporter.section("flashprop: failures (shrunk problem and repro)")
        for (kern, prop), t in failed:
            terminalreporter.write_line(f"--- {kern} / {prop}")
            for line in t.last_failure.splitlines():
                terminalreporter.write_line(line)
