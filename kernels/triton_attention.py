"""Fused FlashAttention-2 in Triton: forward and backward, read top to bottom.

Math. For one (batch, query head) pair with queries q_i, keys k_j and values v_j:

    s_ij = scale * q_i . k_j                      (only keys j visible to query i)
    lse_i = log sum_j exp(s_ij)                   (natural log)
    o_i = sum_j exp(s_ij - lse_i) v_j

The forward streams over key tiles with the online softmax: a running row maximum m_i, a running
denominator l_i and an unnormalised accumulator acc_i, rescaled by exp(m_old - m_new) whenever
the maximum grows. Exponentials use exp2, so scores are kept in base-2 units
(s * scale * log2(e)) and converted back to natural log for lse.

The backward (FlashAttention-2) recomputes P = exp(S - lse) tile by tile:

    dV = P^T dO         dP = dO V^T         dS = P * (dP - Delta)
    dQ = scale * dS K   dK = scale * dS^T Q   with Delta_i = rowsum(dO_i * o_i) - dlse_i

(the dlse term makes lse differentiable too: d lse_i / d s_ij = P_ij).

Variants (``docs/variants.md``, the FlashAttention order of operations), with c = Nk - Nq:

    s_ij = softcap * tanh(s_ij / softcap)         (softcap > 0; tanh: :func:`_tanh`)
    s_ij = s_ij - slope_bh * |i + c - j|          (ALiBi: slopes (Hq,) or (B, Hq))
    s_ij = -inf unless i + c - left <= j <= i + c + right   (window_size; -1: unbounded side)
    a sink logit z_h joins every row's softmax as a key with no value: the online softmax
    starts at m = z_h, l = 1, so lse_i = logaddexp(lse_keys_i, z_h) and o shrinks

and in the backward the softcap's derivative, dS <- dS * (1 - tanh^2) (ALiBi and masks are
additive), and the sinks' gradient dz_h = -sum_{b,i} exp(z_h - lse_bhi) * Delta_bhi (Delta as
above, dlse included). Key tiles outside a window are skipped by the loop bounds, as the
causal ones are. Each variant is a compile-time switch (``WINDOW``, ``SOFTCAP``, ``ALIBI``,
``SINKS``, ``VARLEN``): off, the kernels compile exactly the dense code.

Varlen (``varlen``, ``flash_attn_varlen_func``'s signature; ``VARLEN``): sequence s of a pack is
queries cu_q[s]:cu_q[s + 1] and keys cu_k[s]:cu_k[s + 1] of token-major tensors, and everything
above holds for each sequence alone with its own Nq_s, Nk_s and c = Nk_s - Nq_s. The grids run
over the longest sequences' tiles times sequences times heads; each program reads its
sequence's bounds from cu_seqlens and exits at once when its tile lies past the sequence's
end; tiles address the sequence's rows from its first token, so the loops are the dense ones.
The backward preprocess needs no sequences: it runs on the pack as one batch element.

Conventions (the flashprop kernel contract: the README's conventions table):

* q (B, Hq, Nq, D), k (B, Hkv, Nk, D), v (B, Hkv, Nk, Dv); any strides (strides are passed to
  the kernels, nothing is made contiguous); Dv may differ from D; D, Dv in 1..256 (tiles are
  padded to a power of two >= 16 and loads/stores masked).
* GQA/MQA: query head h reads kv head h // (Hq // Hkv); dK/dV are summed over the group inside
  one program (a loop over the group's query heads), so the backward needs no atomics and is
  deterministic.
* causal is bottom-right aligned: query i sees key j iff j <= i + (Nk - Nq). Key tiles no query
  row of a block sees are skipped; tiles on the diagonal are masked. A row that sees no key
  (Nq > Nk) gets o = 0, lse = -inf and zero gradients (with a sink: o = 0, lse = z_h).
* window_size=(left, right) is bottom-right aligned too; with causal the right edge is the
  diagonal. The host folds it into one band ``i + c - left <= j <= i + c + right`` with both
  sides finite (an unbounded side becomes one that cuts nothing): :func:`resolve_band`.
* varlen: q (Tq, Hq, D), k (Tk, Hkv, D), v (Tk, Hkv, Dv), any strides; int32 cu_seqlens_q/k
  of B + 1 entries from 0 to Tq, Tk (zero-length sequences legal, checked on the host:
  ``contract.validate.check_varlen``); o (Tq, Hq, Dv) token-major, lse (Hq, Tq). Causal and
  the window are bottom-right aligned per sequence; (B, Hq) ALiBi slopes give sequence s row s;
  a sequence with no key gets o = 0, lse = -inf (or z_h), one with no query nothing. Never TMA.
* alibi_slopes and sinks are float32 whatever the inputs' dtype; sinks.grad is float32.
* fp16/bf16 inputs accumulate in fp32; fp32 uses ``tl.dot(input_precision="ieee")`` (no tf32);
  fp64 runs in fp64 throughout (so gradcheck can run on the kernel). lse is fp32 (fp64 for
  fp64 inputs); o has the input dtype.

Stages of this file:
  1. tile helpers (masked loads and stores; 32- or 64-bit row addressing, ``WIDE_ROWS``), the
     key and query ranges a tile visits, the score variants (``_tanh``, ``_modified_scores``)
  2. forward kernel
  3. backward preprocess: Delta and the base-2 lse used by the backward
  4. backward dK/dV kernel (one program per key tile and kv head)
  5. backward dQ kernel (one program per query tile and query head)
  6. tile choice: autotuner configs (GPU) and the fixed interpreter tiles; the passes
     (``PASSES``) with ``launch_meta``, ``resolve_tiles``, ``padded_head_dim`` and
     ``explicit_launch_options``: the public API of the tuning and compilation tools in ci/
  7. host side: input checks, the variants as the kernels take them (``resolve_band``, also
     the tools' API), launchers, autograd, ``attention``, ``varlen`` and the capabilities

Forward memory access: dense 16-bit q, k, v (and o) whose rows and strides are 16-byte aligned go
through 4-D TMA tensor descriptors (Hopper's copy engine: it zero-fills rows and head-dim
columns past the tensor, so those loads need no masks); any other layout through masked
pointer loads. ``FLASHPROP_TRITON_TMA=0`` forces the pointer loads everywhere (to compare).

CPU: under ``TRITON_INTERPRET=1`` (read when this module is imported, as Triton does) the same
kernels run in Triton's interpreter on CPU tensors. The interpreter multiplies bf16 bit patterns
in ``tl.dot`` (triton issue 11584), so bf16 is refused there. Two changes to the interpreter
are made at import: numpy >= 2.4's scalar conversion (:func:`_fix_interpreter_index_for_numpy_2_4`)
and no re-patching in this module's helpers (:func:`_skip_repatching_in_helpers`).
"""

import contextlib
import inspect
import math
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from flashprop.contract.capabilities import ALIBI_SHAPES, Capabilities, KVCache, Limit
from flashprop.contract.validate import INT32_ELEMENTS, Variants, check_variants, check_varlen, extent
from torch import Tensor
from triton.tools.tensor_descriptor import TensorDescriptor

#: Whether the kernels below are Triton-interpreted (CPU tensors) or compiled (CUDA tensors).
#: ``triton.jit`` makes this choice when the decorated function is defined, i.e. at import.
INTERPRET: bool = os.environ.get("TRITON_INTERPRET", "0") == "1"

def _fix_interpreter_index_for_numpy_2_4() -> None:
    """Triton 3.6's interpreter turns a scalar into a Python int with ``int(array_of_shape_1)``,
    which numpy >= 2.4 refuses ("only 0-dimensional arrays can be converted to Python scalars"),
    so every loop with a runtime bound fails (triton issue 9171, fixed upstream by PR 9172).
    Apply the upstream fix (squeeze first) when running interpreted on such a numpy."""
    import numpy as np
    from triton.runtime import interpreter

    try:
        int(np.ones(1, dtype=np.int32))
        return  # numpy < 2.4: nothing to fix
    except TypeError:
        pass
    original = interpreter._patch_lang_tensor
    if getattr(original, "_flashprop_fixed", False):
        return

    def patch_lang_tensor(tensor, scope) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patch_lang_tensor._flashprop_fixed = True
    interpreter._patch_lang_tensor = patch_lang_tensor


def _skip_repatching_in_helpers() -> None:
    """Triton's interpreter patches ``triton.language`` for itself (``_patch_lang``:
    ``inspect.getmembers`` over four modules) when a kernel is launched, and again at every call
    of a ``@triton.jit`` helper, although the launch has patched the same modules: about an
    eighth of this module's interpreted CPU time (forward and backward of a pack of 8 sequences,
    2 heads, D = 64, causal: 0.76 s, 0.66 s without). A call of a helper of this module while
    ``triton.language`` is patched (``tl.load`` is then the interpreter's, not the builtin: a
    launch of a kernel that sees ``tl``, as this module's helpers do) runs the helper without
    patching again; every other call is Triton's own (Triton 3.6 to 3.9)."""
    from triton.runtime import interpreter

    original = interpreter.InterpretedFunction.__call__
    ours = globals()

    def call(self, *args, **kwargs):
        if self.fn.__globals__ is not ours or tl.core.is_builtin(tl.load):
            return original(self, *args, **kwargs)
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise interpreter.InterpreterError(repr(e)) from e

    interpreter.InterpretedFunction.__call__ = call


if INTERPRET:
    _fix_interpreter_index_for_numpy_2_4()
    _skip_repatching_in_helpers()


LOG2E: float = math.log2(math.e)
LN2: float = math.log(2.0)

# ---------------------------------------------------------------------------------------------
# Stage 1: tile helpers
# ---------------------------------------------------------------------------------------------


@triton.jit
def _wide_tile_ptrs(base, start, rows, cols, stride_r, stride_c):
    """Pointers to ``base[rows, cols]`` of one (batch, head) slice, ``rows = start + arange``,
    with 64-bit row offsets: the addressing of the pointer paths when ``WIDE_ROWS``.

    Every kernel's ``base`` already holds the 64-bit (batch, head) offset; the offset within the
    slice is ``rows * stride_r + cols * stride_c``. Without WIDE_ROWS (a launch whose tensors
    span at most 2^31 - 1 elements, :func:`wide_rows`) :func:`_load_tile` and
    :func:`_store_tile` compute it in 32 bits, the cheapest addressing. With WIDE_ROWS: ``base +
    start * stride_r`` in 64 bits (a scalar per tile), plus each row's ``(rows - start) *
    stride_r`` in 64 bits (loop-invariant, so a loop over tiles computes it once), plus each
    element's ``cols * stride_c`` in 32 bits. Row offsets pass 2^31 in a long sequence (q of
    2^27 + 1 rows of 16 elements does on its last row) and in a view whose row stride is itself
    near 2^31, whose rows lie that far apart within one tile: there 32-bit offsets inside the
    tile would wrap too. Column offsets stay 32-bit: they would wrap only in a layout whose
    head-dim stride is 2^31 / (D - 1) or more (the head dim outermost in a tensor of more than
    2^31 elements), which these kernels do not address correctly. The 64-bit offsets cost
    registers (more spills in some tuned configurations), hence the compile-time choice."""
    tile_base = base + tl.cast(start, tl.int64) * stride_r  # start: an int in the interpreter
    row_ptrs = tile_base + tl.arange(0, rows.shape[0]).to(tl.int64) * stride_r
    return row_ptrs[:, None] + (cols * stride_c)[None, :]


@triton.jit
def _load_tile(
    base,
    start,
    rows,
    cols,
    stride_r,
    stride_c,
    n_rows,
    n_cols,
    EVEN_COLS: tl.constexpr,
    CHECK_ROWS: tl.constexpr,
    WIDE_ROWS: tl.constexpr,
):
    """Load ``base[rows, cols]``, ``rows = start + arange``; entries with ``cols >= n_cols``
    (padding of the head dim) or, when CHECK_ROWS, ``rows >= n_rows`` are never read and come
    back as 0. EVEN_COLS states that the tile is exactly ``n_cols`` wide (no column mask
    needed). The head dim is a runtime value, so one compiled kernel serves every head dim that
    pads to the same tile width. Offsets within the slice: 32-bit, or 64-bit row offsets when
    WIDE_ROWS (:func:`_wide_tile_ptrs`).

    The 32-bit form is written out here and in :func:`_store_tile`, not in a helper of its own:
    one more level of inlined calls changes the line information ptxas reads, and with it the
    machine code of some kernels (with Triton 3.6: the unspecialised D = 200 ones), which
    WIDE_ROWS false keeps exactly as it was before the 64-bit form existed."""
    if WIDE_ROWS:
        ptrs = _wide_tile_ptrs(base, start, rows, cols, stride_r, stride_c)
    else:
        ptrs = base + rows[:, None] * stride_r + cols[None, :] * stride_c
    if CHECK_ROWS:
        tile = tl.load(ptrs, mask=(rows < n_rows)[:, None] & (cols < n_cols)[None, :], other=0.0)
    elif not EVEN_COLS:
        tile = tl.load(ptrs, mask=(cols < n_cols)[None, :], other=0.0)
    else:
        tile = tl.load(ptrs)
    return tile


@triton.jit
def _store_tile(base, tile, start, rows, cols, stride_r, stride_c, n_rows, n_cols,
                WIDE_ROWS: tl.constexpr):
    """Store ``tile`` to ``base[rows, cols]``, ``rows = start + arange``, for ``rows < n_rows``
    and ``cols < n_cols``; offsets as :func:`_load_tile` computes them."""
    if WIDE_ROWS:
        ptrs = _wide_tile_ptrs(base, start, rows, cols, stride_r, stride_c)
    else:
        ptrs = base + rows[:, None] * stride_r + cols[None, :] * stride_c
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    tl.store(ptrs, tile.to(base.dtype.element_ty), mask=mask)


@triton.jit
def _load_rows(src, off_b, off_h, start, rows, cols, stride_r, stride_c, n_rows, n_cols,
               EVEN_COLS: tl.constexpr, CHECK_ROWS: tl.constexpr, TMA: tl.constexpr,
               WIDE_ROWS: tl.constexpr):
    """Rows ``rows`` (= ``start`` + arange) of one (batch, head) slice. TMA: ``src`` is a 4-D tensor
    descriptor (B, H, N, D) and the copy engine reads the box, rows and columns past the tensor
    coming back as 0; otherwise ``src`` points at the slice and :func:`_load_tile` reads it
    (32-bit offsets, or 64-bit row offsets when WIDE_ROWS)."""
    if TMA:
        box = src.load([off_b, off_h, start, 0])
        tile = box.reshape(rows.shape[0], cols.shape[0])
    else:
        tile = _load_tile(src, start, rows, cols, stride_r, stride_c, n_rows, n_cols, EVEN_COLS,
                          CHECK_ROWS, WIDE_ROWS)
    return tile


@triton.jit
def _key_range(start_m, n_q, n_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               CAUSAL: tl.constexpr):
    """Key range of the query tile [start_m, start_m + BLOCK_M).

    Returns (full_hi, hi): keys [0, full_hi) form whole tiles every row of the query tile sees
    (no mask needed); keys [full_hi, hi) are the diagonal and the ragged end of the keys (masked);
    keys >= hi are seen by no row of the tile and skipped.
    """
    if CAUSAL:
        offset = n_k - n_q  # bottom-right alignment: row i sees keys j <= i + offset
        hi = tl.maximum(tl.minimum(n_k, start_m + BLOCK_M + offset), 0)
        full_hi = tl.maximum(tl.minimum(n_k, start_m + 1 + offset), 0)
    else:
        hi = n_k
        full_hi = n_k
    full_hi = (full_hi // BLOCK_N) * BLOCK_N
    return full_hi, hi


@triton.jit
def _window_key_range(start_m, n_q, n_k, win_left, win_right, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr):
    """Key range of the query tile [start_m, start_m + BLOCK_M) under a window, whose row i sees
    keys i + c - win_left .. i + c + win_right (c = n_k - n_q; both sides finite:
    :func:`resolve_band`).

    Returns (lo, full_lo, full_hi, hi): keys [full_lo, full_hi) form whole tiles every row of the
    tile sees (no mask); keys [lo, full_lo) (the window's left edge) and [full_hi, hi) (its
    right edge, and the ragged end of the keys) are masked; keys outside [lo, hi) are seen by
    no row of the tile and skipped. lo, full_lo and full_hi are tile boundaries unless clamped
    to hi (the loops after them are then empty).
    """
    offset = n_k - n_q
    last = tl.minimum(start_m + BLOCK_M, n_q) - 1  # the tile's last real row
    hi = tl.maximum(tl.minimum(n_k, last + offset + win_right + 1), 0)
    lo = tl.minimum(tl.maximum(start_m + offset - win_left, 0), hi)
    lo = (lo // BLOCK_N) * BLOCK_N
    full_lo = tl.cdiv(tl.maximum(last + offset - win_left, 0), BLOCK_N) * BLOCK_N
    full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
    full_hi = (tl.minimum(n_k, start_m + offset + win_right + 1) // BLOCK_N) * BLOCK_N
    full_hi = tl.minimum(tl.maximum(full_hi, full_lo), hi)
    return lo, full_lo, full_hi, hi


@triton.jit
def _window_query_range(start_n, n_q, n_k, win_left, win_right, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr):
    """Query range of the key tile [start_n, start_n + BLOCK_N) under a window (the dK/dV pass):
    key j is seen by rows j - c - win_right .. j - c + win_left.

    Returns (lo, full_lo, full_hi, hi): query tiles [full_lo, full_hi) see the whole key tile
    (no mask); [lo, full_lo) (the window's right edge) and [full_hi, hi) (its left edge) are
    masked; other rows see none of its keys and are skipped (boundaries as
    :func:`_window_key_range`'s).
    """
    offset = n_k - n_q
    last = tl.minimum(start_n + BLOCK_N, n_k) - 1  # the tile's last real key
    hi = tl.maximum(tl.minimum(n_q, last - offset + win_left + 1), 0)
    lo = tl.minimum(tl.maximum(start_n - offset - win_right, 0), hi)
    lo = (lo // BLOCK_M) * BLOCK_M
    full_lo = tl.cdiv(tl.maximum(last - offset - win_right, 0), BLOCK_M) * BLOCK_M
    full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
    full_hi = (tl.minimum(n_q, start_n - offset + win_left + 1) // BLOCK_M) * BLOCK_M
    full_hi = tl.minimum(tl.maximum(full_hi, full_lo), hi)
    return lo, full_lo, full_hi, hi


@triton.jit
def _tanh(x):
    """tanh(x), to about an ulp of x's dtype (fp32 or fp64: the interpreter has no libdevice, and
    fast approximations are off by 2^-11). |x| < 0.625: x + x^3 P(x^2) / Q(x^2), the rational
    approximation of the Cephes library (accurate to fp64's rounding there, where the
    exponential form below loses x's leading digits); else (1 - e) / (1 + e), e = exp(-2|x|) in
    (0, 0.29] (no overflow). One division serves both; the sign is put back last."""
    dt = x.dtype  # constants through tl.full: Python floats in a kernel are rounded to fp32
    p0, p1, p2 = (tl.full([], -9.64399179425052238628e-1, dt), tl.full([], -9.92877231001918586564e1, dt),
                  tl.full([], -1.61468768441708447952e3, dt))
    q0, q1, q2 = (tl.full([], 1.12811678491632931402e2, dt), tl.full([], 2.23548839060100448583e3, dt),
                  tl.full([], 4.84406305325125486048e3, dt))
    a = tl.abs(x)
    x2 = a * a
    num = (x2 * p0 + p1) * x2 + p2
    den = ((x2 + q0) * x2 + q1) * x2 + q2
    e = tl.exp2(a * tl.full([], -2.8853900817779268, dt))  # exp(-2|x|) = exp2(-2 log2(e) |x|)
    small = a < 0.625
    ratio = tl.where(small, a * x2 * num, 1.0 - e) / tl.where(small, den, 1.0 + e)
    t = tl.where(small, a + ratio, ratio)
    return tl.where(x < 0, -t, t)


@triton.jit
def _modified_scores(qk, q_idx, kv_idx, n_q, n_k, qk_scale, SOFTCAP: tl.constexpr, softcap2,
                     ALIBI: tl.constexpr, slope2):
    """Base-2 logits of a tile from the raw products ``qk = q_i . k_j``, with the score variants
    (softcap, then ALiBi), and ``tanh`` of the softcap (the backward's derivative 1 - tanh^2;
    ``qk``'s scaled self without a softcap). ``q_idx``, ``kv_idx``: the rows' and keys' indices,
    broadcastable to the tile (keys x queries in the dK/dV pass).

    SOFTCAP: ``qk_scale = scale / softcap`` (tanh's argument) and ``softcap2 = softcap *
    log2(e)``; else ``qk_scale = scale * log2(e)``. ALIBI: ``slope2 = slope * log2(e)`` of this
    (batch, query head), the bias ``-slope2 * |i + c - j|``."""
    if SOFTCAP:
        t = _tanh(qk * qk_scale)
        s = t * softcap2
    else:
        s = qk * qk_scale
        t = s
    if ALIBI:
        s = s - slope2 * tl.abs(q_idx + (n_k - n_q) - kv_idx).to(s.dtype)
    return s, t


@triton.jit
def _in_window(q_idx, kv_idx, n_q, n_k, win_left, win_right):
    """Whether key ``kv_idx`` is in row ``q_idx``'s window, ``i + c - win_left <= j <= i + c +
    win_right`` (c = n_k - n_q; causal folded in by the host), for broadcastable indices."""
    diag = q_idx + (n_k - n_q)
    return (kv_idx >= diag - win_left) & (kv_idx <= diag + win_right)


@triton.jit
def _head_slope2(Slopes, off_b, off_h, stride_ab, stride_ah, ALIBI: tl.constexpr,
                 ACC_DTYPE: tl.constexpr):
    """The ALiBi slope of (batch off_b, query head off_h) times log2(e) (stride_ab = 0 for slopes
    of shape (Hq,)); 0 without ALIBI (unused)."""
    if ALIBI:
        slope = tl.load(Slopes + off_b * stride_ab + off_h * stride_ah).to(ACC_DTYPE)
        slope2 = slope * tl.full([], 1.4426950408889634, ACC_DTYPE)
    else:
        slope2 = tl.zeros([], ACC_DTYPE)
    return slope2


@triton.jit
def _query_tile_start(BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr):
    """First query row of this program's tile. Causal: programs run the last query tiles (the
    ones that see the most keys) first, so the lightest tiles fill the GPU's last wave."""
    pid = tl.program_id(0)
    if CAUSAL:
        pid = tl.num_programs(0) - 1 - pid
    return pid * BLOCK_M


@triton.jit
def _sequence(CuSeqQ, CuSeqK, off_b):
    """Where sequence ``off_b`` of a pack (VARLEN) lies: (q_start, n_q, k_start, n_k), its first
    query and key as 64-bit row indices of the packed tensors (``cu[off_b]``) and its lengths
    (``cu[off_b + 1] - cu[off_b]``)."""
    q_start = tl.load(CuSeqQ + off_b)
    k_start = tl.load(CuSeqK + off_b)
    n_q = tl.load(CuSeqQ + off_b + 1) - q_start
    n_k = tl.load(CuSeqK + off_b + 1) - k_start
    return q_start.to(tl.int64), n_q, k_start.to(tl.int64), n_k


# ---------------------------------------------------------------------------------------------
# Stage 2: forward
# ---------------------------------------------------------------------------------------------


@triton.jit
def _fwd_inner(
    acc, m_i, l_i, q,
    k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd, off_b, off_hkv,
    offs_m, lo, hi, n_q, n_k, qk_scale, win_left, win_right, softcap2, slope2,
    head_dim, head_dim_v, EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
    ALIBI: tl.constexpr, PRECISION: tl.constexpr, TMA: tl.constexpr, WIDE_ROWS: tl.constexpr,
):
    """Online-softmax update of (acc, m_i, l_i) over key tiles [lo, hi).

    K and V come through :func:`_load_rows`: descriptors (TMA) or pointers at the kv head.
    Logits: scaled, or through the score variants (:func:`_modified_scores`).

    m_i is the running row maximum in base-2 units; MASKED tiles hide keys outside the window
    (WINDOW: :func:`_in_window`), keys >= n_k and, when CAUSAL, keys right of the diagonal. A
    row that has seen no key yet keeps m_i = -inf; it is subtracted as 0 so that
    exp2(-inf - 0) = 0 instead of exp2(-inf + inf) = NaN.
    """
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = _load_rows(k_base, off_b, off_hkv, start_n, offs_n, offs_d, stride_kn, stride_kd,
                       n_k, head_dim, EVEN_D, MASKED, TMA, WIDE_ROWS)
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        if SOFTCAP or ALIBI:
            s, _ = _modified_scores(qk, offs_m[:, None], offs_n[None, :], n_q, n_k, qk_scale,
                                    SOFTCAP, softcap2, ALIBI, slope2)
        else:
            s = qk * qk_scale
        if MASKED:
            if WINDOW:
                s = tl.where(_in_window(offs_m[:, None], offs_n[None, :], n_q, n_k, win_left,
                                        win_right), s, float("-inf"))
            visible = (offs_n < n_k)[None, :]
            if CAUSAL:
                visible = visible & (offs_n[None, :] <= offs_m[:, None] + (n_k - n_q))
            s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        if MASKED:
            m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_sub = m_new
        p = tl.exp2(s - m_sub[:, None])
        alpha = tl.exp2(m_i - m_sub)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = _load_rows(v_base, off_b, off_hkv, start_n, offs_n, offs_dv, stride_vn, stride_vd,
                       n_k, head_dim_v, EVEN_DV, MASKED, TMA, WIDE_ROWS)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION,
                     out_dtype=acc.dtype)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _attn_fwd(
    Q, K, V, Out, LSE,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    H_Q, GROUP, N_Q, N_K,
    qk_scale: tl.float64,
    win_left, win_right, softcap2: tl.float64, Slopes, stride_ab, stride_ah, Sinks, stride_z,
    head_dim, head_dim_v, CuSeqQ, CuSeqK, EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    CAUSAL: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
    SINKS: tl.constexpr, VARLEN: tl.constexpr, ACC_DTYPE: tl.constexpr, PRECISION: tl.constexpr,
    SEQ_CLASS: tl.constexpr, TMA: tl.constexpr, WIDE_ROWS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """o and lse for one query tile of one (batch, query head). Grid: (cdiv(Nq, BLOCK_M), B*Hq).

    LSE is a contiguous (B, Hq, Nq) buffer. qk_scale = scale * log2(e) (scale / softcap with
    SOFTCAP: :func:`_modified_scores`), passed as fp64 so that fp64 runs are not rounded
    through fp32. TMA: Q, K, V, Out are 4-D tensor descriptors with boxes (1, 1, rows, padded
    head dim) and the strides are unused; else they are pointers, addressed with 64-bit row
    offsets when WIDE_ROWS (:func:`_wide_tile_ptrs`).

    Variants: WINDOW, the band win_left, win_right (:func:`_window_key_range`); SOFTCAP, softcap2;
    ALIBI, fp32 Slopes of strides (stride_ab, stride_ah); SINKS, fp32 Sinks (Hq,) of stride
    stride_z, each the running max's and sum's start (z_h * log2(e), 1). Unused ones are 0
    (pointers: any tensor).

    VARLEN (never with TMA): a pack of sequences, q, k, v, o token-major (T, H, D) with strides
    (unused, head, token, dim), the batch index off_b a sequence of int32 CuSeqQ, CuSeqK
    (:func:`_sequence`), N_Q, N_K the packed totals Tq, Tk, LSE (Hq, Tq). Grid:
    (cdiv(max_seqlen_q, BLOCK_M), sequences*Hq); tiles past a sequence's queries exit.
    """
    start_m = _query_tile_start(BLOCK_M, CAUSAL)
    off_bh = tl.program_id(1)
    n_q, n_k = N_Q, N_K  # this slice's queries and keys (VARLEN: its sequence's, below)
    if TMA:  # descriptor coordinates are int32; descriptors hold their own strides
        off_b = off_bh // H_Q
        off_h = off_bh % H_Q
        off_hkv = off_h // GROUP
        q_base, k_base, v_base = Q, K, V
    else:
        off_b = (off_bh // H_Q).to(tl.int64)
        off_h = (off_bh % H_Q).to(tl.int64)
        off_hkv = off_h // GROUP
        if VARLEN:  # sequence off_b of the pack: its tokens from q_start and k_start
            q_start, n_q, k_start, n_k = _sequence(CuSeqQ, CuSeqK, off_b)
            if start_m >= n_q:  # a query tile past the sequence's end
                return
            q_base = Q + q_start * stride_qm + off_h * stride_qh
            k_base = K + k_start * stride_kn + off_hkv * stride_kh
            v_base = V + k_start * stride_vn + off_hkv * stride_vh
        else:
            q_base = Q + off_b * stride_qb + off_h * stride_qh
            k_base = K + off_b * stride_kb + off_hkv * stride_kh
            v_base = V + off_b * stride_vb + off_hkv * stride_vh

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    scale2 = tl.full([], qk_scale, ACC_DTYPE)
    cap2 = tl.full([], softcap2, ACC_DTYPE)
    slope2 = _head_slope2(Slopes, off_b, off_h, stride_ab, stride_ah, ALIBI, ACC_DTYPE)

    q = _load_rows(q_base, off_b, off_h, start_m, offs_m, offs_d, stride_qm, stride_qd, n_q,
                   head_dim, EVEN_D, True, TMA, WIDE_ROWS)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=ACC_DTYPE)
    if SINKS:  # the sink: a key of logit z_h with no value, already seen
        z2 = tl.load(Sinks + off_h * stride_z).to(ACC_DTYPE) * tl.full([], 1.4426950408889634, ACC_DTYPE)
        m_i = tl.zeros([BLOCK_M], dtype=ACC_DTYPE) + z2
        l_i = tl.full([BLOCK_M], 1.0, ACC_DTYPE)
    else:
        m_i = tl.full([BLOCK_M], float("-inf"), ACC_DTYPE)
        l_i = tl.zeros([BLOCK_M], dtype=ACC_DTYPE)

    if WINDOW:
        lo, full_lo, full_hi, hi = _window_key_range(start_m, n_q, n_k, win_left, win_right,
                                                     BLOCK_M, BLOCK_N)
        # the window's left edge: masked
        acc, m_i, l_i = _fwd_inner(
            acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd, off_b,
            off_hkv, offs_m, lo, full_lo, n_q, n_k, scale2, win_left, win_right, cap2, slope2,
            head_dim, head_dim_v, EVEN_D, EVEN_DV, BLOCK_D, BLOCK_DV, BLOCK_N,
            True, CAUSAL, WINDOW, SOFTCAP, ALIBI, PRECISION, TMA, WIDE_ROWS,
        )
    else:
        full_lo = 0
        full_hi, hi = _key_range(start_m, n_q, n_k, BLOCK_M, BLOCK_N, CAUSAL)
    # whole tiles every row sees: no masks
    acc, m_i, l_i = _fwd_inner(
        acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd, off_b,
        off_hkv, offs_m, full_lo, full_hi, n_q, n_k, scale2, win_left, win_right, cap2, slope2,
        head_dim, head_dim_v, EVEN_D, EVEN_DV, BLOCK_D, BLOCK_DV, BLOCK_N,
        False, CAUSAL, WINDOW, SOFTCAP, ALIBI, PRECISION, TMA, WIDE_ROWS,
    )
    # the diagonal (or the window's right edge) and the ragged end of the keys: masked
    acc, m_i, l_i = _fwd_inner(
        acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd, off_b,
        off_hkv, offs_m, full_hi, hi, n_q, n_k, scale2, win_left, win_right, cap2, slope2,
        head_dim, head_dim_v, EVEN_D, EVEN_DV, BLOCK_D, BLOCK_DV, BLOCK_N,
        True, CAUSAL, WINDOW, SOFTCAP, ALIBI, PRECISION, TMA, WIDE_ROWS,
    )

    # epilogue: rows that saw no key (nor a sink) have l_i = 0 -> o = 0, lse = -inf
    empty = l_i == 0.0
    o = acc / tl.where(empty, 1.0, l_i)[:, None]
    ln2 = tl.full([], 0.6931471805599453, ACC_DTYPE)
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(tl.where(empty, 1.0, l_i))) * ln2)
    if TMA:  # the copy engine drops rows and columns past the tensor
        Out.store([off_b, off_h, start_m, 0], o.to(Out.dtype).reshape(1, 1, BLOCK_M, BLOCK_DV))
    else:
        if VARLEN:
            o_base = Out + q_start * stride_om + off_h * stride_oh
        else:
            o_base = Out + off_b * stride_ob + off_h * stride_oh
        _store_tile(o_base, o, start_m, offs_m, offs_dv, stride_om, stride_od, n_q, head_dim_v,
                    WIDE_ROWS)
    if VARLEN:  # lse (Hq, Tq): head off_h's row, from the sequence's first query
        lse_ptrs = LSE + off_h * N_Q + q_start + offs_m
    else:  # lse (B, Hq, Nq)
        lse_ptrs = LSE + off_bh.to(tl.int64) * N_Q + offs_m
    tl.store(lse_ptrs, lse, mask=offs_m < n_q)


# ---------------------------------------------------------------------------------------------
# Stage 3: backward preprocess
# ---------------------------------------------------------------------------------------------


@triton.jit
def _attn_bwd_preprocess(
    Out, DO, LSE, DLSE, DELTA, LSE2,
    stride_ob, stride_oh, stride_om, stride_od,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_dlb, stride_dlh, stride_dlm,
    H_Q, N_Q,
    head_dim_v, EVEN_DV: tl.constexpr, BLOCK_DV: tl.constexpr, ACC_DTYPE: tl.constexpr,
    WIDE_ROWS: tl.constexpr, BLOCK_M: tl.constexpr,
):
    """Delta = rowsum(dO * o) - dlse and lse2 = lse * log2(e), with lse2 = +inf on empty rows
    (lse = -inf) so that P = exp2(s - lse2) is 0 there rather than NaN.

    LSE, DELTA, LSE2 are contiguous (B, Hq, Nq); DLSE is strided. WIDE_ROWS: 64-bit row
    offsets into Out and DO (:func:`_wide_tile_ptrs`) and DLSE. Grid: (cdiv(Nq, BLOCK_M), B*Hq).
    """
    start_m = tl.program_id(0) * BLOCK_M
    off_bh = tl.program_id(1)
    off_b = (off_bh // H_Q).to(tl.int64)
    off_h = (off_bh % H_Q).to(tl.int64)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_dv = tl.arange(0, BLOCK_DV)
    row_ok = offs_m < N_Q

    o = _load_tile(Out + off_b * stride_ob + off_h * stride_oh, start_m, offs_m, offs_dv,
                   stride_om, stride_od, N_Q, head_dim_v, EVEN_DV, True, WIDE_ROWS)
    do = _load_tile(DO + off_b * stride_dob + off_h * stride_doh, start_m, offs_m, offs_dv,
                    stride_dom, stride_dod, N_Q, head_dim_v, EVEN_DV, True, WIDE_ROWS)
    dlse_ptrs = DLSE + off_b * stride_dlb + off_h * stride_dlh
    if WIDE_ROWS:
        dlse_ptrs = dlse_ptrs + offs_m.to(tl.int64) * stride_dlm
    else:
        dlse_ptrs = dlse_ptrs + offs_m * stride_dlm
    dlse = tl.load(dlse_ptrs, mask=row_ok, other=0.0)
    delta = tl.sum(o.to(ACC_DTYPE) * do.to(ACC_DTYPE), 1) - dlse.to(ACC_DTYPE)

    rows = off_bh.to(tl.int64) * N_Q + offs_m
    lse = tl.load(LSE + rows, mask=row_ok, other=0.0)
    log2e = tl.full([], 1.4426950408889634, ACC_DTYPE)
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * log2e)
    tl.store(DELTA + rows, delta, mask=row_ok)
    tl.store(LSE2 + rows, lse2, mask=row_ok)


# ---------------------------------------------------------------------------------------------
# Stage 4: backward dK / dV
# ---------------------------------------------------------------------------------------------


@triton.jit
def _bwd_dkdv_inner(
    dk, dv, k, v,
    q_base, do_base, lse2_base, delta_base,
    stride_qm, stride_qd, stride_dom, stride_dod,
    offs_n, lo, hi, n_q, n_k, qk_scale, win_left, win_right, softcap2, slope2,
    head_dim, head_dim_v, EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr,
    MASKED: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
    PRECISION: tl.constexpr, WIDE_ROWS: tl.constexpr,
):
    """Accumulate dK (unscaled) and dV of one key tile over query tiles [lo, hi).

    Works on transposed tiles (keys x queries). Query rows >= n_q load q = dO = Delta = 0 (and
    lse2 = 0, or +inf with ALIBI: P = 0) and so contribute exactly 0; key rows >= n_k only touch
    their own (never stored) rows. MASKED tiles hide the queries left of the diagonal, or,
    WINDOW, the pairs outside the window (:func:`_in_window`). SOFTCAP: dS is chained through
    the softcap, dS * (1 - tanh^2).
    """
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        row_ok = offs_m < n_q
        q = _load_tile(q_base, start_m, offs_m, offs_d, stride_qm, stride_qd, n_q, head_dim,
                       EVEN_D, True, WIDE_ROWS)
        do = _load_tile(do_base, start_m, offs_m, offs_dv, stride_dom, stride_dod, n_q,
                        head_dim_v, EVEN_DV, True, WIDE_ROWS)
        # rows >= n_q: lse2 = 0 makes P = exp2(s) = 1 (q = 0), or, with ALiBi, +inf makes P = 0
        # (the bias alone could overflow exp2 there, and inf * 0 = NaN would reach dK, dV)
        lse2 = tl.load(lse2_base + offs_m, mask=row_ok, other=float("inf") if ALIBI else 0.0)
        delta = tl.load(delta_base + offs_m, mask=row_ok, other=0.0)

        qk_t = tl.dot(k, tl.trans(q), input_precision=PRECISION)
        if SOFTCAP or ALIBI:
            s_t, t_t = _modified_scores(qk_t, offs_m[None, :], offs_n[:, None], n_q, n_k, qk_scale,
                                        SOFTCAP, softcap2, ALIBI, slope2)
        else:
            s_t = qk_t * qk_scale
        if MASKED:
            if WINDOW:
                s_t = tl.where(_in_window(offs_m[None, :], offs_n[:, None], n_q, n_k, win_left,
                                          win_right), s_t, float("-inf"))
            else:
                s_t = tl.where(offs_m[None, :] >= offs_n[:, None] - (n_k - n_q), s_t, float("-inf"))
        p_t = tl.exp2(s_t - lse2[None, :])
        dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=PRECISION, out_dtype=dv.dtype)
        dp_t = tl.dot(v, tl.trans(do), input_precision=PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        if SOFTCAP:
            ds_t = ds_t * (1.0 - t_t * t_t)
        dk = tl.dot(ds_t.to(q.dtype), q, dk, input_precision=PRECISION, out_dtype=dk.dtype)
    return dk, dv


@triton.jit
def _attn_bwd_dkdv(
    Q, K, V, DO, DK, DV, LSE2, DELTA,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    stride_dvb, stride_dvh, stride_dvn, stride_dvd,
    H_KV, GROUP, N_Q, N_K,
    qk_scale: tl.float64, sm_scale: tl.float64,
    win_left, win_right, softcap2: tl.float64, Slopes, stride_ab, stride_ah,
    head_dim, head_dim_v, CuSeqQ, CuSeqK, EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    CAUSAL: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
    VARLEN: tl.constexpr, ACC_DTYPE: tl.constexpr, PRECISION: tl.constexpr,
    SEQ_CLASS: tl.constexpr, WIDE_ROWS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """dK, dV of one key tile of one (batch, kv head), summed over the GROUP query heads that
    read it (each with its own ALiBi slope). WIDE_ROWS: 64-bit row offsets
    (:func:`_wide_tile_ptrs`); the variants' arguments as :func:`_attn_fwd`'s (sinks do not
    enter: the lse they changed is the forward's). Grid: (cdiv(Nk, BLOCK_N), B*Hkv).

    VARLEN: sequence off_b of a pack, as :func:`_attn_fwd` takes it (LSE2, DELTA (Hq, Tq));
    grid (cdiv(max_seqlen_k, BLOCK_N), sequences*Hkv), tiles past the sequence's keys exit."""
    start_n = tl.program_id(0) * BLOCK_N
    off_bh = tl.program_id(1)
    off_b = (off_bh // H_KV).to(tl.int64)
    off_hkv = (off_bh % H_KV).to(tl.int64)
    n_q, n_k = N_Q, N_K  # this slice's queries and keys (VARLEN: its sequence's)
    if VARLEN:
        q_start, n_q, k_start, n_k = _sequence(CuSeqQ, CuSeqK, off_b)
        if start_n >= n_k:  # a key tile past the sequence's end
            return
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    scale2 = tl.full([], qk_scale, ACC_DTYPE)
    cap2 = tl.full([], softcap2, ACC_DTYPE)

    if VARLEN:
        k_base = K + k_start * stride_kn + off_hkv * stride_kh
    else:
        k_base = K + off_b * stride_kb + off_hkv * stride_kh
    k = _load_tile(k_base, start_n, offs_n, offs_d, stride_kn, stride_kd, n_k, head_dim, EVEN_D,
                   True, WIDE_ROWS)
    if VARLEN:
        v_base = V + k_start * stride_vn + off_hkv * stride_vh
    else:
        v_base = V + off_b * stride_vb + off_hkv * stride_vh
    v = _load_tile(v_base, start_n, offs_n, offs_dv, stride_vn, stride_vd, n_k, head_dim_v,
                   EVEN_DV, True, WIDE_ROWS)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=ACC_DTYPE)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=ACC_DTYPE)

    if WINDOW:  # query tiles [lo, full_lo) and [full_hi, hi) masked, whole ones between
        lo, full_lo, full_hi, hi = _window_query_range(start_n, n_q, n_k, win_left, win_right,
                                                       BLOCK_M, BLOCK_N)
    else:
        # Query tiles that see this key tile: rows i >= start_n - offset see key start_n; rows
        # i >= start_n + BLOCK_N - 1 - offset see the whole tile (unmasked from full_lo on).
        if CAUSAL:
            offset = n_k - n_q
            lo = (tl.maximum(start_n - offset, 0) // BLOCK_M) * BLOCK_M
            full_lo = tl.maximum(start_n + BLOCK_N - 1 - offset, 0)
            full_lo = tl.maximum(tl.cdiv(full_lo, BLOCK_M) * BLOCK_M, lo)
        else:
            lo = 0
            full_lo = 0
        full_hi = n_q
    masked_hi = tl.minimum(full_lo, n_q)

    for g in range(0, GROUP):
        off_h = off_hkv * GROUP + g
        if VARLEN:  # LSE2, DELTA (Hq, Tq)
            rows = off_h * N_Q + q_start
            q_base = Q + q_start * stride_qm + off_h * stride_qh
            do_base = DO + q_start * stride_dom + off_h * stride_doh
        else:
            rows = (off_b * H_KV * GROUP + off_h) * N_Q
            q_base = Q + off_b * stride_qb + off_h * stride_qh
            do_base = DO + off_b * stride_dob + off_h * stride_doh
        slope2 = _head_slope2(Slopes, off_b, off_h, stride_ab, stride_ah, ALIBI, ACC_DTYPE)
        dk, dv = _bwd_dkdv_inner(
            dk, dv, k, v, q_base, do_base, LSE2 + rows, DELTA + rows,
            stride_qm, stride_qd, stride_dom, stride_dod,
            offs_n, lo, masked_hi, n_q, n_k, scale2, win_left, win_right, cap2, slope2,
            head_dim, head_dim_v, EVEN_D, EVEN_DV, BLOCK_D, BLOCK_DV, BLOCK_M,
            True, WINDOW, SOFTCAP, ALIBI, PRECISION, WIDE_ROWS,
        )
        dk, dv = _bwd_dkdv_inner(
            dk, dv, k, v, q_base, do_base, LSE2 + rows, DELTA + rows,
            stride_qm, stride_qd, stride_dom, stride_dod,
            offs_n, full_lo, full_hi, n_q, n_k, scale2, win_left, win_right, cap2, slope2,
            head_dim, head_dim_v, EVEN_D, EVEN_DV, BLOCK_D, BLOCK_DV, BLOCK_M,
            False, WINDOW, SOFTCAP, ALIBI, PRECISION, WIDE_ROWS,
        )
        if WINDOW:  # the window's left edge: masked
            dk, dv = _bwd_dkdv_inner(
                dk, dv, k, v, q_base, do_base, LSE2 + rows, DELTA + rows,
                stride_qm, stride_qd, stride_dom, stride_dod,
                offs_n, full_hi, hi, n_q, n_k, scale2, win_left, win_right, cap2, slope2,
                head_dim, head_dim_v, EVEN_D, EVEN_DV, BLOCK_D, BLOCK_DV, BLOCK_M,
                True, WINDOW, SOFTCAP, ALIBI, PRECISION, WIDE_ROWS,
            )

    dk = dk * tl.full([], sm_scale, ACC_DTYPE)
    if VARLEN:
        dk_base = DK + k_start * stride_dkn + off_hkv * stride_dkh
    else:
        dk_base = DK + off_b * stride_dkb + off_hkv * stride_dkh
    _store_tile(dk_base, dk, start_n, offs_n, offs_d, stride_dkn, stride_dkd, n_k, head_dim,
                WIDE_ROWS)
    if VARLEN:
        dv_base = DV + k_start * stride_dvn + off_hkv * stride_dvh
    else:
        dv_base = DV + off_b * stride_dvb + off_hkv * stride_dvh
    _store_tile(dv_base, dv, start_n, offs_n, offs_dv, stride_dvn, stride_dvd, n_k, head_dim_v,
                WIDE_ROWS)


# ---------------------------------------------------------------------------------------------
# Stage 5: backward dQ
# ---------------------------------------------------------------------------------------------


@triton.jit
def _bwd_dq_inner(
    dq, q, do, lse2, delta,
    k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
    offs_m, lo, hi, n_q, n_k, qk_scale, win_left, win_right, softcap2, slope2,
    head_dim, head_dim_v, EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
    ALIBI: tl.constexpr, PRECISION: tl.constexpr, WIDE_ROWS: tl.constexpr,
):
    """Accumulate dQ (unscaled) of one query tile over key tiles [lo, hi); MASKED tiles hide
    keys as :func:`_fwd_inner`'s do. SOFTCAP: dS * (1 - tanh^2)."""
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = _load_tile(k_base, start_n, offs_n, offs_d, stride_kn, stride_kd, n_k,
                       head_dim, EVEN_D, MASKED, WIDE_ROWS)
        v = _load_tile(v_base, start_n, offs_n, offs_dv, stride_vn, stride_vd, n_k,
                       head_dim_v, EVEN_DV, MASKED, WIDE_ROWS)
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        if SOFTCAP or ALIBI:
            s, t = _modified_scores(qk, offs_m[:, None], offs_n[None, :], n_q, n_k, qk_scale,
                                    SOFTCAP, softcap2, ALIBI, slope2)
        else:
            s = qk * qk_scale
        if MASKED:
            if WINDOW:
                s = tl.where(_in_window(offs_m[:, None], offs_n[None, :], n_q, n_k, win_left,
                                        win_right), s, float("-inf"))
            visible = (offs_n < n_k)[None, :]
            if CAUSAL:
                visible = visible & (offs_n[None, :] <= offs_m[:, None] + (n_k - n_q))
            s = tl.where(visible, s, float("-inf"))
        p = tl.exp2(s - lse2[:, None])
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        if SOFTCAP:
            ds = ds * (1.0 - t * t)
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=PRECISION, out_dtype=dq.dtype)
    return dq


@triton.jit
def _attn_bwd_dq(
    Q, K, V, DO, DQ, LSE2, DELTA,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_dqb, stride_dqh, stride_dqm, stride_dqd,
    H_Q, GROUP, N_Q, N_K,
    qk_scale: tl.float64, sm_scale: tl.float64,
    win_left, win_right, softcap2: tl.float64, Slopes, stride_ab, stride_ah,
    head_dim, head_dim_v, CuSeqQ, CuSeqK, EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    CAUSAL: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
    VARLEN: tl.constexpr, ACC_DTYPE: tl.constexpr, PRECISION: tl.constexpr,
    SEQ_CLASS: tl.constexpr, WIDE_ROWS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """dQ of one query tile of one (batch, query head). WIDE_ROWS: 64-bit row offsets
    (:func:`_wide_tile_ptrs`); the variants' arguments as :func:`_attn_bwd_dkdv`'s.
    Grid: (cdiv(Nq, BLOCK_M), B*Hq); VARLEN: as :func:`_attn_fwd`'s (LSE2, DELTA (Hq, Tq))."""
    start_m = _query_tile_start(BLOCK_M, CAUSAL)
    off_bh = tl.program_id(1)
    off_b = (off_bh // H_Q).to(tl.int64)
    off_h = (off_bh % H_Q).to(tl.int64)
    off_hkv = off_h // GROUP
    n_q, n_k = N_Q, N_K  # this slice's queries and keys (VARLEN: its sequence's)
    if VARLEN:  # sequence off_b of the pack: its tokens from q_start and k_start
        q_start, n_q, k_start, n_k = _sequence(CuSeqQ, CuSeqK, off_b)
        if start_m >= n_q:  # a query tile past the sequence's end
            return
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    if VARLEN:  # LSE2, DELTA (Hq, Tq)
        rows = off_h * N_Q + q_start + offs_m
    else:
        rows = off_bh.to(tl.int64) * N_Q + offs_m
    scale2 = tl.full([], qk_scale, ACC_DTYPE)
    cap2 = tl.full([], softcap2, ACC_DTYPE)
    slope2 = _head_slope2(Slopes, off_b, off_h, stride_ab, stride_ah, ALIBI, ACC_DTYPE)

    if VARLEN:
        q_base = Q + q_start * stride_qm + off_h * stride_qh
    else:
        q_base = Q + off_b * stride_qb + off_h * stride_qh
    q = _load_tile(q_base, start_m, offs_m, offs_d, stride_qm, stride_qd, n_q, head_dim, EVEN_D,
                   True, WIDE_ROWS)
    if VARLEN:
        do_base = DO + q_start * stride_dom + off_h * stride_doh
    else:
        do_base = DO + off_b * stride_dob + off_h * stride_doh
    do = _load_tile(do_base, start_m, offs_m, offs_dv, stride_dom, stride_dod, n_q, head_dim_v,
                    EVEN_DV, True, WIDE_ROWS)
    lse2 = tl.load(LSE2 + rows, mask=offs_m < n_q, other=0.0)
    delta = tl.load(DELTA + rows, mask=offs_m < n_q, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=ACC_DTYPE)

    if VARLEN:
        k_base = K + k_start * stride_kn + off_hkv * stride_kh
        v_base = V + k_start * stride_vn + off_hkv * stride_vh
    else:
        k_base = K + off_b * stride_kb + off_hkv * stride_kh
        v_base = V + off_b * stride_vb + off_hkv * stride_vh
    if WINDOW:
        lo, full_lo, full_hi, hi = _window_key_range(start_m, n_q, n_k, win_left, win_right,
                                                     BLOCK_M, BLOCK_N)
        # the window's left edge: masked
        dq = _bwd_dq_inner(
            dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
            offs_m, lo, full_lo, n_q, n_k, scale2, win_left, win_right, cap2, slope2,
            head_dim, head_dim_v, EVEN_D, EVEN_DV, BLOCK_D, BLOCK_DV, BLOCK_N,
            True, CAUSAL, WINDOW, SOFTCAP, ALIBI, PRECISION, WIDE_ROWS,
        )
    else:
        full_lo = 0
        full_hi, hi = _key_range(start_m, n_q, n_k, BLOCK_M, BLOCK_N, CAUSAL)
    dq = _bwd_dq_inner(
        dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
        offs_m, full_lo, full_hi, n_q, n_k, scale2, win_left, win_right, cap2, slope2,
        head_dim, head_dim_v, EVEN_D, EVEN_DV, BLOCK_D, BLOCK_DV, BLOCK_N,
        False, CAUSAL, WINDOW, SOFTCAP, ALIBI, PRECISION, WIDE_ROWS,
    )
    dq = _bwd_dq_inner(
        dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
        offs_m, full_hi, hi, n_q, n_k, scale2, win_left, win_right, cap2, slope2,
        head_dim, head_dim_v, EVEN_D, EVEN_DV, BLOCK_D, BLOCK_DV, BLOCK_N,
        True, CAUSAL, WINDOW, SOFTCAP, ALIBI, PRECISION, WIDE_ROWS,
    )
    dq = dq * tl.full([], sm_scale, ACC_DTYPE)
    if VARLEN:
        dq_base = DQ + q_start * stride_dqm + off_h * stride_dqh
    else:
        dq_base = DQ + off_b * stride_dqb + off_h * stride_dqh
    _store_tile(dq_base, dq, start_m, offs_m, offs_d, stride_dqm, stride_dqd, n_q, head_dim,
                WIDE_ROWS)


# ---------------------------------------------------------------------------------------------
# Stage 6: tile choice
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
#: CUDA's limit on the second grid axis, which carries batch * heads.
_MAX_GRID_Y: int = 65535
#: On a GPU, 16-bit problems with at least this many scores (Nq * Nk) are autotuned; smaller
#: ones, and fp32/fp64 (FMA-unit dots, where small tiles are the answer anyway), take fixed
#: tiles: autotuning compiles ~20 kernels per (padded D, Dv, dtype, causal) key, which pays only on
#: big problems and would dominate a property suite's many small, varied ones.
_AUTOTUNE_MIN_SCORES: int = 512 * 512
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
    pre-hook: the boxes are part of the descriptors, the tiles part of the config)."""
    if not nargs["TMA"]:
        return
    bm, bn, bd, bdv = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_D"], nargs["BLOCK_DV"]
    for name, rows, cols in (("Q", bm, bd), ("K", bn, bd), ("V", bn, bdv), ("Out", bm, bdv)):
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
               "SINKS", "VARLEN", "SEQ_CLASS", "TMA", "WIDE_ROWS")


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


# ---------------------------------------------------------------------------------------------
# Stage 7: host side
# ---------------------------------------------------------------------------------------------

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

_SMEM_REASON = (
    f"explicit block_m/block_n whose tiles exceed the {_SMEM_BUDGET // 1024} KiB shared-memory "
    "budget on a GPU (the estimate in kernels.triton_attention._smem_bytes)"
)
_ALL_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

Tiles = tuple[int, int] | None  # (BLOCK_M, BLOCK_N), or None for the autotuner


def _check_inputs(q: Tensor, k: Tensor, v: Tensor, scale: float | None,
                  block_m: int | None, block_n: int | None) -> Tiles:
    """Refuse what the kernels do not support, naming it; return the tiles to launch with."""
    _check_tensors(q, k, v, "(B, H, N, D)")
    (b, hq, nq, d), (bk, hkv, nk, dk), (bv, hv, nv, dv) = q.shape, k.shape, v.shape
    if not b == bk == bv:
        raise ValueError(f"batch sizes differ: q {b}, k {bk}, v {bv}")
    if hkv != hv or nk != nv:
        raise ValueError(f"k and v must have the same heads and length, got {k.shape}, {v.shape}")
    if d != dk:
        raise ValueError(f"q and k head dims differ: {d} vs {dk}")
    if min(b, hq, hkv, nq, nk, d, dv) == 0:
        raise ValueError(f"empty dimension in q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}")
    if hq % hkv != 0:
        raise ValueError(f"query heads {hq} are not a multiple of kv heads {hkv} (GQA)")
    _check_launch(q, k, v, b * hq, scale, block_m, block_n)
    return resolve_tiles(nq, nk, d, dv, q.dtype, block_m, block_n)


def _check_varlen_inputs(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor,
                         cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int,
                         scale: float | None, block_m: int | None,
                         block_n: int | None) -> tuple[int, Tiles]:
    """:func:`_check_inputs` for packed (T, H, D) tensors and their sequence boundaries
    (``contract.validate.check_varlen``); returns the number of sequences and the tiles,
    chosen as for a dense problem of the longest sequences (``max_seqlen_q``, ``max_seqlen_k``).
    Empty sequences, and packs of no query or no key at all, are legal."""
    _check_tensors(q, k, v, "(T, H, D)")
    count = check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    hq, d, dv = q.shape[1], q.shape[2], v.shape[2]
    if min(hq, d, dv) == 0:
        raise ValueError(f"empty dimension in q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}")
    if max(max_seqlen_q, max_seqlen_k) > INT32_ELEMENTS:
        raise NotImplementedError(f"max_seqlen_q={max_seqlen_q}, max_seqlen_k={max_seqlen_k}: "
                                  "sequences longer than 2^31 - 1 tokens are not supported")
    _check_launch(q, k, v, count * hq, scale, block_m, block_n)
    return count, resolve_tiles(max_seqlen_q, max_seqlen_k, d, dv, q.dtype, block_m, block_n)


def _check_tensors(q: Tensor, k: Tensor, v: Tensor, layout: str) -> None:
    """q, k, v: tensors of the ``layout``'s rank, of one supported dtype and device."""
    rank = len(layout.split(","))
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.ndim != rank:
            raise ValueError(f"{name} must be {rank}-D {layout}, got shape {tuple(t.shape)}")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.dtype not in _ALL_DTYPES:
        raise TypeError(f"dtype {q.dtype} is not supported (fp16, bf16, fp32, fp64)")
    if not q.device == k.device == v.device:
        raise ValueError(f"q, k, v must share a device, got {q.device}, {k.device}, {v.device}")
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


def _check_columns(*tensors: Tensor) -> None:
    """Refuse, with NotImplementedError, a tensor whose last element's head-dim offset
    ``(D - 1) * stride(-1)`` passes 2^31 - 1: the kernels add it in 32 bits."""
    for name, t in zip("qkv", tensors):
        span = (t.shape[-1] - 1) * abs(t.stride(-1))
        if span > INT32_ELEMENTS:
            raise NotImplementedError(f"{name}: head-dim stride {t.stride(-1)} x (D - 1) = {span} "
                                      f"> 2^31 - 1: {_WIDE_COLUMNS_REASON}")


def resolve_tiles(nq: int, nk: int, d: int, dv: int, dtype: torch.dtype,
                  block_m: int | None, block_n: int | None) -> Tiles:
    """The tiles a launch of an (Nq, Nk, D, Dv, dtype) problem uses: the autotuner's (None) for
    large 16-bit problems without explicit tiles on a GPU, fixed ones for other problems
    without, else the explicit ones (a missing one defaults), refused with NotImplementedError
    when they overflow shared memory. The same (BLOCK_M, BLOCK_N) serve every tiled pass."""
    if block_m is None and block_n is None and not INTERPRET:
        if dtype.itemsize == 2 and nq * nk >= _AUTOTUNE_MIN_SCORES:
            return None
        return _fixed_tiles(d, dv, dtype)
    tiles = (block_m or _DEFAULT_TILE, block_n or _DEFAULT_TILE)
    if not INTERPRET and not _explicit_tiles_fit(*tiles, d, dv, dtype):
        raise NotImplementedError(f"block_m={tiles[0]}, block_n={tiles[1]} with D={d}, Dv={dv}, "
                                  f"{dtype}: {_SMEM_REASON}")
    return tiles


def launch_meta(q: Tensor, v: Tensor, causal: bool, *, window: bool = False, softcap: bool = False,
                alibi: bool = False, varlen: tuple[int, int] | None = None) -> dict:
    """Keyword parameters shared by the forward and backward kernels of :data:`PASSES` for
    queries like ``q`` and values like ``v`` (shapes and dtype only: meta tensors do): the head
    dims (runtime values) and the compile-time constants, among them the tile widths, which
    every head dim padding to the same width shares (one compilation for D = 65..128, not one
    per D), and the variants' switches (``CAUSAL``, ``WINDOW``, ``SOFTCAP``, ``ALIBI``: a window
    carries causality itself, :func:`resolve_band`; ``VARLEN`` when ``varlen`` gives a pack's
    ``(max_seqlen_q, max_seqlen_k)``, which then class the sequences, ``SEQ_CLASS``, instead of
    q's and v's lengths). ``WIDE_ROWS`` is False (32-bit row offsets: what
    a launch whose tensors span at most 2^31 - 1 elements compiles); each launch sets it from
    its own tensors with :func:`wide_rows`. The forward adds ``TMA`` and ``SINKS``; the launch
    adds ``BLOCK_M`` and ``BLOCK_N``."""
    d, dv = q.shape[-1], v.shape[-1]
    block_d, block_dv = padded_head_dim(d), padded_head_dim(dv)
    longest = max(varlen) if varlen is not None else max(q.shape[2], v.shape[2])
    return {
        "head_dim": d, "head_dim_v": dv, "BLOCK_D": block_d, "BLOCK_DV": block_dv,
        "EVEN_D": block_d == d, "EVEN_DV": block_dv == dv,
        "SEQ_CLASS": int(longest >= _LONG_SEQUENCE),
        "CAUSAL": bool(causal), "WINDOW": bool(window), "SOFTCAP": bool(softcap),
        "ALIBI": bool(alibi), "VARLEN": varlen is not None,
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
    offsets of :func:`_wide_tile_ptrs`, which cost registers in the tuned kernels."""
    return any(extent(t) > INT32_ELEMENTS for t in tensors)


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
        kernel[grid(block_m, block_n)](*args, **meta, BLOCK_M=block_m, BLOCK_N=block_n, **options)
        launched = (block_m, block_n, options["num_warps"], options["num_stages"])
    _LAST_LAUNCH[name] = (*launched, bool(meta.get("TMA")), tiles is None)


def last_launch() -> dict[str, str]:
    """Tiles, warps and stages of the last launch of each pass (``fwd``, ``bwd_dkdv``,
    ``bwd_dq``), e.g. ``{"fwd": "128x64 w8 s3 TMA (tuned)"}``: which configuration the
    autotuner picked, for benchmark reports (``benchmarks.bench_attention`` records it)."""
    return {
        name: f"{bm}x{bn} w{warps} s{stages}{' TMA' if tma else ''} ({'tuned' if tuned else 'fixed'})"
        for name, (bm, bn, warps, stages, tma, tuned) in _LAST_LAUNCH.items()
    }


def _tma_ready(*tensors: Tensor) -> bool:
    """Whether the forward reads and writes these (B, H, N, D) tensors through TMA descriptors:
    16-bit, unit last stride, every other stride and the base 16-byte aligned (the copy
    engine's rules). ``FLASHPROP_TRITON_TMA=0`` turns TMA off (pointer loads everywhere)."""
    if os.environ.get("FLASHPROP_TRITON_TMA", "1") == "0":
        return False
    return all(
        t.dtype in (torch.float16, torch.bfloat16) and t.stride(-1) == 1 and t.data_ptr() % 16 == 0
        and all(s > 0 and s * t.element_size() % 16 == 0 for s in t.stride()[:-1])
        for t in tensors
    )


Window = tuple[int, int] | None  # (win_left, win_right), both finite; None: no window


@dataclass(frozen=True)
class _Pack:
    """The sequences of a varlen call as the kernels take them (``VARLEN``).

    Attributes:
        cu_q, cu_k: ``cu_seqlens_q``, ``cu_seqlens_k``: int32 (B + 1,), contiguous.
        max_q, max_k: ``max_seqlen_q``, ``max_seqlen_k``: the grids' query and key rows.
        count: the number of sequences B (the grids' batch).
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
    """

    causal: bool
    window: Window = None
    softcap: float = 0.0
    slopes: Tensor | None = None
    sinks: Tensor | None = None
    pack: _Pack | None = None


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
    win_right, softcap2, Slopes, stride_ab, stride_ah`` (:func:`_attn_fwd`); an unused pointer
    points at ``spare`` (any tensor of the call), unused integers are 0."""
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


def _switches(q: Tensor, v: Tensor, mods: _Mods, spare: Tensor) -> dict:
    """:func:`launch_meta` for ``mods``, and the pointer arguments ``CuSeqQ``, ``CuSeqK`` of the
    tiled passes (a dense call's point at ``spare``, any tensor of the call)."""
    pack = mods.pack
    meta = launch_meta(q, v, mods.causal, window=mods.window is not None, softcap=bool(mods.softcap),
                       alibi=mods.slopes is not None,
                       varlen=None if pack is None else (pack.max_q, pack.max_k))
    cu = (spare, spare) if pack is None else (pack.cu_q, pack.cu_k)
    return {**meta, "CuSeqQ": cu[0], "CuSeqK": cu[1]}


def _as_batch(t: Tensor) -> Tensor:
    """A packed token-major (T, H, D) tensor as the kernels address it: a (1, H, T, D) view."""
    return t.transpose(0, 1).unsqueeze(0)


def _grid_sizes(nq: int, nk: int, b: int, pack: _Pack | None) -> tuple[int, int, int]:
    """The query rows, key rows and batch elements the grids cover: the tensors' own (Nq, Nk, B),
    or a pack's longest sequences and its number of sequences (the (1, H, T, D) views' T are
    the packed totals)."""
    return (nq, nk, b) if pack is None else (pack.max_q, pack.max_k, pack.count)


def _forward(q: Tensor, k: Tensor, v: Tensor, mods: _Mods, scale: float,
             tiles: Tiles) -> tuple[Tensor, Tensor]:
    """(o, lse) in the entry point's layout: dense (B, Hq, Nq, Dv) and (B, Hq, Nq); varlen (a
    ``mods.pack``) token-major (Tq, Hq, Dv) and (Hq, Tq), the packed tensors addressed as one
    batch element (:func:`_as_batch`) and never through TMA."""
    pack = mods.pack
    if pack is not None:
        q, k, v = (_as_batch(t) for t in (q, k, v))
    b, hq, nq, _ = q.shape
    hkv, nk, dv = k.shape[1], k.shape[2], v.shape[3]
    if pack is None:
        o = torch.empty((b, hq, nq, dv), dtype=q.dtype, device=q.device)
    else:  # token-major, as the varlen entry point returns it
        o = _as_batch(torch.empty((nq, hq, dv), dtype=q.dtype, device=q.device))
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    lse = torch.empty((b, hq, nq), dtype=lse_dtype, device=q.device)
    tensors = (q, k, v, o)
    strides = [t.stride() for t in tensors]
    tma = pack is None and _tma_ready(*tensors)
    meta = {**_switches(q, v, mods, lse), "SINKS": mods.sinks is not None, "TMA": tma,
            "WIDE_ROWS": not tma and wide_rows(*tensors)}
    if meta["TMA"]:  # boxes sized here for explicit tiles, by _descriptor_boxes when tuned
        tensors = tuple(TensorDescriptor(t, list(t.shape), list(st), [1, 1, 16, 16])
                        for t, st in zip(tensors, strides, strict=True))
        block_m, block_n = tiles or (16, 16)
        _descriptor_boxes({**dict(zip(("Q", "K", "V", "Out"), tensors, strict=True)), **meta,
                           "BLOCK_M": block_m, "BLOCK_N": block_n})
    sinks = (lse, 0) if mods.sinks is None else (mods.sinks, mods.sinks.stride(0))
    args = (*tensors, lse, *(s for st in strides for s in st), hq, hq // hkv, nq, nk,
            *_variant_args(lse, mods, scale), *sinks)
    rows_q, _, batch = _grid_sizes(nq, nk, b, pack)
    _launch("fwd", lambda bm, bn: (triton.cdiv(rows_q, bm), batch * hq), args, meta, tiles)
    return (o, lse) if pack is None else (o[0].transpose(0, 1), lse[0])


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
    rows_q, rows_k, batch = _grid_sizes(nq, nk, b, pack)
    _launch("bwd_dkdv", lambda bm, bn: (triton.cdiv(rows_k, bn), batch * hkv),
            (q, k, v, do, dk, dv, lse2, delta, *strides, *dk.stride(), *dv.stride(),
             hkv, hq // hkv, nq, nk, qk_scale, scale, *variant),
            {**meta, "WIDE_ROWS": wide_rows(q, k, v, do, dk, dv)}, tiles)
    _launch("bwd_dq", lambda bm, bn: (triton.cdiv(rows_q, bm), batch * hq),
            (q, k, v, do, dq, lse2, delta, *strides, *dq.stride(),
             hq, hq // hkv, nq, nk, qk_scale, scale, *variant),
            {**meta, "WIDE_ROWS": wide_rows(q, k, v, do, dq)}, tiles)
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
                tiles: Tiles, pack: _Pack | None) -> tuple[Tensor, Tensor]:
        mods = _Mods(causal, window, softcap, slopes, sinks, pack)
        o, lse = _forward(q, k, v, mods, scale, tiles)
        ctx.save_for_backward(q, k, v, o, lse, sinks, slopes)
        ctx.args = (causal, window, softcap, scale, tiles, pack)
        return o, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do: Tensor, dlse: Tensor):
        q, k, v, o, lse, sinks, slopes = ctx.saved_tensors
        causal, window, softcap, scale, tiles, pack = ctx.args
        mods = _Mods(causal, window, softcap, slopes, sinks, pack)
        dq, dk, dv, dsinks = _backward(do, dlse, q, k, v, o, lse, mods, scale, tiles,
                                       sinks is not None and ctx.needs_input_grad[3])
        return dq, dk, dv, dsinks, None, None, None, None, None, None, None


def attention(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False,
              scale: float | None = None, block_m: int | None = None,
              block_n: int | None = None, window_size: tuple[int, int] | None = None,
              softcap: float = 0.0, alibi_slopes: Tensor | None = None,
              sinks: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Fused FlashAttention-2: returns (o, lse).

    q (B, Hq, Nq, D), k (B, Hkv, Nk, D), v (B, Hkv, Nk, Dv), any strides, Hq % Hkv == 0.
    ``causal`` is bottom-right aligned; ``scale`` defaults to 1/sqrt(D). ``block_m`` /
    ``block_n`` pick the query / key tile sizes (one of 16, 32, 64, 128); left out, a GPU
    autotunes them (16-bit inputs with Nq * Nk >= 512^2; fixed tiles otherwise) and the
    interpreter uses 32 x 32. o has q's dtype and shape (..., Dv); lse is
    (B, Hq, Nq) in fp32 (fp64 for fp64 inputs), natural log, -inf on rows that see no key.
    Differentiable in q, k, v and ``sinks`` (deterministic backward, no atomics).

    Variants (``docs/variants.md``, checked by ``contract.validate.check_variants``):
    ``window_size=(left, right)`` (-1: unbounded side), ``softcap`` (0: off), ``alibi_slopes``
    float32 (Hq,) or (B, Hq), ``sinks`` float32 (Hq,) (a row that sees no key gets lse = z_h).
    """
    tiles = _check_inputs(q, k, v, scale, block_m, block_n)
    b, hq, nq, _ = q.shape
    var = check_variants(b, hq, q.device, window_size=window_size, softcap=softcap,
                         alibi_slopes=alibi_slopes, sinks=sinks)
    return _attend(q, k, v, var, causal, scale, tiles, (nq, k.shape[2]), None)


def varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
           max_seqlen_q: int, max_seqlen_k: int, *, causal: bool = False,
           scale: float | None = None, block_m: int | None = None, block_n: int | None = None,
           window_size: tuple[int, int] | None = None, softcap: float = 0.0,
           alibi_slopes: Tensor | None = None, sinks: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Packed sequences (``flash_attn_varlen_func``'s signature): returns (o, lse).

    q (Tq, Hq, D), k (Tk, Hkv, D), v (Tk, Hkv, Dv) token-major, any strides; sequence s holds
    queries ``cu_seqlens_q[s]:cu_seqlens_q[s + 1]`` and keys ``cu_seqlens_k[s]:cu_seqlens_k[s + 1]``
    (int32, B + 1 entries from 0 to Tq, Tk; zero-length sequences are legal); ``max_seqlen_q/k``
    are at least the longest (``contract.validate.check_varlen``). Every convention of
    :func:`attention` holds for each sequence alone, with its own c = Nk_s - Nq_s: causal and
    the window bottom-right aligned, the ALiBi distance, empty rows; (B, Hq) ALiBi slopes give
    sequence s row s. o (Tq, Hq, Dv) token-major in q's dtype, lse (Hq, Tq) in fp32 (fp64);
    differentiable in q, k, v and ``sinks``. Tiles as :func:`attention`'s for the longest
    sequences."""
    count, tiles = _check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                        max_seqlen_k, scale, block_m, block_n)
    var = check_variants(count, q.shape[1], q.device, window_size=window_size, softcap=softcap,
                         alibi_slopes=alibi_slopes, sinks=sinks)
    pack = _Pack(cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous(), max_seqlen_q, max_seqlen_k,
                 count)
    return _attend(q, k, v, var, causal, scale, tiles, (max_seqlen_q, max_seqlen_k), pack)


def _attend(q: Tensor, k: Tensor, v: Tensor, var: Variants, causal: bool, scale: float | None,
            tiles: Tiles, lengths: tuple[int, int], pack: _Pack | None) -> tuple[Tensor, Tensor]:
    """Both entry points once their inputs are checked: causal and the window folded into the
    kernels' band for queries and keys of ``lengths`` (:func:`resolve_band`; for a pack its
    longest sequences: a side that cuts no key of those cuts none of any sequence, and a
    finite side the band keeps is exact in every sequence), the default scale 1/sqrt(D)."""
    band_causal, window = resolve_band(bool(causal), var.window, *lengths)
    sm_scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    device = torch.cuda.device(q.device) if q.device.type == "cuda" else contextlib.nullcontext()
    with device:
        return _FlashAttention.apply(q, k, v, var.sinks, var.alibi_slopes, band_causal, window,
                                     var.softcap, sm_scale, tiles, pack)


#: The variants both entry points take, forward and backward, in every combination with causal,
#: GQA, Dv != D and the declared dtypes; varlen (``attention.varlen``) in any combination with
#: them; KV-cache decode (``attention.kvcache``, forward only: kernels/triton_decode.py) too.
_VARIANTS = {"window": True, "softcap": True, "alibi": ALIBI_SHAPES, "sinks": True, "varlen": True,
             # the interpreter (CPU time): 8 splits (a program each), pages up to 64 keys
             "kvcache": KVCache(contiguous=True, max_splits=8 if INTERPRET else 128, max_queries=64,
                                page_sizes=(1, 16, 48, 64) if INTERPRET else (1, 16, 48, 64, 100, 256)),
             "variant_backward": frozenset({"window", "softcap", "alibi", "sinks", "varlen"})}


def _capabilities() -> Capabilities:
    """What ``attention`` declares, chosen at import: under the interpreter CPU tensors in fp16,
    fp32, fp64; compiled, CUDA tensors in all four dtypes; neither (no GPU, no interpreter):
    no device at all. The variants (:data:`_VARIANTS`) everywhere."""
    bf16_on_cpu = Limit(
        reason=_BF16_INTERPRETER_REASON,
        applies=lambda p: p.device == "cpu" and p.dtype == torch.bfloat16,
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
    devices = frozenset({"cuda"}) if torch.cuda.is_available() else frozenset()
    return Capabilities(dtypes=frozenset(_ALL_DTYPES), devices=devices, block_m=TILE_SIZES,
                        block_n=TILE_SIZES, fp32_matmul="ieee",
                        limits=(bf16_on_cpu, tiles_too_big, grid_y), **_VARIANTS)


attention.capabilities = _capabilities()
attention.last_launch = last_launch


def _kvcache(q: Tensor, k_cache: Tensor, v_cache: Tensor, **kwargs) -> tuple[Tensor, Tensor]:
    """KV-cache decode, forward only: :func:`kernels.triton_decode.kvcache`, imported at the first
    call (that module builds on this one's helpers: importing it here would be a cycle)."""
    from flashprop.kernels.triton_decode import kvcache

    return kvcache(q, k_cache, v_cache, **kwargs)


attention.kvcache = _kvcache
attention.varlen = varlen
