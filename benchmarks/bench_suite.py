"""The CPU gate: the suite's own hot paths, timed against a calibration anchor in the same run.

Each benchmark reports ``ratios = {"calibration": anchor seconds / benchmark seconds}``, where
the anchor (:mod:`benchmarks.calibration`, plain dense float64 attention on a fixed problem) is
re-measured right after the benchmark, so slow or busy CI machines move both sides alike. The
hot paths:

- ``golden``: :func:`refimpl.golden.attention_golden` (streaming float64) and its backward,
  on the calibration problem itself;
- ``ref-blocked``: :func:`refimpl.blocked.attention` forward and backward on a fixed problem;
- ``triton``: the Triton kernel under ``TRITON_INTERPRET=1`` on a fixed small problem (skipped
  with the reason when it cannot load);
- ``hypothesis``: examples per second of the forward-vs-golden property for ``ref-blocked``
  (problems drawn by :func:`properties.strategies.problems`, judged by properties.check).

Torch runs single-threaded here: a CI box has 2 cores, and one thread is what keeps the ratio
steady when something else runs on the other core.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings

from benchmarks.calibration import (
    CALIBRATION_SHAPE,
    calibration_inputs,
    plain_dense_attention_f64,
)
from benchmarks.conftest import BenchState
from benchmarks.timing import L2Flush, median_seconds
from kernels.registry import Kernel
from properties.check import assert_close_to_golden, references, run_kernel
from properties.problem import Problem
from properties.strategies import Sizes, problems
from refimpl.golden import attention_golden, attention_golden_backward

#: Rounds of the anchor measured after each benchmark (median taken).
ANCHOR_ROUNDS = 5
BLOCKED_PROBLEM = Problem(b=1, hq=2, hkv=2, nq=256, nk=256, d=64, dv=64, causal=True, seed=1)
TRITON_PROBLEM = Problem(b=1, hq=2, hkv=2, nq=64, nk=64, d=32, dv=32, causal=True, seed=2)
#: Examples per timed call of the property (more than the 16 cached references).
EXAMPLES = 20
PROPERTY_SIZES = Sizes(max_n=48, max_work=400_000)

@pytest.fixture(scope="module", autouse=True)
def single_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def anchor_seconds() -> float:
    """Median seconds of the calibration anchor, measured now."""
    q, k, v = calibration_inputs()
    flush = L2Flush("cpu")
    return median_seconds(lambda: plain_dense_attention_f64(q, k, v), "cpu", flush)


def gated(benchmark, name: str, config: str, fn: Callable[[], object], **info) -> None:
    """Benchmark ``fn``, then the anchor; record the ratio the gate compares."""
    benchmark.group = "cpu gate"
    benchmark(fn)
    seconds = benchmark.stats.stats.median
    anchor = anchor_seconds()
    benchmark.extra_info.update(
        kernel=name,
        config=config,
        median_s=seconds,
        anchor_s=anchor,
        ratios={"calibration": anchor / seconds},
        **info,
    )


def shape_label(p: Problem) -> str:
    dtype = str(p.dtype).removeprefix("torch.")
    mask = " causal" if p.causal else ""
    return f"{p.b}x{p.hq}x{p.nq}x{p.d} {dtype}{mask}"


CALIBRATION_LABEL = "{}x{}x{}x{} float64".format(*CALIBRATION_SHAPE)


def test_calibration_anchor(benchmark) -> None:
    """The anchor itself (ungated): shows how fast this machine is."""
    q, k, v = calibration_inputs()
    benchmark.group = "cpu gate"
    benchmark(plain_dense_attention_f64, q, k, v)
    benchmark.extra_info.update(
        kernel="calibration", config=f"fwd {CALIBRATION_LABEL}",
        median_s=benchmark.stats.stats.median,
    )


def test_golden_forward(benchmark) -> None:
    q, k, v = calibration_inputs()
    gated(benchmark, "golden", f"fwd {CALIBRATION_LABEL}", lambda: attention_golden(q, k, v))


def test_golden_backward(benchmark) -> None:
    q, k, v = calibration_inputs()
    do = torch.randn_like(q)
    gated(
        benchmark, "golden", f"bwd {CALIBRATION_LABEL}",
        lambda: attention_golden_backward(q, k, v, do),
    )


def forward_backward(kern: Kernel, p: Problem) -> Callable[[], object]:
    """Forward and ``autograd.grad`` of ``kern`` on ``p``'s tensors."""
    q, k, v = p.inputs(requires_grad=True)
    do = p.grad_output()

    def call() -> tuple[torch.Tensor, ...]:
        o = kern(q, k, v, causal=p.causal)[0]
        return torch.autograd.grad(o, (q, k, v), do)

    return call


def loaded(bench_state: BenchState, name: str) -> Kernel:
    kern = bench_state.load(name)
    if isinstance(kern, str):
        pytest.skip(f"unavailable: {kern}")
    return kern


def test_blocked_forward_backward(benchmark, bench_state: BenchState) -> None:
    kern = loaded(bench_state, "ref-blocked")
    p = BLOCKED_PROBLEM
    gated(benchmark, "ref-blocked", f"fwd+bwd {shape_label(p)}", forward_backward(kern, p))


def test_triton_interpreter(benchmark, bench_state: BenchState) -> None:
    kern = loaded(bench_state, "triton")
    p = TRITON_PROBLEM
    if (reason := kern.capabilities.unsupported_reason(p)) is not None:
        pytest.skip(f"triton does not declare {p.describe()}: {reason}")
    if kern.capabilities.backward:
        gated(benchmark, "triton", f"fwd+bwd {shape_label(p)}", forward_backward(kern, p))
        return
    q, k, v = p.inputs()
    gated(benchmark, "triton", f"fwd {shape_label(p)}", lambda: kern(q, k, v, causal=p.causal))


def test_hypothesis_examples_per_second(benchmark, bench_state: BenchState) -> None:
    """Examples per second of the forward property (ref-blocked vs golden, CPU sizes)."""
    kern = loaded(bench_state, "ref-blocked")

    @settings(
        max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
        phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck),
    )
    @given(problems(kern.capabilities, device="cpu", sizes=PROPERTY_SIZES))
    def forward_property(problem: Problem) -> None:
        out = run_kernel(kern, problem, "forward")
        assert_close_to_golden(kern, problem, "forward", out, ("o", "lse"))

    def run() -> None:
        references.cache_clear()
        forward_property()

    gated(benchmark, "hypothesis", f"forward property, ref-blocked, {EXAMPLES} examples", run)
    benchmark.extra_info["examples_per_s"] = EXAMPLES / benchmark.extra_info["median_s"]
