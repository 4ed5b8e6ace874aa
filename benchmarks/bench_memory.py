"""Memory growth: peak extra memory of a kernel at N and 4N must grow like N, not N^2.

For each kernel the peak extra memory of one call (forward and backward when declared) is
measured at two sequence lengths with B = 1 and H fixed, and the growth exponent
``log(peak(4N) / peak(N)) / log 4`` must stay below 1.5 (O(N): about 1, O(N^2): about 2). The
kernels are those of ``--bench-kernels`` (a user's ``file.py:attr`` among them; default: every
registered one); on the CPU also the streaming golden. A kernel that materialises the score
matrix (``sdpa-math``; on the CPU also the dense calibration anchor, always measured) is a
control: it must come out above 1.5, which shows that the measurement can tell the two apart. A
kernel that cannot be measured here (unavailable, the shapes not declared, refused, out of
memory, or in :data:`MEMORY_SKIPS`) is skipped with the reason, which the report's memory table
shows in its row. Results go to ``extra_info`` (a memory row of :class:`benchmarks.schema.Row`:
the ``mem_*`` fields); the timing is of one call at 4N.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from flashprop.refimpl.golden import attention_golden

from .bench_attention import make_call, unsupported_reason
from .calibration import plain_dense_attention_f64
from .conftest import BenchState, bench_device, kernel_names
from .grid import Config
from .memory import cpu_peak_supported, growth_exponent, peak_extra_bytes
from .schema import Row

#: (N, 4N), heads, head dim, dtype per device.
SHAPES = {"cuda": ((2048, 8192), 16, 64, "bfloat16"), "cpu": ((1024, 4096), 1, 64, "float32")}
#: Kernels whose score matrix is materialised, expected to grow like N^2; the first is the
#: control measured in every run.
QUADRATIC_CONTROLS = {"cuda": ("sdpa-math",), "cpu": ("dense-f64", "sdpa-math")}
#: CPU functions measured besides the kernels: the streaming golden and the control.
CPU_FUNCTIONS = {"golden": attention_golden, "dense-f64": plain_dense_attention_f64}
#: Registered kernels not measured on a device, and why.
MEMORY_SKIPS = {
    ("triton", "cpu"): "under the Triton interpreter, which runs every block operation in NumPy, the "
    "memory measured is the interpreter's, not the compiled kernel's",
}
LINEAR_LIMIT = 1.5
#: Peaks below this are noise (page granularity, allocator slack) and are clamped to it.
FLOOR_BYTES = 1 << 20


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "memory_case" not in metafunc.fixturenames:
        return
    device = bench_device(metafunc.config)
    always = list(CPU_FUNCTIONS) if device == "cpu" else [QUADRATIC_CONTROLS[device][0]]
    names = [*always, *(k for k in kernel_names(metafunc.config) if k not in always)]
    metafunc.parametrize("memory_case", names)


def config_at(device: str, n: int) -> Config:
    _, h, d, dtype = SHAPES[device]
    mode = "fwd+bwd" if device == "cuda" else "fwd"
    return Config(
        n=n, d=d, causal=False, dtype=dtype, mode=mode, tokens=n, hidden=h * d, device=device
    )


def calls(name: str, state: BenchState) -> tuple[Callable[[], object], Callable[[], object]]:
    """The calls at N and 4N for ``name`` (skips with the reason when it cannot run)."""
    device = state.device
    if (reason := MEMORY_SKIPS.get((name, device))) is not None:
        state.skip("memory", name, f"{name} on {device}: {reason}")
    small, large = (config_at(device, n) for n in SHAPES[device][0])
    if name in CPU_FUNCTIONS and device == "cpu":
        fn = CPU_FUNCTIONS[name]
        made = []
        for cfg in (small, large):
            q, k, v, _ = cfg.inputs()
            made.append(lambda q=q, k=k, v=v: fn(q, k, v))
        return made[0], made[1]
    kern = state.load(name)
    for cfg in (small, large):
        if (reason := unsupported_reason(kern, name, cfg)) is not None:
            state.skip("memory", name, reason)
    return make_call(kern, small), make_call(kern, large)


def test_memory_grows_linearly(memory_case: str, benchmark, bench_state: BenchState) -> None:
    """Peak extra memory at 4N is about 4x (not 16x) that at N; the control grows ~16x."""
    device = bench_state.device
    if device == "cpu" and (reason := cpu_peak_supported()) is not None:
        bench_state.skip("memory", memory_case, reason)
    small, large = calls(memory_case, bench_state)
    (n1, n2) = SHAPES[device][0]
    try:
        small(), large()  # compile / autotune (its buffers) outside the measurement
        peak1 = max(FLOOR_BYTES, peak_extra_bytes(small, device))
        peak2 = max(FLOOR_BYTES, peak_extra_bytes(large, device))
    except (ValueError, TypeError, NotImplementedError) as err:
        refusal = f"{memory_case} refused the problem: {type(err).__name__}: {err}"
        bench_state.skip("memory", memory_case, refusal)
    except torch.cuda.OutOfMemoryError as err:
        torch.cuda.empty_cache()
        bench_state.skip("memory", memory_case, f"{memory_case}: out of memory ({err})")
    exponent = growth_exponent(n1, peak1, n2, peak2)
    benchmark.group = "memory growth"
    benchmark.pedantic(large, rounds=1, iterations=1)
    row = Row(
        kernel=memory_case,
        config=f"memory N={n1} vs N={n2}",
        device=device,
        mem_n=[n1, n2],
        mem_peak_bytes=[peak1, peak2],
        mem_exponent=exponent,
    )
    benchmark.extra_info.update(row.extra_info())
    control = memory_case in QUADRATIC_CONTROLS[device]
    detail = (
        f"{memory_case}: peak extra {peak1 / 2**20:.1f} MiB at N={n1}, "
        f"{peak2 / 2**20:.1f} MiB at N={n2}: growth exponent {exponent:.2f}"
    )
    if control:
        assert exponent > LINEAR_LIMIT, f"control should grow like N^2: {detail}"
    else:
        assert exponent < LINEAR_LIMIT, f"memory is not O(N): {detail}"
