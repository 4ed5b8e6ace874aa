#!/usr/bin/env python3
"""Compile the ``triton`` kernel for Hopper (sm_90a) on a machine without a GPU.

The interpreter that runs the property suite on the CPU never compiles anything, so a change
that breaks compilation (a constexpr used as a runtime value, a layout Triton cannot lower, a
shared-memory overflow) would only show on a GPU. ``triton.compile`` with an explicit target
runs the whole pipeline down to a cubin with the ptxas that ships in the Triton wheel, no GPU
needed. Compiled here: the four unspecialised kernels (explicit and fixed tiles) for an even head
dim (64), a masked wide one (200) and a narrow one (17 / 16), with the launch options the kernel
itself would use for 64 x 64 tiles, the forward also reading through TMA descriptors where the
rows are 16-byte multiples; the three passes with 64-bit row offsets (``WIDE_ROWS``) at d = 64;
the three passes in fp32 at d = 64 (IEEE dots, the slowest to build); the first
autotuning config of each tuned kernel at d = 128 (the forward with and without TMA)
specialised as Triton's launcher would for a contiguous problem (unit strides constant, the
rest multiples of 16); the variants (window, softcap, ALiBi, sinks: :func:`variant_cases`);
varlen, alone and with every variant (:func:`varlen_cases`); and the KV-cache decode kernels
(:func:`decode_cases`), and the value checks that run beside those two (:func:`check_cases`).
Also checks that the forward's
autotuner ignores TRITON_CACHE_AUTOTUNING and that every autotuning key names a parameter.
Prints shared memory per kernel; exits 1 on the first failure.

    python ci/compile_triton.py
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"  # the tox env sets 1; compilation needs the real JIT
# As a user may set it: the forward's autotuner must still not use Triton's on-disk autotuning
# cache, which drops its configs (they have a pre_hook) and fails in the next process.
os.environ["TRITON_CACHE_AUTOTUNING"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import flashprop.kernels.triton_attention as ta
import flashprop.kernels.triton_attention_kernels as tak
import flashprop.kernels.triton_checks as checks
import torch
import triton
from flashprop.harness.campaign import usable_cores
from flashprop.kernels.triton_attention_launch import _TUNING_KEY
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

TARGET = GPUTarget("cuda", 90, 32)
#: Pointer parameters of the kernels; the fp32 ones hold lse, Delta and dlse.
POINTERS = {"Q", "K", "V", "Out", "LSE", "DO", "DQ", "DK", "DV", "LSE2", "DELTA", "DLSE", "Slopes", "Sinks",
            "Descale", "Scales", "Table", "Lengths", "OPart", "LSEPart"}
FP32_POINTERS = {"LSE", "LSE2", "DELTA", "DLSE", "OPart", "LSEPart"}
#: The variants' tensors: float32 whatever the inputs' dtype (docs/variants.md); FP8's descales
#: and an FP8 cache's scales.
ALWAYS_FP32_POINTERS = {"Slopes", "Sinks", "Descale", "Scales"}
#: The int32 index tensors: a varlen launch's cu_seqlens, the decode kernels' block table and
#: cache lengths.
INDEX_POINTERS = {"CuSeq", "CuSeqQ", "CuSeqK", "CuQ", "CuK", "Table", "Lengths", "TileMap", "Lens", "Flags"}
FP64_SCALARS = {"qk_scale", "sm_scale", "softcap2", "drop_scale"}
#: The dropout's seed words and threshold (annotated int64 in the kernels).
INT64_SCALARS = {"seed_lo", "seed_hi", "drop_threshold"}
#: FP8 inputs (q, k, v) of the forward, whose o is bf16; of decode with an FP8 cache (FP8_CACHE),
#: the cache alone (q and o bf16).
FP8_INPUTS = {"Q", "K", "V"}
FP8_CACHE_INPUTS = {"K", "V"}
WINDOW_SIDES = {"win_left", "win_right"}
DTYPE = torch.bfloat16


def _boxes(constants: dict) -> dict[str, tuple[int, int]]:
    """The forward's TMA descriptor boxes (rows, columns) when constants["TMA"] is set (FP8: V^T's)."""
    if not constants.get("TMA"):
        return {}
    bm, bn = constants["BLOCK_M"], constants["BLOCK_N"]
    bd, bdv = constants["BLOCK_D"], constants["BLOCK_DV"]
    v_box = (bdv, bn) if constants.get("FP8") else (bn, bdv)  # FP8 reads V^T
    return {"Q": (bm, bd), "K": (bn, bd), "V": v_box, "Out": (bm, bdv)}


def _signature(fn, constants: dict, pointer: str = "bf16") -> dict[str, str]:
    """Triton's type string per parameter: pointers (to ``pointer`` elements; an FP8 ``pointer``,
    fp8e4nv or fp8e5, is q's, k's and v's, o bf16) or tensor descriptors, fp64 scales, the
    dropout's int64 words, constexprs, else i32."""
    out = {}
    boxes = _boxes(constants)
    fp8 = pointer.startswith("fp8")
    fp8_names = FP8_CACHE_INPUTS if constants.get("FP8_CACHE") else FP8_INPUTS
    for name in fn.arg_names:
        element = pointer if not fp8 or name in fp8_names else "bf16"
        if name in constants:
            out[name] = "constexpr"
        elif name in boxes:
            out[name] = "tensordesc<{}[1, 1, {}, {}]>".format(element, *boxes[name])
        elif name in INDEX_POINTERS:
            out[name] = "*i32"
        elif name in POINTERS:
            # lse, Delta and dlse are fp32 buffers, fp64 in an fp64 problem
            wide = "fp64" if pointer == "fp64" else "fp32"
            if name in ALWAYS_FP32_POINTERS:
                out[name] = "*fp32"
            elif constants.get("COMBINE") and name in ("Out", "LSE"):  # decode's split partials
                out[name] = f"*{wide}"
            else:
                out[name] = f"*{wide}" if name in FP32_POINTERS else f"*{element}"
        elif name in FP64_SCALARS:
            out[name] = "fp64"
        elif name in INT64_SCALARS:
            out[name] = "i64"
        else:
            out[name] = "i32"
    return out


def _specialized(fn, constants: dict) -> tuple[dict, dict]:
    """Constants and attributes as Triton's launcher makes them for a contiguous problem with
    D = 128, N = 4096, MHA: unit strides (and GROUP = 1) become the constant 1, the unit strides
    of the ALiBi slopes and sinks too when those are on; a window's sides are not known; every
    other integer and every pointer is known to be a multiple of 16 (elements / bytes)."""
    constants = dict(constants)
    attrs = {}
    boxes = _boxes(constants)
    for i, name in enumerate(fn.arg_names):
        if name in constants or name in FP64_SCALARS or name in INT64_SCALARS or name in boxes:
            continue
        unit = {"stride_ah": constants.get("ALIBI"), "stride_z": constants.get("SINKS")}.get(name)
        if name == "GROUP" or (name.startswith("stride_") and name.endswith("d")) or unit:
            constants[name] = 1  # with the variant on, its contiguous (Hq,) tensor's stride
        elif name in WINDOW_SIDES and constants.get("WINDOW"):
            continue  # a window's sides are any integers
        else:
            attrs[(i,)] = [["tt.divisibility", 16]]  # the variants' unused arguments are 0
    return constants, attrs


def compiled(fn, constants: dict, num_warps: int, num_stages: int, specialize: bool = False,
             pointer: str = "bf16"):
    """JIT function ``fn`` (a :class:`~kernels.triton_attention.Pass`'s ``jit`` or ``plain``)
    compiled for sm_90a with these compile-time ``constants`` (those it does not take are
    dropped), warps and stages, ``pointer`` elements (bf16, fp16, fp32, fp64) and, when
    ``specialize``, the launcher's specialisation for a contiguous problem: Triton's compiled
    kernel (its ``asm["cubin"]``, its ``metadata``)."""
    constants = {k: v for k, v in constants.items() if k in fn.arg_names}
    attrs = None
    if specialize:
        constants, attrs = _specialized(fn, constants)
    return triton.compile(
        ASTSource(fn, _signature(fn, constants, pointer), constants, attrs),
        target=TARGET,
        options={"num_warps": num_warps, "num_stages": num_stages},
    )


def compile_kernel(fn, constants: dict, num_warps: int, num_stages: int,
                   specialize: bool = False, pointer: str = "bf16") -> tuple[float, int]:
    """:func:`compiled`'s compilation, timed: (seconds, bytes of shared memory)."""
    start = time.perf_counter()
    kernel = compiled(fn, constants, num_warps, num_stages, specialize, pointer)
    return time.perf_counter() - start, kernel.metadata.shared


#: Every variant switch on (the forward's SINKS included; the backward kernels drop it).
ALL_VARIANTS = {"window": True, "softcap": True, "alibi": True, "sinks": True}


def compile_meta(d: int, dv: int, tma: bool = False, dtype: torch.dtype = DTYPE,
                 causal: bool = True, window: bool = False, softcap: bool = False,
                 alibi: bool = False, sinks: bool = False, varlen: bool = False,
                 dropout: bool = False, fp8: bool = False) -> dict:
    """The kernel's own compile-time parameters for a problem of these head dims, dtype (bf16),
    causality (causal) and variants (none; ``varlen``: a pack whose longest sequences are as
    long; ``dropout``; ``fp8``: FP8 inputs, forward only) (``tma``: the forward reads through tensor
    descriptors). A window carries causality itself (``kernels.triton_attention.resolve_band``),
    so ``window`` turns CAUSAL off."""
    q = torch.empty((1, 1, 4096, d), dtype=dtype, device="meta")
    v = torch.empty((1, 1, 4096, dv), dtype=dtype, device="meta")
    meta = ta.launch_meta(q, v, causal=causal and not window, window=window, softcap=softcap,
                          alibi=alibi, dropout=dropout, varlen=(4096, 4096) if varlen else None)
    return {**{k: v for k, v in meta.items() if k not in ("head_dim", "head_dim_v")}, "TMA": tma,
            "SINKS": sinks, "FP8": fp8}


def variant_cases(passes: dict) -> list[tuple]:
    """The variants' code (window, softcap, ALiBi, sinks): every pass with all of them on, as
    explicit tiles, TMA, an autotuning config and fp64 (whose tanh and constants are fp64)
    compile them; and the forward with each score variant alone (the branches that all-on
    leaves out)."""
    cases = []
    tiles = {"BLOCK_M": 64, "BLOCK_N": 64}
    options = ta.explicit_launch_options(64, 64, 64, 64, DTYPE.itemsize)
    every = compile_meta(64, 64, **ALL_VARIANTS)
    for name, p in passes.items():
        cases.append((f"{name} d=64 64x64 all variants, unspecialised", p.plain, {**every, **tiles}, options,
                      False, "bf16"))
    cases.append(("fwd d=64 64x64 TMA all variants, unspecialised", passes["fwd"].plain,
                  {**compile_meta(64, 64, tma=True, **ALL_VARIANTS), **tiles}, options, False, "bf16"))
    for name, p in passes.items():
        config = p.configs[0]
        meta = {**compile_meta(128, 128, **ALL_VARIANTS), **config.kwargs}
        options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
        cases.append((f"{name} d=128 autotune config {config.kwargs} all variants, specialised", p.jit,
                      meta, options, True, "bf16"))
    wide = {"BLOCK_M": 32, "BLOCK_N": 32}  # fp64's fixed tiles
    options = ta.explicit_launch_options(32, 32, 64, 64, torch.float64.itemsize)
    every = compile_meta(64, 64, dtype=torch.float64, **ALL_VARIANTS)
    for name, p in passes.items():
        cases.append((f"{name} d=64 fp64 32x32 all variants, unspecialised", p.plain, {**every, **wide},
                      options, False, "fp64"))
    options = ta.explicit_launch_options(64, 64, 64, 64, DTYPE.itemsize)
    for variant in ("softcap", "alibi"):
        cases.append((f"fwd d=64 64x64 {variant} alone, unspecialised", passes["fwd"].plain,
                      {**compile_meta(64, 64, **{variant: True}), **tiles}, options, False, "bf16"))
    return cases


def dropout_fp8_cases(passes: dict) -> list[tuple]:
    """Dropout (the hash in uint32, in every pass: explicit tiles with every variant, and the
    autotuned forward and backward) and the FP8 forward in both formats (pointers and TMA, explicit
    tiles and the first autotuning config, and with every variant; 16-key tiles, whose P V product
    runs in fp16)."""
    cases = []
    tiles = {"BLOCK_M": 64, "BLOCK_N": 64}
    options = ta.explicit_launch_options(64, 64, 64, 64, DTYPE.itemsize)
    every = compile_meta(64, 64, dropout=True, **ALL_VARIANTS)
    for name, p in passes.items():
        cases.append((f"{name} d=64 64x64 dropout, all variants, unspecialised", p.plain, {**every, **tiles},
                      options, False, "bf16"))
        config = p.configs[0]
        meta = {**compile_meta(128, 128, dropout=True), **config.kwargs}
        cases.append((f"{name} d=128 autotune config {config.kwargs} dropout, specialised", p.jit, meta,
                      {"num_warps": config.num_warps, "num_stages": config.num_stages}, True, "bf16"))
    fwd = passes["fwd"]
    options = ta.explicit_launch_options(64, 64, 64, 64, 1)
    config = fwd.configs[0]
    for pointer, dtype in (("fp8e4nv", torch.float8_e4m3fn), ("fp8e5", torch.float8_e5m2)):
        for tma in (False, True):
            meta = {**compile_meta(64, 64, tma=tma, dtype=dtype, fp8=True), **tiles}
            cases.append((f"fwd d=64 64x64 {pointer}{' TMA' if tma else ''}, unspecialised", fwd.plain, meta,
                          options, False, pointer))
        meta = {**compile_meta(128, 128, tma=True, dtype=dtype, fp8=True), **config.kwargs}
        cases.append((f"fwd d=128 autotune config {config.kwargs} {pointer} TMA, specialised", fwd.jit, meta,
                      {"num_warps": config.num_warps, "num_stages": config.num_stages}, True, pointer))
    meta = {**compile_meta(64, 64, dtype=torch.float8_e4m3fn, fp8=True, **ALL_VARIANTS), **tiles}
    cases.append(("fwd d=64 64x64 fp8e4nv all variants, unspecialised", fwd.plain, meta, options, False,
                  "fp8e4nv"))
    narrow = {"BLOCK_M": 64, "BLOCK_N": 16}  # P V reduces over 16 keys: fp16 operands (FP8 dots need 32)
    for tma in (False, True):
        meta = {**compile_meta(64, 64, tma=tma, dtype=torch.float8_e5m2, fp8=True), **narrow}
        cases.append((f"fwd d=64 64x16 fp8e5{' TMA' if tma else ''}, unspecialised", fwd.plain, meta,
                      ta.explicit_launch_options(64, 16, 64, 64, 1), False, "fp8e5"))
    return cases


def varlen_cases(passes: dict) -> list[tuple]:
    """Varlen (packed sequences, never TMA): every pass with VARLEN alone and with every variant
    on, as explicit tiles, an autotuning config (what a large pack launches) and fp64 compile
    them; the dK/dV pass with 64-bit row offsets too."""
    cases = []
    tiles = {"BLOCK_M": 64, "BLOCK_N": 64}
    options = ta.explicit_launch_options(64, 64, 64, 64, DTYPE.itemsize)
    alone, every = compile_meta(64, 64, varlen=True), compile_meta(64, 64, varlen=True, **ALL_VARIANTS)
    for name, p in passes.items():
        cases.append((f"{name} d=64 64x64 varlen, unspecialised", p.plain, {**alone, **tiles}, options,
                      False, "bf16"))
        cases.append((f"{name} d=64 64x64 varlen all variants, unspecialised", p.plain,
                      {**every, **tiles}, options, False, "bf16"))
    cases.append(("bwd_dkdv d=64 64x64 varlen WIDE_ROWS, unspecialised", passes["bwd_dkdv"].plain,
                  {**alone, **tiles, "WIDE_ROWS": True}, options, False, "bf16"))
    for name, p in passes.items():
        config = p.configs[0]
        meta = {**compile_meta(128, 128, varlen=True), **config.kwargs}
        options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
        cases.append((f"{name} d=128 autotune config {config.kwargs} varlen, specialised", p.jit, meta,
                      options, True, "bf16"))
    wide = {"BLOCK_M": 32, "BLOCK_N": 32}  # fp64's fixed tiles
    options = ta.explicit_launch_options(32, 32, 64, 64, torch.float64.itemsize)
    every = compile_meta(64, 64, dtype=torch.float64, varlen=True, **ALL_VARIANTS)
    for name, p in passes.items():
        cases.append((f"{name} d=64 fp64 32x32 varlen all variants, unspecialised", p.plain,
                      {**every, **wide}, options, False, "fp64"))
    cases.append(("varlen tile map, unspecialised", tak._pack_tile_map,
                  {"CHUNK": ta._MAP_CHUNK, "SORT_MAX": ta._MAP_SORT_MAX},
                  {"num_warps": 4, "num_stages": 1}, False, "bf16"))
    return cases


def decode_cases() -> list[tuple]:
    """The KV-cache decode kernels (``kernels/triton_decode.py``) with the parameters and launch
    options ``partial_meta`` / ``combine_meta`` give them: the partial kernel on a paged and a
    contiguous cache, with and without a combine after it, in bf16 (D = 128, the benchmarks'
    specialised kernel too), fp16 (D = 200: masked head dims; causal), softcap and ALiBi alone
    (the score branch without the other) and every variant on (fp16 and fp64; with no combine the
    sinks enter the partial, with one the combine), an FP8 cache in each format with bf16 q, and
    the combine in bf16 and fp64."""
    from flashprop.kernels import triton_decode as td

    window, slopes, sinks = (8, 0), torch.empty(1), torch.empty(1)
    plain, variants = ta._Mods(False), ta._Mods(False, window, 30.0, slopes, sinks)
    cases = []
    for label, dtype, d, paged, combine, mods in (
        ("paged, combine", torch.bfloat16, 128, True, True, plain),
        ("contiguous, no combine", torch.bfloat16, 128, False, False, plain),
        ("paged, causal", torch.float16, 200, True, True, ta._Mods(True)),
        ("paged, softcap alone", torch.bfloat16, 64, True, True, ta._Mods(False, softcap=30.0)),
        ("contiguous, ALiBi alone", torch.bfloat16, 64, False, True, ta._Mods(False, slopes=slopes)),
        ("paged, all variants", torch.float16, 64, True, True, variants),
        ("contiguous, all variants, no combine", torch.float16, 64, False, False, variants),
        ("paged, all variants", torch.float64, 64, True, True, variants),
    ):
        meta = td.partial_meta(d, d, dtype, 32, paged=paged, combine=combine, mods=mods)
        options = {k: meta.pop(k) for k in ("num_warps", "num_stages")}
        pointer = POINTER_NAMES[dtype]
        cases.append((f"decode partial d={d} {pointer} {label}, unspecialised", td.PARTIAL_PLAIN, meta,
                      options, False, pointer))
        if label == "paged, combine":  # the kernel the benchmarks launch (large caches)
            cases.append((f"decode partial d={d} {pointer} {label}, specialised", td._decode_partial, meta,
                          options, True, pointer))
    for pointer, label, mods in (("fp8e4nv", "paged, combine", plain), ("fp8e5", "contiguous, all variants",
                                                                         variants)):
        meta = td.partial_meta(128, 128, torch.bfloat16, 32, paged=label.startswith("paged"), combine=True,
                               mods=mods, fp8_cache=True)
        options = {k: meta.pop(k) for k in ("num_warps", "num_stages")}
        cases.append((f"decode partial d=128 {pointer} cache, bf16 q, {label}, unspecialised",
                      td.PARTIAL_PLAIN, meta, options, False, pointer))
    for dtype in (torch.bfloat16, torch.float64):
        meta = td.combine_meta(128, dtype, 64, sinks=True)
        options = {k: meta.pop(k) for k in ("num_warps", "num_stages")}
        cases.append((f"decode combine dv=128 {POINTER_NAMES[dtype]} 64 splits, sinks, unspecialised",
                      td.COMBINE_PLAIN, meta, options, False, POINTER_NAMES[dtype]))
    return cases


def check_cases() -> list[tuple]:
    """The value checks that run beside the decode and varlen kernels (``kernels/triton_checks.py``)."""
    options = {"num_warps": 4, "num_stages": 1}
    return [(f"{name} value check, unspecialised", fn, {"BLOCK": checks.CHECK_BLOCK}, options, False, "bf16")
            for name, fn in (("decode", checks.cache_value_check), ("varlen", checks.cu_seqlens_check))]


POINTER_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "fp64"}


def main() -> int:
    passes = {name: ta.PASSES[name] for name in ta.TILED_PASSES}
    cases = []
    tiles = {"BLOCK_M": 64, "BLOCK_N": 64}
    for d, dv in ((64, 64), (200, 200), (17, 16)):
        options = ta.explicit_launch_options(64, 64, d, dv, DTYPE.itemsize)
        meta = compile_meta(d, dv)
        for name, p in passes.items():
            label = f"{name} d={d} dv={dv} 64x64, unspecialised"
            cases.append((label, p.plain, {**meta, **tiles}, options, False, "bf16"))
        if d % 8 == 0:  # 16-byte rows: the forward reads q, k, v through TMA descriptors
            label = f"fwd d={d} dv={dv} 64x64 TMA, unspecialised"
            cases.append((label, passes["fwd"].plain, {**compile_meta(d, dv, tma=True), **tiles}, options,
                          False, "bf16"))
        pre = {k: meta[k] for k in ("EVEN_DV", "BLOCK_DV", "ACC_DTYPE", "WIDE_ROWS")}
        pre["BLOCK_M"] = ta.PREPROCESS_BLOCK_M
        cases.append((f"bwd_preprocess dv={dv}", ta.PASSES["bwd_preprocess"].plain, pre,
                      {"num_warps": 4, "num_stages": 1}, False, "bf16"))
    # 64-bit row offsets (tensors spanning more than 2^31 elements): each pass once
    options = ta.explicit_launch_options(64, 64, 64, 64, DTYPE.itemsize)
    for name, p in passes.items():
        cases.append((f"{name} d=64 64x64 WIDE_ROWS, unspecialised", p.plain,
                      {**compile_meta(64, 64), **tiles, "WIDE_ROWS": True}, options, False, "bf16"))
    # fp32: IEEE dots unrolled into multiply-adds, the slowest variants to compile
    options = ta.explicit_launch_options(64, 64, 64, 64, torch.float32.itemsize)
    for name, p in passes.items():
        cases.append((f"{name} d=64 fp32 64x64 {options}, unspecialised", p.plain,
                      {**compile_meta(64, 64), **tiles}, options, False, "fp32"))
    for name, p in passes.items():
        config = p.configs[0]
        meta = {**compile_meta(128, 128), **config.kwargs}
        options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
        cases.append((f"{name} d=128 autotune config {config.kwargs}, specialised", p.jit, meta, options,
                      True, "bf16"))
    config = passes["fwd"].configs[0]
    meta = {**compile_meta(128, 128, tma=True), **config.kwargs}
    options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
    cases.append((f"fwd d=128 autotune config {config.kwargs} TMA, specialised", passes["fwd"].jit, meta,
                  options, True, "bf16"))
    cases += variant_cases(passes)
    cases += dropout_fp8_cases(passes)
    cases += decode_cases()
    cases += varlen_cases(passes)
    cases += check_cases()

    if passes["fwd"].tuned.cache_results:
        print("compile-triton: FAILED the forward's autotuner caches to disk under "
              "TRITON_CACHE_AUTOTUNING=1 (its pre_hook configs are not saved)", file=sys.stderr)
        return 1
    for name, p in passes.items():
        # Each pass keys its tunings on every key name it takes as a parameter (Triton 3.6 drops
        # other names without a word, 3.7 and later refuse them); the forward takes them all.
        takes = [key for key in _TUNING_KEY if key in p.tuned.arg_names]
        if list(p.tuned.keys) != takes or (name == "fwd" and takes != list(_TUNING_KEY)):
            print(f"compile-triton: FAILED {name}'s autotuning key is {list(p.tuned.keys)}, "
                  f"its kernel takes {takes} of {list(_TUNING_KEY)}", file=sys.stderr)
            return 1
    total = time.perf_counter()
    _CASES[:] = cases
    jobs = min(len(cases), usable_cores())
    with multiprocessing.get_context("fork").Pool(jobs) as pool:  # the workers inherit _CASES
        results = pool.map(_compile_one, range(len(cases)), chunksize=1)
    for label, found, error in results:
        if error is not None:  # any compiler error fails the check, with its message
            print(f"compile-triton: FAILED {label}: {error}", file=sys.stderr)
            return 1
        print(f"compile-triton: sm_90a {label}: {found}")
    print(f"compile-triton: {len(cases)} kernels compiled in {time.perf_counter() - total:.0f} s "
          f"({jobs} processes)")
    return 0


#: The cases of :func:`main`, for its pool's forked workers (which take them by index: a jitted
#: function does not pickle).
_CASES: list = []


def _compile_one(index: int) -> tuple[str, str | None, str | None]:
    """Compile case ``index`` of :data:`_CASES`: its label, what it took (or ``None``), the
    compiler's error (or ``None``)."""
    label, fn, meta, options, specialize, pointer = _CASES[index]
    try:
        seconds, smem = compile_kernel(fn, meta, options["num_warps"], options["num_stages"], specialize,
                                       pointer)
    except Exception as err:
        return label, None, f"{type(err).__name__}: {err}"
    return label, f"{seconds:.1f} s, {smem} B shared memory", None


if __name__ == "__main__":
    sys.exit(main())
