#!/usr/bin/env python3
"""How a fuzz campaign scales with workers: examples per second of ``flashprop fuzz`` on 1, 2,
4, ... workers, as a markdown table.

    python ci/campaign_scaling.py KERNEL --device cuda --workers 1 2 --examples 64
    python ci/campaign_scaling.py ref-blocked --device cpu --workers 1 2 4 8 16 --examples 32

Weak scaling: W workers run W shards of every property (``--shards W``, shard i drawing from
seed ``SEED + i``) and ``EXAMPLES`` examples per property per worker, so each worker does the
same work as the lone worker does; a worker's fixed costs (starting, collecting, autotuning
its keys) are paid by every worker at once. Examples per second = examples run (from the
run's ``--json``) / wall time of the command. On CUDA, W workers see the first W GPUs of
``--gpus`` (``CUDA_VISIBLE_DEVICES``): worker ``gwI`` takes GPU ``I mod count``.

Compilation is not a worker's fixed cost: a kernel compiled by an earlier run comes from the
on-disk cache (Triton's), one compiled inside a timed run is paid once, by whichever worker
gets there first. So unless ``--no-warm-up``, an untimed run of the largest worker count, same
seed, comes first: it draws every problem of the timed runs (shard i's problems do not depend
on how many shards there are) and compiles every kernel they need.

The table: workers, examples, wall seconds, examples/s, speedup over the first row, efficiency
(speedup / worker ratio) and efficiency per step (examples/s ratio / worker ratio between
consecutive rows). Exit status 1 if a run failed (a failure is a finding: see its output).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def fuzz_command(kernel: str, device: str, workers: int, examples: int, seed: int,
                 properties: list[str], json_path: str) -> list[str]:
    """``flashprop fuzz`` of ``kernel`` on ``workers`` xdist workers, as many shards, ``examples``
    per property per worker, tallies to ``json_path``."""
    return [sys.executable, "-m", "flashprop.cli", "fuzz", kernel, "--device", device,
            "-n", str(workers), "--max-examples", str(examples * workers), "--json", json_path,
            "--properties", *properties, "--", "--shards", str(workers), "--hypothesis-seed", str(seed)]


def run(command: list[str], env: dict[str, str], log: Path) -> tuple[int, float]:
    """Run ``command`` from the repository root, its output appended to ``log``; (exit status,
    wall seconds)."""
    start = time.monotonic()
    with log.open("a") as out:
        out.write(f"=== {' '.join(command)}\n")
        out.flush()
        code = subprocess.call(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    return code, time.monotonic() - start


def examples_run(json_path: str) -> int:
    """Examples the run's tallies count (passed, refused and failed)."""
    return sum(r["passed"] + r["refused"] + r["failed"] for r in json.loads(Path(json_path).read_text()))


def table(rows: list[tuple[int, int, float]]) -> list[str]:
    """Markdown rows of (workers, examples, wall seconds), with the derived columns."""
    lines = ["| workers | examples | wall s | examples/s | speedup | efficiency | per step |",
             "|---|---|---|---|---|---|---|"]
    w0, _, _ = rows[0]
    rate0 = rows[0][1] / rows[0][2]
    previous = None
    for workers, examples, seconds in rows:
        rate = examples / seconds
        speedup = rate / rate0
        step = "-" if previous is None else f"{(rate / previous[1]) / (workers / previous[0]):.2f}"
        lines.append(f"| {workers} | {examples:,} | {seconds:.1f} | {rate:.1f} | {speedup:.2f} | "
                     f"{speedup / (workers / w0):.2f} | {step} |")
        previous = (workers, rate)
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kernel", help="kernel spec, as flashprop fuzz takes it")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="worker counts, ascending")
    parser.add_argument("--examples", type=int, default=32, help="examples per property per worker")
    parser.add_argument("--seed", type=int, default=1, help="seed of shard 0")
    parser.add_argument("--properties", nargs="+", default=["golden", "metamorphic"],
                        help="property modules (flashprop fuzz --properties)")
    parser.add_argument("--gpus", default=os.environ.get("CUDA_VISIBLE_DEVICES", ""),
                        help="GPU ids to use, comma-separated [CUDA_VISIBLE_DEVICES, else 0,1,...]")
    parser.add_argument("--no-warm-up", dest="warm_up", action="store_false",
                        help="time the runs without compiling their kernels first")
    parser.add_argument("--log", default=None, help="file for the runs' output [a temporary file]")
    ns = parser.parse_args(argv)
    if ns.workers != sorted(ns.workers) or ns.workers[0] < 1:
        parser.error("--workers: positive counts in ascending order")
    gpus = [g for g in ns.gpus.split(",") if g] or [str(i) for i in range(max(ns.workers))]
    if ns.device == "cuda" and len(gpus) < max(ns.workers):
        print(f"campaign-scaling: note: {max(ns.workers)} workers share {len(gpus)} GPUs", file=sys.stderr)
    if ns.log is None:
        handle, ns.log = tempfile.mkstemp(prefix="campaign-scaling-", suffix=".log")
        os.close(handle)
    log = Path(ns.log)
    env = dict(os.environ, OMP_NUM_THREADS="1")

    def env_for(workers: int) -> dict[str, str]:
        if ns.device != "cuda":
            return env
        return dict(env, CUDA_VISIBLE_DEVICES=",".join(gpus[:min(workers, len(gpus))]))

    with tempfile.TemporaryDirectory(prefix="campaign-scaling-") as tmp:
        if ns.warm_up:
            top = ns.workers[-1]
            command = fuzz_command(ns.kernel, ns.device, top, ns.examples, ns.seed, ns.properties,
                                   f"{tmp}/warm-up.json")
            code, seconds = run(command, env_for(top), log)
            print(f"campaign-scaling: warm-up on {top} workers: exit {code} after {seconds:.0f} s")
        rows, failed = [], False
        for workers in ns.workers:
            path = f"{tmp}/w{workers}.json"
            command = fuzz_command(ns.kernel, ns.device, workers, ns.examples, ns.seed, ns.properties, path)
            code, seconds = run(command, env_for(workers), log)
            failed |= code != 0
            rows.append((workers, examples_run(path) if Path(path).exists() else 0, seconds))
            print(f"campaign-scaling: {workers} workers: exit {code}, {rows[-1][1]} examples "
                  f"in {seconds:.1f} s")
    print(f"\n`flashprop fuzz {ns.kernel} --device {ns.device} -n W --max-examples {ns.examples}*W --json "
          f"W.json --properties {' '.join(ns.properties)} -- --shards W --hypothesis-seed {ns.seed}`, "
          f"W = {', '.join(map(str, ns.workers))}{', after a warm-up run' if ns.warm_up else ''}:\n")
    print("\n".join(table(rows)))
    print(f"\ncampaign-scaling: the runs' output is in {log}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
