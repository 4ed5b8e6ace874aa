"""The first call of a kernel at a new large shape: compilation, autotuning and the run.

For each kernel, three shapes in order (bf16, D = 128, not causal, forward and backward):

    new key    (1, 16, 8192, 128): the first call of its compile and autotuning keys
    new N      (1, 16, 12288, 128): a new sequence length in the same class (N >= 2k)
    4 GiB      (1, 256, 16384, 128): q, k, v and dO of 1 GiB each, a new N and head count

Each row records the wall seconds of the first call at its shape (synchronised: compilation,
autotuning and the run), the steady seconds by the grid's protocol (``timing.py``: CUDA events,
L2 flush, spin), their difference, the seconds Triton spent compiling (or loading from its
on-disk cache) and how many variants, when its compilations are counted
(``FLASHPROP_TRITON_COMPILE_LOCKS``, ``harness/compile_locks.py``; the rest of the difference
is autotuning's timing runs), and for the ``triton`` kernel how many new autotuning keys the
call added (its autotuner's cache, ``kernels.triton_attention.PASSES``, re-exported from
``kernels.triton_attention_launch``): the triton kernel keys its tuning on the padded head
dims, causal, the dtypes and ``SEQ_CLASS`` (N < 2048 or not), never on N, B or H, so only the
first shape should tune; a kernel that tuned again at "new N" or "4 GiB" would re-run its
tuning for every new length at large sizes. GPU only (the costs
are GPU compilation and tuning); a shape is run only after the earlier ones of its kernel (run
untimed when a selection left them out).

    FLASHPROP_TRITON_COMPILE_LOCKS=/tmp/locks python -m pytest benchmarks/bench_first_call.py \\
        -p no:cacheprovider -q --device cuda --bench-kernels triton,cuda,sdpa-flash \\
        --benchmark-json first-call.json
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import pytest
import torch
from flashprop.contract.problem import Problem
from flashprop.contract.registry import Kernel
from flashprop.harness import compile_locks
from flashprop.harness.scale_problems import undeclared_reason

from .conftest import BenchState, bench_device, kernel_names, reported_launch
from .schema import Row
from .timing import cuda_event_timer, rounds_for, warm_up

DTYPE, HEAD_DIM = torch.bfloat16, 128


@dataclass(frozen=True)
class Shape:
    """One step of the sequence: its label and (B, H, N)."""

    label: str
    b: int
    h: int
    n: int

    def problem(self) -> Problem:
        return Problem(b=self.b, hq=self.h, hkv=self.h, nq=self.n, nk=self.n, d=HEAD_DIM, dv=HEAD_DIM,
                       dtype=DTYPE, device="cuda")


STEPS = (Shape("new key", 1, 16, 8192), Shape("new N", 1, 16, 12288), Shape("4 GiB", 1, 256, 16384))
#: Steps already run in this process, per kernel.
_DONE: dict[str, list[str]] = {}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "step" not in metafunc.fixturenames:
        return
    params = [pytest.param((name, shape), id=f"{name}:{shape.label.replace(' ', '-')}",
                           marks=pytest.mark.benchmark(group="first call", timer=cuda_event_timer))
              for name in kernel_names(metafunc.config) for shape in STEPS]
    metafunc.parametrize("step", params)


def tuned_keys(kern: Kernel) -> int | None:
    """Autotuning keys the kernel's autotuners hold (``None``: none that flashprop can see)."""
    passes = getattr(sys.modules.get(kern.fn.__module__), "PASSES", None)
    if not isinstance(passes, dict):
        return None
    tuners = [getattr(p, "tuned", None) for p in passes.values()]
    caches = [getattr(t, "cache", None) for t in tuners if t is not None]
    return sum(len(c) for c in caches if isinstance(c, dict)) if caches else None


def make_call(kern: Kernel, shape: Shape):
    """Forward and backward at ``shape`` on fresh device-drawn inputs, synchronised."""
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn((shape.b, shape.h, shape.n, HEAD_DIM), generator=g, device="cuda",
                               dtype=DTYPE) for _ in range(4))
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))

    def call() -> tuple[torch.Tensor, ...]:
        o = kern(q, k, v)[0]
        return torch.autograd.grad(o, (q, k, v), do)

    return call


def first_seconds(call) -> float:
    """Wall seconds of ``call`` from an idle GPU to its last kernel's end."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    call()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def test_first_call(step: tuple[str, Shape], benchmark, bench_state: BenchState,
                    request: pytest.FixtureRequest, capsys: pytest.CaptureFixture) -> None:
    """Time the first call at the step's shape, then the steady call; record both."""
    name, shape = step
    if bench_device(request.config) != "cuda":
        pytest.skip("first-call costs are a GPU kernel's compilation and autotuning: run with --device cuda")
    kern = bench_state.load(name)
    if isinstance(kern, str):
        pytest.skip(f"unavailable: {kern}")
    reason = undeclared_reason(kern.capabilities, shape.problem())
    if reason is not None:
        pytest.skip(f"{name} does not declare {shape}: {reason}")
    done = _DONE.setdefault(name, [])
    try:
        for earlier in STEPS[: STEPS.index(shape)]:
            if earlier.label not in done:  # keep the order: untimed, when a selection left it out
                make_call(kern, earlier)()
                done.append(earlier.label)
        call = make_call(kern, shape)
        stats = compile_locks.stats()
        keys, compiled = tuned_keys(kern), (stats.compile_seconds, stats.variants)
        first = first_seconds(call)
        added = None if keys is None else tuned_keys(kern) - keys
        compile_s = stats.compile_seconds - compiled[0] if compile_locks.installed() else None
        variants = stats.variants - compiled[1] if compile_locks.installed() else None
        done.append(shape.label)
        warm = warm_up(call, "cuda", bench_state.setup)
    except (ValueError, TypeError, NotImplementedError) as err:
        pytest.skip(f"{name} refused {shape}: {type(err).__name__}: {err}")
    except torch.cuda.OutOfMemoryError as err:
        torch.cuda.empty_cache()
        pytest.skip(f"{name} at {shape}: out of memory ({err})")
    benchmark.pedantic(call, setup=bench_state.setup, rounds=rounds_for(warm.seconds, "cuda"), iterations=1)
    if benchmark.disabled:
        return
    steady = benchmark.stats.stats.median
    launch = reported_launch(kern.fn) or None
    row = Row(kernel=name, config=f"first call {shape.label}: fwd+bwd d{HEAD_DIM} full N{shape.n} bf16",
              device="cuda", mode="fwd+bwd", n=shape.n, d=HEAD_DIM, causal=False, dtype="bfloat16",
              b=shape.b, h=shape.h, median_s=steady, host_s=warm.host_seconds, launch=launch,
              first_call={"first_s": first, "overhead_s": first - steady, "tuned_keys": added,
                          "compile_s": compile_s, "variants": variants})
    benchmark.extra_info.update(row.extra_info())
    with capsys.disabled():
        tuned = "-" if added is None else str(added)
        built = "-" if compile_s is None else f"{compile_s:.1f} s for {variants} Triton variants"
        print(f"\nfirst call {name} {shape.label} (B={shape.b}, H={shape.h}, N={shape.n}): "
              f"{first:.2f} s first, {1e3 * steady:.2f} ms steady, compiling {built}, "
              f"new autotuning keys {tuned}")
