"""What the ``triton`` kernel's autotuners measured on one benchmark configuration (GPU only).

    python ci/triton_tuning.py --d 128 --n 2048 --dtype bf16 --causal [--mode fwd+bwd]

Runs the kernel once on the benchmark grid's problem (``benchmarks.grid.Config``: B*N = 16k
tokens, H*D = 2048), which tunes its passes, then prints per pass every configuration the
autotuner timed (Triton's ``do_bench``: median, 20th and 80th percentile), the one it picked,
and the same configurations timed again by the benchmarks' own protocol
(``benchmarks.timing.median_seconds``: L2 flush, a spin over the launch latency, CUDA events)
with each pass pinned in turn to one configuration, the others left at their picks. A pick the
two protocols disagree on, or a spread far wider than the pick's, says where a slow row of the
benchmark table comes from. ``--tma both`` (the default) does all of it twice on the same GPU,
with the forward's TMA descriptors and with pointer loads (``FLASHPROP_TRITON_TMA=0``, read at
every call; TMA is an autotuning key, so each is tuned on its own). ``--json PATH`` writes the
numbers too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.grid import LONG_DTYPE, Config
from benchmarks.timing import RoundSetup, median_seconds


def _describe(cfg) -> str:
    kw = cfg.kwargs
    return f"{kw['BLOCK_M']}x{kw['BLOCK_N']} w{cfg.num_warps} s{cfg.num_stages}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--d", type=int, default=128)
    parser.add_argument("--n", type=int, default=2048)
    parser.add_argument("--dtype", choices=sorted(LONG_DTYPE), default="bf16")
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--mode", choices=("fwd", "fwd+bwd"), default="fwd")
    parser.add_argument("--tma", choices=("on", "off", "both"), default="both",
                        help="the forward's loads: TMA descriptors, pointers, or each in turn")
    parser.add_argument("--json", type=Path, help="also write the timings here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("triton_tuning: needs a CUDA GPU (the autotuner runs only there)", file=sys.stderr)
        return 2

    from flashprop.contract.registry import load_kernel

    from benchmarks.bench_attention import make_call

    name = LONG_DTYPE[args.dtype]
    cfg = Config(n=args.n, d=args.d, causal=args.causal, dtype=name, mode=args.mode,
                 tokens=16384, hidden=2048, device="cuda")
    call = make_call(load_kernel("triton"), cfg)
    setup = RoundSetup("cuda")
    report: dict[str, dict[str, list[dict]]] = {}
    print(f"{cfg.label}: B={cfg.b} H={cfg.h}, {cfg.flops / 1e9:.1f} GFLOP per call")
    for tma in ("on", "off") if args.tma == "both" else (args.tma,):
        os.environ["FLASHPROP_TRITON_TMA"] = "1" if tma == "on" else "0"
        report[f"tma-{tma}"] = _probe(call, cfg, setup, tma, args.mode)
    if args.json:
        args.json.write_text(json.dumps({"config": cfg.label, "runs": report}, indent=1))
    return 0


def _probe(call, cfg: Config, setup: RoundSetup, tma: str, mode: str) -> dict[str, list[dict]]:
    """Tune every pass (one call), then time each pass pinned to each configuration it timed."""
    import flashprop.kernels.triton_attention as ta

    names = ta.TILED_PASSES if mode == "fwd+bwd" else ("fwd",)
    tuners = {name: ta.PASSES[name].tuned for name in names}
    known = {name: set(tuner.cache) for name, tuner in tuners.items()}
    call()  # tunes the passes this problem has not tuned yet
    torch.cuda.synchronize()
    report: dict[str, list[dict]] = {}
    for pass_name, tuner in tuners.items():
        new = set(tuner.cache) - known[pass_name]
        if len(new) != 1:  # fixed tiles, or tuned by the previous run (no TMA key)
            print(f"\nTMA {tma}, {pass_name}: no new tuning (fixed tiles, or tuned above)")
            continue
        (key,) = new
        picked = tuner.cache[key]
        rows = []
        for config, timing in sorted(tuner.configs_timings.items(), key=lambda kv: kv[1][0]):
            tuner.cache[key] = config  # pin this pass to the configuration
            seconds = median_seconds(call, "cuda", setup)
            rows.append({
                "config": _describe(config), "picked": config is picked,
                "do_bench_ms": list(timing), "protocol_ms": 1e3 * seconds,
                "call_tflops": cfg.flops / seconds / 1e12,
            })
        tuner.cache[key] = picked
        report[pass_name] = rows
        print(f"\nTMA {tma}, {pass_name} (key {key}):")
        print("  config            do_bench ms (p50 [p20, p80])   whole call ms   call TFLOP/s")
        for r in rows:
            p50, p20, p80 = r["do_bench_ms"]
            mark = " <- picked" if r["picked"] else ""
            print(f"  {r['config']:<17} {p50:8.3f} [{p20:.3f}, {p80:.3f}]      "
                  f"{r['protocol_ms']:10.3f}   {r['call_tflops']:8.1f}{mark}")
    return report


if __name__ == "__main__":
    sys.exit(main())
