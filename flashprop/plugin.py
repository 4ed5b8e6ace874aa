"""flashprop's pytest plugin: which kernels, which device, which Hypothesis profile.

Options:
    --kernel NAME|module:attr|path.py:attr   kernel under test (repeatable; default: triton)
    --device cpu|cuda                         where tensors live (default: cuda if available)
    --max-examples N                          examples per property, times its weight (the
                                              table's ``asked`` column: what each was given)
    --max-n N                                 largest sequence length drawn
    --tally-json PATH                         write the per-property tallies as JSON too, also
                                              during the run (merged by ``python -m
                                              harness.report``)
    --replay PROPERTY:Problem(...)            run one property on one problem (failures print it)
    --known-failures PATH                     tests expected to fail, with reasons
                                              (``harness/known_failures.py``)
    --example-db DIR|redis://HOST:PORT/N      Hypothesis example database shared by every
                                              worker and run (a directory, or Redis)
    --shards K                                each property test as K shards of its examples,
                                              each from its own seed (``harness/campaign.py``)
    --time 10m                                time box: spread over the properties that draw
                                              examples, each stops when its share is spent
                                              (``harness/timebox.py``); the fuzz profile
                                              on the CPU with the default kernel is boxed at
                                              DEFAULT_CPU_BOX unless --time or --max-examples
    --skip-property NAME                      leave property NAME out (repeatable): it skips
                                              before drawing, and a time box gives it no share;
                                              a NAME that left nothing out says so at the end
    --shrink-seconds S                        longest a property shrinks a failure (default 60;
                                              ``harness.timebox.Shrinking``)
    --tracebacks-file PATH                    the failed tests' full tracebacks go there, not
                                              to the terminal (``flashprop fuzz`` does this)
    --all-skips                               list each test skipped before drawing with its
                                              reason (default: one line per kernel and reason)

Long runs print a progress line now and then; SIGTERM (a CI timeout) stops the run like SIGINT,
with the table. The summary comes last, after pytest's own: the table (with each property's
examples asked, and why a test drew none: its skip reason), then each failure's cause once with
the properties it took down (``harness/causes.py``); with ``$GITHUB_STEP_SUMMARY`` set, the same
is appended there as markdown.

JUnit XML (``--junitxml``): each kernel test is a testcase, whose properties are the examples of
the property it ran (``kernel``, ``property``, ``examples``, ``passed``, ``refused``, ``failed``,
``asked``; ``time_box`` when its share of the time box was spent: it passed with the examples it
ran); a failed property's failure text is flashprop's report (the shrunk problem, its repro, its
replay command), not pytest's traceback, which the terminal and the tracebacks file keep.

Parallel runs (pytest-xdist, ``-n N``): worker i takes CUDA device i mod the visible count, and
its torch an even share of the cores (``OMP_NUM_THREADS``, when set, stands instead); the
workers' tallies are merged into the one summary table; a worker that dies (segfault, lost CUDA
context) is replaced by xdist and the example it was running is reported as that property's
failure, with its replay command. ``--shards K`` splits each property test into K tests with
distinct Hypothesis seeds and K shares of its examples, so that many workers fuzz one property
(``harness/campaign.py``).
Profiles (``--hypothesis-profile``): ``ci`` (bounded, derandomized, no deadline, no database),
``dev`` (the default), ``fuzz`` (many examples, example database on) and ``gpu``.

Tests that take a ``kernel`` argument run once per ``--kernel``; a kernel that cannot run here,
or that does not declare the device, is skipped with the reason.

The options reach the harness in one object: :func:`run_context` builds the session's
``harness.run_context.RunContext`` from them in ``pytest_configure`` and keeps it in
``config.stash[RUN]``; the ``run`` fixture hands it to the property tests, which pass it to
``harness.check.run_property``; this plugin's hooks read it from the stash.
"""

from __future__ import annotations

import argparse
import inspect
import os
import signal
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, Phase, settings

from flashprop.harness.run_context import RUN, Replay, RunContext

_SLOW_OK = [
    HealthCheck.too_slow,
    HealthCheck.data_too_large,
    HealthCheck.filter_too_much,
    HealthCheck.function_scoped_fixture,
]
#: What every profile shares: no deadline (kernels compile on first call), slow examples allowed.
#: Its parent is Hypothesis's ``default`` profile, not ``settings.default``: where a ``CI``
#: variable is set (GitHub Actions, GitLab, tox passing it on), Hypothesis makes its own ``ci``
#: profile the default, derandomized and without a database, and every profile here would
#: inherit that: ``flashprop fuzz`` in a user's CI would draw the same problems every run and save
#: no failure.
_BASE = settings(settings.get_profile("default"), deadline=None, suppress_health_check=_SLOW_OK,
                 print_blob=True)
settings.register_profile("ci", _BASE, max_examples=20, derandomize=True, database=None)
settings.register_profile("dev", _BASE, max_examples=30)
settings.register_profile("fuzz", _BASE, max_examples=500, phases=list(Phase))
settings.register_profile("gpu", _BASE, max_examples=100, derandomize=True, database=None)
settings.load_profile(os.environ.get("FLASHPROP_PROFILE", "dev"))
#: The time box of the fuzz profile's main job on the CPU with the default kernel (the Triton
#: interpreter): a first table within minutes; --time or --max-examples go deeper.
DEFAULT_CPU_BOX = 240.0
#: What --max-examples does (the plugin's and ``flashprop fuzz``'s help): the weights are those
#: the property tests pass to ``harness.check.run_property``.
MAX_EXAMPLES_HELP = (
    "examples per property, times the property's weight: forward and variant forward 1, backward "
    "and variant backward 3/4, most others 1/2, malformed inputs and gradgradcheck 1/4, long "
    "sequences 1/20 (200: forward 200, most 100, long-sequences 10; default: the Hypothesis "
    "profile's number); the table's 'asked' column shows what each property was given"
)
#: The --known-failures entries, and those that matched no collected test.
_KNOWN = pytest.StashKey[list]()
_UNMATCHED = pytest.StashKey[list]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("flashprop")
    group.addoption("--kernel", action="append", default=[],
                    help="kernel under test (repeatable); +cpu, +gpu, +gpu-fuzz, +gpu-bench: a run's kernels")
    group.addoption("--device", default=None, choices=("cpu", "cuda"), help="tensor device")
    group.addoption("--max-examples", type=example_count, default=None, help=MAX_EXAMPLES_HELP)
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
        "--shrink-seconds",
        type=float,
        default=None,
        metavar="S",
        help="longest a property shrinks its failure, from the failure found (default 60; in a time "
        "box, until its share ends and at least 10 s); the report says when shrinking was cut short",
    )
    group.addoption(
        "--tracebacks-file",
        default=None,
        metavar="PATH",
        help="write the full tracebacks of failed tests to PATH instead of the terminal (which "
        "then ends with the table and the failures by cause); a run without failures removes it",
    )
    group.addoption(
        "--all-skips",
        action="store_true",
        help="list each test skipped before drawing with its reason (default: one line per kernel "
        "and reason)",
    )
    group.addoption(
        "--known-failures",
        default=None,
        metavar="PATH",
        help="a file of tests expected to fail, one node id and ' # reason' per line: they run "
        "as strict xfails",
    )
    group.addoption(
        "--skip-property",
        action="append",
        default=[],
        metavar="NAME",
        help="leave out property NAME (as the table's property column names it; repeatable): its "
        "tests skip at the property's start, before drawing, and a time box gives them no share. "
        "A campaign over several runs leaves out the properties that reached their count "
        "(ci/gpu_check.py's fuzz phase with a state folder)",
    )
    group.addoption(
        "--shards",
        type=_shard_count,
        default=1,
        metavar="K",
        help="run each property test as K shards, shard i drawing its share of the examples with "
        "Hypothesis seed BASE + i (BASE: --hypothesis-seed, else random and shown in the header): "
        "with -n, K workers fuzz one property in K different parts of the space",
    )


def example_count(text: str) -> int:
    """``--max-examples``'s value: a whole number of examples, at least 1."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"a whole number >= 1, not {text!r}")
    return int(text)


def _shard_count(text: str) -> int:
    """``--shards``'s value: a whole number of shards, at least 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"--shards takes a whole number >= 1, not {text!r}")
    return int(text)


def prepare_device(option: str | None) -> str:
    """The tensor device of ``--device`` (default: cuda if available). On the CPU, Triton kernels
    run under the interpreter, which is chosen before triton is imported."""
    dev = option
    if dev is None:
        import torch

        dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    return dev


def _device(config: pytest.Config) -> str:
    return prepare_device(config.getoption("--device"))


def _fix_triton_interpreter() -> None:
    """Under ``TRITON_INTERPRET=1`` every interpreted kernel of the run, a kernel author's own
    included, gets the interpreter's fixes (``contract/triton_interpreter.py``): numpy >= 2.4's
    scalar conversion, and room on CPython's frame stack for each launch, which about halves
    the time of a kernel's interpreted calls under pytest. Nothing to do without Triton."""
    try:
        from flashprop.contract.triton_interpreter import apply_interpreter_fixes

        apply_interpreter_fixes()
    except ImportError:
        pass


@pytest.hookimpl(trylast=True)  # after Hypothesis's plugin has loaded --hypothesis-profile
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "meta: tests of flashprop's own helpers (kernel-independent)")
    config.addinivalue_line("markers", "slow: expensive properties")
    if _device(config) == "cuda":
        from flashprop.harness.compile_locks import install_from_environment

        install_from_environment()
    _fix_triton_interpreter()
    _check_kernel_specs(config)
    run = config.stash[RUN] = run_context(config)
    if threading.current_thread() is threading.main_thread():
        # a CI timeout ends the run as Ctrl-C does: with the table; an xdist controller passes
        # the first interrupt on to its workers, which wind down and hand their tallies over
        from flashprop.harness.campaign import WorkersFirst

        if getattr(config, "workerinput", None) is not None:
            handler = run.campaign.wind_down
        elif config.getoption("numprocesses", None):
            handler = WorkersFirst(run.campaign)
        else:
            handler = run.campaign.interrupt
        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGTERM, handler)
    if run.tally_json:
        run.tallies.autosave(run.tally_json)
    known = config.getoption("--known-failures")
    if known:
        from flashprop.harness.known_failures import parse

        try:
            config.stash[_KNOWN] = parse(Path(known))
        except (OSError, ValueError) as err:
            raise pytest.UsageError(f"--known-failures: {err}") from err
    worker = getattr(config, "workerinput", None)
    if worker is not None:
        from flashprop.harness.campaign import configure_worker

        configure_worker(run.campaign, run.tallies, worker, run.device)
    elif getattr(config.option, "xmlpath", None):  # pytest writes JUnit XML here (not on a worker)
        config.pluginmanager.register(JUnitReports(), "flashprop-junit")


def run_context(config: pytest.Config) -> RunContext:
    """The session's run context from the command line (its kernel sets already expanded): the
    options the harness reads (``--max-examples``, ``--example-db``, ``--replay``,
    ``--shrink-seconds``, ``--kernel``, ``--device``, ``--tally-json``, ``--all-skips``,
    ``--skip-property``) and a
    fresh time box, tallies and campaign state."""
    from flashprop.harness.campaign import example_database
    from flashprop.harness.timebox import SHRINK_SECONDS

    replay, database = config.getoption("--replay"), config.getoption("--example-db")
    shrink = config.getoption("--shrink-seconds")
    optional = {}
    if replay:
        from flashprop.contract.problem import Problem

        prop, _, text = replay.partition(":")
        optional["replay"] = Replay(prop, Problem.parse(text))
    if database:
        optional["database"] = example_database(database)
    return RunContext(max_examples=config.getoption("--max-examples"),
                      shrink_seconds=SHRINK_SECONDS if shrink is None else shrink,
                      kernels=tuple(config.getoption("--kernel")), device=_device(config),
                      tally_json=config.getoption("--tally-json"), all_skips=config.getoption("--all-skips"),
                      skip_properties=frozenset(config.getoption("--skip-property")), **optional)


def _check_kernel_specs(config: pytest.Config) -> None:
    """``--kernel +NAME`` is the kernels of a run (``contract.registry.KERNEL_SETS``); a
    ``--kernel`` that names no kernel (no such file, module or attribute, or set) is a usage
    error, said before any test runs; a kernel that exists but cannot run here is skipped, with
    why."""
    from flashprop.contract.registry import KernelSpecError, expand_specs, spec_problem

    try:
        config.option.kernel = expand_specs(config.getoption("--kernel"))
    except KernelSpecError as err:
        raise pytest.UsageError(str(err)) from None
    problem = spec_problem(config.getoption("--kernel"))
    if problem:
        raise pytest.UsageError(problem)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """xdist controller: tell each worker where to note its examples and tallies."""
    from flashprop.harness.campaign import configure_node

    configure_node(node.config.stash[RUN].campaign, node)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """xdist controller: merge a worker's tallies; report the example a dead worker was running."""
    from flashprop.harness.campaign import collect_node

    run = node.config.stash[RUN]
    collect_node(run.campaign, run.tallies, node, error)


def pytest_sessionfinish(session: pytest.Session) -> None:
    run = session.config.stash[RUN]
    worker_output = getattr(session.config, "workeroutput", None)
    if worker_output is None and run.campaign.stop_signals:  # a controller whose workers wound down
        session.exitstatus = pytest.ExitCode.INTERRUPTED
    if worker_output is not None:
        from flashprop.harness import compile_locks

        worker_output["flashprop_tallies"] = run.tallies.rows()
        worker_output["flashprop_compile"] = vars(compile_locks.stats())  # summed by the controller


def _time_box(config: pytest.Config) -> float | None:
    """Seconds of the run's time box: ``--time``, or DEFAULT_CPU_BOX for the fuzz profile's
    main job on the CPU with the default kernel (no --kernel, no --max-examples)."""
    from flashprop.harness.timebox import parse_duration

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


def _draws(item: pytest.Item, config: pytest.Config) -> bool:
    """Whether a kernel test will draw examples, and so take a share of the time box: its body
    runs now, with the arguments it will get, up to its property (``TimeBox.draws``)."""
    from flashprop.harness.strategies import device_sizes

    params = dict(item.callspec.params) if hasattr(item, "callspec") else {}
    if "kernel" not in params or item.get_closest_marker("skip") is not None:
        return False
    run = config.stash[RUN]
    device = run.device
    try:
        loaded = _kernel_for(run, params["kernel"], device)
    except Exception:  # the kernel fixture raises it again, and the run reports it
        return True
    if isinstance(loaded, str):
        return False
    values = {**params, "run": run, "kernel": loaded, "device": device,
              "sizes": device_sizes(device, config.getoption("--max-n"))}
    names = list(inspect.signature(item.obj).parameters)
    if not set(names) <= set(values):
        return True  # it takes other fixtures: count it
    return run.time_box.draws(lambda: item.obj(**{name: values[name] for name in names}))


def pytest_collection_finish(session: pytest.Session) -> None:
    config = session.config
    box = config.stash[RUN].time_box
    seconds = _time_box(config)
    if seconds is not None:  # under xdist each worker boxes its part (the controller collects nothing)
        properties = [i for i in session.items if "kernel" in getattr(i, "fixturenames", ())]
        drawing = sum(_draws(item, config) for item in properties)
        worker = hasattr(config, "workerinput")
        workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) if worker else 1
        box.start(seconds, drawing, idle=len(properties) - drawing, processes=workers)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and getattr(config, "workerinput", None) is None:
        box.follow(reporter.write_line, reporter.isatty)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _KNOWN in config.stash:
        from flashprop.harness.known_failures import mark

        config.stash[_UNMATCHED] = mark(items, config.stash[_KNOWN])


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "kernel" in metafunc.fixturenames:
        from flashprop.contract.registry import default_kernel

        run = metafunc.config.stash[RUN]
        specs = list(run.kernels) or [default_kernel(run.device)]
        metafunc.parametrize("kernel", specs, indirect=True, scope="session")
        shards = metafunc.config.getoption("--shards")
        if shards > 1:
            metafunc.parametrize("flashprop_shard", range(shards), indirect=True, ids=lambda i: f"shard{i}")


@pytest.fixture(autouse=True)
def flashprop_shard(request: pytest.FixtureRequest):
    """``--shards``: the shard this property test runs (its seed and its share of the examples,
    ``harness.campaign.Shard``); ``None`` for an unsharded test."""
    if not hasattr(request, "param"):
        yield None
        return
    with request.config.stash[RUN].campaign.running(request.config, request.param) as shard:
        yield shard


def pytest_report_header(config: pytest.Config) -> str | None:
    from flashprop.harness.campaign import header

    return header(config)


def _kernel_for(run: RunContext, spec: str, device: str):
    """The kernel ``spec`` as the tests on ``device`` get it, or why they are skipped (cached in
    the run context, ``RunContext.loaded``)."""
    from flashprop.contract.registry import KernelUnavailable, load_kernel, observe_outputs

    cache = run.loaded
    if (spec, device) not in cache:
        try:
            loaded = load_kernel(spec)
        except KernelUnavailable as err:
            cache[spec, device] = f"unavailable: {err}"
        else:
            declared = loaded.capabilities.devices
            cache[spec, device] = (
                observe_outputs(loaded, device) if device in declared
                else f"kernel {spec} does not declare device {device} (declares {sorted(declared)})"
            )
    return cache[spec, device]


@pytest.fixture(scope="session")
def run(request: pytest.FixtureRequest) -> RunContext:
    """The session's run context (:func:`run_context`), which the property tests pass to
    ``harness.check.run_property``."""
    return request.config.stash[RUN]


@pytest.fixture(scope="session")
def device(request: pytest.FixtureRequest) -> str:
    return request.config.stash[RUN].device


@pytest.fixture(scope="session")
def kernel(request: pytest.FixtureRequest, run: RunContext, device: str):
    loaded = _kernel_for(run, request.param, device)
    if isinstance(loaded, str):
        pytest.skip(loaded)
    return loaded


@pytest.fixture(scope="session")
def sizes(request: pytest.FixtureRequest, device: str):
    """Size bounds: small under the Triton interpreter / on CPU, larger on a GPU."""
    from flashprop.harness.strategies import device_sizes

    return device_sizes(device, request.config.getoption("--max-n"))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A signal that asked the run to stop, and whose KeyboardInterrupt was lost, stops it here;
    the test's case is noted for its example database key and its failures' place in the tallies
    (``harness.campaign.case_of``)."""
    from flashprop.harness.campaign import case_of

    run = item.config.stash[RUN]
    run.campaign.stop_if_asked()
    run.running.case = case_of(item)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A kernel test's skip reason goes into the tallies, on its row of the table; after its
    call, its examples go into its JUnit properties (:func:`_note_examples`)."""
    report = yield
    params = item.callspec.params if hasattr(item, "callspec") else {}
    if "kernel" in params:
        run = item.config.stash[RUN]
        tallies = run.tallies
        if call.when == "setup":
            tallies.start_item(run.running.case)
        if report.skipped and not hasattr(report, "wasxfail") and isinstance(report.longrepr, tuple):
            tallies.note_skip(params["kernel"], _label(item), report.longrepr[2].removeprefix("Skipped: "))
        if call.when == "call":
            _note_examples(item, call, report, params["kernel"])
    return report


def _note_examples(item: pytest.Item, call: pytest.CallInfo, report: pytest.TestReport, kernel: str) -> None:
    """The examples of the property the test ran, as its JUnit properties (pytest's JUnit XML
    reads them from the teardown report, made after this); a failed property's flashprop report
    on the report, as ``flashprop_failure`` (it travels from an xdist worker with the report; see
    :class:`JUnitReports`)."""
    from flashprop.harness.check import PropertyFailure

    prop, own = item.config.stash[RUN].tallies.running_item()
    if prop is None:
        return
    item.user_properties += [("kernel", kernel), ("property", prop), ("examples", own.run),
                             ("passed", own.passed), ("refused", own.refused), ("failed", own.failed),
                             ("asked", own.asked)]
    if own.cut:
        item.user_properties.append(("time_box", f"its share was spent after {own.run} examples, all passed"))
    if report.failed:
        error = call.excinfo.value if call.excinfo else None
        found = [e for e in getattr(error, "exceptions", [error]) if isinstance(e, PropertyFailure)]
        text = "\n\n".join(map(str, found)) or (own.last_failure and own.last_failure.render())
        if text:
            report.flashprop_failure = text


class JUnitReports:
    """Where pytest writes JUnit XML (``--junitxml``: the main process, not an xdist worker): a
    failed property test's testcase carries flashprop's report (the shrunk problem, its repro,
    its replay command) instead of pytest's traceback, which the terminal and the tracebacks file
    keep (:class:`PropertyReport`)."""

    @pytest.hookimpl(tryfirst=True)  # before pytest's junitxml plugin reads the report
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        text = getattr(report, "flashprop_failure", None)
        if text and report.failed and not isinstance(report.longrepr, PropertyReport):
            report.longrepr = PropertyReport(report.longrepr, text)


class PropertyReport:
    """A failed property test's ``longrepr`` as :class:`JUnitReports` sets it: as a string (what
    JUnit XML writes) flashprop's report, and its first line as ``reprcrash.message`` (JUnit's
    message, pytest's FAILED line); on the terminal (``toterminal``: ``--tb``, the tracebacks
    file) pytest's own report."""

    def __init__(self, pytest_repr: object, text: str) -> None:
        self.pytest_repr, self.text = pytest_repr, text
        crash = getattr(pytest_repr, "reprcrash", None)
        self.reprcrash = SimpleNamespace(path=getattr(crash, "path", ""), lineno=getattr(crash, "lineno", 0),
                                         message=text.splitlines()[0])

    def toterminal(self, tw) -> None:
        if hasattr(self.pytest_repr, "toterminal"):
            self.pytest_repr.toterminal(tw)
        else:
            tw.line(str(self.pytest_repr))

    def __str__(self) -> str:
        return self.text


def _label(item: pytest.Item) -> str:
    """The row of a test skipped before drawing: its name without ``test_``, and the arguments
    it is parametrized with besides the kernel."""
    names = set(inspect.signature(item.obj).parameters) - {"kernel"}
    others = [str(v) for k, v in item.callspec.params.items() if k in names]
    name = getattr(item, "originalname", item.name).removeprefix("test_")
    return name + (f"[{'-'.join(others)}]" if others else "")


def _write_tracebacks(terminalreporter, path: str) -> int:
    """Write the failed tests' full reports (traceback, captured output) to ``path`` (its folder
    made if need be); how many. Without failures, ``path`` is removed: what is there is an
    earlier run's."""
    failed = [r for key in ("failed", "error") for r in terminalreporter.stats.get(key, [])
              if getattr(r, "longreprtext", "")]
    if not failed:
        Path(path).unlink(missing_ok=True)
    else:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w") as f:
            for r in failed:
                f.write(f"{'=' * 20} {r.nodeid} ({r.when})\n{r.longreprtext}\n")
                for title, content in r.sections:
                    f.write(f"{'-' * 20} {title}\n{content}\n")
                f.write("\n")
    return len(failed)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """After pytest's summary, so that it comes last: the table (the tests that drew nothing one
    line per reason, unless --all-skips), each failure's cause once, then the time box's line and
    where the full tracebacks went; the same as markdown in ``$GITHUB_STEP_SUMMARY`` when that is
    set (a GitHub Actions job's summary page). With --tracebacks-file pytest shows no tracebacks,
    and no FAILED line per test when every failed test's report is among the causes (which say
    more: the shrunk problem, the repro, the replay command)."""
    path = config.getoption("--tracebacks-file")
    worker = getattr(config, "workerinput", None) is not None
    written = path and not worker and _write_tracebacks(terminalreporter, path)
    if path:
        config.option.tbstyle = "no"  # pytest's summary leaves out the tracebacks now in the file
        failed = terminalreporter.stats.get("failed", [])
        if failed and all(getattr(r, "flashprop_failure", None) for r in failed):
            terminalreporter.reportchars = terminalreporter.reportchars.replace("f", "")
    result = yield
    from flashprop.harness import compile_locks

    run = config.stash[RUN]
    report = run.tallies
    if run.tally_json:
        report.dump(run.tally_json)
    if compile_locks.installed():  # this process's compilations and its xdist workers'
        compiled = compile_locks.stats() + run.campaign.workers_compiled
        terminalreporter.write_line(f"flashprop: {compiled.line()}")
    for entry in config.stash.get(_UNMATCHED, []):
        terminalreporter.write_line(
            f"flashprop: known failure {entry.node_id} ({entry.where}) matched no collected test"
        )
    if not worker:
        for name in sorted(run.skip_properties - report.left_out()):
            terminalreporter.write_line(f"flashprop: --skip-property {name} matched no property of this run "
                                        "(the names are the table's property column)")
    lines = report.summary_lines(run.all_skips)
    if lines:
        terminalreporter.section("flashprop: examples per property")
        for line in lines:
            terminalreporter.write_line(line)
    failures = report.failure_lines()
    if failures:
        terminalreporter.section("flashprop: failures by cause (the smallest problem of each, shrunk)")
        for line in failures[:-1]:
            terminalreporter.write_line(line)
    if lines and run.time_box.summary():
        terminalreporter.write_line(f"flashprop: {run.time_box.summary()}")
    if lines and run.campaign.stopped_line():
        terminalreporter.write_line(f"flashprop: {run.campaign.stopped_line()}")
    if written:
        terminalreporter.write_line(f"flashprop: the tracebacks of the {written} failed tests are in {path}")
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary and lines:
        with open(step_summary, "a") as f:  # appended: each step of a job adds its part
            f.write("\n".join(report.markdown_lines()))
    return result
