"""Float64 golden attention: the exact semantics every kernel is judged by.

    S = scale * Q K^T,  masked S_ij = -inf where key j is not visible to query i
    lse_i = log sum_j exp(S_ij),  O_i = sum_j exp(S_ij - lse_i) V_j

with GQA (query head h reads kv head h // (Hq // Hkv)), empty rows giving ``O = 0`` and
``lse = -inf``. The forward streams over key chunks with the online-softmax merge, and the
backward streams over key chunks with the saved lse, so memory is O(N * chunk), never O(N^2):

    P = exp(S - lse),  dV = P^T dO,  dP = dO V^T,  Delta_i = sum_d dO_id O_id,
    dS = P * (dP - Delta),  dQ = scale * dS K,  dK = scale * dS^T Q

dK and dV of a kv head are summed over the query heads of its group.

Variants (``docs/variants.md``) enter as FlexAttention-style mods (:mod:`contract.masks`): a
score mod (softcap, ALiBi) rewrites each chunk's scaled logits ``s = f(scale * q k^T)`` before
the mask mod (causal, sliding window) masks them; the backward chains ``dS`` through ``f``
(``dS_raw = dS * f'``, by float64 autograd on the chunk). A sink logit ``z_h`` starts every row's
online-softmax state at ``(m, l, acc) = (z_h, 1, 0)``: a key with no value. Then
``lse = logaddexp(lse_keys, z_h)``, a row with no visible key has ``o = 0``, ``lse = z_h``, and

    dz_h = -sum_{b,i} exp(z_h - lse_bhi) * Delta_bhi.

Dropout (``dropout_p``, ``dropout_seed`` or an explicit keep mask ``dropout_mask``;
:mod:`refimpl.dropout`) weights the values with ``P * Z``, ``Z = M / (1 - p)``, while lse stays
the undropped softmax's; the backward then has ``dV = (P * Z)^T dO`` and
``dS = P * (Z * dP - Delta)`` (``Delta = rowsum(dO * O)`` of the dropped O, which equals
``rowsum(P * Z * dP)``).

FP8 inputs (``contract/fp8.py``: ``q_descale``, ``k_descale``, ``v_descale``, any of them FP8) are
the values they stand for, ``x8 * descale`` per head group, in float64: exactly. What a kernel
may round below that (its probabilities, to the values' FP8 format) is bounded by
:func:`attention_rounding_bound`.

With ``bounds=True`` the backward also returns the same sums taken over absolute values
(``|dO|``, ``|V|``, ``|Q|``, ``|K|``, ``|P (dP - Delta)| <= P (|dO||V|^T + |dO|.|O|)``): the
magnitude that rounding errors scale with, even where the gradient itself cancels to ~0.
"""

from __future__ import annotations

import math

import torch

from ..contract.entry_points import Keywords, entry_point, keywords_of
from ..contract.fp8 import dequantise, is_fp8, unit_roundoff
from ..contract.masks import mask_mod, score_mod
from ..contract.validate import check_dense
from .dropout import dropout_weights
from .online_softmax import NEG_INF, SoftmaxState

DEFAULT_CHUNK = 1024
#: The contract's keywords the references take (``contract/entry_points.py``): the score and
#: mask modifiers, dropout, FP8's descales.
MODIFIER_KEYWORDS = ("causal", "scale", *keywords_of("window", "softcap", "alibi", "sinks"))
DROPOUT_KEYWORDS = keywords_of("dropout")
DESCALE_KEYWORDS = keywords_of("fp8")
#: The references' own keywords: the causal alignment (the kernel's declaration), the key chunk
#: the golden streams over, and a kernel's own dropout mask (``Capabilities.dropout_mask``) in
#: place of the seeded one.
REFERENCE_EXTRA = {"alignment": "bottom-right", "chunk": DEFAULT_CHUNK, "dropout_mask": None}


def expand_kv(t: torch.Tensor, group: int) -> torch.Tensor:
    return t if group == 1 else t.repeat_interleave(group, dim=1)


def default_scale(d: int, scale: float | None) -> float:
    """The softmax scale: ``1/sqrt(D)`` unless given."""
    return 1.0 / math.sqrt(d) if scale is None else float(scale)


def dequantised(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_descale: torch.Tensor | None,
                k_descale: torch.Tensor | None, v_descale: torch.Tensor | None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Dense ``q, k, v`` as float64 values when any is FP8 or has a descale (``x8 * descale`` per
    head group, :func:`contract.fp8.dequantise`); as they are otherwise."""
    descales = (q_descale, k_descale, v_descale)
    if not any(is_fp8(t) for t in (q, k, v)) and all(d is None for d in descales):
        return q, k, v
    hkv = k.shape[1]
    q, k, v = (dequantise(t, d, hkv) for t, d in zip((q, k, v), descales, strict=True))
    return q, k, v


def _variant_mods(nq: int, nk: int, alignment: str, kw: Keywords) -> tuple:
    """The call's mask mod and score mod (:mod:`contract.masks`)."""
    return (
        mask_mod(nq, nk, causal=kw.causal, alignment=alignment, window=kw.window_size),
        score_mod(nq, nk, alignment=alignment, softcap=kw.softcap, alibi_slopes=kw.alibi_slopes),
    )


def _initial_state(q: torch.Tensor, dv: int, sinks: torch.Tensor | None) -> SoftmaxState:
    """The state before any key: the identity, or the sink logit as a key with no value."""
    state = SoftmaxState.identity(q.shape[:3], dv, dtype=torch.float64, device=q.device)
    if sinks is None:
        return state
    z = sinks.to(device=q.device, dtype=torch.float64)[None, :, None].expand(q.shape[:3])
    return SoftmaxState(m=z.clone(), l=torch.ones_like(state.l), acc=state.acc)


@torch.no_grad()
@entry_point("dense", (*MODIFIER_KEYWORDS, *DROPOUT_KEYWORDS, *DESCALE_KEYWORDS), extra=REFERENCE_EXTRA)
def attention_golden(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kw: Keywords, *,
                     alignment: str, chunk: int, dropout_mask: torch.Tensor | None,
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 ``(o, lse)``: o (B, Hq, Nq, Dv), lse (B, Hq, Nq). Streams over key chunks. FP8
    inputs are dequantised with their descales (:func:`dequantised`)."""
    q, k, v = dequantised(q, k, v, kw.q_descale, kw.k_descale, kw.v_descale)
    _, group = check_dense(q, k, v)
    scale = default_scale(q.shape[-1], kw.scale)
    mods = _variant_mods(q.shape[2], k.shape[2], alignment, kw)
    weights = dropout_weights(kw.dropout_p, kw.dropout_seed, dropout_mask)
    state = _initial_state(q, v.shape[-1], kw.sinks)
    for _, vc, s, _, z in _key_chunks(q.to(torch.float64), k, v, group, scale, mods, chunk, weights=weights):
        state = state.merge(SoftmaxState.from_scores(s, vc, z))
    return state.finalize()


@torch.no_grad()
@entry_point("dense", (*MODIFIER_KEYWORDS, *DESCALE_KEYWORDS),
             extra={"alignment": "bottom-right", "chunk": DEFAULT_CHUNK, "p_dtype": None})
def attention_rounding_bound(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kw: Keywords, *,
                             alignment: str, chunk: int, p_dtype: torch.dtype | None,
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    """The most rounding the probabilities to ``p_dtype`` may move o (``docs/variants.md``), in
    o's place (B, Hq, Nq, Dv), float64, with the golden's lse after it (the layouts lift it as
    the golden). ``p_dtype`` defaults to V's format when q and v are FP8, else to none (a zero
    bound); the precision property passes q's 16-bit dtype, the P V operand FlashAttention uses.

    The contract lets a kernel with FP8 q, k, v round each probability it multiplies V by,
    ``x_ij = exp(s_ij - m)`` with m its running max (so ``x <= 1``), possibly times a power of
    two that keeps it finite, to nearest in V's format, while ``l`` sums the unrounded ones
    (FlashAttention-3's P). Rounding to nearest errs by at most ``u * max(x, t)`` (u the format's
    unit roundoff, t its smallest normal: half the subnormal spacing is ``u * t``), and scaled
    back by ``exp(m - m_i) / l_i`` (m_i the row's largest logit, the sink's included, l_i the
    row's sum) that is at most ``u * max(e_ij, t) / l_i`` with ``e_ij = exp(s_ij - m_i)``. A key
    of the row's largest logit is rounded exactly in every such kernel (the running max of its
    tile is its own logit: x = 1, times a power of two), so

        |o_kernel - o|_bhid  <=  u / l_i * sum_j max(e_ij, t) |v_jd|      (keys j that i sees, s_ij < m_i)

    The same holds for 16-bit inputs whose P is rounded to fp16/bf16 (t: fp16's or bf16's
    smallest normal). Zero when no ``p_dtype`` applies (decode reads its FP8 cache in q's 16-bit
    dtype: no FP8 rounding of P). Streams over key chunks, twice (m_i and l_i first)."""
    fmt = p_dtype if p_dtype is not None else v.dtype if is_fp8(q) and is_fp8(v) else None
    q, k, v = dequantised(q, k, v, kw.q_descale, kw.k_descale, kw.v_descale)
    _, group = check_dense(q, k, v)
    q64 = q.to(torch.float64)
    scale = default_scale(q.shape[-1], kw.scale)
    mods = _variant_mods(q.shape[2], k.shape[2], alignment, kw)
    start = _initial_state(q64, v.shape[-1], kw.sinks)
    m = start.m
    for _, _, s, _, _ in _key_chunks(q64, k, v, group, scale, mods, chunk):
        m = torch.maximum(m, s.amax(-1)) if s.shape[-1] else m
    m_safe = torch.where(m == NEG_INF, 0.0, m)
    l = start.l * torch.exp(torch.where(start.m == NEG_INF, NEG_INF, start.m - m_safe))  # noqa: E741
    bound = torch.zeros((*q.shape[:3], v.shape[-1]), dtype=torch.float64, device=q.device)
    tiny = 0.0 if fmt is None else torch.finfo(fmt).smallest_normal
    for _, abs_v, s, _, _ in _key_chunks(q64, k, v.abs(), group, scale, mods, chunk):
        e = torch.exp(s - m_safe[..., None])
        l = l + e.sum(-1)  # noqa: E741
        if fmt is not None:
            rounded = (s != NEG_INF) & (s < m[..., None])
            bound += torch.where(rounded, torch.clamp(e, min=tiny), 0.0) @ abs_v
    l_safe = torch.where(l == 0, 1.0, l)
    if fmt is not None:
        bound = unit_roundoff(fmt) * bound / l_safe[..., None]
    return bound, torch.where(l == 0, NEG_INF, m_safe + torch.log(l_safe))


def _key_chunks(q64, k, v, group, scale, mods, chunk, grad=False, weights=None):
    """Per key chunk: float64 keys and values (expanded to the query heads), the modified and
    masked logits (-inf where the key is not visible), with ``grad`` the map ``dS -> dS_raw``
    through the score mod (identity without one) and the dropout's ``Z`` of ``weights``
    (``None`` without). Memory O(Nq * chunk)."""
    mask_fn, score_fn = mods
    k64, v64 = expand_kv(k.to(torch.float64), group), expand_kv(v.to(torch.float64), group)
    nk = k.shape[2]
    dev = q64.device
    b_idx = torch.arange(q64.shape[0], device=dev)[:, None, None, None]
    h_idx = torch.arange(q64.shape[1], device=dev)[None, :, None, None]
    q_idx = torch.arange(q64.shape[2], device=dev)[None, None, :, None]
    for start in range(0, nk, chunk):
        stop = min(start + chunk, nk)
        kc, vc = k64[:, :, start:stop], v64[:, :, start:stop]
        kv_idx = torch.arange(start, stop, device=dev)[None, None, None, :]
        s = scale * (q64 @ kc.transpose(-1, -2))
        chain = None
        if score_fn is not None:
            with torch.enable_grad():
                raw = s.detach().requires_grad_(grad)
                s = score_fn(raw, b_idx, h_idx, q_idx, kv_idx)
            if grad:
                chain = _chain(s, raw)
            s = s.detach()
        if mask_fn is not None:
            s = s.masked_fill(~mask_fn(b_idx, h_idx, q_idx, kv_idx), NEG_INF)
        z = None if weights is None else weights(b_idx, h_idx, q_idx, kv_idx)
        yield kc, vc, s, chain, z


def _chain(s: torch.Tensor, raw: torch.Tensor):
    """``dS -> dS_raw``: the vector-Jacobian product of the score mod, by autograd."""

    def vjp(ds: torch.Tensor) -> torch.Tensor:
        return torch.autograd.grad(s, raw, ds, retain_graph=True)[0]

    return vjp


@torch.no_grad()
@entry_point("dense", (*MODIFIER_KEYWORDS, *DROPOUT_KEYWORDS), positional=("q", "k", "v", "do"),
             extra={**REFERENCE_EXTRA, "bounds": False, "forward": None})
def attention_golden_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor,
                              kw: Keywords, *, alignment: str, chunk: int,
                              dropout_mask: torch.Tensor | None, bounds: bool,
                              forward: tuple[torch.Tensor, torch.Tensor] | None,
                              ) -> tuple[torch.Tensor, ...]:
    """Float64 gradients ``(dq, dk, dv)``, and ``dsinks`` (Hq,) after them when ``sinks`` is
    given, for upstream gradient ``do`` of the output ``o``; with ``bounds`` followed by the same
    number of bounds computed from absolute values. ``forward``: the golden ``(o, lse)`` of the
    same call (:func:`attention_golden` with these arguments), when the caller has it, so that
    it is not computed again; computed here otherwise."""
    hq, group = check_dense(q, k, v)
    scale = default_scale(q.shape[-1], kw.scale)
    if forward is None:
        forward = attention_golden(q, k, v, **{n: getattr(kw, n) for n in attention_golden_backward.keywords},
                                   alignment=alignment, chunk=chunk, dropout_mask=dropout_mask)
    o, lse = forward
    mods = _variant_mods(q.shape[2], k.shape[2], alignment, kw)
    weights = dropout_weights(kw.dropout_p, kw.dropout_seed, dropout_mask)
    q64, do64 = q.to(torch.float64), do.to(torch.float64)
    nk = k.shape[2]
    delta = (do64 * o).sum(-1, keepdim=True)
    lse_safe = torch.where(lse == NEG_INF, 0.0, lse)[..., None]
    dq = torch.zeros_like(q64)
    dk_parts, dv_parts = [], []
    abs_do, abs_q = do64.abs(), q64.abs()
    abs_delta = (abs_do * o.abs()).sum(-1, keepdim=True)
    dq_abs = torch.zeros_like(q64)
    dk_abs_parts, dv_abs_parts = [], []
    for kc, vc, s, chain, z in _key_chunks(q64, k, v, group, scale, mods, chunk, grad=True, weights=weights):
        p = torch.exp(s - lse_safe)
        pz = p if z is None else p * z  # the dropped probabilities that weight V
        dv_parts.append(pz.transpose(-1, -2) @ do64)
        dp = do64 @ vc.transpose(-1, -2)
        ds = p * ((dp if z is None else z * dp) - delta)
        if chain is not None:
            ds = chain(ds)
        dq += scale * (ds @ kc)
        dk_parts.append(scale * (ds.transpose(-1, -2) @ q64))
        if bounds:
            dv_abs_parts.append(pz.transpose(-1, -2) @ abs_do)
            dp_abs = abs_do @ vc.abs().transpose(-1, -2)
            ds_abs = p * ((dp_abs if z is None else z * dp_abs) + abs_delta)
            if chain is not None:
                ds_abs = chain(ds_abs).abs()
            dq_abs += scale * (ds_abs @ kc.abs())
            dk_abs_parts.append(scale * (ds_abs.transpose(-1, -2) @ abs_q))
    grads = [dq, _cat(dk_parts, k, q64), _cat(dv_parts, v, q64)]
    if bounds:
        grads += [dq_abs, _cat(dk_abs_parts, k, q64), _cat(dv_abs_parts, v, q64)]
    if group > 1:  # sum dK, dV (and their bounds) over the query heads of each group
        for i in (1, 2, 4, 5) if bounds else (1, 2):
            grads[i] = grads[i].view(q.shape[0], hq // group, group, nk, grads[i].shape[-1]).sum(2)
    if kw.sinks is not None:
        p_sink = torch.exp(kw.sinks.to(device=q.device, dtype=torch.float64)[None, :, None] - lse)
        grads.insert(3, -(p_sink * delta[..., 0]).sum((0, 2)))
        if bounds:
            grads.append((p_sink * abs_delta[..., 0]).sum((0, 2)))
    return tuple(grads)


def _cat(parts: list[torch.Tensor], like: torch.Tensor, q64: torch.Tensor) -> torch.Tensor:
    """The key-chunk parts of a dK/dV-shaped gradient (zero-size when Nk = 0)."""
    if parts:
        return torch.cat(parts, dim=2)
    b, _, nk, d = like.shape
    return q64.new_zeros((b, q64.shape[1], nk, d))
