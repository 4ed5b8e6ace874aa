"""Fused FlashAttention-2 in Triton: the entry points ``attention`` and ``varlen`` (the
registry's ``triton`` kernel) and their host side, read top to bottom.

The kernel is three modules, each read top to bottom, in this order:

  ``kernels/triton_attention_kernels.py``: the math, the conventions (layouts, GQA, causal and
    window alignment, varlen, dtypes) and the ``@triton.jit`` kernels (stages 1-5);
  ``kernels/triton_attention_launch.py``: tile choice, autotuning, the passes and their launch
    (stage 6);
  ``kernels/triton_attention.py`` (this one), stage 7: input checks, the variants as the kernels
    take them (:func:`resolve_band`), the forward and backward launches, autograd, ``attention``,
    ``varlen`` and the capabilities. KV-cache decode (``attention.kvcache``) is
    ``kernels/triton_decode.py``.

Users and tools import from this module: ``__all__`` lists its public names, the launch
module's that the tuning and compilation tools in ci/ use (``PASSES``, ``TILED_PASSES``,
``launch_meta``, ``resolve_tiles``, ``padded_head_dim``, ``explicit_launch_options``, ...)
re-exported among them.

CPU: under ``TRITON_INTERPRET=1`` (read when this module is imported, as Triton does) the kernels
run in Triton's interpreter on CPU tensors, bf16 refused (the interpreter multiplies bf16 bit
patterns in ``tl.dot``, triton issue 11584).
"""

import contextlib
import math
from dataclasses import dataclass

import torch
import triton
from flashprop.contract.capabilities import ALIBI_SHAPES, FP8, Capabilities, KVCache, Limit
from flashprop.contract.entry_points import KEYWORDS, Keywords, entry_point
from flashprop.contract.fp8 import CACHE_SCALE_SHAPES, DESCALE_SHAPES, FORMATS, FP8_DTYPES, OUTPUT_DTYPE
from flashprop.contract.problem import Problem
from flashprop.contract.validate import (
    INT32_ELEMENTS,
    Descales,
    Variants,
    check_dense,
    check_dropout,
    check_fp8,
    check_variants,
    check_varlen,
    dropout_threshold,
)
from flashprop.kernels.triton_attention_kernels import INTERPRET, _dropout_mask, _pack_tile_map
from flashprop.kernels.triton_attention_launch import (
    _DEFAULT_TILE,
    _MAX_GRID_Y,
    _SMEM_REASON,
    PASSES,
    PREPROCESS_BLOCK_M,
    TILE_SIZES,
    TILED_PASSES,
    Pass,
    Tiles,
    _explicit_tiles_fit,
    _launch,
    _tma_descriptors,
    _tma_ready,
    explicit_launch_options,
    fp8_values_transposed,
    last_launch,
    launch_meta,
    padded_head_dim,
    resolve_tiles,
    wide_rows,
)
from flashprop.kernels.triton_checks import start_cu_seqlens_check
from torch import Tensor

__all__ = [
    "INTERPRET", "PASSES", "PREPROCESS_BLOCK_M", "TILED_PASSES", "TILE_SIZES", "Pass", "Tiles", "Window",
    "attention", "dropout_mask", "explicit_launch_options", "last_launch", "launch_meta", "padded_head_dim",
    "resolve_band", "resolve_tiles", "varlen", "wide_rows",
]


# ---------------------------------------------------------------------------------------------
# Stage 7: host side
# ---------------------------------------------------------------------------------------------

#: log2(e): the kernels keep scores in base-2 units (``exp2``), the scale multiplied by it.
LOG2E: float = math.log2(math.e)
_BF16_INTERPRETER_REASON = (
    "Triton interpreter computes tl.dot on bf16 bit patterns (triton issue 11584)"
)
#: The huge-rows property on the H200 (2026-11-30, docs/scale.md): an illegal memory access at
#: Nq = 2^27 + 1, Nk = 1, D = 16 (16 x 16 tiles): the in-tile row offsets (row * stride) were
#: 32-bit. They are 64-bit now in launches whose tensors span more than 2^31 elements
#: (``WIDE_ROWS``, :func:`wide_rows`). Column offsets stay 32-bit: a tensor whose head-dim
#: stride reaches 2^31 / (D - 1) (the head dim outermost in a tensor of more than 2^31 elements)
#: is refused (:func:`_check_columns`).
_WIDE_COLUMNS_REASON = ("column offsets (head-dim index * head-dim stride) are 32-bit in these kernels; "
                        "make the head dim the innermost axis (stride 1)")

_ALL_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _check_inputs(q: Tensor, k: Tensor, v: Tensor, scale: float | None,
                  block_m: int | None, block_n: int | None) -> Tiles:
    """Refuse what the kernels do not support, naming it; return the tiles to launch with. The
    dense layout's rules are ``contract.validate.check_dense``'s; what follows is this kernel's."""
    check_dense(q, k, v)
    _check_supported(q)
    (b, hq, nq, d), (hkv, nk, dv) = q.shape, (k.shape[1], k.shape[2], v.shape[3])
    if min(b, hq, hkv, nq, nk, d, dv) == 0:
        raise ValueError(f"empty dimension in q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}")
    _check_launch(q, k, v, b * hq, scale, block_m, block_n)
    return resolve_tiles(nq, nk, d, dv, q.dtype, block_m, block_n, matrices=b * hq)


def _check_varlen_inputs(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor,
                         cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int,
                         scale: float | None, block_m: int | None,
                         block_n: int | None) -> tuple[int, Tiles]:
    """:func:`_check_inputs` for packed (T, H, D) tensors and their sequence boundaries
    (``contract.validate.check_varlen``) but the boundaries' values, which the entry point checks
    while its kernels run (``kernels.triton_checks``); returns the number of sequences and the
    tiles, chosen as for a dense problem of the longest sequences (``max_seqlen_q``,
    ``max_seqlen_k``). Empty sequences, and packs of no query or no key at all, are legal."""
    _check_tensors(q, k, v, "(T, H, D)")
    count = check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, values=False)
    hq, d, dv = q.shape[1], q.shape[2], v.shape[2]
    if min(hq, d, dv) == 0:
        raise ValueError(f"empty dimension in q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}")
    if max(max_seqlen_q, max_seqlen_k) > INT32_ELEMENTS:
        raise NotImplementedError(f"max_seqlen_q={max_seqlen_q}, max_seqlen_k={max_seqlen_k}: "
                                  "sequences longer than 2^31 - 1 tokens are not supported")
    _check_launch(q, k, v, count * hq, scale, block_m, block_n)
    return count, resolve_tiles(max_seqlen_q, max_seqlen_k, d, dv, q.dtype, block_m, block_n,
                                matrices=count * hq)


def _check_tensors(q: Tensor, k: Tensor, v: Tensor, layout: str) -> None:
    """q, k, v: tensors of the ``layout``'s rank (varlen's; the dense layout's are
    ``check_dense``'s), of one supported dtype and device."""
    rank = len(layout.split(","))
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.ndim != rank:
            raise ValueError(f"{name} must be {rank}-D {layout}, got shape {tuple(t.shape)}")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not q.device == k.device == v.device:
        raise ValueError(f"q, k, v must share a device, got {q.device}, {k.device}, {v.device}")
    _check_supported(q)


def _check_supported(q: Tensor) -> None:
    """q's dtype and device (those of k and v, checked alike) are ones this kernel runs."""
    if q.dtype not in _ALL_DTYPES and q.dtype not in FP8_DTYPES:
        raise TypeError(f"dtype {q.dtype} is not supported (fp16, bf16, fp32, fp64; float8_e4m3fn, "
                        "float8_e5m2 with descales)")
    if q.device.type not in ("cpu", "cuda"):
        raise NotImplementedError(f"device type {q.device.type} is not supported")
    if q.device.type == "cpu" and not INTERPRET:
        raise NotImplementedError(
            "CPU tensors run only under Triton's interpreter: set TRITON_INTERPRET=1 before "
            "kernels.triton_attention is imported"
        )
    if INTERPRET and q.dtype == torch.bfloat16:
        raise NotImplementedError(f"bfloat16 under the interpreter: {_BF16_INTERPRETER_REASON}")


def _check_launch(q: Tensor, k: Tensor, v: Tensor, slices: int, scale: float | None,
                  block_m: int | None, block_n: int | None) -> None:
    """What the launch needs of shape-checked inputs of either layout: head dims up to 256,
    ``slices`` (batch elements or sequences, times query heads) within the grid, a finite
    scale, 32-bit column offsets, tile sizes of :data:`TILE_SIZES`."""
    d, dv = q.shape[-1], v.shape[-1]
    if d > 256 or dv > 256:
        raise NotImplementedError(f"head dims above 256 are not supported (D={d}, Dv={dv})")
    if scale is not None and not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale}")
    if q.device.type == "cuda" and slices > _MAX_GRID_Y:
        raise NotImplementedError(f"batch * heads = {slices} exceeds the grid limit {_MAX_GRID_Y}")
    _check_columns(q, k, v)

    for name, tile in (("block_m", block_m), ("block_n", block_n)):
        if tile is not None and tile not in TILE_SIZES:
            raise ValueError(f"{name}={tile} is not one of {TILE_SIZES}")


def _on_device(t: Tensor) -> contextlib.AbstractContextManager:
    """The context in which to launch on ``t``'s device: its CUDA device made current (Triton
    launches on the current one), nothing for the interpreter's CPU tensors."""
    return torch.cuda.device(t.device) if t.device.type == "cuda" else contextlib.nullcontext()


def _check_columns(*tensors: Tensor) -> None:
    """Refuse, with NotImplementedError, a tensor whose last element's head-dim offset
    ``(D - 1) * stride(-1)`` passes 2^31 - 1: the kernels add it in 32 bits."""
    for name, t in zip("qkv", tensors):
        span = (t.shape[-1] - 1) * abs(t.stride(-1))
        if span > INT32_ELEMENTS:
            raise NotImplementedError(f"{name}: head-dim stride {t.stride(-1)} x (D - 1) = {span} "
                                      f"> 2^31 - 1: {_WIDE_COLUMNS_REASON}")



Window = tuple[int, int] | None  # (win_left, win_right), both finite; None: no window


@dataclass(frozen=True)
class _Pack:
    """The sequences of a varlen call as the kernels take them (``VARLEN``).

    Attributes:
        cu_q, cu_k: ``cu_seqlens_q``, ``cu_seqlens_k``: int32 (B + 1,), contiguous.
        max_q, max_k: ``max_seqlen_q``, ``max_seqlen_k``: they class the sequences (``SEQ_CLASS``).
        count: the number of sequences B (the tile maps' and the grids').
    """

    cu_q: Tensor
    cu_k: Tensor
    max_q: int
    max_k: int
    count: int


@dataclass(frozen=True)
class _Mods:
    """The variants of one call as the kernels take them.

    Attributes:
        causal: the ``CAUSAL`` switch (False when ``window`` carries causality).
        window: ``(win_left, win_right)``, both finite (:func:`resolve_band`), or None: no ``WINDOW``.
        softcap: the cap; 0 is off.
        slopes: float32 ALiBi slopes (Hq,) or (B, Hq), or None.
        sinks: float32 sink logits (Hq,), or None.
        pack: the sequences of a varlen call (``VARLEN``), or None: a dense call.
        dropout: ``(dropout_p, dropout_seed)`` with p > 0 (``DROPOUT``), or None.
        descale: FP8's contiguous float32 (B * Hq, 2) of ``(q_descale * k_descale, v_descale)``
            per (batch element or sequence, query head) (``FP8``), or None.
    """

    causal: bool
    window: Window = None
    softcap: float = 0.0
    slopes: Tensor | None = None
    sinks: Tensor | None = None
    pack: _Pack | None = None
    dropout: tuple[float, int] | None = None
    descale: Tensor | None = None


def resolve_band(causal: bool, window: Window, nq: int, nk: int) -> tuple[bool, Window]:
    """The (CAUSAL, window) the kernels run for ``causal`` and ``window_size`` on Nq queries and
    Nk keys: query i sees keys ``i + c - left .. i + c + right`` (c = Nk - Nq) with both sides
    finite. A side that cuts no key (-1, or at least Nk on the left, Nq on the right, past every
    key of every row) becomes Nk (Nq); causal makes the right side 0. A band whose left side
    cuts nothing and whose right side is 0 is the causal diagonal itself: CAUSAL, no window; one
    that cuts nothing at all is no window."""
    left, right = (-1, -1) if window is None else window
    left_cuts = 0 <= left < nk
    right = 0 if causal else (right if 0 <= right < nq else nq)
    if not left_cuts and right == 0:
        return True, None
    if not left_cuts and right == nq:
        return False, None
    return False, (left if left_cuts else nk, right)


def _variant_args(spare: Tensor, mods: _Mods, scale: float) -> tuple:
    """The kernels' runtime arguments after their sizes: ``qk_scale`` and the variants' ``win_left,
    win_right, softcap2, Slopes, stride_ab, stride_ah`` (``triton_attention_kernels._attn_fwd``; the
    tiled passes take :func:`_dropout_args` next); an unused pointer points at ``spare`` (any
    tensor of the call), unused integers are 0."""
    win_left, win_right = mods.window or (0, 0)
    qk_scale = scale / mods.softcap if mods.softcap else scale * LOG2E
    slopes = mods.slopes if mods.slopes is not None else spare
    if mods.slopes is None:
        stride_ab, stride_ah = 0, 0
    elif mods.slopes.dim() == 1:
        stride_ab, stride_ah = 0, mods.slopes.stride(0)
    else:
        stride_ab, stride_ah = mods.slopes.stride()
    return qk_scale, win_left, win_right, mods.softcap * LOG2E, slopes, stride_ab, stride_ah


def _dropout_args(dropout: tuple[float, int] | None) -> tuple[int, int, int, float]:
    """``(seed_lo, seed_hi, drop_threshold, drop_scale)`` of ``(dropout_p, dropout_seed)``: the
    seed's 32-bit words, ``ceil(p 2^32)`` (an entry is kept iff its hash is at least this) and
    ``1 / (1 - p)``; zeros without dropout."""
    if dropout is None:
        return 0, 0, 0, 0.0
    p, seed = dropout
    return seed & 0xFFFFFFFF, seed >> 32, dropout_threshold(p), 1.0 / (1.0 - p)


def _switches(q: Tensor, v: Tensor, mods: _Mods, spare: Tensor) -> dict:
    """:func:`launch_meta` for ``mods``, and the pointer arguments ``CuSeqQ``, ``CuSeqK`` of the
    tiled passes (a dense call's point at ``spare``, any tensor of the call)."""
    pack = mods.pack
    meta = launch_meta(q, v, mods.causal, window=mods.window is not None, softcap=bool(mods.softcap),
                       alibi=mods.slopes is not None, dropout=mods.dropout is not None,
                       varlen=None if pack is None else (pack.max_q, pack.max_k))
    cu = (spare, spare) if pack is None else (pack.cu_q, pack.cu_k)
    return {**meta, "CuSeqQ": cu[0], "CuSeqK": cu[1]}


def _as_batch(t: Tensor) -> Tensor:
    """A packed token-major (T, H, D) tensor as the kernels address it: a (1, H, T, D) view."""
    return t.transpose(0, 1).unsqueeze(0)


def _pass_grid(rows: int, block: int, heads: int, b: int, pack: _Pack | None) -> tuple[int, ...]:
    """A tiled pass's grid over ``rows`` query (or key) rows in tiles of ``block`` for ``heads``
    heads: dense, (cdiv(N, block), B * heads); a pack of T = ``rows`` packed rows, one program
    per entry of its tile map and head, ((cdiv(T, block) + sequences) * heads,), which bounds the
    pack's tiles (:func:`_tile_map`)."""
    if pack is None:
        return triton.cdiv(rows, block), b * heads
    return (triton.cdiv(rows, block) + pack.count) * heads,


def _forward(q: Tensor, k: Tensor, v: Tensor, mods: _Mods, scale: float,
             tiles: Tiles) -> tuple[Tensor, Tensor]:
    """(o, lse) in the entry point's layout: dense (B, Hq, Nq, Dv) and (B, Hq, Nq); varlen (a
    ``mods.pack``) token-major (Tq, Hq, Dv) and (Hq, Tq), the packed tensors addressed as one
    batch element (:func:`_as_batch`) and never through TMA. o has q's dtype (bfloat16 for FP8)."""
    pack = mods.pack
    if pack is not None:
        q, k, v = (_as_batch(t) for t in (q, k, v))
    b, hq, nq, _ = q.shape
    hkv, nk, dv = k.shape[1], k.shape[2], v.shape[3]
    o_dtype = OUTPUT_DTYPE if mods.descale is not None else q.dtype
    if pack is None:
        o = torch.empty((b, hq, nq, dv), dtype=o_dtype, device=q.device)
    else:  # token-major, as the varlen entry point returns it
        o = _as_batch(torch.empty((nq, hq, dv), dtype=o_dtype, device=q.device))
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    lse = torch.empty((b, hq, nq), dtype=lse_dtype, device=q.device)
    tensors = (q, k, v, o)
    strides = [t.stride() for t in tensors]
    tma = pack is None and _tma_ready(*tensors)
    if tma and mods.descale is not None:  # FP8 through TMA reads V^T
        vt = fp8_values_transposed(v)
        tensors, strides[2] = (q, k, vt, o), vt.stride()
    meta = {**_switches(q, v, mods, lse), "SINKS": mods.sinks is not None,
            "FP8": mods.descale is not None, "TMA": tma, "WIDE_ROWS": not tma and wide_rows(*tensors)}
    if meta["TMA"]:
        tensors = _tma_descriptors(tensors, strides, meta, tiles)
    sinks = (lse, 0) if mods.sinks is None else (mods.sinks, mods.sinks.stride(0))
    descale = lse if mods.descale is None else mods.descale
    args = (*tensors, lse, *(s for st in strides for s in st), hq, hq // hkv, nq, nk,
            *_variant_args(lse, mods, scale), *_dropout_args(mods.dropout), *sinks, descale)
    meta.update(_map_args(pack, "q", nq, lse))
    _launch("fwd", lambda bm, bn: _pass_grid(nq, bm, hq, b, pack), args, meta, tiles)
    return (o, lse) if pack is None else (o[0].transpose(0, 1), lse[0])


#: The tile map kernel's chunk of sequences per program.
_MAP_CHUNK = 64
#: Packs of up to this many sequences list them longest first in the tile map (the sort costs
#: count^2 / _MAP_CHUNK comparisons per program); larger ones in pack order.
_MAP_SORT_MAX = 2048


def _tile_map(cu_seqlens: Tensor, count: int, total: int) -> Tensor:
    """The map from a program to its tile of a pack of ``count`` sequences of ``total`` rows,
    as ``cu_seqlens`` counts them (the queries: the forward's and dQ's tiles; the keys: dK/dV's),
    one row per tile size of :data:`TILE_SIZES` (``triton_attention_kernels._pack_tile_map``),
    built on the device without a synchronisation, the longest sequences first (packs of up to
    :data:`_MAP_SORT_MAX` sequences): an int32 (4, 2, map_len), where map_len = cdiv(T, 16) + B
    bounds the sum over sequences of cdiv(N_s, BM) for every tile size BM >= 16 (each sequence
    adds at most one partial tile). Launched on the caller's device, as the passes are
    (``_attend``)."""
    assert TILE_SIZES == (16, 32, 64, 128), "the map's rows are BM = 16 << row"
    map_len = triton.cdiv(total, TILE_SIZES[0]) + count
    tile_map = torch.empty((len(TILE_SIZES), 2, map_len), dtype=torch.int32, device=cu_seqlens.device)
    grid = (max(1, triton.cdiv(count, _MAP_CHUNK)), len(TILE_SIZES))
    _pack_tile_map[grid](cu_seqlens, count, total, tile_map, map_len, CHUNK=_MAP_CHUNK,
                         SORT_MAX=_MAP_SORT_MAX)
    return tile_map


def _map_args(pack: _Pack | None, rows: str, total: int, spare: Tensor) -> dict:
    """A tiled pass's ``TileMap`` and ``map_len``: a pack's :func:`_tile_map` over its query
    (``rows`` "q": the forward's and dQ's tiles) or key ("k": dK/dV's) rows, ``total`` of them;
    a dense call's unused (``spare``, any tensor of the call, and 0)."""
    if pack is None:
        return {"TileMap": spare, "map_len": 0}
    tile_map = _tile_map(pack.cu_q if rows == "q" else pack.cu_k, pack.count, total)
    return {"TileMap": tile_map, "map_len": tile_map.shape[-1]}


def _backward(do: Tensor, dlse: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor,
              lse: Tensor, mods: _Mods, scale: float, tiles: Tiles,
              sinks_grad: bool) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """(dq, dk, dv, dsinks); dsinks (float32, as the sinks) only when ``sinks_grad``. The
    tensors in the entry point's layout (:func:`_forward`); varlen's gradients token-major."""
    pack = mods.pack
    if pack is None:
        dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
        grads = (dq, dk, dv)
    else:  # the packed tensors as one batch element (1, H, T, D); lse, dlse (Hq, Tq) as (1, Hq, Tq)
        grads = tuple(torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
        q, k, v, o, do, dq, dk, dv = (_as_batch(t) for t in (q, k, v, o, do, *grads))
        lse, dlse = lse[None], dlse[None]
    b, hq, nq, _ = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    meta = _switches(q, v, mods, lse)

    delta = torch.empty_like(lse)
    lse2 = torch.empty_like(lse)
    preprocess = PASSES["bwd_preprocess"].jit if tiles is None else PASSES["bwd_preprocess"].plain
    preprocess[(triton.cdiv(nq, PREPROCESS_BLOCK_M), b * hq)](
        o, do, lse, dlse, delta, lse2, *o.stride(), *do.stride(), *dlse.stride(), hq, nq,
        head_dim_v=meta["head_dim_v"], EVEN_DV=meta["EVEN_DV"], BLOCK_DV=meta["BLOCK_DV"],
        ACC_DTYPE=meta["ACC_DTYPE"], WIDE_ROWS=wide_rows(o, do, dlse),
        BLOCK_M=PREPROCESS_BLOCK_M,
    )

    strides = (*q.stride(), *k.stride(), *v.stride(), *do.stride())
    qk_scale, *variant = _variant_args(lse, mods, scale)
    variant += _dropout_args(mods.dropout)
    _launch("bwd_dkdv", lambda bm, bn: _pass_grid(nk, bn, hkv, b, pack),
            (q, k, v, do, dk, dv, lse2, delta, *strides, *dk.stride(), *dv.stride(),
             hkv, hq // hkv, nq, nk, qk_scale, scale, *variant),
            {**meta, **_map_args(pack, "k", nk, lse), "WIDE_ROWS": wide_rows(q, k, v, do, dk, dv)},
            tiles)
    _launch("bwd_dq", lambda bm, bn: _pass_grid(nq, bm, hq, b, pack),
            (q, k, v, do, dq, lse2, delta, *strides, *dq.stride(),
             hq, hq // hkv, nq, nk, qk_scale, scale, *variant),
            {**meta, **_map_args(pack, "q", nq, lse), "WIDE_ROWS": wide_rows(q, k, v, do, dq)},
            tiles)
    dsinks = None
    if sinks_grad:  # dz_h = -sum_{b,i} exp(z_h - lse_bhi) * Delta_bhi (0 on rows of lse = -inf)
        z = mods.sinks.to(lse.dtype)[None, :, None]
        p_sink = torch.where(lse == float("-inf"), 0.0, torch.exp(z - lse))
        dsinks = -(p_sink * delta).sum((0, 2)).to(mods.sinks.dtype)
    return (*grads, dsinks)


class _FlashAttention(torch.autograd.Function):
    """Autograd glue: (o, lse) forward, gradients for q, k, v and the sinks (lse is
    differentiable too). The ALiBi slopes take no gradient."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, sinks: Tensor | None, slopes: Tensor | None,
                causal: bool, window: Window, softcap: float, scale: float,
                tiles: Tiles, pack: _Pack | None, dropout: tuple[float, int] | None) -> tuple[Tensor, Tensor]:
        mods = _Mods(causal, window, softcap, slopes, sinks, pack, dropout)
        o, lse = _forward(q, k, v, mods, scale, tiles)
        ctx.save_for_backward(q, k, v, o, lse, sinks, slopes)
        ctx.args = (causal, window, softcap, scale, tiles, pack, dropout)
        return o, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do: Tensor, dlse: Tensor):
        q, k, v, o, lse, sinks, slopes = ctx.saved_tensors
        causal, window, softcap, scale, tiles, pack, dropout = ctx.args
        mods = _Mods(causal, window, softcap, slopes, sinks, pack, dropout)
        dq, dk, dv, dsinks = _backward(do, dlse, q, k, v, o, lse, mods, scale, tiles,
                                       sinks is not None and ctx.needs_input_grad[3])
        return dq, dk, dv, dsinks, None, None, None, None, None, None, None, None


@entry_point("dense", KEYWORDS["dense"])  # every keyword of the contract
def attention(q: Tensor, k: Tensor, v: Tensor, kw: Keywords) -> tuple[Tensor, Tensor]:
    """Fused FlashAttention-2: returns (o, lse).

    q (B, Hq, Nq, D), k (B, Hkv, Nk, D), v (B, Hkv, Nk, Dv), any strides, Hq % Hkv == 0.
    ``causal`` is bottom-right aligned; ``scale`` defaults to 1/sqrt(D). ``block_m`` /
    ``block_n`` pick the query / key tile sizes (one of 16, 32, 64, 128); left out, a GPU
    autotunes them (16-bit inputs with Nq * Nk >= 512^2, or B * Hq * Nq * Nk >= 2^26; fixed tiles
    otherwise) and the interpreter uses 32 x 32. o has q's dtype and shape (..., Dv); lse is
    (B, Hq, Nq) in fp32 (fp64 for fp64 inputs), natural log, -inf on rows that see no key.
    Differentiable in q, k, v and ``sinks`` (deterministic backward, no atomics).

    Variants (``docs/variants.md``, checked by ``contract.validate.check_variants``):
    ``window_size=(left, right)`` (-1: unbounded side), ``softcap`` (0: off), ``alibi_slopes``
    float32 (Hq,) or (B, Hq), ``sinks`` float32 (Hq,) (a row that sees no key gets lse = z_h),
    ``dropout_p`` with ``dropout_seed`` (an int in [0, 2^64): the contract's keep mask of the
    seed, the same in the forward and the backward; :func:`dropout_mask` returns it).

    FP8: q, k, v float8_e4m3fn or float8_e5m2 with float32 ``q_descale``, ``k_descale``,
    ``v_descale`` of shape (), (Hkv,) or (B, Hkv) (FlashAttention-3's; left out: 1), forward only,
    o in bfloat16; no dropout.
    """
    tiles = _check_inputs(q, k, v, kw.scale, kw.block_m, kw.block_n)
    b, hq, nq, _ = q.shape
    var = check_variants(b, hq, q.device, **kw.variants)
    descales = check_fp8(q, k, v, kw.q_descale, kw.k_descale, kw.v_descale, shapes=_FP8.descales)
    return _attend(q, k, v, var, descales, kw.causal, kw.scale, tiles, (nq, k.shape[2]), None)


@entry_point("varlen", KEYWORDS["varlen"])
def varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
           kw: Keywords) -> tuple[Tensor, Tensor]:
    """Packed sequences (``flash_attn_varlen_func``'s signature): returns (o, lse).

    q (Tq, Hq, D), k (Tk, Hkv, D), v (Tk, Hkv, Dv) token-major, any strides; sequence s holds
    queries ``cu_seqlens_q[s]:cu_seqlens_q[s + 1]`` and keys ``cu_seqlens_k[s]:cu_seqlens_k[s + 1]``
    (int32, B + 1 entries from 0 to Tq, Tk; zero-length sequences are legal); ``max_seqlen_q/k``
    are at least the longest (``contract.validate.check_varlen``). Every convention of
    :func:`attention` holds for each sequence alone, with its own c = Nk_s - Nq_s: causal and
    the window bottom-right aligned, the ALiBi distance, empty rows; (B, Hq) ALiBi slopes give
    sequence s row s. o (Tq, Hq, Dv) token-major in q's dtype, lse (Hq, Tq) in fp32 (fp64);
    differentiable in q, k, v and ``sinks``. Tiles as :func:`attention`'s for the longest
    sequences. Dropout: sequence s's mask is batch element s's, at its own positions; FP8 with
    (B, Hkv) descales: row s for sequence s."""
    count, tiles = _check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                        max_seqlen_k, kw.scale, kw.block_m, kw.block_n)
    var = check_variants(count, q.shape[1], q.device, **kw.variants)
    descales = check_fp8(q, k, v, kw.q_descale, kw.k_descale, kw.v_descale, batch=count,
                         shapes=_FP8.descales)
    pack = _Pack(cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous(), max_seqlen_q, max_seqlen_k,
                 count)
    checked = start_cu_seqlens_check(pack.cu_q, pack.cu_k, q.shape[0], k.shape[0], max_seqlen_q,
                                     max_seqlen_k)
    out = _attend(q, k, v, var, descales, kw.causal, kw.scale, tiles, (max_seqlen_q, max_seqlen_k), pack)
    checked()  # raises for malformed boundaries, which the kernels meanwhile read within bounds
    return out


def _attend(q: Tensor, k: Tensor, v: Tensor, var: Variants, descales: Descales | None, causal: bool,
            scale: float | None, tiles: Tiles, lengths: tuple[int, int],
            pack: _Pack | None) -> tuple[Tensor, Tensor]:
    """Both entry points once their inputs are checked: causal and the window folded into the
    kernels' band for queries and keys of ``lengths`` (:func:`resolve_band`; for a pack its
    longest sequences: a side that cuts no key of those cuts none of any sequence, and a
    finite side the band keeps is exact in every sequence), the default scale 1/sqrt(D); FP8
    inputs (``descales``) forward only, without autograd."""
    band_causal, window = resolve_band(bool(causal), var.window, *lengths)
    sm_scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    dropout = (var.dropout_p, var.dropout_seed) if var.dropout_p else None
    device = _on_device(q)
    if descales is not None:
        if dropout is not None:
            raise NotImplementedError("dropout of FP8 inputs is not in the contract")
        if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, var.sinks)):
            raise NotImplementedError("FP8 inputs are forward only: call with inputs (and sinks) that do "
                                      "not require grad")
        factors = torch.stack(descales.per_query_head(q.shape[1]), -1).reshape(-1, 2).contiguous()
        mods = _Mods(band_causal, window, var.softcap, var.alibi_slopes, var.sinks, pack, None, factors)
        with device:
            return _forward(q, k, v, mods, sm_scale, tiles)
    with device:
        return _FlashAttention.apply(q, k, v, var.sinks, var.alibi_slopes, band_causal, window,
                                     var.softcap, sm_scale, tiles, pack, dropout)


def dropout_mask(q: Tensor, k: Tensor, v: Tensor, *, dropout_p: float, dropout_seed: int | None = None,
                 **call_keywords: object) -> Tensor:
    """The keep mask (B, Hq, Nq, Nk), bool, that :func:`attention` applies to the call with these
    arguments (as FlashAttention's ``return_attn_probs`` exposes its own), written by the same
    device code (``triton_attention_kernels._dropout_weights``). The call's other keywords
    (``call_keywords``: causal, scale, tiles, variants) do not change it; entries of keys a query
    does not see are kept or dropped as if it saw them. All True at p = 0."""
    check_dense(q, k, v)
    _check_supported(q)
    p, seed = check_dropout(dropout_p, dropout_seed)
    b, hq, nq, nk = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    if not p:
        return torch.ones((b, hq, nq, nk), dtype=torch.bool, device=q.device)
    mask = torch.empty((b, hq, nq, nk), dtype=torch.int8, device=q.device)
    seed_lo, seed_hi, threshold, _ = _dropout_args((p, seed))
    device = _on_device(q)
    with device:
        _dropout_mask[(triton.cdiv(nq, _MASK_TILE), b * hq)](mask, seed_lo, seed_hi, threshold, hq, nq, nk,
                                                             BLOCK_M=_MASK_TILE, BLOCK_N=_MASK_TILE)
    return mask.bool()


#: Query rows and keys per program of the dropout mask kernel.
_MASK_TILE = 32


#: FP8 inputs of both entry points (forward only), in either format, every descale shape; an FP8
#: KV cache in decode (kernels/triton_decode.py), in either format, per-tensor and per-head scales.
_FP8 = FP8(formats=frozenset(FORMATS), descales=frozenset(DESCALE_SHAPES),
           cache_scales=frozenset(CACHE_SCALE_SHAPES))
#: The variants both entry points take, forward and backward, in every combination with causal,
#: GQA, Dv != D and the declared dtypes; varlen (``attention.varlen``) in any combination with
#: them; KV-cache decode (``attention.kvcache``, forward only: kernels/triton_decode.py) too.
#: Dropout is dense and varlen, forward and backward; FP8 forward only.
_VARIANTS = {"window": True, "softcap": True, "alibi": ALIBI_SHAPES, "sinks": True, "varlen": True,
             "dropout": True, "fp8": _FP8,
             # the interpreter (CPU time): 8 splits (a program each), pages up to 64 keys
             "kvcache": KVCache(contiguous=True, max_splits=8 if INTERPRET else 128, max_queries=64,
                                page_sizes=(1, 16, 48, 64) if INTERPRET else (1, 16, 48, 64, 100, 256)),
             "variant_backward": frozenset({"window", "softcap", "alibi", "sinks", "varlen", "dropout"})}


#: FP8 problems whose logits may pass this (the Cauchy-Schwarz bound ``Problem.logit_bounds``) are
#: declared a known wrong answer on a GPU: :data:`_FP8_ACCUMULATION_REASON`.
_FP8_LOGIT_LIMIT: float = 64.0
_FP8_ACCUMULATION_REASON = (
    f"FP8 inputs whose logits may exceed {_FP8_LOGIT_LIMIT:g} in magnitude, on a GPU: Hopper's FP8 "
    "tensor cores accumulate Q K^T with about 14 bits (DeepSeek-V3 report, sec. 3.3.2), so a logit "
    "near 1600 is off by about 1 (the H200, 2026-12-01: fp8-forward, Problem(b=1, hq=3, hkv=3, nq=114, "
    "nk=139, d=231, dv=231, causal=True, scale=1.0, layout='transposed', dist='underflow', "
    "fp8=('e4m3', 'batch-head', 'saturated')): o off by 0.31, 11x the fp32-accumulating yardstick's "
    "error, lse by 1.17 at -1607); promoting the partial sums to fp32 every 32 products (DeepGEMM's "
    "two-level accumulation at one wgmma's K: tl.dot's max_num_imprecise_acc=32) cut the error of "
    "Q K^T 2.5-8x on the H100 (2026-12-05) and that problem still failed: the sum inside one wgmma "
    "is the limit; the interpreter sums in fp32"
)


def _fp8_far_logits(p: Problem) -> bool:
    """Whether ``p`` has FP8 inputs on a GPU and a logit bound above :data:`_FP8_LOGIT_LIMIT`."""
    return p.device == "cuda" and p.fp8 is not None and p.mode != "kvcache" and \
        float(p.logit_bounds().max()) > _FP8_LOGIT_LIMIT


def _capabilities() -> Capabilities:
    """What ``attention`` declares, chosen at import: under the interpreter CPU tensors in fp16,
    fp32, fp64; compiled, CUDA tensors in all four dtypes; neither (no GPU, no interpreter):
    no device at all. The variants (:data:`_VARIANTS`) everywhere."""
    bf16_on_cpu = Limit(  # FP8 inputs' dtype is o's, bfloat16: their dots are FP8; an FP8
        reason=_BF16_INTERPRETER_REASON,  # cache's is q's, in whose dtype its dots run
        applies=lambda p: p.device == "cpu" and p.dtype == torch.bfloat16 and (p.fp8 is None or
                                                                              p.mode == "kvcache"),
    )
    if INTERPRET:
        dtypes = frozenset({torch.float16, torch.float32, torch.float64})
        return Capabilities(dtypes=dtypes, devices=frozenset({"cpu"}), block_m=TILE_SIZES,
                            block_n=TILE_SIZES, fp32_matmul="ieee", limits=(bf16_on_cpu,),
                            **_VARIANTS)
    tiles_too_big = Limit(
        reason=_SMEM_REASON,
        applies=lambda p: (p.block_m is not None or p.block_n is not None) and not
        _explicit_tiles_fit(p.block_m or _DEFAULT_TILE, p.block_n or _DEFAULT_TILE,
                            p.d, p.dv, p.dtype),
    )
    grid_y = Limit(
        reason=f"batch * heads above {_MAX_GRID_Y}: CUDA's grid y dimension carries them",
        applies=lambda p: p.device == "cuda" and p.b * p.hq > _MAX_GRID_Y,
    )
    fp8_far_logits = Limit(reason=_FP8_ACCUMULATION_REASON, applies=_fp8_far_logits, raises=False)
    devices = frozenset({"cuda"}) if torch.cuda.is_available() else frozenset()
    return Capabilities(dtypes=frozenset(_ALL_DTYPES), devices=devices, block_m=TILE_SIZES,
                        block_n=TILE_SIZES, fp32_matmul="ieee",
                        limits=(bf16_on_cpu, tiles_too_big, grid_y, fp8_far_logits), **_VARIANTS)


attention.capabilities = _capabilities()
attention.last_launch = last_launch


@entry_point("kvcache", KEYWORDS["kvcache"])
def _kvcache(q: Tensor, k_cache: Tensor, v_cache: Tensor, kw: Keywords) -> tuple[Tensor, Tensor]:
    """KV-cache decode, forward only: :func:`kernels.triton_decode.kvcache` (its body, given the
    bound keywords), imported at the first call (that module builds on this one's helpers:
    importing it here would be a cycle)."""
    from flashprop.kernels.triton_decode import kvcache

    return kvcache.__wrapped__(q, k_cache, v_cache, kw)


attention.kvcache = _kvcache
attention.varlen = varlen
attention.dropout_mask = dropout_mask
