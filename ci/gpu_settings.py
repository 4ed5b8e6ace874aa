"""The settings of ``ci/gpu_check.py``: each a flag, else an environment variable, else a default."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from flashprop.contract.registry import GPU_BENCH_KERNELS, GPU_FUZZ_KERNELS, GPU_PROPERTY_KERNELS
from flashprop.harness.campaign import usable_cores
from flashprop.harness.timebox import parse_duration

ROOT = Path(__file__).resolve().parent.parent
#: Kernels whose property runs take fewer examples by default: Flex compiles each problem's
#: shapes with Inductor.
FEWER_EXAMPLES = {"flex": 10}
#: (name: the flag --name-with-dashes, environment variable, default, help). The defaults of
#: jobs and ids depend on the machine (see :meth:`Config.parse`).
SETTINGS = (
    ("phases", "FLASHPROP_GPU_PHASES", "properties benchmarks gate",
     "phases to run, of: properties fuzz benchmarks gate (they run in that order)"),
    ("kernels", "FLASHPROP_GPU_KERNELS",
     " ".join(f"{k}@{FEWER_EXAMPLES[k]}" if k in FEWER_EXAMPLES else k for k in GPU_PROPERTY_KERNELS),
     "kernels of the property phase; NAME@N: N examples per property instead of the profile's"),
    ("profile", "FLASHPROP_GPU_PROFILE", "gpu", "Hypothesis profile of the property phase"),
    ("files", "FLASHPROP_GPU_FILES", "properties",
     "property files (or folders) of the property and fuzz phases; meta-tests are deselected"),
    ("fuzz_kernels", "FLASHPROP_GPU_FUZZ_KERNELS", " ".join(GPU_FUZZ_KERNELS), "kernels of the fuzz phase"),
    ("fuzz_examples", "FLASHPROP_GPU_FUZZ_EXAMPLES", "2000",
     "examples per property in this call's fuzz run (times its weight), over all its shards"),
    ("fuzz_split", "FLASHPROP_GPU_FUZZ_SPLIT", "4",
     "shards per property test in the fuzz phase, each with its own Hypothesis seed"),
    ("fuzz_time", "FLASHPROP_GPU_FUZZ_TIME", "",
     "time box of each fuzz run (600, 10m: flashprop's --time): every property test gets its share "
     "and passes with the examples it ran, so a call shorter than the counts advances every "
     "property, not only the first the workers took; default: none, each test runs to its count"),
    ("fuzz_seed", "FLASHPROP_GPU_FUZZ_SEED", "",
     "seed of the first shard (the others follow it); default: with a state folder the first seed "
     "none of its calls ran (0 in a new one), else a random one"),
    ("jobs", "FLASHPROP_GPU_JOBS", None,
     "pytest-xdist workers of each property and fuzz run (1: one process, no workers) [CPUs]"),
    ("ids", "FLASHPROP_GPU_IDS", None,
     "GPUs the runs see and the benchmark chunks take in turn [CUDA_VISIBLE_DEVICES's, else all]"),
    ("bench_kernels", "FLASHPROP_GPU_BENCH_KERNELS", " ".join(GPU_BENCH_KERNELS), "kernels to benchmark"),
    ("bench_subset", "FLASHPROP_BENCH_SUBSET", "", "benchmark grid subset ('' for the full grid)"),
    ("bench_chunks", "FLASHPROP_GPU_BENCH_CHUNKS", "",
     "benchmark chunks to run, e.g. 'd128-fp16 memory' (to redo a cut-off one) [the device's all]"),
    ("baseline", "FLASHPROP_GPU_BASELINE", "ci/baselines/h200.json", "baseline of the gate"),
    ("property_timeout", "FLASHPROP_PROPERTY_TIMEOUT", "900",
     "seconds per pytest run of the property and fuzz phases (one run per kernel)"),
    ("pool_seconds", "FLASHPROP_GPU_POOL_SECONDS", "3600",
     "no property or fuzz run starts later than this many seconds after the first one, and none "
     "runs past it (exit 125: not started), nor do the failures' replays; with a state folder each "
     "property run gets at most an even share of what is left, so every kernel advances"),
    ("bench_timeout", "FLASHPROP_BENCH_TIMEOUT", "240",
     "seconds per benchmark chunk; a chunk cut off keeps the benchmarks it finished"),
    ("bench_seconds", "FLASHPROP_GPU_BENCH_SECONDS", "3600",
     "the benchmark phase (compilation included) ends this many seconds after it starts: later "
     "chunks get what is left, none starts with under 30 s (reported as not run)"),
    ("replays", "FLASHPROP_GPU_REPLAYS", "3",
     "each failure's problem is replayed alone this many times, in fresh processes, within the "
     "pool's time (a replay that finds it spent is reported as not run)"),
    ("state", "FLASHPROP_GPU_STATE", "",
     "folder keeping each call's runs under a hash of the sources: a passed property run is not "
     "run again, a cut-off one's passed tests are not either (they are deselected and their "
     "tallies reported), fuzz calls take fresh seeds, leave out the properties kept calls ran to "
     "their count, and the report adds up their tallies"),
    ("device", "FLASHPROP_GPU_DEVICE", "cuda", "device of the run; 'cpu' is for testing this script"),
)
PHASES = ("properties", "fuzz", "benchmarks", "gate")
#: The benchmark chunks per device: head dim (and dtype on the GPU), then the memory checks (and on
#: the GPU the decode and varlen rows).
CHUNKS = {"cuda": ("d64-bf16", "d64-fp16", "d128-bf16", "d128-fp16", "memory", "decode", "varlen"),
          "cpu": ("d64", "d128", "memory")}
#: No run or chunk starts with fewer seconds than this left before its deadline.
LEAST_SECONDS = 30
#: The exit status reported for a run or chunk that was not started (its deadline had passed).
NOT_STARTED = 125
_print_lock = threading.Lock()


class SettingError(ValueError):
    """A setting the GPU check cannot run with (exit 2)."""


def say(line: str) -> None:
    """A progress line on stdout (from any thread)."""
    with _print_lock:
        print(f"gpu-check: {line}", flush=True)


@dataclass
class Config:
    """The settings of one call, parsed and checked (see :data:`SETTINGS`)."""

    out: Path
    phases: list[str]
    kernels: list[tuple[str, int | None]]
    profile: str
    files: list[str]
    fuzz_kernels: list[str]
    fuzz_examples: int
    fuzz_split: int
    fuzz_time: str
    fuzz_seed: int | None
    jobs: int
    ids: list[str]
    ids_given: bool
    bench_kernels: str
    bench_subset: str
    bench_chunks: list[str]
    baseline: Path
    property_timeout: float
    pool_seconds: float
    bench_timeout: float
    bench_seconds: float
    replays: int
    state: Path | None
    device: str

    @classmethod
    def parse(cls, argv: list[str] | None = None, environ: dict[str, str] | None = None,
              description: str = "") -> Config:
        """The settings from the command line, else the environment, else the defaults; raises
        :class:`SettingError` for a value that cannot be used. The output folder is relative to
        the working directory, the other paths (files, baseline, state) to the repository root,
        where the runs start."""
        environ = os.environ if environ is None else environ
        parser = argparse.ArgumentParser(description=description)
        parser.add_argument("out", type=Path, help="output folder")
        for name, variable, default, text in SETTINGS:
            flag = f"--{name.replace('_', '-')}"
            shown = "" if default is None else f" [{default}]"  # else the text says it
            parser.add_argument(flag, dest=name, help=f"{text} (${variable}){shown}",
                                default=environ.get(variable, default))
        raw = vars(parser.parse_args(argv))
        if environ.get("FLASHPROP_GPU_FUZZ_ONLY"):
            raise SettingError("FLASHPROP_GPU_FUZZ_ONLY is gone: with FLASHPROP_GPU_STATE fuzz calls add up, "
                               "each with fresh seeds, so the next call goes on where a cut-off one stopped")
        phases = raw["phases"].split()
        if unknown := set(phases) - set(PHASES):
            raise SettingError(f"unknown phases {sorted(unknown)}: choose among {', '.join(PHASES)}")
        device = raw["device"]
        if device not in CHUNKS:
            raise SettingError(f"FLASHPROP_GPU_DEVICE: cuda or cpu, not {device!r}")
        chunks = raw["bench_chunks"].split() or list(CHUNKS[device])
        if unknown := set(chunks) - set(CHUNKS[device]):
            raise SettingError(f"benchmark chunks {sorted(unknown)}: those of {device} are {CHUNKS[device]}")
        ids = (raw["ids"] or environ.get("CUDA_VISIBLE_DEVICES", "").replace(",", " ")).split()
        if not ids and device == "cuda":
            ids = [str(i) for i in range(_cuda_device_count())]
        return cls(
            out=raw["out"], phases=[p for p in PHASES if p in phases],
            kernels=[parse_kernel(spec) for spec in raw["kernels"].split()], profile=raw["profile"],
            files=raw["files"].split(), fuzz_kernels=raw["fuzz_kernels"].split(),
            fuzz_examples=_number(raw, "fuzz_examples", int, 1),
            fuzz_split=_number(raw, "fuzz_split", int, 1), fuzz_time=_duration(raw, "fuzz_time"),
            fuzz_seed=_number(raw, "fuzz_seed", int, 0) if raw["fuzz_seed"] else None,
            jobs=_number(raw, "jobs", int, 1) if raw["jobs"] else usable_cores(),
            ids=ids, ids_given=bool(raw["ids"]), bench_kernels=raw["bench_kernels"],
            bench_subset=raw["bench_subset"], bench_chunks=[c for c in CHUNKS[device] if c in chunks],
            baseline=ROOT / raw["baseline"], property_timeout=_number(raw, "property_timeout", float, 0),
            pool_seconds=_number(raw, "pool_seconds", float, 0),
            bench_timeout=_number(raw, "bench_timeout", float, 0),
            bench_seconds=_number(raw, "bench_seconds", float, 0), replays=_number(raw, "replays", int, 0),
            state=ROOT / raw["state"] if raw["state"] else None, device=device,
        )


def _setting(name: str) -> str:
    """Setting ``name`` as an error names it: its flag and its variable."""
    variable = next(v for n, v, _, _ in SETTINGS if n == name)
    return f"--{name.replace('_', '-')} / {variable}"


def _number(raw: dict[str, str], name: str, kind: type, least: int) -> int | float:
    """Setting ``name`` as a number of ``kind``, at least ``least``."""
    try:
        value = kind(raw[name])
    except ValueError:
        raise SettingError(f"{_setting(name)}: a number, not {raw[name]!r}") from None
    if value < least:
        raise SettingError(f"{_setting(name)}: at least {least}, not {value}")
    return value


def _duration(raw: dict[str, str], name: str) -> str:
    """Setting ``name``: a duration flashprop's ``--time`` takes (``harness.timebox.parse_duration``),
    or "" (none)."""
    text = raw[name].strip()
    if text:
        try:
            parse_duration(text)
        except ValueError as err:
            raise SettingError(f"{_setting(name)}: {err}") from None
    return text


def parse_kernel(spec: str) -> tuple[str, int | None]:
    """``NAME@N`` -> (NAME, N): N examples per property; ``NAME`` -> (NAME, None): the profile's."""
    name, at, count = spec.rpartition("@")
    if not at:
        return spec, None
    if not count.isdigit() or not name:
        raise SettingError(f"kernel {spec!r}: NAME@N takes a whole number of examples")
    return name, int(count)


def _cuda_device_count() -> int:
    """GPUs torch sees, asked in a child process (this one stays without CUDA)."""
    found = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                           capture_output=True, text=True)
    return int(found.stdout.strip() or 0)
