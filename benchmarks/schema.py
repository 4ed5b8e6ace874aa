"""One benchmark row: what every benchmark of this folder writes into pytest-benchmark's
``extra_info``, and what the readers (``benchmarks.report``, ``ci/bench_gate.py``) read back.

pytest-benchmark keeps a benchmark's timings (``stats``) and one free dict, ``extra_info``, per
benchmark in its JSON. :class:`Row` names every key of that dict once: a benchmark builds a Row
and stores :meth:`Row.extra_info`; a reader gets Rows back from a JSON file with :func:`rows`.

Which fields a row fills in, besides ``kernel`` and ``config`` (a stable label of the problem):

    grid     (bench_attention) device, mode, n, d, causal, dtype, b, h, flops, median_s,
             host_s, tflops, peak_mem_bytes, ratios, timing, launch
    decode   (bench_decode) device, mode, n (the cache length), d, dtype, b, h, hkv, page_size,
             bytes_read, median_s, host_s, ratios (``copy``: the fraction of the copy
             bandwidth), timing, launch
    varlen   (bench_varlen) the grid's fields with n the pack's mean length, b its number of
             sequences, lengths, flops of the real work
    layer    (bench_layer) the grid's shape fields, d_model, block_tflops instead of tflops
    memory   (bench_memory) device, mem_n, mem_peak_bytes, mem_exponent
    first    (bench_first_call) the grid's shape fields, median_s, launch, first_call
    gate     (bench_suite) median_s, anchor_s, ratios, timing; examples_per_s for Hypothesis
    anchor   (bench_suite's calibration anchors) median_s

A suite may also list what it skipped, for the report (``output_json["skipped"]``, written by
``conftest.py``'s JSON hook): one :class:`Skipped` each, read back by :func:`skipped`.

``ratios`` maps each anchor to ``anchor seconds / kernel seconds``, both measured in the same
run (higher is faster): the number ``ci/bench_gate.py`` compares with its baseline, only
between rows timed under the same protocol, ``timing`` (a ``benchmarks.timing.Clock``'s protocol).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields


@dataclass(frozen=True)
class Row:
    """One benchmark's ``extra_info``; a field left ``None`` is not written.

    Attributes:
        kernel: the kernel (registered name), or the timed function of the CPU gate.
        config: the problem's label, e.g. ``fwd d64 causal N4096 bf16`` (the gate's key).
        device: ``cuda`` or ``cpu``.
        mode: ``fwd`` or ``fwd+bwd``.
        n, d, causal, dtype, b, h: sequence length, head dim, causal mask, dtype name (e.g.
            ``bfloat16``), batch and heads of the problem.
        d_model: the model width of a transformer-block row (heads x head dim).
        hkv, page_size: a decode row's kv heads and page size (``None``: a contiguous cache).
        bytes_read: the bytes a decode row reads per call (K, V and the block table).
        lengths: a varlen row's sequence lengths (queries and keys alike), in pack order.
        flops: floating-point operations of one timed call.
        median_s: median seconds of the timed call.
        host_s: host seconds of one call with an idle GPU (its launch cost; ``None`` on the CPU).
        tflops: ``flops / median_s / 1e12`` of an attention call.
        block_tflops: the same for a whole transformer block.
        peak_mem_bytes: peak memory allocated by one call beyond what was live before it.
        ratios: anchor name -> anchor seconds / this row's seconds, in the same run.
        timing: the timing protocol of ``median_s`` and ``ratios``.
        launch: what the kernel says it launched, per pass (e.g. the autotuner's tiles).
        gated: ``False`` for a row the gate must not compare (its ratios are reported only): a
            launch-bound decode row, whose time is mostly the host's latency.
        first_call: (bench_first_call) the first call at the row's shape: ``first_s`` (wall
            seconds: compilation, autotuning and the run), ``overhead_s`` (``first_s`` minus
            ``median_s``), ``compile_s`` and ``variants`` (Triton's compilations during it, when
            counted; else ``None``) and ``tuned_keys`` (autotuning keys the call added;
            ``None``: the kernel has no autotuner flashprop can see).
        anchor_s: median seconds of the gate's calibration anchor.
        examples_per_s: Hypothesis examples per second (the gate's property row).
        mem_n: the two sequence lengths of a memory-growth row.
        mem_peak_bytes: the peak extra bytes at each of them.
        mem_exponent: ``log(peak ratio) / log(length ratio)``: 1 for O(N), 2 for O(N^2).
    """

    kernel: str
    config: str
    device: str | None = None
    mode: str | None = None
    n: int | None = None
    d: int | None = None
    causal: bool | None = None
    dtype: str | None = None
    b: int | None = None
    h: int | None = None
    d_model: int | None = None
    hkv: int | None = None
    page_size: int | None = None
    bytes_read: int | None = None
    lengths: list[int] | None = None
    flops: float | None = None
    median_s: float | None = None
    host_s: float | None = None
    tflops: float | None = None
    block_tflops: float | None = None
    peak_mem_bytes: int | None = None
    ratios: dict[str, float] = field(default_factory=dict)
    timing: str | None = None
    launch: dict[str, str] | None = None
    gated: bool | None = None
    first_call: dict[str, float | int | None] | None = None
    anchor_s: float | None = None
    examples_per_s: float | None = None
    mem_n: list[int] | None = None
    mem_peak_bytes: list[int] | None = None
    mem_exponent: float | None = None

    def extra_info(self) -> dict[str, object]:
        """The row as ``extra_info`` (``benchmark.extra_info.update(row.extra_info())``)."""
        return {name: value for name, value in asdict(self).items() if value is not None}

    @classmethod
    def read(cls, info: Mapping[str, object]) -> Row:
        """The row an ``extra_info`` holds; keys that are not fields of :class:`Row` are ignored."""
        return cls(**{f.name: info[f.name] for f in fields(cls) if f.name in info})


def rows(output_json: Mapping) -> list[Row]:
    """The rows of a pytest-benchmark JSON document (benchmarks without ``extra_info`` left out)."""
    return [Row.read(b["extra_info"]) for b in output_json.get("benchmarks", []) if b.get("extra_info")]


@dataclass(frozen=True)
class Skipped:
    """A benchmark a suite did not run, for the report: the suite (``memory``), the kernel and
    why (the text of its pytest skip)."""

    suite: str
    kernel: str
    reason: str


def skipped(output_json: Mapping, suite: str) -> list[Skipped]:
    """The benchmarks of ``suite`` that a pytest-benchmark JSON document lists as skipped."""
    listed = (Skipped(**entry) for entry in output_json.get("skipped", []))
    return [entry for entry in listed if entry.suite == suite]
