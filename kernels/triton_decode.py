"""KV-cache decode in Triton (flash-decoding): split-KV partials and their combine, read top to bottom.

The ``triton`` kernel's ``attention.kvcache`` (``docs/variants.md``'s decode contract,
``flash_attn_with_kvcache``'s signature); forward only.

Math. Batch element b holds a sequence of ``L_b = cache_seqlens[b]`` keys in its cache; its Nq
queries are the last Nq positions of that sequence, so with c = L_b - Nq query i is at position
i + c. For one query row (query i, query head h of kv head h // GROUP):

    s_j = scale * q_i . k_j                       (keys j < L_b that row i sees)
    lse_i = log sum_j exp(s_j),   o_i = sum_j exp(s_j - lse_i) v_j

Split-KV (flash-decoding). The key tiles a program's rows see are cut into ``num_splits``
contiguous runs of whole tiles; run s gives a partial (o_s, lse_s) over its keys alone, computed
with the online softmax (running maximum, denominator and accumulator, rescaled whenever the
maximum grows; base-2 units as in :mod:`kernels.triton_attention_kernels`), and the combine merges the
runs by their lse:

    lse = log sum_s exp(lse_s),   o = sum_s exp(lse_s - lse) o_s

A run with no key has lse_s = -inf and o_s = 0 and weighs exp(-inf) = 0: it changes nothing and
makes no NaN (the merge subtracts a maximum of -inf as 0). A sink logit z_h (``sinks``) is one
more term of the merge, a run of lse z_h and o = 0, so it enters once, whatever the splits.
With ``num_splits == 1`` there is no combine: the one run starts its online softmax at
(z_h, 1) and writes o and lse itself.

GQA packing. One program serves one (batch element, kv head, split) and every query row of that
kv head's group: ``R = GROUP * Nq`` rows, row r = query r // GROUP of query head
kv_head * GROUP + r % GROUP, padded to a tile of BLOCK_M rows (a power of two >= 16, the
smallest ``tl.dot`` takes; more rows than BLOCK_M are cut into row tiles, each a program). So
every key and value is read once per (split, row tile) instead of once per query head: decode
is bound by the cache's bytes, not by FLOPs.

Variants (``docs/variants.md``), per row with its own query position i + c:

    s_j = softcap * tanh(s_j / softcap)           (softcap > 0)
    s_j = s_j - slope_bh * |i + c - j|            (ALiBi: slopes (Hq,) or (B, Hq))
    s_j = -inf unless i + c - left <= j <= i + c + right   (window_size; causal: j <= i + c)

through the dense kernel's helpers (``_modified_scores``, ``_in_window``), and the band from its
``resolve_band`` with the cache's capacity as Nk (a side that cuts no key of the capacity cuts
none of any shorter sequence). Key tiles no row of a program sees (left of a window, right of
the diagonal) are skipped by the loop bounds before the splits are cut.

Conventions:

* q (B, Nq, Hq, D); the cache (B, Ncache, Hkv, D) contiguous, or (num_pages, page_size, Hkv, D)
  paged with an int32 ``block_table`` (B, max_pages): key position j of batch element b is row
  j % page_size of page ``block_table[b, j // page_size]``. Addresses are computed per key row
  (64-bit), so any page size and any strides work; nothing is made contiguous.
* Only cache positions j < L_b are read, and only the block-table entries of their pages: the
  loads are masked (other = 0) and the loops stop at the length. Lengths are clamped into
  [0, capacity] and page indices into [0, num_pages) in the kernel, so no value of them reads
  outside the tensors. So the values are checked while the kernels run
  (``kernels.triton_checks.start_cache_check``: one small kernel on a side stream, enqueued
  before the launches and read on the host after them; shapes and dtypes before it,
  ``check_decode``): the host waits for a few flags, not for the decode. A malformed call raises
  and its outputs are dropped. A CUDA graph cannot capture a call (the host reads the flags).
* o (B, Nq, Hq, Dv) in the inputs' dtype; lse (B, Hq, Nq) natural log, float32 (float64 for
  float64 inputs); a row that sees no key gets o = 0, lse = -inf (with a sink: lse = z_h).
  Partials are kept in the accumulator dtype (float32; float64 for float64).
* Dtypes, head dims (1..256, tiles padded to a power of two and masked), ``block_m`` (the row
  tile's upper bound) and ``block_n`` (the key tile) with their shared-memory limit on a GPU are
  the dense kernel's; bf16 is refused under the interpreter as there. The page sizes, splits and
  queries are declared in the dense module's capabilities (``attention.capabilities.kvcache``):
  fewer pages and splits under the interpreter, whose CPU runs each program after the other.
* An FP8 cache (``docs/variants.md``: float8_e4m3fn or float8_e5m2 k_cache and v_cache, fp16 or
  bf16 q, float32 ``k_scale`` and ``v_scale`` of shape () or (Hkv,)): s_j = scale * k_scale *
  q_i . k8_j and o = v_scale * sum_j p_j v8_j, each tile upcast exactly to q's dtype in
  registers, so the cache is read in one byte per value; o in q's dtype.

``num_splits=0`` chooses the split count (:func:`choose_splits`): two programs per SM for a
contiguous cache, six for a paged one (rounded down), while each run keeps a few key tiles.

Stages of this file:
  1. the partial kernel: one program per (split x row tile, kv head, batch element)
  2. the combine kernel: one program per output row
  3. host side: the split heuristic, tiles, input checks, the launches, ``kvcache``
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl
from flashprop.contract.capabilities import KVCache
from flashprop.contract.entry_points import KEYWORDS, Keywords, entry_point
from flashprop.contract.fp8 import is_fp8
from flashprop.contract.validate import (
    check_cache_scales,
    check_decode,
    check_variants,
)
from flashprop.kernels import triton_attention as ta
from flashprop.kernels.triton_attention_kernels import _INTERPRETED, INTERPRET, _in_window, _modified_scores
from flashprop.kernels.triton_attention_launch import (
    _MAX_GRID_Y,
    TILE_SIZES,
    _smem_bytes,
    _unspecialized,
    padded_head_dim,
    resolve_tiles,
)
from flashprop.kernels.triton_checks import start_cache_check
from torch import Tensor

# ---------------------------------------------------------------------------------------------
# Stage 1: the partial kernel
# ---------------------------------------------------------------------------------------------


@triton.jit
def _cache_rows(Table, off_b, offs_n, key_ok, stride_kp, stride_kn, stride_vp, stride_vn,
                stride_tb, stride_tp, page_size, num_pages, PAGED: tl.constexpr):
    """64-bit offsets, in the key and in the value cache, of key positions ``offs_n`` of batch
    element off_b (before the head and head-dim offsets). PAGED: row ``j % page_size`` of page
    ``Table[b, j // page_size]`` (``stride_kp``, ``stride_vp``: the page strides), the table read
    only where ``key_ok`` and the page index clamped into [0, num_pages); else row j of batch
    element b (``stride_kp``, ``stride_vp``: the batch strides)."""
    if PAGED:
        slot = offs_n // page_size
        page = tl.load(Table + off_b * stride_tb + slot * stride_tp, mask=key_ok, other=0)
        page = tl.minimum(tl.maximum(page, 0), num_pages - 1).to(tl.int64)
        row = (offs_n - slot * page_size).to(tl.int64)
        k_rows = page * stride_kp + row * stride_kn
        v_rows = page * stride_vp + row * stride_vn
    else:
        row = offs_n.to(tl.int64)
        k_rows = off_b * stride_kp + row * stride_kn
        v_rows = off_b * stride_vp + row * stride_vn
    return k_rows, v_rows


@triton.jit
def _upcast(x, dtype: tl.constexpr):
    """An FP8 tile's values exactly in q's 16-bit ``dtype``, through fp32 under the interpreter
    (whose conversion to fp32 is the exact one: ``triton_attention_kernels._operand``)."""
    if _INTERPRETED:
        x = x.to(tl.float32)
    return x.to(dtype)


@triton.jit
def _decode_partial(
    Q, K, V, Table, Lengths, Out, LSE,
    stride_qb, stride_qn, stride_qh, stride_qd,
    stride_kp, stride_kn, stride_kh, stride_kd,
    stride_vp, stride_vn, stride_vh, stride_vd,
    stride_tb, stride_tp, stride_l,
    stride_ob, stride_on, stride_oh, stride_od,
    H_KV, GROUP, N_Q, capacity, page_size, num_pages, num_splits,
    qk_scale: tl.float64, win_left, win_right, softcap2: tl.float64, Slopes, stride_ab, stride_ah,
    Sinks, stride_z, Scales,
    head_dim, head_dim_v, EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, PAGED: tl.constexpr,
    CAUSAL: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
    SINKS: tl.constexpr, FP8_CACHE: tl.constexpr, COMBINE: tl.constexpr, ACC_DTYPE: tl.constexpr,
    PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """One run of key tiles for one row tile of one (batch element, kv head).
    Grid: (num_splits * row tiles, H_KV, B), the row tile fastest (its programs read the same keys).

    K, V are the cache (``stride_kp``: the batch stride, or the page stride when PAGED with the
    int32 ``Table``); ``Lengths`` the int32 cache lengths (stride ``stride_l``). qk_scale,
    win_left, win_right, softcap2 and the ALiBi slopes' strides as
    :func:`kernels.triton_attention_kernels._attn_fwd` takes them (CAUSAL, WINDOW: the band of
    ``resolve_band``). COMBINE: ``Out`` (B, H_KV, num_splits, R, Dv) and ``LSE`` (B, H_KV,
    num_splits, R) are contiguous partials in ACC_DTYPE, o_s normalised and lse_s in base 2, no
    sink; else ``Out`` is the strided o (B, Nq, Hq, Dv), ``LSE`` the contiguous (B, Hq, Nq)
    natural-log lse, and the sinks (SINKS) start the online softmax. Unused pointers point at
    any tensor, unused integers are 0.

    FP8_CACHE: K, V in one FP8 format, Q 16-bit; ``Scales`` a contiguous float32 (B, H_KV, 2) of
    each (batch element, kv head)'s ``k_scale`` and ``v_scale``. Each tile is upcast to q's dtype
    (exactly: e4m3 and e5m2 fit fp16 and bf16), k's scale is folded into the softmax scale and
    v's applied to o (partials too: the combine is linear in them), P rounded to q's dtype for
    P V, as FlashInfer's decode does (``docs/variants.md``).
    """
    n_rows = GROUP * N_Q
    row_tiles = tl.cdiv(n_rows, BLOCK_M)
    split = tl.program_id(0) // row_tiles
    tile = tl.program_id(0) % row_tiles
    off_hkv = tl.program_id(1).to(tl.int64)
    off_b = tl.program_id(2).to(tl.int64)
    length = tl.minimum(tl.maximum(tl.load(Lengths + off_b * stride_l), 0), capacity)
    offset = length - N_Q  # c: query i sits at position i + c

    offs_r = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = offs_r < n_rows
    query = offs_r // GROUP
    head = off_hkv * GROUP + offs_r % GROUP
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)

    # the keys the tile's queries see: [lo, hi), then this split's run of whole tiles in it
    first_q = (tile * BLOCK_M) // GROUP
    last_q = (tl.minimum(tile * BLOCK_M + BLOCK_M, n_rows) - 1) // GROUP
    lo = 0
    hi = length
    if CAUSAL:
        hi = tl.minimum(tl.maximum(last_q + offset + 1, 0), length)
    if WINDOW:
        hi = tl.minimum(tl.maximum(last_q + offset + win_right + 1, 0), length)
        lo = tl.minimum(tl.maximum(first_q + offset - win_left, 0), hi)
    first_tile = lo // BLOCK_N
    n_tiles = tl.where(hi > lo, tl.cdiv(hi, BLOCK_N) - first_tile, 0)
    per_split = tl.cdiv(n_tiles, num_splits)
    run_lo = (first_tile + split * per_split) * BLOCK_N
    run_hi = tl.minimum((first_tile + tl.minimum((split + 1) * per_split, n_tiles)) * BLOCK_N, hi)

    q_rows = off_b * stride_qb + query.to(tl.int64) * stride_qn + head * stride_qh
    q_mask = row_ok[:, None] if EVEN_D else row_ok[:, None] & (offs_d < head_dim)[None, :]
    q = tl.load(Q + q_rows[:, None] + (offs_d * stride_qd)[None, :], mask=q_mask, other=0.0)
    scale2 = tl.full([], qk_scale, ACC_DTYPE)
    if FP8_CACHE:  # the logits of the dequantised keys: q k8 * k_scale
        scales = Scales + (off_b * H_KV + off_hkv) * 2
        scale2 = scale2 * tl.load(scales).to(ACC_DTYPE)
    cap2 = tl.full([], softcap2, ACC_DTYPE)
    log2e = tl.full([], 1.4426950408889634, ACC_DTYPE)
    if ALIBI:
        slopes = tl.load(Slopes + off_b * stride_ab + head * stride_ah, mask=row_ok, other=0.0)
        slope2 = (slopes.to(ACC_DTYPE) * log2e)[:, None]
    else:
        slope2 = tl.zeros([BLOCK_M, 1], ACC_DTYPE)

    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=ACC_DTYPE)
    if SINKS and not COMBINE:  # the sink: a key of logit z_h with no value, already seen
        z = tl.load(Sinks + head * stride_z, mask=row_ok, other=0.0)
        m_i = z.to(ACC_DTYPE) * log2e
        l_i = tl.full([BLOCK_M], 1.0, ACC_DTYPE)
    else:
        m_i = tl.full([BLOCK_M], float("-inf"), ACC_DTYPE)
        l_i = tl.zeros([BLOCK_M], dtype=ACC_DTYPE)

    k_base = K + off_hkv * stride_kh
    v_base = V + off_hkv * stride_vh
    for start_n in range(run_lo, run_hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        key_ok = offs_n < run_hi  # never a position >= L_b
        k_rows, v_rows = _cache_rows(Table, off_b, offs_n, key_ok, stride_kp, stride_kn, stride_vp,
                                     stride_vn, stride_tb, stride_tp, page_size, num_pages, PAGED)
        k_mask = key_ok[:, None] if EVEN_D else key_ok[:, None] & (offs_d < head_dim)[None, :]
        k = tl.load(k_base + k_rows[:, None] + (offs_d * stride_kd)[None, :], mask=k_mask, other=0.0)
        if FP8_CACHE:
            k = _upcast(k, q.dtype)
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION, out_dtype=ACC_DTYPE)
        if SOFTCAP or ALIBI:
            s, _ = _modified_scores(qk, query[:, None], offs_n[None, :], N_Q, length, scale2,
                                    SOFTCAP, cap2, ALIBI, slope2, q.dtype)
        else:
            s = qk * scale2
        visible = key_ok[None, :]
        if CAUSAL:
            visible = visible & (offs_n[None, :] <= query[:, None] + offset)
        if WINDOW:
            visible = visible & _in_window(query[:, None], offs_n[None, :], N_Q, length, win_left,
                                           win_right)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet: exp2(-inf) = 0
        p = tl.exp2(s - m_sub[:, None])
        alpha = tl.exp2(m_i - m_sub)
        l_i = l_i * alpha + tl.sum(p, 1)
        v_mask = key_ok[:, None] if EVEN_DV else key_ok[:, None] & (offs_dv < head_dim_v)[None, :]
        v = tl.load(v_base + v_rows[:, None] + (offs_dv * stride_vd)[None, :], mask=v_mask, other=0.0)
        if FP8_CACHE:
            v = _upcast(v, q.dtype)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION,
                     out_dtype=ACC_DTYPE)
        m_i = m_new

    # epilogue: rows that saw no key (nor a sink) have l_i = 0 -> o = 0, lse = -inf
    empty = l_i == 0.0
    o = acc / tl.where(empty, 1.0, l_i)[:, None]
    if FP8_CACHE:  # the dequantised values: v8 * v_scale
        o = o * tl.load(scales + 1).to(ACC_DTYPE)
    lse2 = tl.where(empty, float("-inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))
    dv_ok = row_ok[:, None] & (offs_dv < head_dim_v)[None, :]
    if COMBINE:
        part = ((off_b * H_KV + off_hkv) * num_splits + split) * n_rows + offs_r
        tl.store(Out + (part * head_dim_v)[:, None] + offs_dv[None, :], o, mask=dv_ok)
        tl.store(LSE + part, lse2, mask=row_ok)
    else:
        o_rows = off_b * stride_ob + query.to(tl.int64) * stride_on + head * stride_oh
        tl.store(Out + o_rows[:, None] + (offs_dv * stride_od)[None, :], o.to(Out.dtype.element_ty),
                 mask=dv_ok)
        ln2 = tl.full([], 0.6931471805599453, ACC_DTYPE)
        tl.store(LSE + (off_b * H_KV * GROUP + head) * N_Q + query, lse2 * ln2, mask=row_ok)


# ---------------------------------------------------------------------------------------------
# Stage 2: the combine kernel
# ---------------------------------------------------------------------------------------------


@triton.jit
def _decode_combine(
    OPart, LSEPart, Out, LSE, Sinks,
    stride_ob, stride_on, stride_oh, stride_od, stride_z,
    H_KV, GROUP, N_Q, num_splits, head_dim_v,
    BLOCK_DV: tl.constexpr, SINKS: tl.constexpr, ACC_DTYPE: tl.constexpr, BLOCK_S: tl.constexpr,
):
    """o and lse of one query row from its num_splits partials (:func:`_decode_partial`'s COMBINE
    layout), BLOCK_S splits at a time, merged online by their base-2 lse; the sink (SINKS) is
    the merge's starting term (lse z_h, o = 0). Partials of lse -inf weigh 0 and their o is not
    read. Grid: (GROUP * Nq, H_KV, B)."""
    row = tl.program_id(0)
    off_hkv = tl.program_id(1).to(tl.int64)
    off_b = tl.program_id(2).to(tl.int64)
    n_rows = GROUP * N_Q
    query = row // GROUP
    head = off_hkv * GROUP + row % GROUP
    offs_dv = tl.arange(0, BLOCK_DV)
    dv_ok = offs_dv < head_dim_v
    first = (off_b * H_KV + off_hkv) * num_splits * n_rows + row  # split s's row: first + s * R

    log2e = tl.full([], 1.4426950408889634, ACC_DTYPE)
    if SINKS:
        m_i = tl.load(Sinks + head * stride_z).to(ACC_DTYPE) * log2e
        l_i = tl.full([], 1.0, ACC_DTYPE)
    else:
        m_i = tl.full([], float("-inf"), ACC_DTYPE)
        l_i = tl.zeros([], ACC_DTYPE)
    acc = tl.zeros([BLOCK_DV], dtype=ACC_DTYPE)
    for start_s in range(0, num_splits, BLOCK_S):
        offs_s = start_s + tl.arange(0, BLOCK_S)
        parts = first + offs_s.to(tl.int64) * n_rows
        lse_s = tl.load(LSEPart + parts, mask=offs_s < num_splits, other=float("-inf"))
        m_new = tl.maximum(m_i, tl.max(lse_s, 0))
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        w = tl.exp2(lse_s - m_sub)
        alpha = tl.exp2(m_i - m_sub)
        seen = lse_s > float("-inf")
        o_s = tl.load(OPart + (parts * head_dim_v)[:, None] + offs_dv[None, :],
                      mask=seen[:, None] & dv_ok[None, :], other=0.0)
        acc = acc * alpha + tl.sum(w[:, None] * o_s, 0)
        l_i = l_i * alpha + tl.sum(w, 0)
        m_i = m_new

    empty = l_i == 0.0
    o = acc / tl.where(empty, 1.0, l_i)
    ln2 = tl.full([], 0.6931471805599453, ACC_DTYPE)
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(tl.where(empty, 1.0, l_i))) * ln2)
    o_row = off_b * stride_ob + query.to(tl.int64) * stride_on + head * stride_oh
    tl.store(Out + o_row + offs_dv * stride_od, o.to(Out.dtype.element_ty), mask=dv_ok)
    tl.store(LSE + (off_b * H_KV * GROUP + head) * N_Q + query, lse)


# ---------------------------------------------------------------------------------------------
# Stage 3: host side
# ---------------------------------------------------------------------------------------------

#: What the entry point declares: ``attention.capabilities.kvcache`` of the dense module, the one
#: place its limits are written. The addressing takes any page size (per key row); other sizes
#: are refused only so that the declaration, which the error contract checks, is exact: add one
#: there to declare it.
DECLARATION: KVCache = ta.attention.capabilities.kvcache
PAGE_SIZES: tuple[int, ...] = DECLARATION.page_sizes
#: The FP8 cache's declaration (``attention.capabilities.fp8``: its ``cache_scales`` and formats).
DECLARATION_FP8 = ta.attention.capabilities.fp8
#: The most splits a call takes (``num_splits``), and the heuristic's cap: 128 on a GPU, 8 under the
#: interpreter (it runs each split's program after the other, on the CPU).
MAX_SPLITS: int = DECLARATION.max_splits
#: The most queries per sequence (Nq) a call decodes.
MAX_QUERIES: int = DECLARATION.max_queries

#: Key tile (BLOCK_N) without ``block_n``: the dense kernel's 32 under the interpreter (CPU
#: problems are short); on a GPU 64 keys x 128 dims x 2 bytes (16 KiB) per K or V tile,
#: pipelined three deep.
INTERPRETER_BLOCK_N: int = 32
_DEFAULT_BLOCK_N: int = INTERPRETER_BLOCK_N if INTERPRET else 64
#: The largest row tile (BLOCK_M) without ``block_m``: a GQA group of 8 query heads at Nq = 8 fits
#: one tile; more rows are cut into row tiles (each reads the keys again).
_MAX_ROWS: int = 64
#: Partials the combine kernel merges per step of its loop (4 under the interpreter, whose
#: declared max_splits is 8: so CPU runs take the loop more than once too).
_COMBINE_SPLITS: int = 4 if INTERPRET else 16
#: The split heuristic: resident programs to aim for per SM, for contiguous and for paged caches,
#: and the fewest key tiles a run keeps (below, the partial's fixed costs and the combine
#: dominate). Measured on the H200 (``ci/decode_tuning.py``, docs/results/2026-12-02-s31-h200.md):
#: with B * Hkv * row tiles * splits programs, 256 on 132 SMs read 97-103% of the copy bandwidth
#: from contiguous caches and 512 only 84-89% (a partial extra round of programs), so the count
#: is rounded down; paged caches, whose page-table loads add a dependent latency to every tile,
#: read most with about six programs per SM (B = 32: three splits, 91-100%, against 71-80% with
#: two).
_PROGRAMS_PER_SM: dict[bool, int] = {False: 2, True: 6}
_MIN_TILES_PER_SPLIT: int = 4
#: SMs the heuristic assumes without a GPU (the interpreter): an H200's, so the CPU runs choose
#: the splits a GPU would choose for the same problem.
_NOMINAL_SMS: int = 132
#: Bytes of shared memory the default tiles may use on a GPU (per stage: a K and a V tile).
_SMEM_BUDGET: int = 160 * 1024
#: CUDA's limit on the grid's y and z axes (kv heads, batch elements).
_MAX_GRID_YZ: int = 65535
#: From this many cached keys per call (B * Hkv * capacity) on, the launch uses the kernels that
#: Triton specialises on their integer arguments and pointer alignment (unit and 16-multiple
#: strides known at compile time: vectorised loads), a compilation per combination; smaller
#: calls (the property suite's many small, varied problems) use the twins compiled once per set
#: of compile-time constants (``kernels.triton_attention_launch._unspecialized``). 2^13: the smallest
#: benchmark row (B = 1, Hkv = 8, 1k keys) is specialised; the GPU suite's largest decode problem
#: (B = 3, Hkv = 3, a capacity of 3 pages of 256) is not.
_SPECIALISE_MIN_KEYS: int = 2**13


def choose_splits(batch: int, kv_heads: int, row_tiles: int, capacity: int, block_n: int,
                  sms: int, paged: bool = False) -> int:
    """The split count for ``num_splits=0``: the most splits whose programs (``batch * kv_heads *
    row_tiles * splits``) stay within _PROGRAMS_PER_SM[paged] per SM of ``sms``, but no more splits
    than leave each run _MIN_TILES_PER_SPLIT key tiles of the capacity (the longest sequence the
    cache holds), and at most MAX_SPLITS. At least 1.

    On an H200 (132 SMs), Hkv = 8, one row tile: a contiguous cache takes 33 splits at B = 1 from
    33 * 256 keys on (8.4k; fewer below), 4 at B = 8 and 1 from B = 32 on; a paged one 99, 12 and
    3. It reads the capacity, not ``cache_seqlens``, so choosing needs no device
    synchronisation; a sequence shorter than the capacity gets runs of fewer tiles (its splits
    cut its own key range)."""
    wanted = _PROGRAMS_PER_SM[paged] * sms // max(1, batch * kv_heads * row_tiles)
    room = max(1, capacity // (_MIN_TILES_PER_SPLIT * block_n))
    return max(1, min(MAX_SPLITS, wanted, room))


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _sms(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (:data:`_NOMINAL_SMS` for the interpreter's CPU)."""
    if device.type != "cuda":
        return _NOMINAL_SMS
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


def _tiles(rows: int, d: int, dv: int, dtype: torch.dtype, block_m: int | None,
           block_n: int | None) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages). BLOCK_M: the ``rows`` padded to a power of two
    >= 16, at most ``block_m`` (or _MAX_ROWS); BLOCK_N: ``block_n`` or the default, halved on a GPU
    until three stages of K and V tiles fit the budget (large head dims, fp32, fp64). Explicit
    tiles over the dense kernel's shared-memory budget are refused as the dense kernel refuses
    them (``resolve_tiles``: the same ``Limit``)."""
    if block_m is not None or block_n is not None:
        resolve_tiles(1, 1, d, dv, dtype, block_m, block_n)  # raises NotImplementedError when over
    block_m_ = min(block_m or _MAX_ROWS, max(16, triton.next_power_of_2(rows)))
    width = padded_head_dim(d) + padded_head_dim(dv)
    if block_n is not None:
        stages = 2 if _smem_bytes(block_m_, block_n, width, dtype.itemsize, 2) <= _SMEM_BUDGET else 1
        return block_m_, block_n, 4, stages
    tile = _DEFAULT_BLOCK_N
    while tile > 16 and _smem_bytes(block_m_, tile, width, dtype.itemsize, 3) > _SMEM_BUDGET:
        tile //= 2
    stages = 3 if _smem_bytes(block_m_, tile, width, dtype.itemsize, 3) <= _SMEM_BUDGET else 1
    return block_m_, tile, 4, stages


def _check_tensors(q: object, k_cache: object, v_cache: object, scale: float | None,
                   block_m: int | None, block_n: int | None) -> None:
    """What the kernels take beyond ``check_decode``'s shapes: tensors of one declared dtype on one
    device, the interpreter for CPU tensors (no bf16 there), head dims <= 256, 32-bit head-dim
    offsets, a finite scale, declared tiles; inputs that do not require grad (forward only)."""
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not (is_fp8(k_cache) or is_fp8(v_cache)) and not q.dtype == k_cache.dtype == v_cache.dtype:
        raise TypeError(f"q, k_cache, v_cache must share a dtype (or the cache be FP8), got {q.dtype}, "
                        f"{k_cache.dtype}, {v_cache.dtype}")
    if q.dtype not in ta._ALL_DTYPES:
        raise TypeError(f"dtype {q.dtype} is not supported (fp16, bf16, fp32, fp64)")
    if not q.device == k_cache.device == v_cache.device:
        raise ValueError(f"q, k_cache, v_cache must share a device, got {q.device}, {k_cache.device}, "
                         f"{v_cache.device}")
    if q.device.type not in ("cpu", "cuda"):
        raise NotImplementedError(f"device type {q.device.type} is not supported")
    if q.device.type == "cpu" and not INTERPRET:
        raise NotImplementedError("CPU tensors run only under Triton's interpreter: set TRITON_INTERPRET=1 "
                                  "before kernels.triton_attention is imported")
    if INTERPRET and q.dtype == torch.bfloat16:
        raise NotImplementedError(f"bfloat16 under the interpreter: {ta._BF16_INTERPRETER_REASON}")
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k_cache, v_cache)):
        raise NotImplementedError("kvcache is forward only: call it on inputs that do not require grad")
    if q.dim() == 4 and v_cache.dim() == 4 and (q.shape[-1] > 256 or v_cache.shape[-1] > 256):
        raise NotImplementedError(f"head dims above 256 are not supported (D={q.shape[-1]}, "
                                  f"Dv={v_cache.shape[-1]})")
    if scale is not None and not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale}")
    for name, tile in (("block_m", block_m), ("block_n", block_n)):
        if tile is not None and tile not in TILE_SIZES:
            raise ValueError(f"{name}={tile} is not one of {TILE_SIZES}")
    ta._check_columns(q, k_cache, v_cache)


def _check_declared(q: Tensor, k_cache: Tensor, block_table: Tensor | None, hkv: int) -> None:
    """Refuse, with NotImplementedError, what :data:`DECLARATION` and the grid do not cover."""
    b, nq = q.shape[:2]
    if block_table is not None and k_cache.shape[1] not in PAGE_SIZES:
        raise NotImplementedError(f"page_size={k_cache.shape[1]} is not declared (page sizes {PAGE_SIZES}: "
                                  "any size works; the declaration lists those the suite checks)")
    if nq > MAX_QUERIES:
        raise NotImplementedError(f"Nq={nq} queries per sequence: at most {MAX_QUERIES} are decoded at once")
    if q.device.type == "cuda" and b * q.shape[2] > _MAX_GRID_Y:
        raise NotImplementedError(f"batch * heads = {b * q.shape[2]} exceeds the grid limit "
                                  f"{_MAX_GRID_Y} (the dense kernel's limit, declared for both)")
    if q.device.type == "cuda" and max(b, hkv) > _MAX_GRID_YZ:
        raise NotImplementedError(f"B={b}, Hkv={hkv}: at most {_MAX_GRID_YZ} each (CUDA grid axes)")


def _kernels(keys: int, device: torch.device) -> tuple:
    """(partial, combine): Triton-specialised for calls of at least _SPECIALISE_MIN_KEYS cached keys
    on a GPU, else their twins compiled once per set of compile-time constants."""
    if device.type == "cuda" and keys >= _SPECIALISE_MIN_KEYS:
        return _decode_partial, _decode_combine
    return PARTIAL_PLAIN, COMBINE_PLAIN


#: The unspecialised twins of the two kernels (``kernels.triton_attention_launch._unspecialized``).
PARTIAL_PLAIN = _unspecialized(_decode_partial)
COMBINE_PLAIN = _unspecialized(_decode_combine)


#: What the last call launched: (splits, row tiles, BLOCK_M, BLOCK_N, num_warps, num_stages,
#: specialised), formatted only when asked (:func:`last_launch`).
_LAST_LAUNCH: dict[str, tuple[int, int, int, int, int, int, bool]] = {}


def last_launch() -> dict[str, str]:
    """The split count, tiles, warps and stages of the last call, e.g. ``{"decode": "33 splits x 1
    row tile of 16 x 64, w4 s3, specialised"}``: what the heuristic chose, for benchmark reports."""
    return {
        name: f"{splits} split{'s' * (splits > 1)} x {tiles} row tile{'s' * (tiles > 1)} of {bm} x {bn}, "
              f"w{warps} s{stages}, {'specialised' if special else 'unspecialised'}"
        for name, (splits, tiles, bm, bn, warps, stages, special) in _LAST_LAUNCH.items()
    }


def partial_meta(d: int, dv: int, dtype: torch.dtype, rows: int, *, paged: bool, combine: bool,
                 mods: ta._Mods, block_m: int | None = None, block_n: int | None = None,
                 fp8_cache: bool = False) -> dict:
    """The partial kernel's compile-time parameters and launch options (``num_warps``,
    ``num_stages``) for head dims ``d``, ``dv``, q's ``dtype``, ``rows`` query rows per kv head
    (GQA group x Nq), a paged cache or not, an FP8 one or not, a combine after it or not, the
    variants ``mods`` (as ``resolve_band`` gives them) and the tile bounds (:func:`_tiles`; an FP8
    cache's tiles are upcast to q's dtype, so they are sized as q's): what :func:`kvcache`
    launches, and what ``ci/compile_triton.py`` compiles."""
    block_m_, block_n_, warps, stages = _tiles(rows, d, dv, dtype, block_m, block_n)
    block_d, block_dv = padded_head_dim(d), padded_head_dim(dv)
    return {
        "EVEN_D": block_d == d, "EVEN_DV": block_dv == dv, "BLOCK_D": block_d, "BLOCK_DV": block_dv,
        "PAGED": paged, "CAUSAL": mods.causal, "WINDOW": mods.window is not None,
        "SOFTCAP": bool(mods.softcap), "ALIBI": mods.slopes is not None, "SINKS": mods.sinks is not None,
        "FP8_CACHE": fp8_cache, "COMBINE": combine, "ACC_DTYPE": _acc(dtype), "PRECISION": "ieee",
        "BLOCK_M": block_m_, "BLOCK_N": block_n_, "num_warps": warps, "num_stages": stages,
    }


def combine_meta(dv: int, dtype: torch.dtype, splits: int, sinks: bool) -> dict:
    """The combine kernel's compile-time parameters and launch options for ``splits`` partials."""
    return {"BLOCK_DV": padded_head_dim(dv), "SINKS": sinks, "ACC_DTYPE": _acc(dtype),
            "BLOCK_S": min(_COMBINE_SPLITS, triton.next_power_of_2(splits)), "num_warps": 4,
            "num_stages": 1}


def _acc(dtype: torch.dtype) -> tl.dtype:
    """The kernels' ACC_DTYPE: float64 for float64 inputs, else float32."""
    return tl.float64 if dtype == torch.float64 else tl.float32


@entry_point("kvcache", KEYWORDS["kvcache"])  # every keyword of the contract
def kvcache(q: Tensor, k_cache: Tensor, v_cache: Tensor, kw: Keywords) -> tuple[Tensor, Tensor]:
    """KV-cache decode (``flash_attn_with_kvcache``), forward only: returns (o, lse).

    q (B, Nq, Hq, D); k_cache, v_cache (B, Ncache, Hkv, D / Dv), or paged (num_pages, page_size,
    Hkv, D / Dv) with an int32 ``block_table`` (B, max_pages); int32 ``cache_seqlens`` (B,); any
    strides. ``num_splits``: split-KV runs, 1..MAX_SPLITS, 0 to let :func:`choose_splits` pick.
    ``causal`` (bottom-right: query i sees keys j <= i + L_b - Nq), ``scale`` (default
    1/sqrt(D)) and the variants as the dense ``attention`` takes them; ``block_m`` / ``block_n``
    bound the row and key tiles. An FP8 cache (float8_e4m3fn or float8_e5m2, with fp16 or bf16
    q) takes float32 ``k_scale``, ``v_scale`` of shape () or (Hkv,) (FlashInfer's and vLLM's
    convention; 1 when left out). o (B, Nq, Hq, Dv) in q's dtype, lse (B, Hq, Nq) float32
    (float64 for float64). Inputs are checked by ``contract.validate.check_decode``,
    ``check_variants`` and ``check_cache_scales`` (clear errors for malformed lengths, tables,
    splits and scales).
    """
    cache_seqlens, block_table, num_splits = kw.cache_seqlens, kw.block_table, kw.num_splits
    scale, block_m, block_n = kw.scale, kw.block_m, kw.block_n
    _check_tensors(q, k_cache, v_cache, scale, block_m, block_n)
    # shapes, dtypes and num_splits now; the values of the lengths and the table beside the launch
    capacity = check_decode(q, k_cache, v_cache, cache_seqlens, block_table, num_splits, MAX_SPLITS,
                            values=False)
    b, nq, hq, d = q.shape
    hkv, dv = k_cache.shape[2], v_cache.shape[3]
    _check_declared(q, k_cache, block_table, hkv)
    fp8 = check_cache_scales(q, k_cache, v_cache, kw.k_scale, kw.v_scale,
                             shapes=DECLARATION_FP8.cache_scales)
    var = check_variants(b, hq, q.device, **kw.variants)
    band_causal, window = ta.resolve_band(bool(kw.causal), var.window, nq, capacity)
    mods = ta._Mods(band_causal, window, var.softcap, var.alibi_slopes, var.sinks)
    sm_scale = 1.0 / math.sqrt(d) if scale is None else float(scale)

    acc_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    o = torch.empty((b, nq, hq, dv), dtype=q.dtype, device=q.device)
    lse = torch.empty((b, hq, nq), dtype=acc_dtype, device=q.device)
    values_checked = start_cache_check(k_cache, cache_seqlens, block_table, capacity)
    if o.numel() == 0 and lse.numel() == 0:
        values_checked()
        return o, lse
    group = hq // hkv
    rows = group * nq
    paged = block_table is not None
    meta = partial_meta(d, dv, q.dtype, rows, paged=paged, combine=False, mods=mods,
                        block_m=block_m, block_n=block_n, fp8_cache=fp8 is not None)
    row_tiles = triton.cdiv(rows, meta["BLOCK_M"])
    splits = num_splits or choose_splits(b, hkv, row_tiles, capacity, meta["BLOCK_N"], _sms(q.device), paged)
    meta["COMBINE"] = splits > 1
    partial, combine = _kernels(b * hkv * capacity, q.device)
    _LAST_LAUNCH["decode"] = (splits, row_tiles, meta["BLOCK_M"], meta["BLOCK_N"], meta["num_warps"],
                              meta["num_stages"], partial is _decode_partial)

    table = block_table if paged else cache_seqlens  # an unused pointer points at any tensor
    page_size, num_pages = (k_cache.shape[1], k_cache.shape[0]) if paged else (0, 0)
    if splits > 1:
        out = torch.empty((b, hkv, splits, rows, dv), dtype=acc_dtype, device=q.device)
        out_lse = torch.empty((b, hkv, splits, rows), dtype=acc_dtype, device=q.device)
    else:
        out, out_lse = o, lse
    sinks_ = (mods.sinks, mods.sinks.stride(0)) if mods.sinks is not None else (lse, 0)
    scales = lse if fp8 is None else torch.stack((fp8.k, fp8.v), dim=-1).contiguous()  # (B, Hkv, 2)
    device = ta._on_device(q)
    with device:
        partial[(splits * row_tiles, hkv, b)](
            q, k_cache, v_cache, table, cache_seqlens, out, out_lse,
            *q.stride(), *k_cache.stride(), *v_cache.stride(),
            *(table.stride() if paged else (0, 0)), cache_seqlens.stride(0), *o.stride(),
            hkv, group, nq, capacity, page_size, num_pages, splits,
            *ta._variant_args(lse, mods, sm_scale), *sinks_, scales, d, dv, **meta,
        )
        if splits > 1:
            combine[(rows, hkv, b)](
                out, out_lse, o, lse, sinks_[0], *o.stride(), sinks_[1], hkv, group, nq, splits, dv,
                **combine_meta(dv, q.dtype, splits, mods.sinks is not None),
            )
    values_checked()  # raises for a malformed call, whose o is dropped
    return o, lse


kvcache.last_launch = last_launch
# The entry point the dense module exposes (``attention.kvcache``, which imports this module at
# its first call) tells what it launched too, as ``attention.last_launch`` does for the dense passes.
ta._kvcache.last_launch = last_launch
