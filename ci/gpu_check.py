#!/usr/bin/env python3
"""The whole GPU check on a CUDA machine with torch and triton (no network, no tox).

    python ci/gpu_check.py OUTDIR          # settings: flags or FLASHPROP_GPU_* (--help lists them)

Phases, in this order, those that ``--phases`` / ``FLASHPROP_GPU_PHASES`` names
[properties benchmarks gate]:

- ``properties``: the property suite (``gpu`` profile) on each kernel, one pytest run per kernel
  over JOBS pytest-xdist workers (``-n JOBS --dist load``): worker ``gwI`` takes GPU ``I mod
  count``, the workers' tallies are merged into one table, a worker that dies (a lost CUDA
  context) is replaced and the example it was running is reported as a failure
  (``harness/campaign.py``); a kernel that breaks its workers' CUDA context does not touch
  the other kernels' runs. ``NAME@N``: N examples per property (times its weight).
- ``fuzz``: the ``fuzz`` profile on each fuzz kernel, one pytest-xdist run per kernel, each
  property test split into FLASHPROP_GPU_FUZZ_SPLIT shards of distinct Hypothesis seeds, so the
  workers fuzz one property in different parts of the space (``ci/gpu_runs.py``); with
  FLASHPROP_GPU_FUZZ_TIME each run is time-boxed (flashprop's ``--time``: every property test
  gets its share, so a short call advances all of them). With
  ``FLASHPROP_GPU_STATE`` the calls add up: each takes seeds no earlier call ran, leaves out
  the properties that earlier calls ran to their count (``--skip-property``), and the report
  adds the table of every call (a campaign longer than one device call, or spread over machines
  that carry the folder along).
- ``benchmarks``: the benchmark grid in chunks after a parallel compile warm-up, the GPUs in
  turn, under a deadline; ``bench.json``, its table and plot (``ci/gpu_bench.py``).
- ``gate``: ``ci/bench_gate.py`` against the baseline, written (and said so) when missing.

Each failure of the property and fuzz phases is replayed alone in fresh processes
(``ci/replay_failures.py``): reproducible or flaky, within what is left of the pool (replays that
find it spent are reported as not run, so a call's own limit does not cut the report). A pytest
run that reaches its time limit is interrupted as Ctrl-C would (``ci/limited.py``; its xdist
workers wind down), so it still prints the table of the examples it ran, which the report counts;
its phase fails.

OUTDIR gets at most 8 files: ``report.md`` (the phases with exit codes and seconds, the merged
per-property tables, the gate table, the benchmark table), ``properties.log`` and ``fuzz.log``
(every pytest run's output), ``bench.json``, ``bench.md``, ``bench.png``, ``bench.log``, and the
new baseline when one was written; ``report.md`` is written after each phase, and on Ctrl-C (or
a time limit's SIGINT) with the phase that was running reported as exit 130. Exit status: 0 all
passed, 1 a phase failed or was interrupted, 2 cannot run (no CUDA device, a setting it cannot use).
"""

from __future__ import annotations

import random
import subprocess
import sys
import tempfile
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from gpu_bench import BenchPhase, gate
from gpu_runs import State, build_cuda_kernel, fuzz_runs, property_runs, run_phase, sources_hash
from gpu_settings import PHASES, ROOT, Config, SettingError, say

#: The exit status a phase is reported with when the driver was interrupted while it ran.
INTERRUPTED = 130


def device_line(device: str) -> str:
    """The GPU and the versions of torch and triton; SettingError when CUDA cannot run here."""
    if device == "cpu":
        versions = []
        for package in ("torch", "triton"):
            try:
                versions.append(f"{package} {version(package)}")
            except PackageNotFoundError:
                versions.append(f"no {package}")
        return f"no GPU (FLASHPROP_GPU_DEVICE=cpu), {', '.join(versions)}"
    probe = ("import pytest_benchmark, torch, triton\n"
             "assert torch.cuda.is_available(), f'torch {torch.__version__} sees no CUDA device'\n"
             "print(torch.cuda.get_device_name(), f'torch {torch.__version__}',"
             " f'triton {triton.__version__}', sep=', ')")
    found = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    if found.returncode != 0:
        reason = (found.stderr.strip().splitlines() or ["?"])[-1]
        raise SettingError(f"cannot run here: {reason} (needs torch with CUDA, triton and pytest-benchmark; "
                           "without a GPU: FLASHPROP_GPU_DEVICE=cpu, or the tox env 'bench')")
    return found.stdout.strip()


def report_text(cfg: Config, device: str, phases: dict[str, tuple[int, float]], sections: dict[str, str],
                gate_text: str | None) -> str:
    """report.md: the phase table, what ran, each test phase's tables, the gate, the benchmarks."""
    lines = ["# flashprop gpu-check", "", device, "", "| phase | exit | seconds |", "|---|---|---|"]
    lines += [f"| {name} | {code} | {seconds:.0f} |" for name, (code, seconds) in phases.items()]
    lines.append("")
    workers = "one process" if cfg.jobs == 1 else f"{cfg.jobs} xdist workers"
    if "properties" in phases:
        kernels = " ".join(k if n is None else f"{k}@{n}" for k, n in cfg.kernels)
        lines.append(f"property kernels: {kernels} (profile {cfg.profile}, {workers} per kernel)")
    if "fuzz" in phases:
        lines.append(f"fuzz kernels: {' '.join(cfg.fuzz_kernels)} ({cfg.fuzz_examples} examples per property "
                     f"in {cfg.fuzz_split} shards of distinct seeds, {workers} per kernel)")
    if "benchmarks" in phases:
        lines.append(f"benchmark kernels: {cfg.bench_kernels} (subset {cfg.bench_subset or 'full grid'}; "
                     f"chunks {' '.join(cfg.bench_chunks)})")
    for phase, text in sections.items():
        lines += ["", f"## {phase}: examples per property (all runs), exit status per run", "", "```", text,
                  "```"]
    if gate_text is not None:
        baseline = cfg.baseline.relative_to(ROOT) if cfg.baseline.is_relative_to(ROOT) else cfg.baseline
        lines += ["", f"## Bench gate against {baseline}", "", gate_text.rstrip()]
    table = cfg.out / "bench.md"
    if table.is_file():  # without its title
        lines += ["", *table.read_text().splitlines()[1:]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None, environ: dict[str, str] | None = None) -> int:
    """Run the phases asked for (settings: ``argv``, else ``environ``, default ``os.environ``);
    the exit status (0 passed, 1 a phase failed, 2 cannot run)."""
    try:
        cfg = Config.parse(argv, environ, description=__doc__.splitlines()[0])
        device = device_line(cfg.device)
        state = State(cfg.state, sources_hash()) if cfg.state is not None else None
        runs = {"properties": property_runs(cfg) if "properties" in cfg.phases else []}
        if "fuzz" in cfg.phases:
            base = (cfg.fuzz_seed if cfg.fuzz_seed is not None else state.next_seed() if state is not None
                    else random.SystemRandom().randrange(2**31))
            complete = state.complete(cfg.fuzz_examples) if state is not None else None
            runs["fuzz"] = fuzz_runs(cfg, base, complete)
            if state is not None:
                state.check_seeds(runs["fuzz"])
    except SettingError as err:
        print(f"gpu-check: {err}", file=sys.stderr)
        return 2
    say(device)
    if state is not None:
        say(f"runs kept in {state.folder}")
    cfg.out.mkdir(parents=True, exist_ok=True)
    cfg.out = cfg.out.resolve()
    phases: dict[str, tuple[int, float]] = {}
    sections: dict[str, str] = {}
    gate_text = None
    if cfg.device == "cuda" and "cuda" in [run.kernel for phase_runs in runs.values() for run in phase_runs]:
        build_cuda_kernel()
    deadline = time.monotonic() + cfg.pool_seconds
    report = cfg.out / "report.md"
    current, start = None, time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        parts = Path(tmp)
        try:
            for current in [phase for phase in PHASES if phase in cfg.phases]:
                start = time.monotonic()
                if current in ("properties", "fuzz"):
                    code, sections[current] = run_phase(cfg, current, runs[current], parts, state, deadline)
                elif current == "benchmarks":
                    code = BenchPhase(cfg, parts).run()
                else:
                    code, gate_text = gate(cfg, parts)
                phases[current] = (code, time.monotonic() - start)
                say(f"phase {current} exit {code} after {phases[current][1]:.0f} s")
                # after each phase, so that a driver killed later leaves the phases it finished
                report.write_text(report_text(cfg, device, phases, sections, gate_text))
        except KeyboardInterrupt:  # Ctrl-C, or a time limit's SIGINT: the report of what finished
            if current is not None:
                phases[current] = (INTERRUPTED, time.monotonic() - start)
                say(f"phase {current} interrupted after {phases[current][1]:.0f} s")
        report.write_text(report_text(cfg, device, phases, sections, gate_text))
    say(f"report in {cfg.out / 'report.md'}")
    failed = [f"{name} exit {code}" for name, (code, _) in phases.items() if code != 0]
    say(f"FAILED ({', '.join(failed)})" if failed else "all phases passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
