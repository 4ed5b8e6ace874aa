"""The CPU gate: the suite's own hot paths, timed against a calibration anchor in the same run.

Every round of a benchmark is preceded by one run of its anchor (:mod:`benchmarks.calibration`:
plain dense float64 attention, a large problem for BLAS-bound paths, many tiny ones for
overhead-bound paths), and the gated number is the median over rounds of ``anchor seconds /
benchmark seconds``. Both are timed in process CPU time (:data:`benchmarks.timing.GATE_CLOCK`,
not the grid's wall-clock) with torch single-threaded, so a busy or slower CI machine moves both
sides alike (on a 2-core box shared with other jobs, wall-clock time mostly measures the
neighbours; none of these paths sleeps or waits, which process time would not see). The hot
paths and their anchors:

- ``golden`` (large): :func:`refimpl.golden.attention_golden` (streaming float64, two key
  chunks) and its backward, on the anchor's own shape so both work on data of one size (a
  larger golden problem spilled out of the caches the anchor fits in, and shared-host memory
  bandwidth then moved the ratio by +-30% between quiet runs);
- ``ref-blocked`` (tiny): :func:`refimpl.blocked.attention` forward and backward, fixed problem;
- ``triton`` (tiny): the Triton kernel under ``TRITON_INTERPRET=1`` on a fixed small problem
  (skipped with the reason when it cannot load);
- ``hypothesis`` (tiny): examples per second of the forward-vs-golden property for
  ``ref-blocked`` (problems from :func:`harness.strategies.problems`, judged by
  harness.check).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest
import torch
from flashprop.contract.problem import Problem
from flashprop.contract.registry import Kernel
from flashprop.harness.check import assert_close_to_golden, references, run_kernel
from flashprop.harness.strategies import Sizes, problems
from flashprop.refimpl.golden import attention_golden, attention_golden_backward
from hypothesis import HealthCheck, Phase, given, settings

from .calibration import ANCHORS, CALIBRATION_SHAPE, calibration_inputs
from .conftest import BenchState
from .schema import Row
from .timing import GATE_CLOCK

#: Timed rounds per benchmark, each paired with one anchor run.
ROUNDS = 11
GOLDEN_SHAPE = CALIBRATION_SHAPE
#: Key chunk of the streamed golden in the gate: two chunks over GOLDEN_SHAPE's keys.
GOLDEN_CHUNK = CALIBRATION_SHAPE[2] // 2
BLOCKED_PROBLEM = Problem(b=1, hq=2, hkv=2, nq=256, nk=256, d=64, dv=64, causal=True, seed=1)
TRITON_PROBLEM = Problem(b=1, hq=2, hkv=2, nq=64, nk=64, d=32, dv=32, causal=True, seed=2)
#: Examples per timed call of the property (more than the 16 cached references).
EXAMPLES = 20
PROPERTY_SIZES = Sizes(max_n=48, max_work=400_000)

pytestmark = pytest.mark.benchmark(group="cpu gate", timer=GATE_CLOCK.timer)


@pytest.fixture(scope="module", autouse=True)
def single_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def shape_label(shape: tuple[int, ...], dtype: torch.dtype, causal: bool = False) -> str:
    mask = " causal" if causal else ""
    return "x".join(map(str, shape)) + f" {str(dtype).removeprefix('torch.')}{mask}"


LARGE, TINY = ANCHORS


def gated(benchmark, name: str, config: str, fn: Callable[[], object], anchor: str) -> Row:
    """Benchmark ``fn`` with an anchor run before each round; record (and return) the gated row."""
    anchor_fn = ANCHORS[anchor]()
    anchor_times: list[float] = []

    def timed_anchor() -> None:
        start = GATE_CLOCK.timer()
        anchor_fn()
        anchor_times.append(GATE_CLOCK.timer() - start)

    benchmark.pedantic(fn, setup=timed_anchor, rounds=ROUNDS, warmup_rounds=1)
    times = benchmark.stats.stats.data
    pairs = [a / max(t, 1e-9) for a, t in zip(anchor_times[-len(times) :], times, strict=True)]
    row = Row(
        kernel=name,
        config=config,
        median_s=statistics.median(times),
        anchor_s=statistics.median(anchor_times),
        ratios={anchor: statistics.median(pairs)},
        timing=GATE_CLOCK.protocol,
    )
    benchmark.extra_info.update(row.extra_info())
    return row


@pytest.mark.parametrize("anchor", ANCHORS)
def test_calibration_anchor(benchmark, anchor: str) -> None:
    """An anchor itself (ungated): how fast this machine is."""
    benchmark.pedantic(ANCHORS[anchor](), rounds=ROUNDS, warmup_rounds=1)
    row = Row(kernel=anchor, config="calibration", median_s=benchmark.stats.stats.median,
              timing=GATE_CLOCK.protocol)
    benchmark.extra_info.update(row.extra_info())


def test_golden_forward(benchmark) -> None:
    q, k, v = calibration_inputs(GOLDEN_SHAPE)
    config = f"fwd {shape_label(GOLDEN_SHAPE, torch.float64)}"
    gated(benchmark, "golden", config, lambda: attention_golden(q, k, v, chunk=GOLDEN_CHUNK), LARGE)


def test_golden_backward(benchmark) -> None:
    q, k, v = calibration_inputs(GOLDEN_SHAPE)
    do = torch.randn_like(q)
    config = f"bwd {shape_label(GOLDEN_SHAPE, torch.float64)}"
    run = lambda: attention_golden_backward(q, k, v, do, chunk=GOLDEN_CHUNK)  # noqa: E731
    gated(benchmark, "golden", config, run, LARGE)


def forward_backward(kern: Kernel, p: Problem) -> Callable[[], object]:
    """Forward and ``autograd.grad`` of ``kern`` on ``p``'s tensors."""
    q, k, v = p.inputs(requires_grad=True)
    do = p.grad_output()

    def call() -> tuple[torch.Tensor, ...]:
        o = kern(q, k, v, causal=p.causal)[0]
        return torch.autograd.grad(o, (q, k, v), do)

    return call


def problem_label(p: Problem) -> str:
    return shape_label((p.b, p.hq, p.nq, p.d), p.dtype, p.causal)


def loaded(bench_state: BenchState, name: str) -> Kernel:
    kern = bench_state.load(name)
    if isinstance(kern, str):
        pytest.skip(f"unavailable: {kern}")
    return kern


def test_blocked_forward_backward(benchmark, bench_state: BenchState) -> None:
    kern = loaded(bench_state, "ref-blocked")
    p = BLOCKED_PROBLEM
    config = f"fwd+bwd {problem_label(p)}"
    gated(benchmark, "ref-blocked", config, forward_backward(kern, p), TINY)


def test_triton_interpreter(benchmark, bench_state: BenchState) -> None:
    kern = loaded(bench_state, "triton")
    p = TRITON_PROBLEM
    if (reason := kern.capabilities.unsupported_reason(p)) is not None:
        pytest.skip(f"triton does not declare {p.describe()}: {reason}")
    if kern.capabilities.backward:
        gated(benchmark, "triton", f"fwd+bwd {problem_label(p)}", forward_backward(kern, p), TINY)
        return
    q, k, v = p.inputs()
    call = lambda: kern(q, k, v, causal=p.causal)  # noqa: E731
    gated(benchmark, "triton", f"fwd {problem_label(p)}", call, TINY)


def test_hypothesis_examples_per_second(benchmark, bench_state: BenchState) -> None:
    """Examples per second of the forward property (ref-blocked vs golden, CPU sizes)."""
    kern = loaded(bench_state, "ref-blocked")

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(problems(kern.capabilities, device="cpu", sizes=PROPERTY_SIZES))
    def forward_property(problem: Problem) -> None:
        out = run_kernel(kern, problem, "forward")
        assert_close_to_golden(kern, problem, "forward", out, ("o", "lse"))

    def run() -> None:
        references.cache_clear()
        forward_property()

    config = f"forward property, ref-blocked, {EXAMPLES} examples"
    row = gated(benchmark, "hypothesis", config, run, TINY)
    benchmark.extra_info.update(replace(row, examples_per_s=EXAMPLES / row.median_s).extra_info())
