#!/usr/bin/env python3
"""Instructions per key tile of the ``triton`` kernel's inner loops, read from the SASS of an
sm_90a build (no GPU needed: ``ci/compile_triton.py``'s compiler call and the ``cuobjdump`` in
Triton's wheel).

    python ci/sass_loop.py fwd                     # dense against softcap, d = 128, bf16
    python ci/sass_loop.py bwd_dq --variants alibi sinks

Compiles pass ``PASS`` (``fwd``, ``bwd_dkdv``, ``bwd_dq``) at its first autotuning config for a
contiguous d = 128 bf16 problem without a mask, once dense and once per variant named, and prints
for each backward branch of the SASS (a loop over key tiles: the masked and the unmasked one)
its instruction count and the most frequent opcodes. A static count: what one trip through the
loop issues per thread, not a time; the score tile has BLOCK_M x BLOCK_N / (32 x num_warps)
elements per thread.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import compile_triton as ct
import flashprop.kernels.triton_attention as ta
import triton

CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
_INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]+)\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")
_BRANCH = re.compile(r"/\*([0-9a-f]+)\*/\s+(?:@!?U?P\w+\s+)?BRA\s+0x([0-9a-f]+)")


def sass(fn, constants: dict, num_warps: int, num_stages: int) -> str:
    """The SASS of ``fn`` compiled for sm_90a as Triton's launcher specialises a contiguous problem."""
    kernel = ct.compiled(fn, constants, num_warps, num_stages, specialize=True)
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "kernel.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        return subprocess.run([str(CUOBJDUMP), "-sass", str(cubin)], capture_output=True, text=True,
                              check=True).stdout


def loops(text: str) -> list[collections.Counter]:
    """Opcode counts of each loop: the instructions between a backward branch and its target."""
    lines = text.splitlines()
    spans = [(int(m.group(2), 16), int(m.group(1), 16)) for m in map(_BRANCH.search, lines)
             if m and int(m.group(2), 16) < int(m.group(1), 16)]
    counts = []
    for lo, hi in spans:
        found = collections.Counter(m.group(2) for m in map(_INSTRUCTION.match, lines)
                                    if m and lo <= int(m.group(1), 16) <= hi)
        counts.append(found)
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pass_name", choices=ta.TILED_PASSES)
    parser.add_argument("--variants", nargs="*", default=["softcap"], choices=["softcap", "alibi", "sinks"])
    args = parser.parse_args()
    p = ta.PASSES[args.pass_name]
    config = p.configs[0]
    per_thread = config.kwargs["BLOCK_M"] * config.kwargs["BLOCK_N"] // (32 * config.num_warps)
    print(f"{args.pass_name}: d = 128 bf16, no mask, {config.kwargs} w{config.num_warps} "
          f"s{config.num_stages}: {per_thread} scores per thread per key tile")
    for variant in ["dense", *args.variants]:
        flags = {} if variant == "dense" else {variant: True}
        meta = {**ct.compile_meta(128, 128, causal=False, **flags), **config.kwargs}
        for i, found in enumerate(loops(sass(p.jit, meta, config.num_warps, config.num_stages))):
            top = ", ".join(f"{op} {n}" for op, n in found.most_common(8))
            print(f"  {variant:8s} loop {i + 1}: {sum(found.values())} instructions ({top})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
