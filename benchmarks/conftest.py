"""Options and shared state of the benchmark suites.

Options (each also read from an environment variable, the option wins):
    --bench-kernels   FLASHPROP_BENCH_KERNELS   kernels to time (default: every registered one)
    --bench-anchors   FLASHPROP_BENCH_ANCHORS   anchors each kernel is compared with
                                                (default: contract.registry.BENCH_ANCHORS:
                                                sdpa-flash,sdpa-cudnn on CUDA, sdpa-math on CPU)
    --bench-seqlens   FLASHPROP_BENCH_SEQLENS   N values, e.g. 1k,2k,4k
    --bench-head-dims FLASHPROP_BENCH_HEAD_DIMS e.g. 64,128
    --bench-dtypes    FLASHPROP_BENCH_DTYPES    e.g. bf16,fp16 (or bfloat16,float16)
    --bench-modes     FLASHPROP_BENCH_MODES     fwd and/or fwd+bwd
    --bench-subset    FLASHPROP_BENCH_SUBSET    a named subset of benchmarks.grid.SUBSETS
    --bench-variants  FLASHPROP_BENCH_VARIANTS  rows' variants (benchmarks.grid.VARIANTS), e.g.
                                                dense,softcap,fp8 (default: dense)
    --bench-report    FLASHPROP_BENCH_REPORT    folder for the plot and markdown table, written
                                                together with --benchmark-json
The device comes from the root conftest's ``--device`` (default: cuda when available).

Each benchmark file times its row through :func:`measure_row` (warm-up, the refusal and
out-of-memory skips, ``benchmark.pedantic`` under the device's clock, the launch the kernel
reports) and adds its own anchors and :class:`~benchmarks.schema.Row` fields.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NoReturn

import pytest
import torch
from flashprop.contract.registry import BENCH_ANCHORS, BUILTIN, Kernel, KernelUnavailable, load_kernel
from flashprop.contract.validate import CLEAR_ERRORS

from .grid import (
    CPU_GRID,
    GPU_GRID,
    LONG_DTYPE,
    SUBSETS,
    Config,
    GridSpec,
    parse_ints,
    parse_names,
)
from .schema import Skipped
from .timing import RoundSetup, rounds_for, warm_up

_OPTIONS = {
    "--bench-kernels": "FLASHPROP_BENCH_KERNELS",
    "--bench-anchors": "FLASHPROP_BENCH_ANCHORS",
    "--bench-seqlens": "FLASHPROP_BENCH_SEQLENS",
    "--bench-head-dims": "FLASHPROP_BENCH_HEAD_DIMS",
    "--bench-dtypes": "FLASHPROP_BENCH_DTYPES",
    "--bench-modes": "FLASHPROP_BENCH_MODES",
    "--bench-subset": "FLASHPROP_BENCH_SUBSET",
    "--bench-variants": "FLASHPROP_BENCH_VARIANTS",
    "--bench-report": "FLASHPROP_BENCH_REPORT",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("flashprop benchmarks")
    for option, env in _OPTIONS.items():
        group.addoption(option, default=None, help=f"(env {env}) see benchmarks/conftest.py")


def bench_option(config: pytest.Config, option: str) -> str | None:
    """An option's value, else its environment variable's, else ``None``."""
    return option_or_env(option, config.getoption(option))


def option_or_env(option: str, value: str | None) -> str | None:
    """``value`` (a command line's), else the option's environment variable's, else ``None``."""
    return value or os.environ.get(_OPTIONS[option]) or None


def bench_device(config: pytest.Config) -> str:
    """``--device`` from the root conftest, else cuda when torch sees one."""
    device = config.getoption("--device", default=None)
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    return device


def grid_spec(config: pytest.Config, device: str) -> GridSpec:
    """The grid for ``device`` narrowed by the command-line options."""
    return grid_from(lambda option: bench_option(config, option), device)


def grid_from(value: Callable[[str], str | None], device: str) -> GridSpec:
    """The grid for ``device`` narrowed by ``value(--bench-...)``, the options' values (pytest's
    options here, ``flashprop bench --against``'s in :mod:`benchmarks.against`)."""
    base = GPU_GRID if device == "cuda" else CPU_GRID
    return GridSpec(
        seqlens=parse_ints(value("--bench-seqlens"), base.seqlens),
        head_dims=parse_ints(value("--bench-head-dims"), base.head_dims),
        dtypes=tuple(
            LONG_DTYPE.get(name, name)
            for name in parse_names(value("--bench-dtypes"), base.dtypes)
        ),
        modes=parse_names(value("--bench-modes"), base.modes),
        tokens=base.tokens,
        hidden=base.hidden,
        variants=parse_names(value("--bench-variants"), base.variants),
    )


def bench_subset(config: pytest.Config) -> str | None:
    subset = bench_option(config, "--bench-subset") or None  # "" is the full grid
    if subset is not None and subset not in SUBSETS:
        raise pytest.UsageError(f"--bench-subset {subset!r}: known subsets {sorted(SUBSETS)}")
    return subset


@dataclass
class BenchState:
    """Per-session state: loaded kernels (or why not), anchor times, the round setup (L2
    flush buffer, launch-latency spin), and the benchmarks skipped for the report."""

    device: str
    setup: RoundSetup
    loaded: dict[str, Kernel | str] = field(default_factory=dict)
    anchor_seconds: dict[tuple[str, Config], float | str] = field(default_factory=dict)
    skipped: list[Skipped] = field(default_factory=list)

    def skip(self, suite: str, kernel: str, reason: str) -> NoReturn:
        """Skip the running benchmark with ``reason``, and keep it for the report's table."""
        __tracebackhide__ = True  # pytest's skip line names the benchmark's line, not this one
        self.skipped.append(Skipped(suite, kernel, reason))
        pytest.skip(reason)

    def load(self, name: str) -> Kernel | str:
        """The kernel, or the reason it cannot run here (cached)."""
        if name not in self.loaded:
            try:
                self.loaded[name] = load_kernel(name)
            except KernelUnavailable as err:
                self.loaded[name] = str(err)
            except ImportError as err:
                self.loaded[name] = f"kernel {name}: not importable ({err})"
        return self.loaded[name]


_STATE = pytest.StashKey[BenchState]()


@pytest.fixture(scope="session")
def bench_state(request: pytest.FixtureRequest) -> Iterator[BenchState]:
    """The session state (kept in the config's stash for the JSON hook below); on the CPU torch
    runs single-threaded, the kernels and their anchor alike (on a shared 2-core box threads
    mostly compete with the neighbours, and the ratios would depend on the core count)."""
    import torch

    device = bench_device(request.config)
    threads = torch.get_num_threads()
    if device == "cpu":
        torch.set_num_threads(1)
    state = request.config.stash[_STATE] = BenchState(device=device, setup=RoundSetup(device))
    yield state
    torch.set_num_threads(threads)


def parametrize_rows(metafunc: pytest.Metafunc, fixture: str, default_kernels: tuple[str, ...],
                     rows: Callable[[str], list]) -> None:
    """Give ``fixture`` a ``(kernel name, row)`` per row of ``rows(device)`` (each with a
    ``label``) and kernel ``--bench-kernels`` names (default ``default_kernels``), each row a
    benchmark group timed by the device's clock."""
    from .timing import CLOCKS

    config = metafunc.config
    device = bench_device(config)
    names = parse_names(bench_option(config, "--bench-kernels"), default_kernels)
    params = []
    for cfg in rows(device):
        mark = pytest.mark.benchmark(group=cfg.label, timer=CLOCKS[device].timer)
        params += [pytest.param((name, cfg), marks=mark, id=f"{name}:{cfg.label.replace(' ', '-')}")
                   for name in names]
    metafunc.parametrize(fixture, params)


@dataclass(frozen=True)
class Measured:
    """One timed row: the median seconds of its rounds, one call's host seconds, the launch the
    kernel reported after them (``last_launch()``, or ``None``) and what ``probe`` returned."""

    seconds: float
    host_seconds: float | None
    launch: dict | None
    probed: object = None


def measure_row(benchmark, state: BenchState, name: str, label: str, make: Callable[[], Callable[[], object]],
                entry: Callable[[], object] | None = None,
                probe: Callable[[Callable[[], object]], object] | None = None) -> Measured | None:
    """Time ``make()``'s callable for one row: warm it up (compilation, autotuning, the spin's
    size), run ``probe`` on it (peak memory, say), then ``benchmark.pedantic`` with the rounds
    the warm-up asks for, under the state's round setup, and ask ``entry()`` (the entry point
    called, looked up after the rounds: a registry entry may resolve on its first call) for its
    ``last_launch()``. A refusal (``CLEAR_ERRORS``) or running
    out of memory skips the row with its reason; ``None`` under ``--benchmark-disable`` (a smoke
    pass: nothing measured). The callable, and what it holds, is dropped on return, before the
    caller times its anchors."""
    device, setup = state.device, state.setup
    try:
        call = make()
        warm = warm_up(call, device, setup)
        probed = probe(call) if probe is not None else None
    except CLEAR_ERRORS as err:
        pytest.skip(f"{name} refused {label}: {type(err).__name__}: {err}")
    except torch.cuda.OutOfMemoryError as err:
        torch.cuda.empty_cache()
        pytest.skip(f"{name} at {label}: out of memory ({err})")
    benchmark.pedantic(call, setup=setup, rounds=rounds_for(warm.seconds, device), iterations=1)
    if benchmark.disabled:
        return None
    launch = reported_launch(entry()) if entry is not None else None
    return Measured(benchmark.stats.stats.median, warm.host_seconds, launch or None, probed)


def reported_launch(entry: object) -> dict[str, str]:
    """What an entry point says it launched last (its ``last_launch()``: the triton kernel's tiles
    per pass, tuned or fixed, or its decode splits), or ``{}`` for one that does not say."""
    last = getattr(entry, "last_launch", None)
    return dict(last()) if callable(last) else {}


def kernel_names(config: pytest.Config) -> tuple[str, ...]:
    return parse_names(bench_option(config, "--bench-kernels"), BUILTIN)


def anchor_names(config: pytest.Config, device: str) -> tuple[str, ...]:
    return parse_names(bench_option(config, "--bench-anchors"), BENCH_ANCHORS[device])


def pytest_configure(config: pytest.Config) -> None:
    """A benchmark run started from inside a pytest-xdist worker (a test of ``flashprop bench``
    or of the GPU driver in a parallel run) inherits ``PYTEST_XDIST_WORKER``, from which
    pytest-benchmark concludes that it runs under xdist and disables itself: this process is no
    xdist worker unless xdist made it one. (pytest-benchmark's own configure runs last.)"""
    if not hasattr(config, "workerinput"):
        os.environ.pop("PYTEST_XDIST_WORKER", None)


def pytest_benchmark_update_json(config: pytest.Config, benchmarks, output_json: dict) -> None:
    """Add the benchmarks skipped for the report (``output_json["skipped"]``: suite, kernel,
    reason); with ``--bench-report DIR``, write the markdown table and the plot next to the JSON."""
    state = config.stash.get(_STATE, None)
    if state is not None and state.skipped:
        output_json["skipped"] = [asdict(skipped) for skipped in state.skipped]
    folder = bench_option(config, "--bench-report")
    if folder:
        from .report import write_report

        write_report(output_json, Path(folder))
