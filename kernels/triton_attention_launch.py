"""Fused FlashAttention-2 in Triton, stage 6: how the passes of
``kernels/triton_attention_kernels.py`` (the math and the kernels, stages 1-5) are tiled and
launched. ``kernels/triton_attention.py`` (stage 7, the host side) calls :func:`_launch` and
re-exports this module's public names, which the tuning and compilation tools in ci/ take from
there.

In order:

* the tile sizes and the limits they must fit (shared memory, the grid), :func:`padded_head_dim`
  and :func:`explicit_launch_options` (warps and stages of explicit or fixed tiles);
* the autotuner: its configurations per pass, their pruner and key; the unspecialised twins that
  explicit and fixed tiles launch; :class:`Pass`, :data:`PASSES` and :data:`TILED_PASSES`;
* per launch: :func:`resolve_tiles` (explicit, fixed or autotuned tiles), :func:`launch_meta`
  (the compile-time switches), :func:`wide_rows` (32- or 64-bit row offsets), the forward's TMA
  descriptors (:func:`_tma_ready`, :func:`_tma_descriptors`), :func:`_launch` and what
  :func:`last_launch` reports of it.

On a GPU, 16-bit problems of at least 512^2 scores per matrix, or 2^26 in all, without explicit
tiles are autotuned; the others take fixed tiles. Under the interpreter (``INTERPRET``) every
launch takes explicit tiles, 32 x 32 unless given.
"""

import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from flashprop.contract.validate import INT32_ELEMENTS, extent
from flashprop.kernels.triton_attention_kernels import (
    INTERPRET,
    _attn_bwd_dkdv,
    _attn_bwd_dq,
    _attn_bwd_preprocess,
    _attn_fwd,
)
from torch import Tensor
from triton.tools.tensor_descriptor import TensorDescriptor

# ---------------------------------------------------------------------------------------------
# Stage 6: tile choice and launch
# ---------------------------------------------------------------------------------------------

#: Tile sizes accepted as ``block_m`` / ``block_n``.
TILE_SIZES: tuple[int, ...] = (16, 32, 64, 128)
#: Tiles used under the interpreter (small, so CPU runs stay fast) and when only one of
#: ``block_m`` / ``block_n`` is given on a GPU.
_DEFAULT_TILE: int = 32 if INTERPRET else 64
#: Query rows per program of the backward preprocess (not autotuned: it is memory-bound).
PREPROCESS_BLOCK_M: int = 32 if INTERPRET else 64
#: Shared-memory budget (bytes) an explicit tile pair must fit on a GPU; see _smem_bytes.
_SMEM_BUDGET: int = 160 * 1024
#: The reason an explicit tile pair over the budget is refused (:func:`resolve_tiles`).
_SMEM_REASON = (
    f"explicit block_m/block_n whose tiles exceed the {_SMEM_BUDGET // 1024} KiB shared-memory "
    "budget on a GPU (the estimate in kernels.triton_attention_launch._smem_bytes)"
)
#: CUDA's limit on the second grid axis, which carries batch * heads.
_MAX_GRID_Y: int = 65535
#: On a GPU, 16-bit problems with at least this many scores per score matrix (Nq * Nk), or at
#: least _AUTOTUNE_MIN_TOTAL_SCORES in all its B x Hq matrices, are autotuned; smaller ones, and
#: fp32/fp64 (FMA-unit dots, where small tiles are the answer anyway), take fixed tiles:
#: autotuning compiles ~20 kernels per (padded D, Dv, dtype, causal) key, which pays only on big
#: problems and would dominate a property suite's many small, varied ones.
_AUTOTUNE_MIN_SCORES: int = 512 * 512
#: The total: a batch of many short sequences is big work too (the varlen rows' dense anchor,
#: B = 52, Hq = 16, N = 315: 8.3e7 scores, had taken the fixed tiles, its backward at a tenth of
#: the varlen kernel's speed); the suite's problems stay far below it (B, H <= 8, N <= a few
#: hundred: under 3e6).
_AUTOTUNE_MIN_TOTAL_SCORES: int = 2**26
#: Sequences at least this long are tuned apart from shorter ones (``SEQ_CLASS``, an autotuning
#: key that the kernels do not otherwise use). With one key per head dim the first problem seen
#: (in the benchmark grid: N = 512) picked the tiles for every N, and the causal forward at
#: N = 2k ran at 0.96-0.98x SDPA flash on the H200; with this key (and heaviest-first causal
#: tiles) 1.07-1.23x (docs/results/2026-11-29-h200-s9.md).
_LONG_SEQUENCE: int = 2048


#: Narrowest padded head dim. tl.dot needs 16; on a GPU the tiles are at least 64 wide, because
#: Triton 3.6 compiles narrower ones into a kernel that reads shared memory out of bounds on
#: Hopper: found by the fuzz run on the H200 (CUDA error: illegal memory access; compute-sanitizer
#: "Invalid __shared__ read of size 512 bytes") for D = 17, Dv = 16 (tiles 32 and 16), Nk = 1,
#: bf16, causal, 64 x 64 tiles; the same problem padded to 64 passes memcheck. Related upstream
#: reports: triton issues 10486 and 11366 (wgmma, BLOCK_D = 32, num_warps = 4).
_MIN_TILE_DIM: int = 16 if INTERPRET else 64


def padded_head_dim(d: int) -> int:
    """Head dim ``d`` padded to a tile width (``BLOCK_D`` / ``BLOCK_DV``): the next power of
    two, at least _MIN_TILE_DIM."""
    return max(_MIN_TILE_DIM, triton.next_power_of_2(d))


def _smem_bytes(resident: int, streamed: int, width: int, itemsize: int, stages: int) -> int:
    """Estimated shared memory of a kernel that keeps a ``resident`` tile of rows and streams
    ``streamed`` rows (``stages`` buffers), each row ``width`` elements wide (D + Dv padded)."""
    return (resident + stages * streamed) * width * itemsize


def _explicit_tiles_fit(block_m: int, block_n: int, d: int, dv: int, dtype: torch.dtype) -> bool:
    """Whether explicit tiles fit the GPU's shared-memory budget with one pipeline stage
    (in every kernel: the query tile and the key tile are each resident in one of them)."""
    itemsize = dtype.itemsize
    width = padded_head_dim(d) + padded_head_dim(dv)
    return _smem_bytes(block_m, block_n, width, itemsize, 1) <= _SMEM_BUDGET


def explicit_launch_options(block_m: int, block_n: int, d: int, dv: int,
                            itemsize: int) -> dict[str, int]:
    """num_warps / num_stages for explicit tiles: two stages when they fit, else one; warps by
    the tile's multiply-adds per dot, BLOCK_M x BLOCK_N x padded head dim: eight from 2^18 on;
    in fp32, whose IEEE dots are multiply-adds without tensor cores, eight from 2^17 and
    sixteen from 2^18.

    The warps count sets how much code each thread unrolls, hence the compile time, which bounds
    the property suite on a GPU (every drawn problem needs new variants). Measured with
    ci/compile_triton.py's compiler call for sm_90a, forward + dK/dV + dQ: bf16, D = 200,
    64 x 64 tiles: 20.5 s with four warps, 7.8 s with eight; fp32, D = 64, 64 x 64: 42 s with
    four, 15 s with eight; fp32, D = 128, 64 x 64: 32 s with eight, 14 s with sixteen."""
    width = padded_head_dim(d) + padded_head_dim(dv)
    two_stages = max(_smem_bytes(block_m, block_n, width, itemsize, 2),
                     _smem_bytes(block_n, block_m, width, itemsize, 2))
    work = block_m * block_n * max(padded_head_dim(d), padded_head_dim(dv))
    if itemsize == 4:
        warps = min(16, max(4, work // 2**14))
    else:
        warps = 8 if work >= 2**18 else 4
    return {
        "num_warps": warps,
        "num_stages": 2 if two_stages <= _SMEM_BUDGET else 1,
    }


def _fixed_tiles(d: int, dv: int, dtype: torch.dtype) -> tuple[int, int]:
    """Tiles for problems not autotuned on a GPU: the largest candidate within the budget."""
    wide = dtype in (torch.float32, torch.float64)
    candidates = [(32, 32), (32, 16), (16, 16)] if wide else [(64, 64), (32, 32), (16, 16)]
    return next(t for t in candidates if _explicit_tiles_fit(*t, d, dv, dtype))


def _configs(tiles: list[tuple[int, int, int, int]],
             pre_hook: Callable[[dict], None] | None = None) -> list[triton.Config]:
    return [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s, pre_hook=pre_hook)
        for bm, bn, w, s in tiles
    ]


def _descriptor_boxes(nargs: dict) -> None:
    """Size the forward's descriptor boxes for the tiles being launched (an autotuner
    pre-hook: the boxes are part of the descriptors, the tiles part of the config). FP8: V's
    descriptor is V^T's (:func:`fp8_values_transposed`), its box (Dv, keys)."""
    if not nargs["TMA"]:
        return
    bm, bn, bd, bdv = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_D"], nargs["BLOCK_DV"]
    v_box = (bdv, bn) if nargs.get("FP8") else (bn, bdv)
    for name, rows, cols in (("Q", bm, bd), ("K", bn, bd), ("V", *v_box), ("Out", bm, bdv)):
        nargs[name].block_shape = [1, 1, rows, cols]


# (BLOCK_M, BLOCK_N, num_warps, num_stages) for Hopper tensor cores (16-bit inputs only); the
# two-stage 64x32 / 32x64 ones are there for head dims above 128.
_FWD_CONFIGS = _configs([
    (128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (128, 128, 8, 2), (128, 32, 4, 4),
    (64, 64, 4, 3), (64, 128, 4, 3), (128, 64, 4, 4), (64, 64, 4, 2), (64, 32, 4, 2),
], pre_hook=_descriptor_boxes)
_DKDV_CONFIGS = _configs([
    (32, 128, 4, 3), (64, 128, 8, 3), (64, 128, 4, 2), (32, 64, 4, 3), (64, 64, 4, 3),
    (32, 128, 8, 3), (32, 64, 4, 2),
])
_DQ_CONFIGS = _configs([
    (128, 32, 4, 3), (128, 64, 8, 3), (64, 64, 4, 3), (128, 64, 4, 2), (64, 32, 4, 3),
    (128, 32, 8, 3), (64, 32, 4, 2),
])


def _itemsize(arg: Tensor | TensorDescriptor) -> int:
    """Bytes per element of a kernel's tensor argument (a tensor, or a TMA descriptor of one)."""
    return (arg.base if isinstance(arg, TensorDescriptor) else arg).element_size()


def _pruner(resident: str) -> Callable[..., list[triton.Config]]:
    """An ``early_config_prune`` for a kernel whose resident tile is ``resident`` ("BLOCK_M" or
    "BLOCK_N"): drop configs whose pipelined tiles overflow shared memory (large head dims);
    never return an empty list."""

    def prune(configs: list[triton.Config], named_args: dict, **meta) -> list[triton.Config]:
        itemsize = _itemsize(named_args["Q"])
        width = meta["BLOCK_D"] + meta["BLOCK_DV"]

        def smem(c: triton.Config) -> int:
            bm, bn = c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]
            res, streamed = (bm, bn) if resident == "BLOCK_M" else (bn, bm)
            return _smem_bytes(res, streamed, width, itemsize, c.num_stages)

        return [c for c in configs if smem(c) <= 200 * 1024] or [min(configs, key=smem)]

    return prune


#: What the autotuner keys its tunings on (each pass takes those of its own parameters).
_TUNING_KEY = ("BLOCK_D", "BLOCK_DV", "EVEN_D", "EVEN_DV", "CAUSAL", "WINDOW", "SOFTCAP", "ALIBI",
               "DROPOUT", "SINKS", "FP8", "VARLEN", "SEQ_CLASS", "TMA", "WIDE_ROWS")


def _autotuned(kernel: Callable, configs: list[triton.Config], resident: str) -> Callable:
    tuner = triton.autotune(
        configs=configs,
        # Keyed on the compiled kernel's shape, not on the head dims themselves: D = 65..128
        # run one compiled kernel (BLOCK_D = 128, EVEN_D false), so they share one tuning
        # instead of each distinct D tuning (compiling and timing every config) again. The
        # dtype of every tensor is keyed too; SEQ_CLASS separates short and long sequences;
        # TMA and SINKS (forward only: the backward kernels have no such argument, so their key
        # leaves them out; Triton >= 3.7 refuses a key naming a parameter the kernel does not
        # take). The variants' switches are keyed: a softcap's tanh or a window's extra loop
        # changes which tiles are fastest.
        # WIDE_ROWS (64-bit row offsets, tensors past 2^31 elements) is keyed too, though the
        # same tiles fit: its kernels spill differently (sm_90a, D = 128, the forward's
        # 128x64 w4 loop: 39 local loads per pass, 7 with 32-bit offsets), so a tuning done on
        # a huge problem must not choose the tiles of the ordinary problems of its key. Huge
        # problems are rare; their extra tuning costs little.
        key=[name for name in _TUNING_KEY if name in kernel.arg_names],
        prune_configs_by={"early_config_prune": _pruner(resident)},
    )(kernel)
    if any(c.pre_hook for c in configs):
        # Triton 3.6's on-disk autotuning cache (TRITON_CACHE_AUTOTUNING=1) leaves configs with
        # a pre_hook out of the timings it saves; the next process reads an empty list and
        # fails in min(). The forward's configs size its TMA boxes in a pre_hook: tune it
        # afresh in every process whatever that variable says.
        tuner.cache_results = False
    return tuner


def _unspecialized(kernel: Callable) -> Callable:
    """``kernel`` compiled once per set of compile-time constants, whatever its other arguments.

    Triton specialises each integer argument on being 1 or a multiple of 16 and each pointer on
    16-byte alignment, and compiles a kernel per combination: right for speed (vectorised
    loads need to know the strides), ruinous for a property suite whose every problem has new
    shapes and strides (on the H200 the tests ran at 0.1-0.9 examples/s, almost all compiling;
    over 6,000 drawn problems the forward alone needed 3,262 compilations specialised and 387
    without). Explicit and fixed tiles launch this twin; the autotuned path (large 16-bit
    problems, what the benchmarks time) keeps the specialised kernel.
    """
    params = inspect.signature(kernel.fn).parameters
    runtime = [name for name, p in params.items() if "constexpr" not in str(p.annotation)]
    return triton.jit(kernel.fn, do_not_specialize=runtime)  # pointers lose their alignment too


@dataclass(frozen=True)
class Pass:
    """One GPU pass of the kernel, as the launcher and the tuning and compilation tools
    (``ci/compile_triton.py``, ``ci/triton_variants.py``, ``ci/triton_tuning.py``) see it.

    Attributes:
        jit: the JIT function, specialised by Triton on its integer and pointer arguments: what
            the autotuned path launches (large 16-bit problems on a GPU).
        plain: its unspecialised twin (:func:`_unspecialized`): what explicit and fixed tiles
            launch, compiled once per set of compile-time constants.
        tuned: the autotuner over ``jit`` (``None``: not autotuned).
        configs: the autotuner's candidate configurations, in order (empty when not tuned).
    """

    jit: Callable
    plain: Callable
    tuned: Callable | None = None
    configs: tuple[triton.Config, ...] = ()


def _tiled_pass(kernel: Callable, configs: list[triton.Config], resident: str) -> Pass:
    """A tiled pass: autotuned over ``configs`` (``resident``: its resident tile) on a GPU."""
    return Pass(kernel, _unspecialized(kernel), _autotuned(kernel, configs, resident), tuple(configs))


#: The passes of one forward and backward, in launch order, named as :func:`last_launch` names
#: them: the forward (o, lse), the backward preprocess (Delta, base-2 lse; PREPROCESS_BLOCK_M
#: query rows per program, not tuned: it is memory-bound), dK/dV and dQ.
PASSES: dict[str, Pass] = {
    "fwd": _tiled_pass(_attn_fwd, _FWD_CONFIGS, "BLOCK_M"),
    "bwd_preprocess": Pass(_attn_bwd_preprocess, _unspecialized(_attn_bwd_preprocess)),
    "bwd_dkdv": _tiled_pass(_attn_bwd_dkdv, _DKDV_CONFIGS, "BLOCK_N"),
    "bwd_dq": _tiled_pass(_attn_bwd_dq, _DQ_CONFIGS, "BLOCK_M"),
}
#: The passes that take (BLOCK_M, BLOCK_N) tiles: explicit, fixed or autotuned.
TILED_PASSES: tuple[str, ...] = ("fwd", "bwd_dkdv", "bwd_dq")

Tiles = tuple[int, int] | None  # (BLOCK_M, BLOCK_N), or None for the autotuner


def resolve_tiles(nq: int, nk: int, d: int, dv: int, dtype: torch.dtype,
                  block_m: int | None, block_n: int | None, matrices: int = 1) -> Tiles:
    """The tiles a launch of ``matrices`` (Nq, Nk, D, Dv, dtype) score matrices uses: the
    autotuner's (None) for large 16-bit and FP8 problems without explicit tiles on a GPU, fixed
    ones for other problems without, else the explicit ones (a missing one defaults), refused
    with NotImplementedError when they overflow shared memory. The same (BLOCK_M, BLOCK_N)
    serve every tiled pass."""
    if block_m is None and block_n is None and not INTERPRET:
        scores = nq * nk
        if dtype.itemsize <= 2 and (scores >= _AUTOTUNE_MIN_SCORES
                                    or matrices * scores >= _AUTOTUNE_MIN_TOTAL_SCORES):
            return None
        return _fixed_tiles(d, dv, dtype)
    tiles = (block_m or _DEFAULT_TILE, block_n or _DEFAULT_TILE)
    if not INTERPRET and not _explicit_tiles_fit(*tiles, d, dv, dtype):
        raise NotImplementedError(f"block_m={tiles[0]}, block_n={tiles[1]} with D={d}, Dv={dv}, "
                                  f"{dtype}: {_SMEM_REASON}")
    return tiles


def launch_meta(q: Tensor, v: Tensor, causal: bool, *, window: bool = False, softcap: bool = False,
                alibi: bool = False, dropout: bool = False,
                varlen: tuple[int, int] | None = None) -> dict:
    """Keyword parameters shared by the forward and backward kernels of :data:`PASSES` for
    queries like ``q`` and values like ``v`` (shapes and dtype only: meta tensors do): the head
    dims (runtime values) and the compile-time constants, among them the tile widths, which
    every head dim padding to the same width shares (one compilation for D = 65..128, not one
    per D), and the variants' switches (``CAUSAL``, ``WINDOW``, ``SOFTCAP``, ``ALIBI``, ``DROPOUT``: a window
    carries causality itself, ``triton_attention.resolve_band``; ``VARLEN`` when ``varlen``
    gives a pack's ``(max_seqlen_q, max_seqlen_k)``, which then class the sequences,
    ``SEQ_CLASS``, instead of q's and v's lengths). ``WIDE_ROWS`` is False (32-bit row offsets: what
    a launch whose tensors span at most 2^31 - 1 elements compiles); each launch sets it from
    its own tensors with :func:`wide_rows`. The forward adds ``TMA``, ``SINKS`` and ``FP8``; the launch
    adds ``BLOCK_M`` and ``BLOCK_N``."""
    d, dv = q.shape[-1], v.shape[-1]
    block_d, block_dv = padded_head_dim(d), padded_head_dim(dv)
    longest = max(varlen) if varlen is not None else max(q.shape[2], v.shape[2])
    return {
        "head_dim": d, "head_dim_v": dv, "BLOCK_D": block_d, "BLOCK_DV": block_dv,
        "EVEN_D": block_d == d, "EVEN_DV": block_dv == dv,
        "SEQ_CLASS": int(longest >= _LONG_SEQUENCE),
        "CAUSAL": bool(causal), "WINDOW": bool(window), "SOFTCAP": bool(softcap),
        "ALIBI": bool(alibi), "DROPOUT": bool(dropout), "VARLEN": varlen is not None,
        "ACC_DTYPE": tl.float64 if q.dtype == torch.float64 else tl.float32,
        "PRECISION": "ieee",
        "WIDE_ROWS": False,
    }


def wide_rows(*tensors: Tensor) -> bool:
    """``WIDE_ROWS`` of a launch whose kernel addresses ``tensors`` through pointers (not TMA
    descriptors): True when any of them spans more than 2^31 - 1 elements, its extent
    ``1 + sum((size_i - 1) * |stride_i|)`` (:func:`~flashprop.contract.validate.extent`).

    The kernels add a 64-bit (batch, head) offset to the base pointer and, without WIDE_ROWS,
    the offset within the slice, ``row * stride_r + col * stride_c``, in 32 bits. That offset is
    at most the tensor's extent - 1 for every element read or written (rows and columns past
    the tensor are masked), so a tensor of extent <= 2^31 - 1 needs no 64-bit offset; a larger
    one (a long sequence, or a strided view whose rows lie far apart) gets the 64-bit row
    offsets of ``triton_attention_kernels._wide_tile_ptrs``, which cost registers in the tuned
    kernels."""
    return any(extent(t) > INT32_ELEMENTS for t in tensors)


#: What the forward's descriptors carry: 16-bit inputs and outputs, FP8 inputs (whose o is bf16).
_TMA_DTYPES = (torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2)


def _tma_ready(*tensors: Tensor) -> bool:
    """Whether the forward reads and writes these (B, H, N, D) tensors through TMA descriptors:
    16-bit or FP8, unit last stride, every other stride and the base 16-byte aligned (the copy
    engine's rules). ``FLASHPROP_TRITON_TMA=0`` turns TMA off (pointer loads everywhere)."""
    if os.environ.get("FLASHPROP_TRITON_TMA", "1") == "0":
        return False
    return all(
        t.dtype in _TMA_DTYPES and t.stride(-1) == 1 and t.data_ptr() % 16 == 0
        and all(s > 0 and s * t.element_size() % 16 == 0 for s in t.stride()[:-1])
        for t in tensors
    )


def fp8_values_transposed(v: Tensor) -> Tensor:
    """FP8 ``v`` (B, H, N, Dv) as the forward's TMA path reads it: V^T, a (B, H, Dv, N) view whose
    rows are padded to 16 keys (16-byte aligned, as descriptors need), keys innermost, because
    Hopper's FP8 wgmma reads its B operand K-major (FlashAttention-3 transposes V in shared
    memory instead). One pass over V on the host: about 1% of the forward's time at 16k tokens."""
    b, h, n, dv = v.shape
    padded = torch.empty((b, h, dv, -(-n // 16) * 16), dtype=v.dtype, device=v.device)
    vt = padded[..., :n]
    vt.copy_(v.transpose(-1, -2))
    return vt


def _tma_descriptors(tensors: tuple[Tensor, ...], strides: list[tuple[int, ...]], meta: dict,
                     tiles: Tiles) -> tuple[TensorDescriptor, ...]:
    """The forward's 4-D TMA descriptors of q, k, v and o (``tensors``, addressed with
    ``strides``), their boxes sized here for explicit ``tiles``, by :func:`_descriptor_boxes`
    (the autotuner's pre-hook) when ``tiles`` is None."""
    descriptors = tuple(TensorDescriptor(t, list(t.shape), list(st), [1, 1, 16, 16])
                        for t, st in zip(tensors, strides, strict=True))
    block_m, block_n = tiles or (16, 16)
    _descriptor_boxes({**dict(zip(("Q", "K", "V", "Out"), descriptors, strict=True)), **meta,
                       "BLOCK_M": block_m, "BLOCK_N": block_n})
    return descriptors


#: What the last launch of each pass ran with: (BLOCK_M, BLOCK_N, num_warps, num_stages, TMA,
#: tuned), formatted only when asked (:func:`last_launch`), not on every launch.
_LAST_LAUNCH: dict[str, tuple[int, int, int, int, bool, bool]] = {}


def _launch(name: str, grid: Callable[[int, int], tuple[int, int]], args: tuple, meta: dict,
            tiles: Tiles) -> None:
    """Launch pass ``name`` of :data:`PASSES`: its unspecialised twin with explicit tiles, or its
    specialised autotuner when ``tiles`` is None. ``grid(BLOCK_M, BLOCK_N)`` gives the grid."""
    tuned, kernel = PASSES[name].tuned, PASSES[name].plain
    if tiles is None:
        tuned[lambda cfg: grid(cfg["BLOCK_M"], cfg["BLOCK_N"])](*args, **meta)
        cfg = tuned.best_config
        launched = (cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"], cfg.num_warps, cfg.num_stages)
    else:
        block_m, block_n = tiles
        options = explicit_launch_options(block_m, block_n, meta["head_dim"],
                                          meta["head_dim_v"], _itemsize(args[0]))
        # SEQ_CLASS is an autotuning key the kernels' code never reads: one compilation serves
        # short and long sequences here (two identical ones did: the long-sequence properties
        # compiled each of their variants twice on the GPU)
        kernel[grid(block_m, block_n)](*args, **{**meta, "SEQ_CLASS": 0}, BLOCK_M=block_m,
                                       BLOCK_N=block_n, **options)
        launched = (block_m, block_n, options["num_warps"], options["num_stages"])
    if name == "fwd":  # a new call: a backward pass recorded before belongs to an earlier one
        _LAST_LAUNCH.clear()
    _LAST_LAUNCH[name] = (*launched, bool(meta.get("TMA")), tiles is None)


def last_launch() -> dict[str, str]:
    """Tiles, warps and stages of each pass (``fwd``, ``bwd_dkdv``, ``bwd_dq``) of the last call
    (its forward, and its backward if one ran after it), e.g. ``{"fwd": "128x64 w8 s3 TMA
    (tuned)"}``: which configuration the autotuner picked, for benchmark reports
    (``benchmarks.bench_attention`` records it)."""
    return {
        name: f"{bm}x{bn} w{warps} s{stages}{' TMA' if tma else ''} ({'tuned' if tuned else 'fixed'})"
        for name, (bm, bn, warps, stages, tma, tuned) in _LAST_LAUNCH.items()
    }
