"""Blocked FlashAttention-2, forward and backward, in plain PyTorch: a readable reference kernel.

The loops are the fused kernels' loops, written out. Matmul operands are rounded to the input
dtype (as tensor cores read them) and accumulated in float32 (float64 for float64 inputs).
Three entry points share the tile loops (``docs/variants.md``): :func:`attention` (dense),
``attention.varlen`` (packed sequences) and ``attention.kvcache`` (decode from a KV cache).

Forward, for each query tile Q_i (block_m rows), over key tiles K_j, V_j (block_n rows):

    S = scale * Q_i K_j^T
    S = softcap * tanh(S / softcap)           (softcap; 0 is off)
    S = S - slope * |i + c - j|               (ALiBi: one slope per head, or per batch element and head)
    S = -inf where key j is not visible       (tail keys don't exist; causal; window)
    m_new = max(m, rowmax(S));  P = exp(S - m_new);  alpha = exp(m - m_new)
    l = alpha * l + rowsum(P);  acc = alpha * acc + P V_j;  m = m_new
    O_i = acc / l,  lse_i = m + log(l)       (empty rows: O = 0, lse = -inf)

With ``c = Nk - Nq`` (bottom-right alignment), key j is visible from query i iff ``j < Nk``,
``j <= i + c`` when causal, and ``i + c - left <= j <= i + c + right`` for
``window_size=(left, right)`` (-1 leaves that side unbounded; with causal the right edge is also
the diagonal). These are :mod:`contract.masks`' mask and score mods, in that order. Key tiles
that no row of the query tile sees (above the causal diagonal, outside the window) are skipped.

A sink logit z_h (one per query head, natural-log units, not scaled) is a key with no value: the
state starts at ``m = z_h, l = 1, acc = 0``, so ``lse = logaddexp(lse_keys, z_h)``, the output
shrinks by the sink's share, and a row that sees no key has ``O = 0, lse = z_h``.

Backward (FA2): Delta = rowsum(dO * O); for each key tile, over the query tiles that see it:

    P = exp(S - lse);  dV_j += P^T dO_i;  dP = dO_i V_j^T;  dS = P * (dP - Delta_i)
    dS = dS * (1 - (S_capped / softcap)^2)   (the softcap's derivative; ALiBi and masks are additive)
    dK_j += scale * dS^T Q_i;  dQ_i += scale * dS K_j
    dz_h = -sum_{b,i} exp(z_h - lse_bhi) * Delta_bhi

Dropout (``dropout_p`` p > 0, ``dropout_seed``; :mod:`refimpl.dropout`): each tile's probabilities
that weight the values are ``P * Z`` with ``Z = M / (1 - p)`` and the counter-based keep mask
``M[b, h, i, j]`` of the seed, so l and lse stay the undropped softmax's; the backward recomputes
the same ``Z`` from the same indices (no mask is stored):

    dV_j += (P * Z)^T dO_i;  dS = P * (Z * dP - Delta_i)

At p = 0 nothing is dropped and the loops are the plain ones. ``attention.dropout_mask`` gives the
keep mask (B, Hq, Nq, Nk) a call applies; a varlen sequence s uses batch element s's.

GQA: query head h reads kv head h // group; dK and dV are summed over the group.

FP8 (forward only; ``docs/variants.md``): FP8 q, k, v (float8_e4m3fn or float8_e5m2) with
``q_descale``, ``k_descale``, ``v_descale`` (any of the contract's shapes) as FlashAttention-3
computes them: the tiles are read as their FP8 values (exact in float32), the logits are
``S = scale * q_descale * k_descale * (Q_i K_j^T)`` (the descales of the query head's kv head,
per batch element), P is rounded to the FP8 format for the PV product (the input dtype, as for
every dtype: unscaled, ``exp(S - m_new) <= 1``) while l sums it unrounded, and
``O_i = v_descale * acc / l`` is returned in bfloat16. Decode from an FP8 cache (``k_scale``,
``v_scale``: (), (Hkv,)) with float16 or bfloat16 q reads the cache's FP8 values in float32 with
the same descales; P is rounded to q's dtype there.

Varlen: packed token-major q (Tq, Hq, D), k (Tk, Hkv, D), v (Tk, Hkv, Dv); each sequence
``cu_seqlens[s]:cu_seqlens[s+1]`` runs through the same tile loops on its own (its own Nq, Nk
and c) as a batch of one, with ALiBi slopes row s when they are (B, Hq). o (Tq, Hq, Dv),
lse (Hq, Tq); the gradients flow back through the per-sequence calls.

KV-cache decode (forward only): q (B, Nq, Hq, D) are the last Nq queries of a sequence of
``L_b = cache_seqlens[b]`` keys (``c = L_b - Nq``). Only cache positions ``< L_b`` are read:
position j of batch element b is ``k_cache[b, j]``, or, paged, slot ``j % page_size`` of page
``block_table[b, j // page_size]``. Split-KV (flash-decoding) cuts the ``ceil(L_b / block_n)``
key tiles into ``num_splits`` contiguous runs of ``ceil(tiles / num_splits)`` tiles; each run
gives a partial ``(O_s, lse_s)`` kept in the accumulator dtype (a run with no key: O_s = 0,
lse_s = -inf; the sink belongs to the first run), and the partials merge by their lse:

    lse = logaddexp_s lse_s,   O = sum_s exp(lse_s - lse) O_s
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..contract.capabilities import ALIBI_SHAPES, FP8, Capabilities, KVCache
from ..contract.entry_points import KEYWORDS, Keywords, entry_point
from ..contract.fp8 import CACHE_SCALE_SHAPES, DESCALE_SHAPES, FORMATS, is_fp8
from ..contract.masks import causal_offset
from ..contract.outputs import output_dtype
from ..contract.validate import (
    Descales,
    check_cache_scales,
    check_decode,
    check_dense,
    check_dropout,
    check_fp8,
    check_variants,
    check_varlen,
)
from .dropout import Dropout, dropout_of
from .dropout import dropout_mask as _keep_mask
from .golden import default_scale
from .online_softmax import merge_partials

NEG_INF = float("-inf")
TILES = (3, 16, 32, 64, 128)
#: Any page size works (a position is addressed page by page); these are the ones declared.
PAGE_SIZES = (1, 2, 3, 4, 5, 8, 16, 64, 256)
MAX_SPLITS = 64
MAX_DECODE_QUERIES = 64

Window = tuple[int, int]


@dataclass(frozen=True)
class Order:
    """The order the tile loops sum in. Every order computes the same attention and rounds
    differently: :data:`NATURAL` is this kernel's, :mod:`refimpl.reordered` runs another.

    Attributes:
        reverse: each loop visits its tiles last to first (the forward's key tiles; the
            backward's key tiles and, for each, the query tiles that see it).
        d_tile: products over the head dim (``Q K^T``, and ``dO V^T`` in the backward) summed
            tile by tile, ``d_tile`` columns each, last tile first (0, or D <= d_tile: one matmul).
    """

    reverse: bool = False
    d_tile: int = 0

    def visit(self, tiles: range) -> range:
        """The tile starts ``tiles`` in this order's visiting order."""
        return tiles[::-1] if self.reverse else tiles

    def dot(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """``a @ b^T``: (..., M, D) by (..., N, D) -> (..., M, N), summed over D in this order."""
        d = a.shape[-1]
        if not self.d_tile or d <= self.d_tile:
            return a @ b.transpose(-1, -2)
        starts = range(0, d, self.d_tile)[::-1]
        total = a[..., starts[0] :] @ b[..., starts[0] :].transpose(-1, -2)
        for d0 in starts[1:]:
            d1 = d0 + self.d_tile
            total = total + a[..., d0:d1] @ b[..., d0:d1].transpose(-1, -2)
        return total


NATURAL = Order()


@dataclass(frozen=True)
class _Mods:
    """The score and mask modifiers of one call (``docs/variants.md``) as the tile loops read
    them, derived from the checked keywords (``contract.validate.Variants``: the one record of
    what a call asked for), and the loops' summation order.

    Attributes:
        window: ``(left, right)``; -1 leaves that side unbounded, ``(-1, -1)`` is no window.
        softcap: the cap t of ``s -> t * tanh(s / t)``; 0 is off.
        slopes: ALiBi slopes (B, Hq) in the accumulator dtype, or ``None``.
        sinks: sink logits (Hq,), or ``None``.
        order: the order the tile loops sum in.
        dropout: the call's dropout, or ``None`` (p = 0: none).
        descale: FP8's ``(scale factor, v_descale)`` per batch element and query head (B, Hq):
            ``q_descale * k_descale`` (k's alone in decode) and V's, or ``None`` (no FP8).
    """

    window: Window
    softcap: float
    slopes: torch.Tensor | None
    sinks: torch.Tensor | None
    order: Order = NATURAL
    dropout: Dropout | None = None
    descale: tuple[torch.Tensor, torch.Tensor] | None = None


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _kv_head(h: int, group: int) -> int:
    return h // group


def _bhnd(t: torch.Tensor) -> torch.Tensor:
    """Token-major (N, H, D) -> (1, H, N, D): one sequence as a batch of one (a view)."""
    return t.transpose(0, 1)[None]


# ---------------------------------------------------------------------------------- the tiles
def _key_range(
    q0: int, q1: int, keys: tuple[int, int], offset: int, causal: bool, window: Window, block_n: int
) -> tuple[int, int]:
    """The keys ``[start, stop)`` the forward visits for rows ``q0..q1-1``: from the key tile
    holding the first key any of them sees (the window's left edge) to one past the last key
    any of them sees (the causal diagonal, the window's right edge), within ``keys`` (the
    whole sequence, or one split of split-KV, starting on a tile boundary)."""
    left, right = window
    reach = 0 if causal else right  # how far right of its diagonal a row sees; -1: unbounded
    start = max(keys[0], q0 + offset - left) if left >= 0 else keys[0]
    stop = min(keys[1], q1 + offset + reach) if reach >= 0 else keys[1]
    return start // block_n * block_n, stop


def _query_range(
    k0: int, k1: int, nq: int, offset: int, causal: bool, window: Window, block_m: int
) -> tuple[int, int]:
    """The rows ``[start, stop)`` the backward visits for keys ``k0..k1-1``: from the query tile
    holding the first row that sees any of them to one past the last such row."""
    left, right = window
    reach = 0 if causal else right
    start = max(0, k0 - offset - reach) if reach >= 0 else 0
    stop = min(nq, k1 - offset + left) if left >= 0 else nq
    return start // block_m * block_m, stop


def _scores(
    qi: torch.Tensor,
    kj: torch.Tensor,
    scale: float,
    rows: torch.Tensor,
    cols: torch.Tensor,
    causal: bool,
    offset: int,
    nk: int,
    var: _Mods,
    h: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logits of one tile of query head ``h``: scaled, soft-capped, ALiBi-biased, then masked
    (-inf beyond the key tail, above the causal diagonal, outside the window). Also returns the
    softcap's derivative ``1 - tanh^2`` for the backward (``None`` without a softcap)."""
    s = scale * var.order.dot(qi, kj)
    if var.descale is not None:  # FP8: the logits of the values q8 * q_descale, k8 * k_descale
        s = s * var.descale[0][:, h, None, None]
    dcap = None
    if var.softcap:
        t = torch.tanh(s / var.softcap)
        s, dcap = var.softcap * t, 1 - t * t
    if var.slopes is not None:
        s = s - var.slopes[:, h, None, None] * (rows[:, None] + offset - cols[None, :]).abs()
    visible = cols[None, :] < nk
    if causal:
        visible = visible & (cols[None, :] <= rows[:, None] + offset)
    left, right = var.window
    if left >= 0:
        visible = visible & (cols[None, :] >= rows[:, None] + offset - left)
    if right >= 0:
        visible = visible & (cols[None, :] <= rows[:, None] + offset + right)
    return s.masked_fill(~visible, NEG_INF), dcap


def _dropout(var: _Mods, b: int, h: int, rows: torch.Tensor, cols: torch.Tensor,
             dtype: torch.dtype) -> torch.Tensor | None:
    """The dropout's ``Z = M / (1 - p)`` of one tile (b, rows, cols) of query head ``h``, in
    ``dtype``; ``None`` without dropout. The forward and the backward both call it."""
    if var.dropout is None:
        return None
    batch = torch.arange(b, device=rows.device)[:, None, None]
    return var.dropout.factor(batch, h, rows[None, :, None], cols[None, None, :], dtype)


def _forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    scale: float,
    block_m: int,
    block_n: int,
    var: _Mods,
    keys: tuple[int, int] | None = None,
    out_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(o, lse)`` of q (B, Hq, Nq, D) against k (B, Hkv, Nk, D), v (B, Hkv, Nk, Dv).

    ``keys`` limits the key tiles to ``[start, stop)`` (one split of split-KV; default: all);
    o is in ``out_dtype`` (default: the input dtype), lse in the accumulator dtype."""
    b, hq, nq, _ = q.shape
    group = hq // k.shape[1]
    nk, dv = k.shape[2], v.shape[3]
    acc_t = _acc_dtype(q.dtype)
    offset = causal_offset(nq, nk)
    keys = (0, nk) if keys is None else keys
    o = torch.empty((b, hq, nq, dv), dtype=out_dtype or output_dtype(q.dtype), device=q.device)
    lse = torch.empty((b, hq, nq), dtype=acc_t, device=q.device)
    for h in range(hq):
        kh, vh = k[:, _kv_head(h, group)], v[:, _kv_head(h, group)]
        for q0 in range(0, nq, block_m):
            q1 = min(q0 + block_m, nq)
            rows = torch.arange(q0, q1, device=q.device)
            qi = q[:, h, q0:q1].to(acc_t)
            m = torch.full((b, q1 - q0), NEG_INF, dtype=acc_t, device=q.device)
            l = torch.zeros((b, q1 - q0), dtype=acc_t, device=q.device)  # noqa: E741
            if var.sinks is not None:  # the sink: a key of logit z_h with no value
                m.fill_(var.sinks[h])
                l.fill_(1.0)
            acc = torch.zeros((b, q1 - q0, dv), dtype=acc_t, device=q.device)
            k_start, k_stop = _key_range(q0, q1, keys, offset, causal, var.window, block_n)
            for k0 in var.order.visit(range(k_start, k_stop, block_n)):
                cols = torch.arange(k0, k0 + block_n, device=q.device)
                kj = kh[:, k0 : k0 + block_n].to(acc_t)
                vj = vh[:, k0 : k0 + block_n].to(acc_t)
                s, _ = _scores(qi, kj, scale, rows, cols[: kj.shape[1]], causal, offset, nk, var, h)
                m_new = torch.maximum(m, s.amax(-1))
                m_safe = torch.where(m_new == NEG_INF, 0.0, m_new)
                p = torch.exp(s - m_safe[..., None])
                alpha = torch.exp(m - m_safe)
                l = alpha * l + p.sum(-1)  # noqa: E741
                z = _dropout(var, b, h, rows, cols[: kj.shape[1]], acc_t)
                p = p if z is None else p * z  # P * Z weights V; l stays the softmax's
                acc = alpha[..., None] * acc + p.to(q.dtype).to(acc_t) @ vj
                m = m_new
            empty = l == 0
            l_safe = torch.where(empty, 1.0, l)
            out = acc / l_safe[..., None]
            if var.descale is not None:  # FP8: V's descale, on the normalised output
                out = out * var.descale[1][:, h, None, None]
            o[:, h, q0:q1] = torch.where(empty[..., None], 0.0, out).to(o.dtype)
            lse[:, h, q0:q1] = torch.where(empty, NEG_INF, m + torch.log(l_safe))
    return o, lse


def _backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    do: torch.Tensor,
    causal: bool,
    scale: float,
    block_m: int,
    block_n: int,
    var: _Mods,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(dq, dk, dv, dsinks)`` (``dsinks`` is ``None`` without sinks)."""
    _, hq, nq, _ = q.shape
    group = hq // k.shape[1]
    nk = k.shape[2]
    acc_t = _acc_dtype(q.dtype)
    offset = causal_offset(nq, nk)
    delta = (do.to(acc_t) * o.to(acc_t)).sum(-1)
    lse_safe = torch.where(lse == NEG_INF, 0.0, lse)
    dq = torch.zeros(q.shape, dtype=acc_t, device=q.device)
    dk = torch.zeros(k.shape, dtype=acc_t, device=q.device)
    dv = torch.zeros(v.shape, dtype=acc_t, device=q.device)
    for h in range(hq):
        hk = _kv_head(h, group)
        for k0 in var.order.visit(range(0, nk, block_n)):
            k1 = min(k0 + block_n, nk)
            cols = torch.arange(k0, k1, device=q.device)
            kj, vj = k[:, hk, k0:k1].to(acc_t), v[:, hk, k0:k1].to(acc_t)
            q_start, q_stop = _query_range(k0, k1, nq, offset, causal, var.window, block_m)
            for q0 in var.order.visit(range(q_start, q_stop, block_m)):
                q1 = min(q0 + block_m, nq)
                rows = torch.arange(q0, q1, device=q.device)
                qi, doi = q[:, h, q0:q1].to(acc_t), do[:, h, q0:q1].to(acc_t)
                s, dcap = _scores(qi, kj, scale, rows, cols, causal, offset, nk, var, h)
                p = torch.exp(s - lse_safe[:, h, q0:q1, None])
                z = _dropout(var, q.shape[0], h, rows, cols, acc_t)
                pz = p if z is None else p * z
                dv[:, hk, k0:k1] += pz.to(q.dtype).to(acc_t).transpose(-1, -2) @ doi
                dp = var.order.dot(doi, vj)
                if z is not None:  # dP of the dropped probabilities, back to P's
                    dp = dp * z
                ds = p * (dp - delta[:, h, q0:q1, None])
                if dcap is not None:  # back through the softcap
                    ds = ds * dcap
                ds_lp = ds.to(q.dtype).to(acc_t)
                dk[:, hk, k0:k1] += scale * (ds_lp.transpose(-1, -2) @ qi)
                dq[:, h, q0:q1] += scale * (ds_lp @ kj)
    dsinks = None
    if var.sinks is not None:  # the sink's probability exp(z_h - lse) times -Delta
        z = var.sinks.to(acc_t)[None, :, None]
        dsinks = -(torch.exp(z - lse) * delta).sum((0, 2)).to(var.sinks.dtype)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dsinks


class _BlockedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sinks, causal, scale, block_m, block_n, window, softcap, slopes, order,
                dropout, descale):
        var = _Mods(window, softcap, slopes, sinks, order, dropout, descale)
        o, lse = _forward(q, k, v, causal, scale, block_m, block_n, var)
        ctx.save_for_backward(q, k, v, o, lse, slopes, sinks)
        ctx.args = (causal, scale, block_m, block_n, window, softcap, order, dropout)
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do, _dlse):
        q, k, v, o, lse, slopes, sinks = ctx.saved_tensors
        causal, scale, block_m, block_n, window, softcap, order, dropout = ctx.args
        var = _Mods(window, softcap, slopes, sinks, order, dropout)
        dq, dk, dv, dsinks = _backward(q, k, v, o, lse, do, causal, scale, block_m, block_n, var)
        return dq, dk, dv, dsinks, None, None, None, None, None, None, None, None, None, None


def _split_kv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    scale: float,
    block_m: int,
    block_n: int,
    var: _Mods,
    num_splits: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Flash-decoding of one sequence (a batch of one): the key tiles in ``num_splits``
    contiguous runs, a partial ``(o, lse)`` per run in the accumulator dtype, merged by lse."""
    nk = k.shape[2]
    tiles = -(-nk // block_n)
    per_split = -(-tiles // num_splits) * block_n  # keys per run: ceil(tiles / num_splits) tiles
    o = lse = None
    for i in range(num_splits):
        run = var if i == 0 else replace(var, sinks=None)  # the sink is counted once
        keys = (i * per_split, min(nk, (i + 1) * per_split))
        o_i, lse_i = _forward(q, k, v, causal, scale, block_m, block_n, run, keys, _acc_dtype(q.dtype))
        o, lse = (o_i, lse_i) if o is None else merge_partials(o, lse, o_i, lse_i)
    return o.to(q.dtype), lse


# ------------------------------------------------------------------------------ input checks
def _settings(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float | None,
    block_m: int | None,
    block_n: int | None,
    cache: bool = False,
) -> tuple[float, int, int]:
    """Checks every entry point makes (dtypes, devices, tile sizes); the scale and tiles to use.
    ``cache``: the decode entry point, whose FP8 cache goes with 16-bit q."""
    fp8_cache = cache and is_fp8(k) and not is_fp8(q)
    if not (q.dtype == k.dtype == v.dtype) and not (fp8_cache and k.dtype == v.dtype):
        raise TypeError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    caps = attention.capabilities
    formats = {FORMATS[name] for name in caps.fp8.formats}
    for name, t in (("q", q), ("the cache" if cache else "k, v", k)):
        if t.dtype not in caps.dtypes and t.dtype not in formats:
            raise TypeError(f"dtype {t.dtype} of {name} is not supported")
    if not (q.device == k.device == v.device):
        raise ValueError("q, k, v are on different devices")
    block_m = 64 if block_m is None else block_m
    block_n = 64 if block_n is None else block_n
    if block_m < 1 or block_n < 1:
        raise ValueError(f"tile sizes must be positive, got block_m={block_m}, block_n={block_n}")
    scale = default_scale(q.shape[-1], scale)
    return scale, block_m, block_n


def _variants(
    q: torch.Tensor, batch: int, hq: int, kw: Keywords
) -> tuple[Window, float, torch.Tensor | None, Dropout | None]:
    """Check the call's variant keywords (:func:`contract.validate.check_variants`); returns the
    window (``(-1, -1)``: none), the softcap, the ALiBi slopes as (batch, Hq) in the accumulator
    dtype (``None``: no ALiBi) and the dropout (``None`` at p = 0)."""
    var = check_variants(batch, hq, q.device, **kw.variants)
    slopes = None if var.alibi_slopes is None else var.alibi_slopes.expand(batch, hq).to(_acc_dtype(q.dtype))
    return var.window or (-1, -1), var.softcap, slopes, dropout_of(var.dropout_p, var.dropout_seed)


def _fp8(descales: Descales | None, hq: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Checked FP8 descales (B, Hkv) as the tile loops read them (:attr:`_Mods.descale`): the
    logits' factor ``q_descale * k_descale`` (k's alone for an FP8 cache) and ``v_descale``, per
    batch element and query head (B, Hq); ``None`` without FP8."""
    return None if descales is None else descales.per_query_head(hq)


def _fp8_inputs(descales: Descales | None, hq: int, what: str, tensors: tuple,
                dropout: Dropout | None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """:func:`_fp8` of the dense and varlen entry points: FP8 q, k, v are forward only and take
    no dropout (``what``: the call, ``tensors``: those gradients would be taken for)."""
    fp8 = _fp8(descales, hq)
    if fp8 is not None:
        _forward_only(f"{what} on FP8 inputs", tensors)
        if dropout is not None:
            raise NotImplementedError("dropout of FP8 inputs is not in the contract")
    return fp8


def _forward_only(what: str, tensors: tuple) -> None:
    """``NotImplementedError`` when autograd would need gradients of ``tensors`` (``what``)."""
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors):
        raise NotImplementedError(f"{what} is forward only: call it on inputs that do not require grad")


def _sequences(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
) -> list[tuple[slice, slice]]:
    """Check the packed tensors and the sequence boundaries (:func:`contract.validate.check_varlen`);
    returns each sequence's token ranges ``(q, k)``."""
    check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    return [(slice(cq[s], cq[s + 1]), slice(ck[s], ck[s + 1])) for s in range(len(cq) - 1)]


def _cache_lengths(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    block_table: torch.Tensor | None,
    num_splits: int,
) -> list[int]:
    """Check the decode inputs (:func:`contract.validate.check_decode`; any number of splits
    works, however many are declared); returns ``cache_seqlens`` as a list."""
    check_decode(q, k_cache, v_cache, cache_seqlens, block_table, num_splits, max_splits=None)
    if q.shape[1] < 1:
        raise ValueError("kvcache needs at least one query per sequence (Nq >= 1)")
    return cache_seqlens.tolist()


# ------------------------------------------------------------------------------ entry points
#: What the entry points return: ``(o, lse)``.
Pair = tuple[torch.Tensor, torch.Tensor]


# Each takes every keyword of the contract (``contract/entry_points.py``); the body's ``order``
# (the tile loops' summation order, :class:`Order`) is ``ref-reordered``'s, which calls the body
# (``__wrapped__``) with its own.
@entry_point("dense", KEYWORDS["dense"])
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kw: Keywords,
              order: Order = NATURAL) -> Pair:
    """Blocked FlashAttention-2 ``(o, lse)`` with bottom-right causal alignment; any tile sizes.

    q (B, Hq, Nq, D), k (B, Hkv, Nk, D), v (B, Hkv, Nk, Dv); o (B, Hq, Nq, Dv), lse (B, Hq, Nq).
    Differentiable in q, k, v and ``sinks``. FP8 q, k, v with their descales: forward only, o in
    bfloat16."""
    check_dense(q, k, v)
    scale, block_m, block_n = _settings(q, k, v, kw.scale, kw.block_m, kw.block_n)
    b, hq = q.shape[:2]
    window, softcap, slopes, dropout = _variants(q, b, hq, kw)
    descales = check_fp8(q, k, v, kw.q_descale, kw.k_descale, kw.v_descale,
                         shapes=attention.capabilities.fp8.descales)
    causal, sinks = kw.causal, kw.sinks
    fp8 = _fp8_inputs(descales, hq, "attention", (q, k, v, sinks), dropout)
    return _BlockedAttention.apply(q, k, v, sinks, causal, scale, block_m, block_n, window, softcap, slopes,
                                   order, dropout, fp8)


@entry_point("varlen", KEYWORDS["varlen"])
def varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, kw: Keywords,
           order: Order = NATURAL) -> Pair:
    """Packed sequences (``flash_attn_varlen_func``): q (Tq, Hq, D), k (Tk, Hkv, D),
    v (Tk, Hkv, Dv) -> o (Tq, Hq, Dv), lse (Hq, Tq). Differentiable in q, k, v and ``sinks``.
    Sequence s drops as batch element s of a dense call, and reads row s of (B, Hkv) FP8
    descales."""
    seqs = _sequences(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    scale, block_m, block_n = _settings(q, k, v, kw.scale, kw.block_m, kw.block_n)
    b, hq = len(seqs), q.shape[1]
    window, softcap, slopes, dropout = _variants(q, b, hq, kw)
    descales = check_fp8(q, k, v, kw.q_descale, kw.k_descale, kw.v_descale, batch=b,
                         shapes=attention.capabilities.fp8.descales)
    causal, sinks = kw.causal, kw.sinks
    fp8 = _fp8_inputs(descales, hq, "varlen", (q, k, v, sinks), dropout)
    outs, lses = [], []
    for s, (sq, sk) in enumerate(seqs):
        slopes_s = None if slopes is None else slopes[s : s + 1]  # (B, Hq) slopes: row s
        dropout_s = None if dropout is None else replace(dropout, batch=s)  # the hash's batch index: s
        fp8_s = None if fp8 is None else (fp8[0][s : s + 1], fp8[1][s : s + 1])
        args = (causal, scale, block_m, block_n, window, softcap, slopes_s, order, dropout_s, fp8_s)
        o, lse = _BlockedAttention.apply(_bhnd(q[sq]), _bhnd(k[sk]), _bhnd(v[sk]), sinks, *args)
        outs.append(o[0].transpose(0, 1))
        lses.append(lse[0])
    return torch.cat(outs), torch.cat(lses, dim=1)


@entry_point("kvcache", KEYWORDS["kvcache"])
def kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, kw: Keywords,
            order: Order = NATURAL) -> Pair:
    """KV-cache decode (``flash_attn_with_kvcache``), forward only: q (B, Nq, Hq, D), cache
    (B, Ncache, Hkv, D) or paged (num_pages, page_size, Hkv, D) with ``block_table``
    (B, max_pages) -> o (B, Nq, Hq, Dv), lse (B, Hq, Nq). ``num_splits``: split-KV runs
    (0: the kernel chooses, and it chooses 1). An FP8 cache takes ``k_scale``, ``v_scale`` of
    shape () or (Hkv,) (float16 or bfloat16 q)."""
    causal, sinks, block_table, num_splits = kw.causal, kw.sinks, kw.block_table, kw.num_splits
    k_scale, v_scale = kw.k_scale, kw.v_scale
    _forward_only("kvcache", (q, k_cache, v_cache, kw.alibi_slopes, sinks))
    lengths = _cache_lengths(q, k_cache, v_cache, kw.cache_seqlens, block_table, num_splits)
    scale, block_m, block_n = _settings(q, k_cache, v_cache, kw.scale, kw.block_m, kw.block_n, cache=True)
    b, nq, hq, _ = q.shape
    window, softcap, slopes, _ = _variants(q, b, hq, kw)
    fp8 = _fp8(check_cache_scales(q, k_cache, v_cache, k_scale, v_scale,
                                  shapes=attention.capabilities.fp8.cache_scales), hq)
    o = torch.empty((b, nq, hq, v_cache.shape[3]), dtype=q.dtype, device=q.device)
    lse = torch.empty((b, hq, nq), dtype=_acc_dtype(q.dtype), device=q.device)
    for i, length in enumerate(lengths):
        pos = torch.arange(length, device=k_cache.device)  # the positions read: j < L_b, no others
        if block_table is None:
            k_seq, v_seq = k_cache[i, pos], v_cache[i, pos]
        else:
            page, slot = block_table[i, pos // k_cache.shape[1]].long(), pos % k_cache.shape[1]
            k_seq, v_seq = k_cache[page, slot], v_cache[page, slot]
        fp8_i = None if fp8 is None else (fp8[0][i : i + 1], fp8[1][i : i + 1])
        slopes_i = None if slopes is None else slopes[i : i + 1]
        var = _Mods(window, softcap, slopes_i, sinks, order, None, fp8_i)
        o_i, lse_i = _split_kv(
            _bhnd(q[i]), _bhnd(k_seq), _bhnd(v_seq), causal, scale, block_m, block_n, var, num_splits or 1
        )
        o[i], lse[i] = o_i[0].transpose(0, 1), lse_i[0]
    return o, lse


def dropout_mask(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, dropout_p: float, dropout_seed: int | None = None,
    **call_keywords: object,
) -> torch.Tensor:
    """The keep mask (B, Hq, Nq, Nk), bool, that :func:`attention` applies to the call with these
    arguments (FlashAttention's ``return_attn_probs`` gives its mask likewise): the seed's
    (:func:`refimpl.dropout.dropout_mask`). The call's other keywords (``call_keywords``: causal,
    scale, tiles, variants) do not change it; entries of keys a query does not see are kept or
    dropped as if it saw them."""
    hq, _ = check_dense(q, k, v)
    p, seed = check_dropout(dropout_p, dropout_seed)
    return _keep_mask(q.shape[0], hq, q.shape[2], k.shape[2], dropout_p=p, dropout_seed=seed, device=q.device)


attention.varlen = varlen
attention.kvcache = kvcache
attention.dropout_mask = dropout_mask
attention.capabilities = Capabilities(
    block_m=TILES,
    block_n=TILES,
    window=True,
    softcap=True,
    alibi=ALIBI_SHAPES,
    sinks=True,
    varlen=True,
    kvcache=KVCache(page_sizes=PAGE_SIZES, max_splits=MAX_SPLITS, max_queries=MAX_DECODE_QUERIES),
    dropout=True,
    fp8=FP8(formats=frozenset(FORMATS), descales=frozenset(DESCALE_SHAPES),
            cache_scales=frozenset(CACHE_SCALE_SHAPES)),
)
