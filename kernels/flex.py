"""Adapter for FlexAttention (``torch.nn.attention.flex_attention``), compiled, on CUDA.

Causal masking is a ``mask_mod`` with the contract's bottom-right alignment
(``kv_idx <= q_idx + Nk - Nq``), so Flex is judged by the same convention as the fused kernels.
It returns the lse (``return_lse=True``; natural log).

Variants (``docs/variants.md``), each through Flex's own hooks, bottom-right aligned
(``c = Nk - Nq``; for varlen, each sequence's own ``c``):

    window_size    mask_mod ``q_idx + c - left <= kv_idx <= q_idx + c + right`` (a side of -1 is
                   open; ``causal`` caps the right side at 0)
    softcap        score_mod ``s -> softcap * tanh(s / softcap)``
    alibi_slopes   score_mod after the softcap ``s -> s - slope * |q_idx + c - kv_idx|``, the
                   slope indexed ``[h]`` for (Hq,) slopes, ``[b, h]`` for (B, Hq)
    varlen         ``fn.varlen`` (``flash_attn_varlen_func``'s signature): the packed tokens as one
                   batch element under a document mask built from ``cu_seqlens`` (each token's
                   sequence, the sequences' starts and offsets ``Nk_s - Nq_s``), so a query sees
                   only keys of its own sequence, with causal, window and ALiBi at that sequence's
                   bottom-right diagonal; returns o (Tq, Hq, Dv) and lse (Hq, Tq)

Flex differentiates through its mods, so the backward of all four is declared. Undeclared:
sinks (``flex_attention`` has no extra term in the softmax denominator: a score_mod rewrites
scores of real keys only) and KV-cache decode (no ``fn.kvcache``: ``flex_attention`` takes dense
tensors and no cache lengths or block table).

Compiled-code reuse: the mods close over tensors (window edges, offsets, the softcap, ALiBi
slopes, document ids), which the compiled kernel takes as inputs, so a new window, offset or
softcap is new data, not a recompilation (Python numbers in a closure are specialised on: a
recompilation per value). Block masks are built with ``create_block_mask`` once per (mask,
shapes) and cached; eagerly for small ones, compiled from ``COMPILED_MASK_PAIRS`` (Nq * Nk) on.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from flashprop.contract.capabilities import ALIBI_SHAPES, Capabilities, Limit
from flashprop.contract.entry_points import Keywords, entry_point
from flashprop.contract.validate import (
    INT32_ELEMENTS,
    check_dense,
    check_elements,
    check_variants,
    check_varlen,
)

try:
    from torch.nn.attention.flex_attention import BlockMask, and_masks, create_block_mask, flex_attention
except ImportError:  # pragma: no cover - very old torch
    flex_attention = None

#: ``(q_idx, kv_idx) -> (diag, key)``: the key on query ``q_idx``'s (bottom-right) diagonal and the
#: key's position, both within the query's sequence.
Coords = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
ScoreMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
#: The keywords both entry points take (``contract/entry_points.py``).
_KEYWORDS = ("causal", "scale", "window_size", "softcap", "alibi_slopes")
Pair = tuple[torch.Tensor, torch.Tensor]
#: An open window side: farther than any sequence (and far from int32 overflow).
_OPEN = 2**30


def unavailable_reason() -> str | None:
    if flex_attention is None:
        return "torch.nn.attention.flex_attention is not in this torch"
    if not torch.cuda.is_available():
        return "needs a CUDA device for compiled FlexAttention (torch sees none)"
    return None


#: Recompilations allowed per process. The suite draws many shapes, dtypes and head dims; past
#: Dynamo's default limit (8) it would silently run flex_attention *eagerly* (an unfused dense
#: path), so the limit is raised and hitting it raises instead of falling back.
RECOMPILE_LIMIT = 256


#: From this many (query, key) pairs on, a block mask is built by a compiled ``create_block_mask``.
#: The eager one evaluates the mask_mod on the whole Nq x Nk grid at once, in int64 indices:
#: 8 * Nq * Nk bytes and more (2^28 pairs: about 3 GB of host memory measured on the CPU; at
#: Nq = Nk = 128k it asked for 128 GiB and ran out of the H200's memory in the long-golden
#: property). Compiled, it works block by block; compiling costs seconds, so small masks (the
#: suite draws thousands) stay eager.
COMPILED_MASK_PAIRS = 2**28


@functools.cache
def _dynamo_limits() -> None:
    import torch._dynamo

    torch._dynamo.config.recompile_limit = RECOMPILE_LIMIT
    torch._dynamo.config.accumulated_recompile_limit = max(
        torch._dynamo.config.accumulated_recompile_limit, RECOMPILE_LIMIT
    )
    torch._dynamo.config.fail_on_recompile_limit_hit = True


@functools.cache
def _compiled():
    _dynamo_limits()
    # dynamic=None: automatic dynamic shapes, so a new sequence length does not recompile each time
    return torch.compile(flex_attention, dynamic=None)


@functools.cache
def _compiled_block_mask():
    _dynamo_limits()
    return torch.compile(create_block_mask, dynamic=None)


def _block_mask(mask: MaskMod, nq: int, nk: int, device: str) -> BlockMask:
    """``create_block_mask`` over all batch elements and heads, compiled for large grids."""
    build = _compiled_block_mask() if nq * nk >= COMPILED_MASK_PAIRS else create_block_mask
    return build(mask, None, None, nq, nk, device=device)


def _int(value: int, device: str) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.int32, device=device)


def _band(coords: Coords, causal: bool, window: tuple[int, int] | None, device: str) -> MaskMod | None:
    """Causal and window visibility ``diag - left <= key <= diag + right``; ``None``: all visible."""
    left, right = (-1, -1) if window is None else window
    if causal:
        right = 0
    if left < 0 and right < 0:
        return None
    lo, hi = _int(left if left >= 0 else _OPEN, device), _int(right if right >= 0 else _OPEN, device)

    def band(b, h, q_idx, kv_idx):
        diag, key = coords(q_idx, kv_idx)
        return (key >= diag - lo) & (key <= diag + hi)

    return band


def _score_mod(
    coords: Coords, softcap: float, slope: Callable[..., torch.Tensor] | None, device: str
) -> ScoreMod | None:
    """Softcap, then ALiBi ``- slope(b, h, q_idx) * |diag - key|``; ``None``: the identity."""
    if not softcap and slope is None:
        return None
    cap = torch.tensor(softcap, dtype=torch.float32, device=device) if softcap else None

    def modified(score, b, h, q_idx, kv_idx):
        if cap is not None:
            score = cap * torch.tanh(score / cap)
        if slope is not None:
            diag, key = coords(q_idx, kv_idx)
            score = score - slope(b, h, q_idx).to(score.dtype) * (diag - key).abs().to(score.dtype)
        return score

    return modified


#: What compiled FlexAttention did past 2^31 elements on the H200 (torch 2.11; the huge-rows
#: property, 2026-11-30, docs/scale.md): the adapter declares ``max_elements`` and refuses more.
PAST_INT32 = "compiled FlexAttention hit an illegal memory access at N=2^27+1, D=16 (q of 2^31 + 16 elements)"


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if q.device.type != "cuda":
        raise NotImplementedError("the flex adapter runs compiled FlexAttention on CUDA only")
    caps = attention.capabilities
    if q.dtype not in caps.dtypes:
        raise TypeError(f"flex adapter does not take {q.dtype}")
    # Inductor's own refusal of other head dims is an InductorError (LoweringException
    # "NYI: embedding dimension ... must be at least 16"), not a clear error: check first.
    if q.shape[-1] not in caps.head_dims or v.shape[-1] not in caps.head_dims:
        raise NotImplementedError(
            f"flex adapter: head dims D={q.shape[-1]}, Dv={v.shape[-1]} not in {sorted(caps.head_dims)}"
        )
    check_elements("flex adapter", INT32_ELEMENTS, PAST_INT32, q, k, v)


def _flex(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    score_mod: ScoreMod | None,
    block_mask: BlockMask | None,
    scale: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(o, lse)`` of flex_attention on (B, H, N, D) tensors."""
    if q.shape[2] == 0 or k.shape[2] == 0:  # flex_attention fails with an IndexError
        raise NotImplementedError(
            f"flex_attention takes no empty sequence (Nq={q.shape[2]}, Nk={k.shape[2]})"
        )
    return _compiled()(
        q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
        enable_gqa=q.shape[1] != k.shape[1], return_lse=True,
    )


# ----------------------------------------------------------------------------- dense
@functools.lru_cache(maxsize=64)
def _dense_coords(nq: int, nk: int, device: str) -> Coords:
    offset = _int(nk - nq, device)

    def coords(q_idx, kv_idx):
        return q_idx + offset, kv_idx

    return coords


@functools.lru_cache(maxsize=64)
def _dense_block_mask(
    nq: int, nk: int, causal: bool, window: tuple[int, int] | None, device: str
) -> BlockMask | None:
    band = _band(_dense_coords(nq, nk, device), causal, window, device)
    return None if band is None else _block_mask(band, nq, nk, device)


@entry_point("dense", _KEYWORDS)
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kw: Keywords) -> Pair:
    """FlexAttention ``(o, lse)``, bottom-right causal, with window, softcap and ALiBi."""
    check_dense(q, k, v)
    _check(q, k, v)
    b, hq, nq, _ = q.shape
    var = check_variants(b, hq, q.device, **kw.variants)
    nk, device = k.shape[2], str(q.device)
    slope = None
    if (slopes := var.alibi_slopes) is not None:
        slope = (lambda b, h, q_idx: slopes[h]) if slopes.dim() == 1 else (lambda b, h, q_idx: slopes[b, h])
    score_mod = _score_mod(_dense_coords(nq, nk, device), var.softcap, slope, device)
    return _flex(q, k, v, score_mod, _dense_block_mask(nq, nk, kw.causal, var.window, device), kw.scale)


# ----------------------------------------------------------------------------- varlen
class _Documents:
    """The packed sequences of ``cu_seqlens``: each token's sequence (``doc_q``, ``doc_k``) and,
    per sequence, its first query and key and its offset ``Nk_s - Nq_s``."""

    def __init__(self, cu_q: tuple[int, ...], cu_k: tuple[int, ...], device: str) -> None:
        cq, ck = (torch.tensor(cu, dtype=torch.int32, device=device) for cu in (cu_q, cu_k))
        nq, nk = cq.diff(), ck.diff()
        seqs = torch.arange(len(nq), dtype=torch.int32, device=device)
        self.doc_q = torch.repeat_interleave(seqs, nq, output_size=cu_q[-1])
        self.doc_k = torch.repeat_interleave(seqs, nk, output_size=cu_k[-1])
        self.q_start, self.k_start, self.offset = cq[:-1], ck[:-1], nk - nq
        self.shape = (cu_q[-1], cu_k[-1])

    def coords(self) -> Coords:
        doc_q, q_start, k_start, offset = self.doc_q, self.q_start, self.k_start, self.offset

        def coords(q_idx, kv_idx):
            doc = doc_q[q_idx]
            return q_idx - q_start[doc] + offset[doc], kv_idx - k_start[doc]

        return coords

    def same(self) -> MaskMod:
        doc_q, doc_k = self.doc_q, self.doc_k

        def same_sequence(b, h, q_idx, kv_idx):
            return doc_q[q_idx] == doc_k[kv_idx]

        return same_sequence


@functools.lru_cache(maxsize=64)
def _documents(cu_q: tuple[int, ...], cu_k: tuple[int, ...], device: str) -> _Documents:
    return _Documents(cu_q, cu_k, device)


@functools.lru_cache(maxsize=64)
def _document_block_mask(
    cu_q: tuple[int, ...], cu_k: tuple[int, ...], causal: bool, window: tuple[int, int] | None, device: str
) -> BlockMask:
    docs = _documents(cu_q, cu_k, device)
    band = _band(docs.coords(), causal, window, device)
    mask = docs.same() if band is None else and_masks(docs.same(), band)
    return _block_mask(mask, *docs.shape, device)


@entry_point("varlen", _KEYWORDS)
def varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, kw: Keywords) -> Pair:
    """Packed sequences (``flash_attn_varlen_func``): o (Tq, Hq, Dv), lse (Hq, Tq)."""
    _check(q, k, v)
    n_seq = check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    var = check_variants(n_seq, q.shape[1], q.device, **kw.variants)
    device = str(q.device)
    cu_q, cu_k = tuple(cu_seqlens_q.tolist()), tuple(cu_seqlens_k.tolist())
    docs = _documents(cu_q, cu_k, device)
    slope = None
    if (slopes := var.alibi_slopes) is not None:
        doc_q = docs.doc_q
        slope = (lambda b, h, q_idx: slopes[h]) if slopes.dim() == 1 else (
            lambda b, h, q_idx: slopes[doc_q[q_idx], h]
        )
    score_mod = _score_mod(docs.coords(), var.softcap, slope, device)
    block_mask = _document_block_mask(cu_q, cu_k, kw.causal, var.window, device)
    o, lse = _flex(*(t.transpose(0, 1)[None] for t in (q, k, v)), score_mod, block_mask, kw.scale)
    return o[0].transpose(0, 1), lse[0]


#: Found by flashprop on the H200 (torch 2.11.0+cu130): for GQA with a causal block mask under
#: dynamic shapes, Inductor finds no kernel for flex_attention and raises InductorError
#: ("LoweringException: NoValidChoicesError: No choices to select"), e.g.
#: Problem(b=1, hq=8, hkv=2, nq=127, nk=127, d=16, dtype=float16, causal=True) and
#: Problem(b=1, hq=4, hkv=1, nq=127, nk=127, d=64, dtype=float16, causal=True).
GQA_CAUSAL_NO_CHOICES = Limit(
    reason="Inductor has no flex_attention kernel choice for GQA with a block mask (causal, a "
    "sliding window or varlen documents) under dynamic shapes (InductorError NoValidChoicesError; "
    "torch 2.11, H200)",
    applies=lambda p: p.hq != p.hkv and (p.causal or p.window is not None or p.seqlens is not None),
    raises=False,
)
#: The window and varlen cases of the same finding, from the variant properties (flashprop on the
#: H200, torch 2.11): Problem(b=1, hq=4, hkv=2, nq=127, nk=127, d=16, dtype='float16',
#: scale=0.03125, window=(-1, 0), softcap=0.5) raised InductorError NoValidChoicesError.

#: Found by the variant properties on the H200 (torch 2.11.0+cu130): with a block mask (any
#: window, or varlen documents) and Dv = 256 > D, Inductor's flex_attention template needs 256 KiB
#: of shared memory (the H200 has 227 KiB) and raises InductorError "No valid triton configs.
#: OutOfMemoryError: out of resource", e.g. Problem(b=1, hq=1, hkv=1, nq=300, nk=300, d=64,
#: dv=256, dtype='float16', scale=0.03125, layout='transposed', window=(-1, -1)).
MASKED_DV256_SHARED_MEMORY = Limit(
    reason="Inductor's flex_attention with a block mask and Dv = 256 > D needs more shared memory "
    "than the H200 has (InductorError out of resource; torch 2.11)",
    applies=lambda p: p.dv == 256 and p.d < p.dv and (p.window is not None or p.seqlens is not None),
    raises=False,
)

attention.varlen = varlen
attention.capabilities = Capabilities(
    dtypes=frozenset({torch.float16, torch.bfloat16, torch.float32}),
    head_dims=frozenset({16, 32, 64, 128, 256}),
    devices=frozenset({"cuda"}),
    max_elements=INT32_ELEMENTS,
    fp32_matmul="tf32",
    limits=(GQA_CAUSAL_NO_CHOICES, MASKED_DV256_SHARED_MEMORY),
    window=True,
    softcap=True,
    alibi=ALIBI_SHAPES,
    varlen=True,
    variant_backward=frozenset({"window", "softcap", "alibi", "varlen"}),
)
