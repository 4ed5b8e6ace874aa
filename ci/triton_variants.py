#!/usr/bin/env python3
"""How many Triton kernel variants the property suite makes the ``triton`` kernel compile on a
GPU, and how long a sample of them takes to compile for sm_90a (no GPU needed).

On a GPU the suite is bound by compilation: every problem it draws picks compile-time
constants (tiles, dtype, padded head dims and whether they are exact, causality, the variants'
switches: window, softcap, ALiBi, sinks; TMA) and each new combination is a new compilation of
the forward, dK/dV and dQ passes. This script draws problems as the ``gpu`` profile does (dense
ones and, as often each, ones using each declared variant, with the others joining at random
as the variant properties draw them; sizes of the GPU conftest; explicit, fixed or autotuned
tiles as the kernel resolves them), counts the distinct (forward, dK/dV, dQ) variant sets and
compiles a random sample of them with the launch options the kernel would use:

    python ci/triton_variants.py --draws 3000 --sample 40

Counts need seconds; compiling needs about 2-10 s per kernel on one core.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"  # the launch options and tiles of the compiled kernel
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import flashprop.kernels.triton_attention as ta
import torch
from flashprop.contract.problem import Problem
from flashprop.contract.variants import MODIFIERS
from flashprop.harness.strategies import device_sizes, problems
from flashprop.harness.variant_problems import variant_problems
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ci.compile_triton import compile_kernel, compile_meta

POINTER = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32",
           torch.float64: "fp64"}

#: (dtype, (BLOCK_M, BLOCK_N), BLOCK_D, BLOCK_DV, EVEN_D, EVEN_DV, CAUSAL, WINDOW, SOFTCAP,
#: ALIBI, SINKS)
Variant = tuple


def draw(n: int) -> list[Problem]:
    """``n`` problems as the property suite draws them on a GPU (deterministic): dense ones and
    ones using each declared variant (:data:`MODIFIERS`), as likely each."""
    caps = dataclasses.replace(ta.attention.capabilities, devices=frozenset({"cuda"}))
    sizes = device_sizes("cuda")
    drawn: list[Problem] = []
    variants = [variant_problems(caps, v, device="cuda", sizes=sizes) for v in MODIFIERS
                if caps.declares_variant(v)]

    @settings(max_examples=n, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(st.one_of(problems(caps, device="cuda", sizes=sizes), *variants))
    def collect(p: Problem) -> None:
        drawn.append(p)

    collect()
    return drawn


def variant(p: Problem) -> Variant | None:
    """The compile-time constants of ``p``'s launches with explicit or fixed tiles, or None
    when the autotuner picks them (large 16-bit problems) or the tiles are refused."""
    try:
        tiles = ta.resolve_tiles(p.nq, p.nk, p.d, p.dv, p.dtype, p.block_m, p.block_n)
    except NotImplementedError:  # tiles over the shared-memory budget
        return None
    if tiles is None:
        return None
    bd, bdv = ta.padded_head_dim(p.d), ta.padded_head_dim(p.dv)
    causal, window = ta.resolve_band(p.causal, p.window, p.nq, p.nk)  # a window carries causality
    return (p.dtype, tiles, bd, bdv, bd == p.d, bdv == p.dv, causal, window is not None,
            bool(p.softcap), p.alibi is not None, p.sinks is not None)


def compile_seconds(v: Variant) -> float:
    """Seconds to compile the forward (pointer loads), dK/dV and dQ passes of ``v``."""
    dtype, (bm, bn), bd, bdv, even_d, even_dv, causal, window, softcap, alibi, sinks = v
    d, dv = (bd if even_d else bd - 1), (bdv if even_dv else bdv - 1)
    options = ta.explicit_launch_options(bm, bn, d, dv, dtype.itemsize)
    switches = {"window": window, "softcap": softcap, "alibi": alibi, "sinks": sinks}
    meta = {**compile_meta(d, dv, dtype=dtype, causal=causal, **switches), "BLOCK_M": bm, "BLOCK_N": bn}
    return sum(compile_kernel(ta.PASSES[name].plain, meta, options["num_warps"], options["num_stages"],
                              pointer=POINTER[dtype])[0]
               for name in ta.TILED_PASSES)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draws", type=int, default=3000, help="problems to draw")
    parser.add_argument("--sample", type=int, default=0, help="variant sets to compile")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sample")
    args = parser.parse_args()

    variants: dict[Variant, int] = {}
    for p in draw(args.draws):
        v = variant(p)
        if v is not None:
            variants[v] = variants.get(v, 0) + 1
    print(f"triton-variants: {args.draws} problems, {len(variants)} distinct (forward, dK/dV, "
          "dQ) variant sets with explicit or fixed tiles")
    if not args.sample:
        return 0
    sample = random.Random(args.seed).sample(sorted(variants, key=repr), args.sample)
    total = 0.0
    for v in sample:
        seconds = compile_seconds(v)
        total += seconds
        dtype, tiles, bd, bdv, even_d, even_dv, causal, window, softcap, alibi, sinks = v
        on = [name for name, flag in (("window", window), ("softcap", softcap), ("alibi", alibi),
                                      ("sinks", sinks)) if flag]
        print(f"  {POINTER[dtype]} tiles {tiles} BLOCK_D {bd}/{bdv} even {even_d}/{even_dv} "
              f"causal {causal} variants {'+'.join(on) or 'none'}: {seconds:.1f} s")
    print(f"triton-variants: {len(sample)} sets compiled in {total:.0f} s "
          f"({total / len(sample):.1f} s per set)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
