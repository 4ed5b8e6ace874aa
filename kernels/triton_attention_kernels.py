"""Fused FlashAttention-2 in Triton, the device kernels: forward and backward, read top to bottom.

The ``triton`` kernel is three modules, each read top to bottom, in this order:

  ``kernels/triton_attention_kernels.py`` (this one): the math, the conventions and the
    ``@triton.jit`` kernels (stages 1-5);
  ``kernels/triton_attention_launch.py``: tile choice, autotuning, the passes and their launch
    (stage 6);
  ``kernels/triton_attention.py``: the host side, input checks, the variants as the kernels take
    them, autograd and the entry points ``attention`` and ``varlen`` (stage 7).

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
causal ones are.

Dropout (``dropout_p`` p, ``dropout_seed``; ``docs/variants.md``): the probabilities that weight
V are P * Z with Z = M / (1 - p), M the contract's counter-based keep mask of (seed, b, h, i, j)
(``refimpl/dropout.py``'s hash, bit for bit, in uint32: ``_dropout_weights``), so the backward
recomputes Z from the same indices and no mask is stored; l and lse stay the softmax's:

    o = (P * Z) V / l     dV = (P * Z)^T dO     dS = P * (Z * dP - Delta)

FP8 (forward only): q, k, v float8_e4m3fn or float8_e5m2 with descales (FlashAttention-3's
``q_descale``, ``k_descale``, ``v_descale``): the tiles' products are exact in fp32, the logits
``scale * q_descale * k_descale * q8 . k8``, P rounded to the FP8 format for P V, and o
``v_descale * acc / l`` in bfloat16.

Each variant is a compile-time switch (``WINDOW``, ``SOFTCAP``, ``ALIBI``, ``SINKS``,
``DROPOUT``, ``FP8``, ``VARLEN``): off, the kernels compile exactly the dense code.

Varlen (``varlen``, ``flash_attn_varlen_func``'s signature; ``VARLEN``): sequence s of a pack is
queries cu_q[s]:cu_q[s + 1] and keys cu_k[s]:cu_k[s + 1] of token-major tensors, and everything
above holds for each sequence alone with its own Nq_s, Nk_s and c = Nk_s - Nq_s. The forward's
grid runs over the pack's query tiles (each sequence's own tiles, the longest sequences first: a
map built on the device, :func:`_pack_tile_map`) times heads, so a pack of one long and many
short sequences launches no program per (short sequence, tile of the longest) and does not end
on the longest one's tiles alone; a few programs past the last tile exit.
The backward's grids run over the longest sequences' tiles times sequences times heads; each
program reads its sequence's bounds from cu_seqlens and exits at once when its tile lies past
the sequence's end. Tiles address the sequence's rows from its first token, so the loops are
the dense ones. The backward preprocess needs no sequences: it runs on the pack as one batch
element.

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
  sides finite (an unbounded side becomes one that cuts nothing):
  ``triton_attention.resolve_band``.
* varlen: q (Tq, Hq, D), k (Tk, Hkv, D), v (Tk, Hkv, Dv), any strides; int32 cu_seqlens_q/k
  of B + 1 entries from 0 to Tq, Tk (zero-length sequences legal, checked on the host:
  ``contract.validate.check_varlen``); o (Tq, Hq, Dv) token-major, lse (Hq, Tq). Causal and
  the window are bottom-right aligned per sequence; (B, Hq) ALiBi slopes give sequence s row s;
  a sequence with no key gets o = 0, lse = -inf (or z_h), one with no query nothing. Never TMA.
* alibi_slopes and sinks are float32 whatever the inputs' dtype; sinks.grad is float32.
* fp16/bf16 inputs accumulate in fp32; fp32 uses ``tl.dot(input_precision="ieee")`` (no tf32);
  fp64 runs in fp64 throughout (so gradcheck can run on the kernel). lse is fp32 (fp64 for
  fp64 inputs); o has the input dtype.

Stages of this module:
  1. tile helpers (masked loads and stores; 32- or 64-bit row addressing, ``WIDE_ROWS``), the
     key and query ranges a tile visits, the score variants (``_tanh``, ``_modified_scores``),
     the dropout hash (``_dropout_weights``), P's rounding for the P V product
  2. forward kernel
  3. backward preprocess: Delta and the base-2 lse used by the backward
  4. backward dK/dV kernel (one program per key tile and kv head)
  5. backward dQ kernel (one program per query tile and query head)
  and the dropout keep mask kernel (what ``attention.dropout_mask`` returns)
The launch module (stage 6) chooses the tiles and the compile-time switches and launches these
kernels; the host module (stage 7) checks the inputs and folds the variants into their arguments.

Forward memory access: dense 16-bit q, k, v (and o) whose rows and strides are 16-byte aligned go
through 4-D TMA tensor descriptors (Hopper's copy engine: it zero-fills rows and head-dim
columns past the tensor, so those loads need no masks); any other layout through masked
pointer loads. ``FLASHPROP_TRITON_TMA=0`` forces the pointer loads everywhere (to compare).

CPU: under ``TRITON_INTERPRET=1`` (read when this module is imported, as Triton does) the same
kernels run in Triton's interpreter on CPU tensors. The interpreter multiplies bf16 bit patterns
in ``tl.dot`` (triton issue 11584), so bf16 is refused there. At import the interpreter gets
the fixes every interpreted kernel gains (``contract.triton_interpreter.apply_interpreter_fixes``: numpy
>= 2.4's scalar conversion, room on CPython's frame stack for each launch) and one for this
module's helpers: no re-patching in them (:func:`_skip_repatching_in_helpers`).
"""

import os

import triton
import triton.language as tl
from flashprop.contract.triton_interpreter import apply_interpreter_fixes

#: Whether the kernels below are Triton-interpreted (CPU tensors) or compiled (CUDA tensors).
#: ``triton.jit`` makes this choice when the decorated function is defined, i.e. at import.
INTERPRET: bool = os.environ.get("TRITON_INTERPRET", "0") == "1"
_INTERPRETED = tl.constexpr(INTERPRET)  # the same, as the kernels read it


def _skip_repatching_in_helpers() -> None:
    """Triton's interpreter patches ``triton.language`` for itself (``_patch_lang``:
    ``inspect.getmembers`` over four modules) when a kernel is launched, and again at every call
    of a ``@triton.jit`` helper, although the launch has patched the same modules: about an
    eighth of this module's interpreted CPU time (forward and backward of a pack of 8 sequences,
    2 heads, D = 64, causal: 0.76 s, 0.66 s without). A call of a helper of this module while
    ``triton.language`` is patched (``tl.load`` is then the interpreter's, not the builtin: a
    launch of a kernel that sees ``tl``, as this module's helpers do) runs the helper without
    patching again; every other call is Triton's own (Triton 3.6 to 3.9). The kernel's
    ``@triton.jit`` functions all live in this module (the launch module's twins wrap them),
    so keying on its globals covers them, and the helpers that ``kernels/triton_decode.py``'s
    kernels call (``_in_window``, ``_modified_scores``)."""
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
    apply_interpreter_fixes()
    _skip_repatching_in_helpers()

# ---------------------------------------------------------------------------------------------
# Stage 1: tile helpers
# ---------------------------------------------------------------------------------------------


@triton.jit
def _wide_tile_ptrs(base, start, rows, cols, stride_r, stride_c):
    """Pointers to ``base[rows, cols]`` of one (batch, head) slice, ``rows = start + arange``,
    with 64-bit row offsets: the addressing of the pointer paths when ``WIDE_ROWS``.

    Every kernel's ``base`` already holds the 64-bit (batch, head) offset; the offset within the
    slice is ``rows * stride_r + cols * stride_c``. Without WIDE_ROWS (a launch whose tensors
    span at most 2^31 - 1 elements, ``triton_attention_launch.wide_rows``) :func:`_load_tile` and
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
    ``triton_attention.resolve_band``).

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
def _tanh(y, y_scale, LOW_PRECISION: tl.constexpr):
    """tanh(x), x = y * y_scale (fp32 or fp64 ``y``, ``y_scale`` > 0), as accurate as the inputs'
    dtype needs.

    Accurate (fp32 and fp64 inputs; to about an ulp of x's dtype): |x| < 0.625, x + x^3
    P(x^2) / Q(x^2), the rational approximation of the Cephes library (accurate to fp64's
    rounding there, where the exponential form loses x's leading digits); else (1 - e) / (1 +
    e), e = exp(-2|x|) in (0, 0.29] (no overflow). One division serves both; the sign is put
    back last.

    ``LOW_PRECISION`` (16-bit or FP8 inputs, fp32 ``x``), to a relative error of 1e-6: the
    rational function x P(x^2) / Q(x^2) below on x clamped to [-9, 9] (tanh(9) is 1 in fp32),
    through the hardware's approximate reciprocal on a GPU (:func:`_reciprocal_approx`). No
    cancellation near 0 (P(0) = Q(0) = 1: tiny x are returned as they are), no branch, no
    exponential. A capped logit ``cap * tanh`` then moves by about 1e-6 of itself, hundreds of
    times below its fp16 rounding, which is what the softcap precision property measures
    against; a huge cap (softcap-huge: 1e8) keeps the logits. 13 more instructions per score
    than the dense loop, where the accurate form took 30 more (``ci/sass_loop.py``; its division
    alone, ``div.full.f32``, is 8 on sm_90). Not ``tanh.approx.f32``: its relative error, 2^-11,
    is an fp16 rounding of every capped logit."""
    if LOW_PRECISION:
        x = tl.clamp(y * y_scale, -9.0, 9.0, propagate_nan=tl.PropagateNan.ALL)
        x2 = x * x
        # P and Q, fitted for this kernel by iteratively reweighted least squares on the relative
        # error with P(0) = Q(0) = 1: at most 9.1e-7 over 1e-30 <= |x| <= 12 evaluated in fp32
        # (at 5.88). Q's roots in x^2 are negative: no pole.
        num = (((-5.108791422455544e-09 * x2 + 6.56176962104986e-06) * x2 + 0.002614719733545019) * x2
               + 0.1263181467777603) * x2 + 1.0
        den = ((0.00018633126714400177 * x2 + 0.022501528728078115) * x2 + 0.45964903848922406) * x2 + 1.0
        t = x * num * _reciprocal_approx(den)
    else:
        dt = y.dtype  # constants through tl.full: Python floats in a kernel are rounded to fp32
        x = y * y_scale
        a = tl.abs(x)
        p0, p1, p2 = (tl.full([], -9.64399179425052238628e-1, dt), tl.full([], -9.92877231001918586564e1, dt),
                      tl.full([], -1.61468768441708447952e3, dt))
        q0, q1, q2 = (tl.full([], 1.12811678491632931402e2, dt), tl.full([], 2.23548839060100448583e3, dt),
                      tl.full([], 4.84406305325125486048e3, dt))
        x2 = a * a
        num = (x2 * p0 + p1) * x2 + p2
        den = ((x2 + q0) * x2 + q1) * x2 + q2
        e = tl.exp2(a * tl.full([], -2.8853900817779268, dt))
        small = a < 0.625
        ratio = tl.where(small, a * x2 * num, 1.0 - e) / tl.where(small, den, 1.0 + e)
        t = tl.where(small, a + ratio, ratio)
        t = tl.where(x < 0, -t, t)
    return t


@triton.jit
def _reciprocal_approx(x):
    """1 / x of fp32 ``x`` in [1, 300]: ``rcp.approx.ftz.f32`` on a GPU (one MUFU instruction;
    relative error about 2^-23), a division under the interpreter."""
    if _INTERPRETED:
        return 1.0 / x
    else:
        return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)


@triton.jit
def _modified_scores(qk, q_idx, kv_idx, n_q, n_k, qk_scale, SOFTCAP: tl.constexpr, softcap2,
                     ALIBI: tl.constexpr, slope2, IN_DTYPE: tl.constexpr):
    """Base-2 logits of a tile from the raw products ``qk = q_i . k_j``, with the score variants
    (softcap, then ALiBi), and ``tanh`` of the softcap (the backward's derivative 1 - tanh^2;
    ``qk``'s scaled self without a softcap). ``q_idx``, ``kv_idx``: the rows' and keys' indices,
    broadcastable to the tile (keys x queries in the dK/dV pass).

    SOFTCAP: ``qk_scale = scale / softcap`` (tanh's argument) and ``softcap2 = softcap *
    log2(e)``; else ``qk_scale = scale * log2(e)``. ALIBI: ``slope2 = slope * log2(e)`` of this
    (batch, query head), the bias ``-slope2 * |i + c - j|``. ``IN_DTYPE``: the inputs' dtype,
    which sets the tanh's accuracy (:func:`_tanh`: 16-bit and FP8 inputs take the fast form)."""
    if SOFTCAP:
        t = _tanh(qk, qk_scale, IN_DTYPE != tl.float32 and IN_DTYPE != tl.float64)
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
def _clamped(lo, hi, total):
    """A sequence's boundaries ``lo = cu[s]``, ``hi = cu[s + 1]`` of a pack of ``total`` rows,
    clamped to (start, end) with 0 <= start <= end <= total: unchanged for well-formed
    boundaries; on the malformed ones that ``kernels.triton_checks`` refuses beside the kernels,
    they keep every read within the packed tensors."""
    start = tl.minimum(tl.maximum(lo, 0), total)
    return start, tl.minimum(tl.maximum(hi, start), total)


@triton.jit
def _sequence(CuSeqQ, CuSeqK, off_b, N_Q, N_K):
    """Where sequence ``off_b`` of a pack (VARLEN) of ``N_Q`` queries and ``N_K`` keys lies:
    (q_start, n_q, k_start, n_k), its first query and key as 64-bit row indices of the packed
    tensors (``cu[off_b]``) and its lengths (``cu[off_b + 1] - cu[off_b]``), clamped into the
    pack (:func:`_clamped`)."""
    q_start, q_end = _clamped(tl.load(CuSeqQ + off_b), tl.load(CuSeqQ + off_b + 1), N_Q)
    k_start, k_end = _clamped(tl.load(CuSeqK + off_b), tl.load(CuSeqK + off_b + 1), N_K)
    return q_start.to(tl.int64), q_end - q_start, k_start.to(tl.int64), k_end - k_start


@triton.jit
def _row_tiles(CuSeq, idx, count, total, bm):
    """(N_s, cdiv(N_s, bm)): the rows (queries or keys, as ``CuSeq`` counts them, ``total`` in
    all, clamped as :func:`_clamped`) and tiles of bm rows of sequences ``idx`` of a pack of
    ``count`` (0 past the pack); the tiles as int64, whose sums over a pack cannot wrap."""
    ok = idx < count
    start, end = _clamped(tl.load(CuSeq + idx, mask=ok, other=0),
                          tl.load(CuSeq + idx + 1, mask=ok, other=0), total)
    n = end - start
    return n, ((n + bm - 1) // bm).to(tl.int64)


@triton.jit
def _pack_tile_map(CuSeq, count, total_rows, TileMap, map_len, CHUNK: tl.constexpr,
                   SORT_MAX: tl.constexpr):
    """The tile map of a pack of ``count`` sequences (VARLEN) over the ``total_rows`` rows
    ``CuSeq`` counts: the queries (cu_seqlens_q: the forward's and dQ's tiles) or the keys
    (cu_seqlens_k: dK/dV's).
    Program (c, j) writes sequences c * CHUNK .. c * CHUNK + CHUNK - 1 into row j, for tiles of
    BM = 16 << j rows: two int32 vectors of ``map_len`` entries, TileMap[j, 0, t] the sequence of
    the pack's t-th tile and TileMap[j, 1, t] its index within the sequence; -1 past the last
    tile (map_len >= cdiv(T, 16) + count bounds every row's tiles). Every entry is written, and
    within the map, whatever the boundaries hold (:func:`_clamped`: the passes then read
    within the pack).

    Order: each sequence's cdiv(N_s, BM) tiles are consecutive; the sequences come longest first
    (ties in pack order) when count <= SORT_MAX, else in pack order. The passes run the map's
    entries in order (heads fastest), so the longest sequences' tiles, the slowest programs,
    start first and the short ones fill the last wave: a pack drawn with its longest sequence
    last otherwise ends on that sequence's tiles alone. A sequence's first tile in the
    map is the number of tiles of the sequences before it: with the sort, a sum over every
    sequence of the pack (count / CHUNK steps of CHUNK x CHUNK comparisons); without, the tiles of
    the chunks before this one and a cumulative sum within it."""
    bm = 16 << tl.program_id(1)
    seq_row = TileMap + tl.program_id(1) * 2 * map_len
    tile_row = seq_row + map_len
    mine = tl.program_id(0) * CHUNK + tl.arange(0, CHUNK)
    n, tiles = _row_tiles(CuSeq, mine, count, total_rows, bm)
    if count <= SORT_MAX:
        first = tl.zeros([CHUNK], tl.int64)  # tiles of the sequences listed before each of mine
        total = tl.full([], 0, tl.int64)
        for other0 in range(0, count, CHUNK):
            other = other0 + tl.arange(0, CHUNK)
            n_o, tiles_o = _row_tiles(CuSeq, other, count, total_rows, bm)
            longer, tie = n_o[:, None] > n[None, :], n_o[:, None] == n[None, :]
            ahead = longer | (tie & (other[:, None] < mine[None, :]))
            first += tl.sum(tl.where(ahead, tiles_o[:, None], 0), 0)
            total += tl.sum(tiles_o, 0)
    else:
        before = tl.full([], 0, tl.int64)  # tiles of the chunks before this one
        for other0 in range(0, tl.program_id(0) * CHUNK, CHUNK):
            before += tl.sum(_row_tiles(CuSeq, other0 + tl.arange(0, CHUNK), count, total_rows, bm)[1], 0)
        first = before + tl.cumsum(tiles, 0) - tiles
        total = before + tl.sum(tiles, 0)  # the pack's tiles when this chunk is the last
    for k in range(0, tl.max(tiles, 0)):
        listed = (k < tiles) & (first + k < map_len)  # holds for well-formed boundaries
        tl.store(seq_row + first + k, mine, mask=listed)
        tl.store(tile_row + first + k, (tl.zeros_like(mine) + k).to(tl.int32), mask=listed)
    if tl.program_id(0) == tl.num_programs(0) - 1:  # the last chunk: -1 past the pack's tiles
        for rest in range(total, map_len, CHUNK):
            t = rest + tl.arange(0, CHUNK)
            tl.store(seq_row + t, tl.full([CHUNK], -1, tl.int32), mask=t < map_len)
            tl.store(tile_row + t, tl.full([CHUNK], -1, tl.int32), mask=t < map_len)


@triton.jit
def _pack_tile(TileMap, map_len, BLOCK: tl.constexpr, HEADS):
    """(sequence, tile within it, head) of this program of a pass over a pack: program_id(0) is
    entry // HEADS of the row of :func:`_pack_tile_map` for tiles of BLOCK rows (16, 32, 64, 128:
    rows 0-3) and head program_id(0) % HEADS (heads fastest, so the programs start in the map's
    order); sequence -1 past the pack's last tile. The forward and dQ pass query tiles and query
    heads, dK/dV key tiles and KV heads."""
    row: tl.constexpr = (BLOCK >= 32) + (BLOCK >= 64) + (BLOCK >= 128)
    pid = tl.program_id(0)
    entry = TileMap + row * 2 * map_len + pid // HEADS
    return tl.load(entry), tl.load(entry + map_len), pid % HEADS


@triton.jit
def _fmix32(x):
    """MurmurHash3's 32-bit finaliser of uint32 ``x`` (products wrap mod 2^32)."""
    x = x ^ (x >> 16)
    x = x * 0x85EBCA6B
    x = x ^ (x >> 13)
    x = x * 0xC2B2AE35
    return x ^ (x >> 16)


@triton.jit
def _absorb(state, word):
    """One round of the contract's dropout hash: ``fmix32((state ^ word) + 0x9E3779B9)``, the
    word's low 32 bits (``refimpl/dropout.py``)."""
    return _fmix32((state ^ word.to(tl.uint32)) + 0x9E3779B9)


@triton.jit
def _dropout_state(seed_lo, seed_hi, off_b, off_h, DROPOUT: tl.constexpr):
    """The dropout hash's state after the words (s_lo, s_hi, b, h) of one (batch element or
    sequence, query head): a uint32 scalar that :func:`_dropout_kept` finishes per entry (0,
    unused, without DROPOUT)."""
    state = tl.zeros([], tl.uint32)
    if DROPOUT:
        state = _absorb(state, seed_lo)
        state = _absorb(state, seed_hi)
        state = _absorb(state, off_b)
        state = _absorb(state, off_h)
    return state


@triton.jit
def _dropout_kept(state, q_idx, kv_idx, drop_threshold):
    """The contract's keep mask M at broadcastable query and key indices (their positions in the
    sequence): the hash of (state, i, j) is at least ``drop_threshold = ceil(p 2^32)``. Bit for
    bit ``refimpl/dropout.py``'s; ``attention.dropout_mask`` writes it."""
    h = _absorb(_absorb(state, q_idx), kv_idx)
    return h.to(tl.int64) >= drop_threshold


@triton.jit
def _dropout_weights(state, q_idx, kv_idx, drop_threshold, drop_scale):
    """The dropout's ``Z = M / (1 - p)`` (:func:`_dropout_kept`): ``drop_scale = 1 / (1 - p)``
    where kept, else 0."""
    return tl.where(_dropout_kept(state, q_idx, kv_idx, drop_threshold), drop_scale, 0.0)


@triton.jit
def _exact_fp8(p, SIGNIFICANT: tl.constexpr, SUBNORMAL_MAGIC: tl.constexpr, MIN_NORMAL: tl.constexpr):
    """``p`` in [0, 1] rounded to nearest in fp32 onto an FP8 format's values (``SIGNIFICANT``
    bits; below ``MIN_NORMAL``, multiples of the subnormal spacing u: ``(p + 1.5 u 2^23) -
    1.5 u 2^23``), for the interpreter only: its fp32 -> FP8 conversion drops the carry when
    rounding up crosses a power of two (0.4868 becomes 0.25 in e4m3 with Triton 3.6 and 3.9), and
    converts exactly representable values correctly. Normal range: Veltkamp's split,
    ``c = p (2^(24 - SIGNIFICANT) + 1)``, ``c - (c - p)``."""
    c = p * (2.0 ** (24 - SIGNIFICANT) + 1.0)
    normal = c - (c - p)
    sub = (p + SUBNORMAL_MAGIC) - SUBNORMAL_MAGIC
    return tl.where(p < MIN_NORMAL, sub, normal)


@triton.jit
def _operand(x, K: tl.constexpr):
    """``x`` as ``tl.dot`` takes it along a reduction of ``K``: itself, or an FP8 tile's values
    exactly in a wider type: fp32 under the interpreter (its FP8 ``tl.dot`` decodes e5m2
    subnormals as 0 and values from 2^13 on as NaN, with Triton 3.6 and 3.9, while its conversion
    to fp32 is exact), fp16 on a GPU when K < 32 (Triton's FP8 dot needs K >= 32; fp16 holds
    every e4m3 and e5m2 value)."""
    if x.dtype == tl.float8e4nv or x.dtype == tl.float8e5:
        if _INTERPRETED:
            x = x.to(tl.float32)
        elif K < 32:
            x = x.to(tl.float16)
    return x


@triton.jit
def _probabilities_as(p, dtype: tl.constexpr):
    """The probabilities ``p`` (in [0, 1], or up to 1 / (1 - dropout_p) with dropout) rounded to
    ``dtype`` for the P V product; FP8 (``docs/variants.md``: P in the inputs' format) through
    :func:`_exact_fp8` under the interpreter."""
    if _INTERPRETED and dtype == tl.float8e4nv:
        p = _exact_fp8(p, 4, 1.5 * 2.0 ** 14, 2.0 ** -6)
    if _INTERPRETED and dtype == tl.float8e5:
        p = _exact_fp8(p, 3, 1.5 * 2.0 ** 7, 2.0 ** -14)
    return p.to(dtype)


# ---------------------------------------------------------------------------------------------
# Stage 2: forward
# ---------------------------------------------------------------------------------------------


@triton.jit
def _fwd_inner(
    acc, m_i, l_i, q,
    k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd, off_b, off_hkv,
    offs_m, lo, hi, n_q, n_k, qk_scale, win_left, win_right, softcap2, slope2,
    drop_state, drop_threshold, drop_scale,
    head_dim, head_dim_v, EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
    ALIBI: tl.constexpr, DROPOUT: tl.constexpr, FP8: tl.constexpr, PRECISION: tl.constexpr,
    TMA: tl.constexpr, WIDE_ROWS: tl.constexpr,
):
    """Online-softmax update of (acc, m_i, l_i) over key tiles [lo, hi).

    K and V come through :func:`_load_rows`: descriptors (TMA) or pointers at the kv head.
    Logits: scaled, or through the score variants (:func:`_modified_scores`).

    m_i is the running row maximum in base-2 units; MASKED tiles hide keys outside the window
    (WINDOW: :func:`_in_window`), keys >= n_k and, when CAUSAL, keys right of the diagonal. A
    row that has seen no key yet keeps m_i = -inf; it is subtracted as 0 so that
    exp2(-inf - 0) = 0 instead of exp2(-inf + inf) = NaN.

    DROPOUT: the probabilities that weight V are ``P * Z`` (:func:`_dropout_weights`); l_i sums
    P undropped, so lse is the softmax's. P is rounded to V's dtype for the product
    (:func:`_probabilities_as`: FP8 V, FP8 P). FP8 with TMA: ``v_base`` describes V^T.
    """
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = _load_rows(k_base, off_b, off_hkv, start_n, offs_n, offs_d, stride_kn, stride_kd,
                       n_k, head_dim, EVEN_D, MASKED, TMA, WIDE_ROWS)
        qk = tl.dot(_operand(q, BLOCK_D), tl.trans(_operand(k, BLOCK_D)), input_precision=PRECISION)
        if SOFTCAP or ALIBI:
            s, _ = _modified_scores(qk, offs_m[:, None], offs_n[None, :], n_q, n_k, qk_scale,
                                    SOFTCAP, softcap2, ALIBI, slope2, q.dtype)
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
        if TMA and FP8:  # V^T's descriptor (B, H, Dv, N): the key axis innermost, as FP8 wgmma reads it
            v = tl.trans(v_base.load([off_b, off_hkv, 0, start_n]).reshape(BLOCK_DV, BLOCK_N))
        else:
            v = _load_rows(v_base, off_b, off_hkv, start_n, offs_n, offs_dv, stride_vn, stride_vd,
                           n_k, head_dim_v, EVEN_DV, MASKED, TMA, WIDE_ROWS)
        if DROPOUT:
            p = p * _dropout_weights(drop_state, offs_m[:, None], offs_n[None, :], drop_threshold,
                                     drop_scale)
        pv = _operand(_probabilities_as(p, v.dtype), BLOCK_N)
        acc = tl.dot(pv, _operand(v, BLOCK_N), acc * alpha[:, None], input_precision=PRECISION,
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
    win_left, win_right, softcap2: tl.float64, Slopes, stride_ab, stride_ah,
    seed_lo: tl.int64, seed_hi: tl.int64, drop_threshold: tl.int64, drop_scale: tl.float64,
    Sinks, stride_z, Descale,
    head_dim, head_dim_v, CuSeqQ, CuSeqK, TileMap, map_len, EVEN_D: tl.constexpr,
    EVEN_DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    CAUSAL: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
    DROPOUT: tl.constexpr, SINKS: tl.constexpr, FP8: tl.constexpr, VARLEN: tl.constexpr,
    ACC_DTYPE: tl.constexpr, PRECISION: tl.constexpr,
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
    stride_z, each the running max's and sum's start (z_h * log2(e), 1); DROPOUT, the seed's
    words seed_lo, seed_hi, drop_threshold = ceil(p 2^32) and drop_scale = 1 / (1 - p)
    (:func:`_dropout_weights`; the batch index is the sequence's under VARLEN). Unused ones are 0
    (pointers: any tensor).

    FP8 (``docs/variants.md``): q, k, v in one FP8 format (with TMA, V the descriptor of V^T, a
    (B, Hkv, Dv, Nk) tensor: Hopper's FP8 wgmma reads its B operand K-major, the key axis innermost),
    Out bfloat16, and Descale a contiguous
    float32 (B * Hq, 2): per (batch element or sequence, query head) the logits' factor
    ``q_descale * k_descale``, folded into the scale, and ``v_descale``, applied to the
    normalised output. P is rounded to the FP8 format for the P V product.

    VARLEN (never with TMA): a pack of sequences, q, k, v, o token-major (T, H, D) with strides
    (unused, head, token, dim), the batch index off_b a sequence of int32 CuSeqQ, CuSeqK
    (:func:`_sequence`), N_Q, N_K the packed totals Tq, Tk, LSE (Hq, Tq). Grid: ((cdiv(Tq,
    BLOCK_M) + sequences) * Hq,), program_id(0) an entry of the pack's TileMap and a head
    (:func:`_pack_tile`; causal: each sequence's last tile first); programs past the last tile
    exit.
    """
    if VARLEN:  # program_id(0): the pack's tile (its sequence and index in it) and the head
        seq, tile, head = _pack_tile(TileMap, map_len, BLOCK_M, H_Q)
        if seq < 0:
            return
        off_bh = seq * H_Q + head
    else:
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
            q_start, n_q, k_start, n_k = _sequence(CuSeqQ, CuSeqK, off_b, N_Q, N_K)
            if CAUSAL:  # the tiles that see the most keys first, as _query_tile_start
                tile = tl.cdiv(n_q, BLOCK_M) - 1 - tile
            start_m = tile * BLOCK_M
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
    if FP8:  # the logits of the dequantised values: q8 k8 * q_descale * k_descale
        scale2 = scale2 * tl.load(Descale + off_bh.to(tl.int64) * 2)
    cap2 = tl.full([], softcap2, ACC_DTYPE)
    slope2 = _head_slope2(Slopes, off_b, off_h, stride_ab, stride_ah, ALIBI, ACC_DTYPE)
    drop_scale_t = tl.full([], drop_scale, ACC_DTYPE)
    drop_state = _dropout_state(seed_lo, seed_hi, off_b, off_h, DROPOUT)

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
            drop_state, drop_threshold, drop_scale_t,
        head_dim, head_dim_v, EVEN_D, EVEN_DV, BLOCK_D, BLOCK_DV, BLOCK_N,
            True, CAUSAL, WINDOW, SOFTCAP, ALIBI, DROPOUT, FP8, PRECISION, TMA, WIDE_ROWS,
        )
    else:
        full_lo = 0
        full_hi, hi = _key_range(start_m, n_q, n_k, BLOCK_M, BLOCK_N, CAUSAL)
    # whole tiles every row sees: no masks
    acc, m_i, l_i = _fwd_inner(
        acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd, off_b,
        off_hkv, offs_m, full_lo, full_hi, n_q, n_k, scale2, win_left, win_right, cap2, slope2,
        drop_state, drop_threshold, drop_scale_t,
        head_dim, head_dim_v, EVEN_D, EVEN_DV, BLOCK_D, BLOCK_DV, BLOCK_N,
        False, CAUSAL, WINDOW, SOFTCAP, ALIBI, DROPOUT, FP8, PRECISION, TMA, WIDE_ROWS,
    )
    # the diagonal (or the window's right edge) and the ragged end of the keys: masked
    acc, m_i, l_i = _fwd_inner(
        acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd, off_b,
        off_hkv, offs_m, full_hi, hi, n_q, n_k, scale2, win_left, win_right, cap2, slope2,
        drop_state, drop_threshold, drop_scale_t,
        head_dim, head_dim_v, EVEN_D, EVEN_DV, BLOCK_D, BLOCK_DV, BLOCK_N,
        True, CAUSAL, WINDOW, SOFTCAP, ALIBI, DROPOUT, FP8, PRECISION, TMA, WIDE_ROWS,
    )

    # epilogue: rows that saw no key (nor a sink) have l_i = 0 -> o = 0, lse = -inf
    empty = l_i == 0.0
    o = acc / tl.where(empty, 1.0, l_i)[:, None]
    if FP8:  # the dequantised values' output: v_descale on the normalised one
        o = o * tl.load(Descale + off_bh.to(tl.int64) * 2 + 1)
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
    drop_state, drop_threshold, drop_scale,
    head_dim, head_dim_v, EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr,
    MASKED: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
    DROPOUT: tl.constexpr, PRECISION: tl.constexpr, WIDE_ROWS: tl.constexpr,
):
    """Accumulate dK (unscaled) and dV of one key tile over query tiles [lo, hi).

    Works on transposed tiles (keys x queries). Query rows >= n_q load q = dO = Delta = 0 (and
    lse2 = 0, or +inf with ALIBI: P = 0) and so contribute exactly 0; key rows >= n_k only touch
    their own (never stored) rows. MASKED tiles hide the queries left of the diagonal, or,
    WINDOW, the pairs outside the window (:func:`_in_window`). SOFTCAP: dS is chained through
    the softcap, dS * (1 - tanh^2). DROPOUT: the same ``Z`` as the forward's, from the same
    indices (:func:`_dropout_weights`): dV += (P Z)^T dO and dS = P (Z dP - Delta).
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
                                        SOFTCAP, softcap2, ALIBI, slope2, q.dtype)
        else:
            s_t = qk_t * qk_scale
        if MASKED:
            if WINDOW:
                s_t = tl.where(_in_window(offs_m[None, :], offs_n[:, None], n_q, n_k, win_left,
                                          win_right), s_t, float("-inf"))
            else:
                s_t = tl.where(offs_m[None, :] >= offs_n[:, None] - (n_k - n_q), s_t, float("-inf"))
        p_t = tl.exp2(s_t - lse2[None, :])
        dp_t = tl.dot(v, tl.trans(do), input_precision=PRECISION)
        if DROPOUT:
            z_t = _dropout_weights(drop_state, offs_m[None, :], offs_n[:, None], drop_threshold, drop_scale)
            dv = tl.dot((p_t * z_t).to(do.dtype), do, dv, input_precision=PRECISION, out_dtype=dv.dtype)
            dp_t = dp_t * z_t
        else:
            dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=PRECISION, out_dtype=dv.dtype)
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
    seed_lo: tl.int64, seed_hi: tl.int64, drop_threshold: tl.int64, drop_scale: tl.float64,
    head_dim, head_dim_v, CuSeqQ, CuSeqK, TileMap, map_len, EVEN_D: tl.constexpr,
    EVEN_DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    CAUSAL: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
    DROPOUT: tl.constexpr, VARLEN: tl.constexpr, ACC_DTYPE: tl.constexpr, PRECISION: tl.constexpr,
    SEQ_CLASS: tl.constexpr, WIDE_ROWS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """dK, dV of one key tile of one (batch, kv head), summed over the GROUP query heads that
    read it (each with its own ALiBi slope). WIDE_ROWS: 64-bit row offsets
    (:func:`_wide_tile_ptrs`); the variants' arguments as :func:`_attn_fwd`'s (sinks do not
    enter: the lse they changed is the forward's). Grid: (cdiv(Nk, BLOCK_N), B*Hkv).

    VARLEN: sequence off_b of a pack, as :func:`_attn_fwd` takes it (LSE2, DELTA (Hq, Tq)), and
    the pack's key tiles in TileMap (:func:`_pack_tile_map` over cu_seqlens_k): grid ((cdiv(Tk,
    BLOCK_N) + sequences) * Hkv,), program_id(0) a key tile and a KV head (:func:`_pack_tile`;
    a sequence's first key tiles, which causal queries see most, first); programs past the last
    tile exit."""
    if VARLEN:  # program_id(0): the pack's key tile (its sequence and index in it) and the head
        seq, tile, head = _pack_tile(TileMap, map_len, BLOCK_N, H_KV)
        if seq < 0:
            return
        off_b = seq.to(tl.int64)
        off_hkv = head.to(tl.int64)
        q_start, n_q, k_start, n_k = _sequence(CuSeqQ, CuSeqK, off_b, N_Q, N_K)
        start_n = tile * BLOCK_N
    else:
        start_n = tl.program_id(0) * BLOCK_N
        off_b = (tl.program_id(1) // H_KV).to(tl.int64)
        off_hkv = (tl.program_id(1) % H_KV).to(tl.int64)
        n_q, n_k = N_Q, N_K  # this slice's queries and keys (VARLEN: its sequence's, above)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    scale2 = tl.full([], qk_scale, ACC_DTYPE)
    cap2 = tl.full([], softcap2, ACC_DTYPE)
    drop_scale_t = tl.full([], drop_scale, ACC_DTYPE)

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
        drop_state = _dropout_state(seed_lo, seed_hi, off_b, off_h, DROPOUT)
        dk, dv = _bwd_dkdv_inner(
            dk, dv, k, v, q_base, do_base, LSE2 + rows, DELTA + rows,
            stride_qm, stride_qd, stride_dom, stride_dod,
            offs_n, lo, masked_hi, n_q, n_k, scale2, win_left, win_right, cap2, slope2,
            drop_state, drop_threshold, drop_scale_t,
            head_dim, head_dim_v, EVEN_D, EVEN_DV, BLOCK_D, BLOCK_DV, BLOCK_M,
            True, WINDOW, SOFTCAP, ALIBI, DROPOUT, PRECISION, WIDE_ROWS,
        )
        dk, dv = _bwd_dkdv_inner(
            dk, dv, k, v, q_base, do_base, LSE2 + rows, DELTA + rows,
            stride_qm, stride_qd, stride_dom, stride_dod,
            offs_n, full_lo, full_hi, n_q, n_k, scale2, win_left, win_right, cap2, slope2,
            drop_state, drop_threshold, drop_scale_t,
            head_dim, head_dim_v, EVEN_D, EVEN_DV, BLOCK_D, BLOCK_DV, BLOCK_M,
            False, WINDOW, SOFTCAP, ALIBI, DROPOUT, PRECISION, WIDE_ROWS,
        )
        if WINDOW:  # the window's left edge: masked
            dk, dv = _bwd_dkdv_inner(
                dk, dv, k, v, q_base, do_base, LSE2 + rows, DELTA + rows,
                stride_qm, stride_qd, stride_dom, stride_dod,
                offs_n, full_hi, hi, n_q, n_k, scale2, win_left, win_right, cap2, slope2,
                drop_state, drop_threshold, drop_scale_t,
                head_dim, head_dim_v, EVEN_D, EVEN_DV, BLOCK_D, BLOCK_DV, BLOCK_M,
                True, WINDOW, SOFTCAP, ALIBI, DROPOUT, PRECISION, WIDE_ROWS,
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
    drop_state, drop_threshold, drop_scale,
    head_dim, head_dim_v, EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
    ALIBI: tl.constexpr, DROPOUT: tl.constexpr, PRECISION: tl.constexpr, WIDE_ROWS: tl.constexpr,
):
    """Accumulate dQ (unscaled) of one query tile over key tiles [lo, hi); MASKED tiles hide
    keys as :func:`_fwd_inner`'s do. SOFTCAP: dS * (1 - tanh^2). DROPOUT: dS = P (Z dP - Delta)."""
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
                                    SOFTCAP, softcap2, ALIBI, slope2, q.dtype)
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
        if DROPOUT:
            dp = dp * _dropout_weights(drop_state, offs_m[:, None], offs_n[None, :], drop_threshold,
                                       drop_scale)
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
    seed_lo: tl.int64, seed_hi: tl.int64, drop_threshold: tl.int64, drop_scale: tl.float64,
    head_dim, head_dim_v, CuSeqQ, CuSeqK, TileMap, map_len, EVEN_D: tl.constexpr,
    EVEN_DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    CAUSAL: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
    DROPOUT: tl.constexpr, VARLEN: tl.constexpr, ACC_DTYPE: tl.constexpr, PRECISION: tl.constexpr,
    SEQ_CLASS: tl.constexpr, WIDE_ROWS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """dQ of one query tile of one (batch, query head). WIDE_ROWS: 64-bit row offsets
    (:func:`_wide_tile_ptrs`); the variants' arguments as :func:`_attn_bwd_dkdv`'s.
    Grid: (cdiv(Nq, BLOCK_M), B*Hq); VARLEN: as :func:`_attn_fwd`'s (the grid, the tile map
    over cu_seqlens_q; LSE2, DELTA (Hq, Tq))."""
    if VARLEN:  # program_id(0): the pack's query tile (its sequence and index in it) and the head
        seq, tile, head = _pack_tile(TileMap, map_len, BLOCK_M, H_Q)
        if seq < 0:
            return
        off_b = seq.to(tl.int64)
        off_h = head.to(tl.int64)
        q_start, n_q, k_start, n_k = _sequence(CuSeqQ, CuSeqK, off_b, N_Q, N_K)
        if CAUSAL:  # the tiles that see the most keys first, as _query_tile_start
            tile = tl.cdiv(n_q, BLOCK_M) - 1 - tile
        start_m = tile * BLOCK_M
    else:
        start_m = _query_tile_start(BLOCK_M, CAUSAL)
        off_b = (tl.program_id(1) // H_Q).to(tl.int64)
        off_h = (tl.program_id(1) % H_Q).to(tl.int64)
        n_q, n_k = N_Q, N_K  # this slice's queries and keys (VARLEN: its sequence's, above)
    off_hkv = off_h // GROUP
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    if VARLEN:  # LSE2, DELTA (Hq, Tq)
        rows = off_h * N_Q + q_start + offs_m
    else:
        rows = (off_b * H_Q + off_h) * N_Q + offs_m
    scale2 = tl.full([], qk_scale, ACC_DTYPE)
    cap2 = tl.full([], softcap2, ACC_DTYPE)
    slope2 = _head_slope2(Slopes, off_b, off_h, stride_ab, stride_ah, ALIBI, ACC_DTYPE)
    drop_scale_t = tl.full([], drop_scale, ACC_DTYPE)
    drop_state = _dropout_state(seed_lo, seed_hi, off_b, off_h, DROPOUT)

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
            drop_state, drop_threshold, drop_scale_t,
            head_dim, head_dim_v, EVEN_D, EVEN_DV, BLOCK_D, BLOCK_DV, BLOCK_N,
            True, CAUSAL, WINDOW, SOFTCAP, ALIBI, DROPOUT, PRECISION, WIDE_ROWS,
        )
    else:
        full_lo = 0
        full_hi, hi = _key_range(start_m, n_q, n_k, BLOCK_M, BLOCK_N, CAUSAL)
    dq = _bwd_dq_inner(
        dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
        offs_m, full_lo, full_hi, n_q, n_k, scale2, win_left, win_right, cap2, slope2,
        drop_state, drop_threshold, drop_scale_t,
        head_dim, head_dim_v, EVEN_D, EVEN_DV, BLOCK_D, BLOCK_DV, BLOCK_N,
        False, CAUSAL, WINDOW, SOFTCAP, ALIBI, DROPOUT, PRECISION, WIDE_ROWS,
    )
    dq = _bwd_dq_inner(
        dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
        offs_m, full_hi, hi, n_q, n_k, scale2, win_left, win_right, cap2, slope2,
        drop_state, drop_threshold, drop_scale_t,
        head_dim, head_dim_v, EVEN_D, EVEN_DV, BLOCK_D, BLOCK_DV, BLOCK_N,
        True, CAUSAL, WINDOW, SOFTCAP, ALIBI, DROPOUT, PRECISION, WIDE_ROWS,
    )
    dq = dq * tl.full([], sm_scale, ACC_DTYPE)
    if VARLEN:
        dq_base = DQ + q_start * stride_dqm + off_h * stride_dqh
    else:
        dq_base = DQ + off_b * stride_dqb + off_h * stride_dqh
    _store_tile(dq_base, dq, start_m, offs_m, offs_d, stride_dqm, stride_dqd, n_q, head_dim,
                WIDE_ROWS)


# ---------------------------------------------------------------------------------------------
# The dropout keep mask, as the kernels above apply it (``attention.dropout_mask``)
# ---------------------------------------------------------------------------------------------


@triton.jit
def _dropout_mask(
    Mask, seed_lo: tl.int64, seed_hi: tl.int64, drop_threshold: tl.int64, H_Q, N_Q, N_K,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Mask (B, Hq, Nq, Nk) int8, contiguous: 1 where entry (b, h, i, j) is kept, from the same
    :func:`_dropout_state` and :func:`_dropout_kept` as the forward and backward. Grid:
    (cdiv(Nq, BLOCK_M), B*Hq); each program writes its query rows, every key."""
    start_m = tl.program_id(0) * BLOCK_M
    off_bh = tl.program_id(1).to(tl.int64)
    state = _dropout_state(seed_lo, seed_hi, off_bh // H_Q, off_bh % H_Q, True)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    for start_n in range(0, N_K, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kept = _dropout_kept(state, offs_m[:, None], offs_n[None, :], drop_threshold)
        ptrs = Mask + (off_bh * N_Q + offs_m[:, None]) * N_K + offs_n[None, :]
        tl.store(ptrs, kept.to(tl.int8), mask=(offs_m < N_Q)[:, None] & (offs_n < N_K)[None, :])
