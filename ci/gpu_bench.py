"""The benchmark and gate phases of ``ci/gpu_check.py``.

The benchmarks run in chunks, one pytest process each (per head dim and dtype on the GPU, per
head dim on the CPU, then the memory chunk: ``bench_memory.py`` and ``bench_layer.py``; on the
GPU also the decode and varlen rows, ``bench_decode.py`` and ``bench_varlen.py``), each
writing its own pytest-benchmark JSON: a chunk cut off by its time limit loses only itself (and
keeps what it finished: it is interrupted as Ctrl-C would). On several GPUs chunk ``i`` runs on
GPU ``i mod n``, the GPUs side by side, each GPU's chunks one after another.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import limited
from flashprop.benchmarks.grid import SHORT_DTYPE
from flashprop.benchmarks.varlen import GPU_VARLEN
from gpu_runs import build_cuda_kernel
from gpu_settings import LEAST_SECONDS, NOT_STARTED, ROOT, Config, say

#: The chunks that are one benchmark file each.
FILE_CHUNKS = {"memory": ["benchmarks/bench_memory.py", "benchmarks/bench_layer.py"],
               "decode": ["benchmarks/bench_decode.py"], "varlen": ["benchmarks/bench_varlen.py"]}


def chunk_args(chunk: str) -> list[str]:
    """The pytest arguments of a benchmark chunk (``d64``, ``d64-bf16``, ``memory``, ``decode``,
    ``varlen``)."""
    if chunk in FILE_CHUNKS:
        return list(FILE_CHUNKS[chunk])
    dims, _, dtype = chunk.partition("-")
    return ["benchmarks/bench_attention.py", "--bench-head-dims", dims.removeprefix("d"),
            *(["--bench-dtypes", dtype] if dtype else [])]


def warm_keys(chunks: list[str]) -> list[tuple[str, str, str]]:
    """The compile warm-up's keys, (head dim, dtype, mask), of the GPU chunks asked for."""
    return [(dims.removeprefix("d"), dtype, mask) for dims, _, dtype in (c.partition("-") for c in chunks)
            if dtype and dims.startswith("d") for mask in ("full", "causal")]


def warm_commands(chunks: list[str]) -> list[tuple[str, list[str]]]:
    """The compile warm-up's processes, (name, pytest arguments), of the GPU chunks asked for: per
    (head dim, dtype, mask) key the attention grid at N = 1024 and 2048, and with the varlen chunk
    its rows of the same key (each autotunes its passes on its own pack)."""
    commands = [(f"d={d} {dtype} {mask}",
                 ["benchmarks/bench_attention.py", "--bench-head-dims", d, "--bench-dtypes", dtype,
                  "-k", mask, "--bench-seqlens", "1024 2048"])
                for d, dtype, mask in warm_keys(chunks)]
    if "varlen" in chunks:
        for d in GPU_VARLEN.head_dims:
            for dtype in map(SHORT_DTYPE.get, GPU_VARLEN.dtypes):
                commands += [(f"varlen d={d} {dtype} {mask}",
                              ["benchmarks/bench_varlen.py", "-k", f"d{d} and {mask} and {dtype}"])
                             for mask in ("full", "causal")]
    return commands


def chunks_per_gpu(chunks: list[str], ids: list[str]) -> list[tuple[str | None, list[str]]]:
    """Chunk ``i`` on GPU ``ids[i mod n]``, each GPU's chunks in order; one list (GPU ``None``:
    the environment's) with fewer than two GPUs. A configuration's anchors are timed in the same
    process, on the same GPU, as the kernels compared with them."""
    if len(ids) < 2:
        return [(None, list(chunks))]
    return [(gpu, chunks[i::len(ids)]) for i, gpu in enumerate(ids) if chunks[i::len(ids)]]


def merge_benchmarks(parts: list[Path], out: Path) -> None:
    """pytest-benchmark JSON files merged into one: the first one's header, every file's
    benchmarks (and what they list as skipped, for the report) in the order of ``parts``."""
    merged = json.loads(parts[0].read_text())
    for part in parts[1:]:
        data = json.loads(part.read_text())
        merged["benchmarks"] += data["benchmarks"]
        merged["skipped"] = merged.get("skipped", []) + data.get("skipped", [])
    out.write_text(json.dumps(merged, indent=1))


@dataclass
class Chunk:
    """One benchmark chunk of a call and its outcome."""

    name: str
    gpu: str | None
    exit: int = NOT_STARTED
    seconds: float = 0.0
    log: str = ""
    json: Path | None = None


class BenchPhase:
    """The benchmark phase of one call, which ends ``bench_seconds`` after it starts."""

    def __init__(self, cfg: Config, parts: Path):
        self.cfg, self.parts = cfg, parts
        self.end = time.monotonic() + cfg.bench_seconds

    def left(self) -> float:
        """Seconds a chunk may take now: its timeout, or what is left of the phase if less."""
        return min(self.cfg.bench_timeout, self.end - time.monotonic())

    def warm_up(self) -> None:
        """Compile the autotuned kernels first, JOBS processes at a time (:func:`warm_commands`;
        the triton kernel tunes N >= 2048 apart, varlen per pack), each run with
        ``--benchmark-disable``: it fills the on-disk compile caches, and the timed chunks only
        pick among compiled configurations."""
        commands = warm_commands(self.cfg.bench_chunks)
        if not commands:
            return
        say(f"compiling the benchmark kernels (one process per key, {self.cfg.jobs} at a time)")
        start = time.monotonic()

        def warm(named: tuple[str, list[str]]) -> None:
            name, args = named
            command = [sys.executable, "-m", "pytest", *args, "-p", "no:cacheprovider", "-q", "--device",
                       "cuda", "--benchmark-disable", "--bench-kernels", self.cfg.bench_kernels]
            try:
                done = subprocess.run(command, cwd=ROOT, capture_output=True, timeout=max(1.0, self.left()))
                code = done.returncode
            except subprocess.TimeoutExpired:
                code = 124
            say(f"  {name}: exit {code}")

        with concurrent.futures.ThreadPoolExecutor(self.cfg.jobs) as pool:
            list(pool.map(warm, commands))
        say(f"compiled in {time.monotonic() - start:.0f} s")

    def run_chunk(self, chunk: Chunk) -> None:
        """One chunk within its time limit (interrupted, it keeps the benchmarks it finished);
        not started when less than LEAST_SECONDS is left of the phase."""
        limit = self.left()
        if limit < LEAST_SECONDS:
            chunk.log = f"gpu-check: benchmarks-{chunk.name} not run: FLASHPROP_GPU_BENCH_SECONDS reached\n"
            say(chunk.log.removeprefix("gpu-check: ").strip())
            return
        env = dict(os.environ)
        if chunk.gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = chunk.gpu
            say(f"benchmarks-{chunk.name} on GPU {chunk.gpu}")
        path = self.parts / f"bench-{chunk.name}.json"
        command = [sys.executable, "-m", "pytest", *chunk_args(chunk.name), "-p", "no:cacheprovider", "-q",
                   "-rs", "--durations=12", "--device", self.cfg.device, "--bench-kernels",
                   self.cfg.bench_kernels, "--bench-subset", self.cfg.bench_subset,
                   "--benchmark-json", str(path)]
        start = time.monotonic()
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        output: list[str] = []
        reader = threading.Thread(target=lambda: output.extend(proc.stdout))
        reader.start()
        chunk.exit = limited.stop(proc, limit)
        reader.join()
        chunk.seconds = time.monotonic() - start
        chunk.log = f"=== benchmarks-{chunk.name}: {shlex.join(command)}\n{''.join(output)}"
        chunk.json = path if path.is_file() and path.stat().st_size else None
        say(f"benchmarks-{chunk.name} exit {chunk.exit} after {chunk.seconds:.0f} s")

    def run(self) -> int:
        """The warm-up (on CUDA), the chunks (the GPUs side by side), ``bench.json`` merged in
        grid order, its table and plot (``python -m benchmarks.report``), ``bench.log``; 1 if a
        chunk failed or was not run."""
        if self.cfg.device == "cuda":
            if "cuda" in self.cfg.bench_kernels.split():
                build_cuda_kernel()
            self.warm_up()
        plan = chunks_per_gpu(self.cfg.bench_chunks, self.cfg.ids)
        chunks = {name: Chunk(name, gpu) for gpu, names in plan for name in names}

        def run_in_turn(names: list[str]) -> None:
            for name in names:
                self.run_chunk(chunks[name])

        threads = [threading.Thread(target=run_in_turn, args=(names,)) for _, names in plan]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        ordered = [chunks[name] for name in self.cfg.bench_chunks]  # grid order, whichever GPU ran them
        log = self.cfg.out / "bench.log"
        log.write_text("".join(c.log for c in ordered))
        found = [c.json for c in ordered if c.json is not None]
        if found:
            merge_benchmarks(found, self.cfg.out / "bench.json")
            command = [sys.executable, "-m", "benchmarks.report", str(self.cfg.out / "bench.json"),
                       "--out", str(self.cfg.out)]
            report = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
            with log.open("a") as f:
                f.write(report.stdout + report.stderr)
        return int(any(c.exit != 0 for c in ordered))


def gate(cfg: Config, parts: Path) -> tuple[int, str]:
    """``ci/bench_gate.py --init-missing`` of ``bench.json`` against the baseline (written, with
    a copy in the output folder, when there was none): its exit status (2: no bench.json) and
    its table."""
    bench = cfg.out / "bench.json"
    if not bench.is_file():
        return 2, f"gate not run: the benchmarks wrote no {bench}"
    had_baseline = cfg.baseline.is_file()
    markdown = parts / "gate.md"
    command = [sys.executable, "ci/bench_gate.py", "--init-missing", str(cfg.baseline), str(bench),
               "--markdown", str(markdown)]
    say(f"gate: {shlex.join(command[1:])}")
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
        code, text = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired:
        code, text = 124, "the gate did not finish in 60 s"
    print(text, end="", flush=True)
    if not had_baseline and cfg.baseline.is_file():
        (cfg.out / cfg.baseline.name).write_text(cfg.baseline.read_text())
        say(f"NOTE: no baseline existed; wrote {cfg.baseline} (copy in {cfg.out}): commit it")
    return code, markdown.read_text() if markdown.is_file() and markdown.stat().st_size else text
