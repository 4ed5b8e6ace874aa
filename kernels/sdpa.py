"""Adapters for PyTorch's ``scaled_dot_product_attention`` backends.

Each adapter pins one backend with ``torch.nn.attention.sdpa_kernel`` and declares what that
backend supports. SDPA's ``is_causal`` is top-left aligned (query i sees key j iff j <= i), so
the adapters declare ``causal_alignment="top-left"`` and the reference follows. SDPA returns no
lse. A problem the pinned backend refuses ("No available kernel") is re-raised as
``NotImplementedError`` naming the backend: a clear refusal under the error contract.

Variants (``docs/variants.md``). SDPA's one handle on the logits is ``attn_mask``: a bool
visibility mask or an additive float bias (float32, rounded to the query dtype for the backends
that take no wider one: :data:`_WIDE_BIAS`). The backends that take a mask
(math, efficient, cuDNN) declare the variants a mask expresses, all with the top-left diagonal
(query i's diagonal key is key i; ``c = 0`` in the contract's formulas):

    window_size    a bool mask ``i - left <= j <= i + right``; with ``causal`` also ``j <= i``
                   (built into the mask: SDPA is not given ``is_causal`` and a mask together)
    alibi_slopes   the float bias ``-slope * |i - j|``, ``-inf`` where a key is not visible;
                   slopes of shape (Hq,) or (B, Hq)
    varlen         ``fn.varlen`` (``flash_attn_varlen_func``'s signature): the packed tokens as
                   one batch element with a block-diagonal mask, each sequence's block with its
                   own causal / window / ALiBi at its own top-left diagonal; returns o (Tq, Hq, Dv)
    KV-cache       ``fn.kvcache`` (``flash_attn_with_kvcache``'s signature), forward only: the
                   cache, read through ``block_table`` when paged, gathered densely up to the
                   longest ``cache_seqlens``; entries past a sequence's length are zeroed (a NaN
                   key behind a mask still poisons SDPA's row: the mask is added to the logit)
                   and masked. No split-KV: ``num_splits`` 0 or 1 (``max_splits=1``). The one
                   declared alignment holds here too: with ``causal`` query i of the Nq new
                   queries sees cache keys j <= i (the golden follows the declaration)

Dropout (``dropout_p``, ``dropout_seed``; dense and varlen): SDPA draws its mask from the global
generator, so the call runs with that generator seeded by ``dropout_seed`` and the caller's state
restored after it (:func:`_seeded`; the fused backends draw from the CUDA generator's Philox
seed and offset, which ``torch.manual_seed`` resets). Every backend declares it, forward and
backward: autograd saves the math backend's mask, and the fused kernels save their RNG state for
the backward. The flash backend, which takes no mask, has dropout as its one variant.

Gradients of window, ALiBi and varlen are SDPA's own backward through the mask (autograd for
math), so they are declared. Softcap (a nonlinear rewrite of each logit, not an additive bias)
and sinks (an extra softmax term with no key) have no SDPA form: undeclared, and the entry
points do not take those keywords (``TypeError``). The flash backend takes no mask at all: it
declares no mask variant.

A row that sees no key gives o = 0: SDPA's convention since PyTorch 2.5 (``_safe_softmax`` for
math, and the fused kernels updated to match: pytorch#133882) and the suite's. The math backend does so in
torch 2.13 on the CPU (bool and ``-inf`` masks, with finite gradients), so the mask is passed as
is; a fused backend that does not is a finding. PyTorch's dispatcher check
(``torch.backends.cuda.can_use_*_attention``) is asked with the mask each entry point builds, so
problems a backend refuses with that mask are undeclared limits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from flashprop.contract.capabilities import ALIBI_SHAPES, Capabilities, KVCache, Limit
from flashprop.contract.entry_points import Keywords, entry_point
from flashprop.contract.masks import score_mod, visible_mask
from flashprop.contract.validate import (
    INT32_ELEMENTS,
    check_decode,
    check_dense,
    check_dropout,
    check_elements,
    check_variants,
    check_varlen,
)
from torch.nn.attention import SDPBackend, sdpa_kernel

_LOW = frozenset({torch.float16, torch.bfloat16})


def _cuda_reason() -> str | None:
    return None if torch.cuda.is_available() else "needs a CUDA device (torch sees none)"


@dataclass(frozen=True)
class _Call:
    """One SDPA call on (B, H, N, D) tensors: what an entry point asks of the backend."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    attn_mask: torch.Tensor | None = None
    is_causal: bool = False
    scale: float | None = None
    dropout: tuple[float, int | None] = (0.0, None)

    @property
    def enable_gqa(self) -> bool:
        return self.q.shape[1] != self.k.shape[1]


def _both(a: torch.Tensor | None, b: torch.Tensor) -> torch.Tensor:
    return b if a is None else a & b


def _bias_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype an ALiBi bias is computed in for queries of ``dtype``: float64 for float64, else
    float32 (a 16-bit bias is rounded: at a slope of 8 and a distance of 47, fp16's spacing is
    0.25, an error of up to 0.125 in a logit)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


#: The backends that take an additive ``attn_mask`` of a wider float dtype than the queries
#: (float32 with fp16 / bf16): the bias reaches them unrounded. The others are given it rounded
#: to the query dtype (:func:`_for_backend`). Measured on the H200 (torch 2.11, session 30): math
#: takes a float32 mask on the CPU and on CUDA; efficient refuses one ("invalid dtype for bias -
#: should match query's dtype"), although ``can_use_efficient_attention`` says yes; cuDNN takes
#: one and answers wrongly (an ALiBi bias of slope 8 over 48 keys: max|o - float64| = 4.06 with a
#: float32 mask, 9.8e-4 with the same bias in fp16; docs/findings.md).
_WIDE_BIAS: frozenset[SDPBackend] = frozenset({SDPBackend.MATH})


def _for_backend(call: _Call, backend: SDPBackend) -> _Call:
    """``call`` as ``backend`` takes it: a float bias wider than the queries rounded to their dtype
    unless the backend takes it as is (:data:`_WIDE_BIAS`); a bool mask and no mask unchanged."""
    mask = call.attn_mask
    if mask is None or not mask.is_floating_point() or mask.dtype == call.q.dtype or backend in _WIDE_BIAS:
        return call
    return dataclasses.replace(call, attn_mask=mask.to(call.q.dtype))


def _attn_mask(
    rows: torch.Tensor,
    cols: torch.Tensor,
    *,
    causal: bool,
    window: tuple[int, int] | None,
    slopes: torch.Tensor | None,
    keep: torch.Tensor | None,
    dtype: torch.dtype,
) -> torch.Tensor | None:
    """SDPA's ``attn_mask`` for queries at positions ``rows`` and keys at positions ``cols``
    within their own sequence (broadcastable 4-d integer tensors; top-left: query i's diagonal
    key is key i); ``None`` when every key is visible and there is no bias.

    Key j is visible from query i where ``keep`` holds (the same sequence, inside the cache;
    ``None``: everywhere) and ``i - left <= j <= i + right`` (-1: that side open; ``causal``
    caps the right side at 0). Without ``slopes`` that is the bool mask; with ALiBi ``slopes``
    (broadcastable against ``(B, Hq, Nq, Nk)``) it is the bias ``-slope * |i - j|`` computed in
    ``dtype`` (:func:`_bias_dtype`: float32 or float64, rounded once), ``-inf`` where not visible;
    :func:`_for_backend` rounds it to what the pinned backend takes.
    """
    left, right = (-1, -1) if window is None else window
    if causal:
        right = 0
    offset = cols - rows  # j - i
    visible = keep
    if right >= 0:
        visible = _both(visible, offset <= right)
    if left >= 0:
        visible = _both(visible, offset >= -left)
    if slopes is None:
        return visible
    bias = -slopes.to(dtype) * offset.abs().to(dtype)
    return bias if visible is None else bias.masked_fill(~visible, float("-inf"))


def _positions(n: int, dim: int, device: torch.device) -> torch.Tensor:
    """``0..n-1`` along dimension ``dim`` of a 4-d tensor."""
    shape = [1, 1, 1, 1]
    shape[dim] = n
    return torch.arange(n, device=device).view(shape)


def _head_slopes(alibi_slopes: torch.Tensor, heads: int) -> torch.Tensor:
    """Slopes (Hq,) or (B, Hq) as (1 or B, Hq, 1, 1)."""
    return alibi_slopes.reshape(-1, heads, 1, 1)


#: The keywords of the entry points of a backend that takes a mask (the variants a mask expresses,
#: and dropout), per entry point; a backend that takes none takes ``causal``, ``scale`` and dropout.
_MASK_KEYWORDS = ("causal", "scale", "window_size", "alibi_slopes")
_PLAIN_KEYWORDS = ("causal", "scale", "dropout_p", "dropout_seed")
_KEYWORDS: Mapping[str, tuple[str, ...]] = {
    "dense": (*_MASK_KEYWORDS, "dropout_p", "dropout_seed"),
    "varlen": (*_MASK_KEYWORDS, "dropout_p", "dropout_seed"),
    "kvcache": (*_MASK_KEYWORDS, "cache_seqlens", "block_table", "num_splits"),
}


def _dense_call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kw: Keywords) -> _Call:
    """Dense (B, H, N, D) inputs (``contract.validate.check_dense``); causal alone stays SDPA's
    ``is_causal``, a window or ALiBi becomes a mask with the causal edge in it."""
    check_dense(q, k, v)
    dropout = check_dropout(kw.dropout_p, kw.dropout_seed)
    if kw.window_size is None and kw.alibi_slopes is None:
        return _Call(q, k, v, None, kw.causal, kw.scale, dropout)
    b, hq = q.shape[:2]
    var = check_variants(b, hq, q.device, window_size=kw.window_size, alibi_slopes=kw.alibi_slopes)
    slopes = None if var.alibi_slopes is None else _head_slopes(var.alibi_slopes, hq)
    rows, cols = _positions(q.shape[2], 2, q.device), _positions(k.shape[2], 3, q.device)
    mask = _attn_mask(rows, cols, causal=kw.causal, window=var.window, slopes=slopes, keep=None,
                      dtype=_bias_dtype(q.dtype))
    return _Call(q, k, v, mask, kw.causal and mask is None, kw.scale, dropout)


def _sequence_positions(cu_seqlens: torch.Tensor, total: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per packed token: its sequence and its position within the sequence."""
    lengths = cu_seqlens.diff().long()
    device = cu_seqlens.device
    seq = torch.repeat_interleave(torch.arange(len(lengths), device=device), lengths, output_size=total)
    return seq, torch.arange(total, device=device) - cu_seqlens.long()[seq]


def _varlen_call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, kw: Keywords) -> _Call:
    """Packed (T, H, D) inputs as one batch element (1, H, T, D) with a block-diagonal mask."""
    n_seq = check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    dropout = check_dropout(kw.dropout_p, kw.dropout_seed)
    tq, hq = q.shape[:2]
    var = check_variants(n_seq, hq, q.device, window_size=kw.window_size, alibi_slopes=kw.alibi_slopes)
    seq_q, pos_q = _sequence_positions(cu_seqlens_q, tq)
    seq_k, pos_k = _sequence_positions(cu_seqlens_k, k.shape[0])
    slopes = var.alibi_slopes
    if slopes is not None:
        # (Hq,) slopes are shared; of (B, Hq) slopes each query row takes its sequence's row
        slopes = _head_slopes(slopes, hq) if slopes.dim() == 1 else slopes[seq_q].T[None, :, :, None]
    mask = _attn_mask(
        pos_q.view(1, 1, -1, 1),
        pos_k.view(1, 1, 1, -1),
        causal=kw.causal,
        window=var.window,
        slopes=slopes,
        keep=seq_q.view(1, 1, -1, 1) == seq_k.view(1, 1, 1, -1),
        dtype=_bias_dtype(q.dtype),
    )
    return _Call(*(t.transpose(0, 1)[None] for t in (q, k, v)), mask, False, kw.scale, dropout)


def _gather(cache: torch.Tensor, block_table: torch.Tensor | None, length: int) -> torch.Tensor:
    """(B, length, Hkv, D): each batch element's first ``length`` cache positions."""
    if block_table is None:
        return cache[:, :length]
    pages = -(-length // cache.shape[1])
    return cache[block_table[:, :pages].long()].flatten(1, 2)[:, :length]


def _kvcache_call(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, kw: Keywords) -> _Call:
    """Decode inputs (B, Nq, H, D) against the gathered cache, keys past each length masked."""
    cache_seqlens, block_table = kw.cache_seqlens, kw.block_table
    check_decode(q, k_cache, v_cache, cache_seqlens, block_table, kw.num_splits, max_splits=1)
    b, nq, hq, _ = q.shape
    var = check_variants(b, hq, q.device, window_size=kw.window_size, alibi_slopes=kw.alibi_slopes)
    slopes = None if var.alibi_slopes is None else _head_slopes(var.alibi_slopes, hq)
    length = int(cache_seqlens.max()) if b else 0
    inside = torch.arange(length, device=q.device) < cache_seqlens[:, None]  # (B, length)
    k, v = (
        _gather(c, block_table, length).masked_fill(~inside[:, :, None, None], 0).transpose(1, 2)
        for c in (k_cache, v_cache)
    )
    mask = _attn_mask(
        _positions(nq, 2, q.device),
        _positions(length, 3, q.device),
        causal=kw.causal,
        window=var.window,
        slopes=slopes,
        keep=inside[:, None, None, :],
        dtype=_bias_dtype(q.dtype),
    )
    return _Call(q.transpose(1, 2), k, v, mask, False, kw.scale)


#: Per entry point: the call a backend that takes a mask makes (``body(*positional, kw)``) and how
#: SDPA's (B, H, N, D) output becomes the entry point's.
_BUILDS: Mapping[str, tuple[Callable[..., _Call], Callable[[torch.Tensor], torch.Tensor]]] = {
    "dense": (_dense_call, lambda o: o),
    # o (Tq, Hq, Dv) through squeeze, not o[0]: select's backward would hand SDPA a fresh
    # head-major dO, another order than o's (CUDNN_STRIDED_GRAD_OUTPUT); squeeze's passes the
    # caller's dO on as a view
    "varlen": (_varlen_call, lambda o: o.squeeze(0).transpose(0, 1)),
    "kvcache": (_kvcache_call, lambda o: o.transpose(1, 2)),  # o (B, Nq, Hq, Dv)
}
#: The calls each kind of adapter makes, per entry point (``Problem.mode``), with its signature.
_MASKED_CALLS: Mapping[str, Callable[..., _Call]] = {
    mode: entry_point(mode, _KEYWORDS[mode])(build) for mode, (build, _) in _BUILDS.items()
}
_PLAIN_CALLS: Mapping[str, Callable[..., _Call]] = {
    "dense": entry_point("dense", _PLAIN_KEYWORDS)(_dense_call),
}
#: What a backend that takes a mask declares beyond the dense contract.
_MASK_VARIANTS = dict(
    window=True,
    alibi=ALIBI_SHAPES,
    varlen=True,
    kvcache=KVCache(contiguous=True, page_sizes=(1, 16, 64, 256), max_splits=1),
    variant_backward=frozenset({"window", "alibi", "varlen"}),
)


def _make(name: str, backend: SDPBackend, caps: Capabilities, doc: str) -> Callable:
    """The adapter ``name`` of ``backend``: its entry points pin the backend; the error messages
    of Python's own keyword check (an undeclared variant) name the entry point."""

    def run(call: _Call) -> torch.Tensor:
        call = _for_backend(call, backend)
        if call.q.device.type not in caps.devices:
            raise NotImplementedError(f"SDPA {backend.name} does not run on {call.q.device.type}")
        if call.q.dtype not in caps.dtypes:
            raise TypeError(f"SDPA {backend.name} does not take {call.q.dtype}")
        if caps.max_elements is not None:
            check_elements(f"SDPA {backend.name}", caps.max_elements, PAST_INT32[backend.name],
                           call.q, call.k, call.v)
        rate, seed = call.dropout
        if rate and not caps.dropout:
            raise NotImplementedError(f"SDPA {backend.name}: dropout is not declared by this adapter")
        try:
            with sdpa_kernel([backend]), _seeded(call.q.device, seed):
                return F.scaled_dot_product_attention(
                    call.q, call.k, call.v, attn_mask=call.attn_mask, dropout_p=rate,
                    is_causal=call.is_causal, scale=call.scale, enable_gqa=call.enable_gqa,
                )
        except RuntimeError as err:
            if "No available kernel" in str(err):
                raise NotImplementedError(f"SDPA {backend.name} refused the problem: {err}") from err
            raise

    if caps.window:  # a backend that takes a mask: every variant a mask expresses
        attention = _with_masks(run)
    else:
        attention = entry_point("dense", _PLAIN_KEYWORDS)(lambda q, k, v, kw: run(_dense_call(q, k, v, kw)))

    attention.__doc__ = doc
    attention.__name__ = attention.__qualname__ = name
    for mode in ("varlen", "kvcache"):
        entry = getattr(attention, mode, None)
        if entry is not None:
            entry.__qualname__ = f"{name}.{mode}"
    attention.capabilities = caps
    if "cuda" not in caps.devices or "cpu" in caps.devices:
        return attention
    attention.unavailable_reason = _cuda_reason
    return attention


@contextlib.contextmanager
def _seeded(device: torch.device, seed: int | None) -> Iterator[None]:
    """SDPA's dropout draws its mask from the global generator of ``device``: within this
    context that generator starts at ``seed`` (the contract's seed: the same seed, the same mask;
    the backward reuses the forward's mask, saved by autograd or the fused kernel's RNG state),
    and the caller's generator state is restored after it. Nothing is done without a seed."""
    if seed is None:
        yield
        return
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices, device_type=device.type):
        torch.manual_seed(seed)
        yield


def _with_masks(run: Callable[[_Call], torch.Tensor]) -> Callable:
    """The dense, varlen and decode entry points of a backend that takes a mask: each builds its
    call (:data:`_BUILDS`), runs it and gives SDPA's output the entry point's layout."""

    def entry(mode: str, doc: str | None) -> Callable:
        build, output = _BUILDS[mode]

        @entry_point(mode, _KEYWORDS[mode])
        def call(*args: object) -> torch.Tensor:
            return output(run(build(*args)))

        call.__doc__, call.__name__ = doc, mode
        return call

    attention = entry("dense", None)
    attention.varlen = entry("varlen", "Packed sequences (``flash_attn_varlen_func``): o (Tq, Hq, Dv).")
    attention.kvcache = entry(
        "kvcache", "KV-cache decode (``flash_attn_with_kvcache``), forward only: o (B, Nq, Hq, Dv)."
    )
    return attention


#: What a backend that takes a mask declares with dropout (forward and backward), as every SDPA
#: backend runs it: ``dropout_p`` from the device's global generator, seeded by :func:`_seeded`.
_MASKED_WITH_DROPOUT = dict(_MASK_VARIANTS, dropout=True,
                       variant_backward=_MASK_VARIANTS["variant_backward"] | {"dropout"})

sdpa_math = _make(
    "sdpa_math",
    SDPBackend.MATH,
    Capabilities(causal_alignment="top-left", returns_lse=False, **_MASKED_WITH_DROPOUT),
    "SDPA math backend: plain PyTorch ops, CPU and CUDA, every dtype; variants as masks; dropout "
    "seeded through the global generator (:func:`_seeded`).",
)


def _dispatcher_limit(backend: SDPBackend, label: str, can_use_name: str,
                      calls: Mapping[str, Callable[..., _Call]]) -> Limit:
    """Problems PyTorch's own SDPA dispatcher check rejects for ``backend`` (``label`` in the reason).

    ``torch.backends.cuda.can_use_*_attention`` is the check behind "No available kernel"; its
    rules change between releases (on the H200, torch 2.11: flash refuses causal with
    Nq != Nk and a last-dim stride != 1; efficient refuses D or Dv not a multiple of 8 in
    fp16/bf16 (4 in fp32) and GQA; cuDNN refuses Nk = 1 and more), so the adapters ask it
    rather than copy its rules. It is asked about the very call the adapter makes (``calls``:
    per entry point, the tensors, the mask and the flags), so mask-dependent refusals are
    covered; a problem the adapter refuses itself (an undeclared variant, an entry point it does
    not have) is not asked about. Refused problems are undeclared: the error-contract property
    checks that they raise (NotImplementedError), every other property skips them. The check
    is asked with gradients on (decode has no backward), so the refusal covers backward-only
    restrictions too.
    """
    can_use = getattr(torch.backends.cuda, can_use_name, None)

    def applies(p) -> bool:
        build = calls.get(p.mode)
        if can_use is None or build is None or p.device != "cuda" or not torch.cuda.is_available():
            return False
        inp = p.kernel_inputs(requires_grad=p.cache is None)
        try:
            call = _for_backend(build(*inp.args, causal=p.causal, scale=p.scale, **inp.kwargs), backend)
        except (TypeError, ValueError, NotImplementedError):
            return False
        try:
            params = torch.backends.cuda.SDPAParams(
                call.q, call.k, call.v, call.attn_mask, call.dropout[0], call.is_causal, call.enable_gqa
            )
        except TypeError:  # releases before enable_gqa
            params = torch.backends.cuda.SDPAParams(
                call.q, call.k, call.v, call.attn_mask, call.dropout[0], call.is_causal
            )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return not can_use(params, False)

    return Limit(
        reason=f"PyTorch's SDPA dispatcher rejects it for {label} "
        f"(torch.backends.cuda.{can_use_name} is False; the backend raises 'No available kernel')",
        applies=applies,
    )


def _misaligned_views(backend: str, symptom: str) -> Limit:
    """A finding of flashprop on the H200 (torch 2.11.0+cu130): the dispatcher accepts sliced
    views whose base is not 16-byte aligned (``layout='sliced'``: NaN-poisoned neighbours), and
    the backend then fails with ``symptom`` instead of copying the input or refusing it clearly.
    Declared ``raises=False``: such problems are skipped with this reason."""
    return Limit(
        reason=f"SDPA {backend}: {symptom} on sliced views whose base is not 16-byte aligned, "
        "which its dispatcher accepts (torch 2.11, H200)",
        applies=lambda p: p.layout == "sliced",
        raises=False,
    )


#: e.g. Problem(b=2, hq=4, hkv=2, nq=17, nk=1, d=8, dtype=bfloat16, layout='sliced', seed=5)
FLASH_MISALIGNED_VIEWS = _misaligned_views(
    "flash", "crashes with 'CUDA error: misaligned address' (the CUDA context is lost)"
)
#: e.g. Problem(b=1, hq=6, hkv=3, nq=1, nk=4, d=8, dv=40, dtype=float16, layout='sliced',
#: dist='spikes', seed=7776)
CUDNN_MISALIGNED_VIEWS = _misaligned_views(
    "cuDNN", "crashes with 'CUDA error: misaligned address' (the CUDA context is lost)"
)
#: e.g. Problem(b=1, hq=1, hkv=1, nq=1, nk=1, d=8, dv=8, dtype=float16, layout='sliced'): a
#: refusal, but not a clear one (the error contract asks for ValueError, TypeError or
#: NotImplementedError)
EFFICIENT_MISALIGNED_VIEWS = _misaligned_views(
    "efficient", "raises RuntimeError('cutlassF: no kernel found to launch!')"
)

def _through_mask(p) -> bool:
    """Whether the adapters run ``p`` through an explicit mask (window, ALiBi, varlen, decode)."""
    return p.window is not None or p.alibi is not None or p.seqlens is not None or p.cache is not None


def _sequence_pairs(p) -> tuple[tuple[int, int], ...]:
    """(queries, keys) of each sequence the mask of ``p`` covers: a pack's sequences, a decode
    batch's cache lengths, or the dense problem's one pair."""
    if p.seqlens is not None:
        return p.seqlens
    if p.cache is not None:
        return tuple((p.nq, length) for length in p.cache)
    return ((p.nq, p.nk),)


def _masked_empty_row(p) -> bool:
    """Whether ``p`` goes through an explicit mask and has a query row that sees no key under the
    adapters' top-left alignment (a whole row of the mask False)."""
    if not _through_mask(p):
        return False
    for nq, nk in _sequence_pairs(p):
        if nq == 0:
            continue
        if nk == 0:
            return True
        mask = visible_mask(nq, nk, causal=p.causal, alignment="top-left", window=p.window)
        if mask is not None and not bool(mask.any(-1).all()):
            return True
    return False


#: A finding of flashprop's variant properties on the H200 (torch 2.11.0+cu130): under an
#: attn_mask, a query row that sees no key gets a non-zero output from the cuDNN backend (and
#: non-zero gradients), where the convention (and SDPA math) gives 0: e.g.
#: Problem(b=2, hq=1, hkv=1, nq=1, nk=2, d=8, dtype='float16', window=(-1, -1),
#: seqlens=((0, 2), (1, 0))) gave o = 0.705 for the query of the sequence with no key.
#: cuDNN turns the boolean mask into a finite -65504 bias, so a fully masked row attends to every
#: key (pytorch#177842 reports the same).
CUDNN_MASKED_EMPTY_ROWS = Limit(
    reason="SDPA cuDNN: a row that sees no key under an attn_mask gets a non-zero output instead of 0 "
    "(the mask becomes a finite -65504 bias; torch 2.11, H200)",
    applies=_masked_empty_row,
    raises=False,
)


def _storage_order(layout: str) -> str:
    """Which of a tensor's two dims before the last is stored outer in ``layout``
    (``Problem._place``): ``transposed`` swaps them, the other layouts keep the logical order."""
    return "transposed" if layout == "transposed" else "contiguous"


def _grad_out_of_o_order(p) -> bool:
    """Whether ``p``'s dO is stored in the other order than q (and so o, which SDPA's cuDNN
    backend lays out like q, pytorch#138354): head-major against sequence-major, dense or packed
    alike (a pack's (T, H, D) rows are SDPA's (1, H, T, D) sequence-major view). A dO with a
    non-unit innermost stride (strided) is copied by torch in o's layout first, and the sliced one
    is :data:`CUDNN_MISALIGNED_GRAD_OUTPUT`'s."""
    ordered = p.do_layout in ("contiguous", "transposed")
    return ordered and _storage_order(p.do_layout) != _storage_order(p.layout)


#: A finding of flashprop's backward properties (torch 2.11.0+cu130; found on the H200 in session
#: 39, explained on an H100 in session 41, docs/findings.md). SDPA's cuDNN backward caches the
#: cuDNN graph it builds per call signature, and a later call whose dO has other strides but the
#: same shapes and q, k, v, o strides reuses it: its dq, dk, dv are O(1) off (the forward right).
#: Whichever dO layout comes first in a process is right and the other wrong: with q, k, v, o
#: head-major (B=1, H=2, N=64, D=64, no mask, fp16), dO head-major then sequence-major gave max
#: errors 8.4e-4 then 1.76; sequence-major then head-major 8.4e-4 then 1.84 (each order in a fresh
#: process). So a dO's correctness depends on what ran before it. The limit keeps every dO stored in
#: o's order, dense and packed, so that all calls of one signature hand cuDNN the same dO strides.
#: The varlen entry point passes the caller's dO on as a view (``_BUILDS``): until session 42 its
#: ``o[0]`` made autograd hand SDPA a fresh head-major dO, so a one-sequence pack and its dense run
#: (same shapes, masks and q, k, v strides) disagreed, whichever ran second wrong (22 of 40
#: varlen-sequence-alone examples in session 41).
CUDNN_STRIDED_GRAD_OUTPUT = Limit(
    reason="SDPA cuDNN backward: a dO stored in another order than o reuses the cuDNN graph cached "
    "for the first dO strides seen with the same shapes and q, k, v, o strides, so its dq, dk, dv "
    "are O(1) off whenever another dO layout came first in the process (torch 2.11; H200 and H100)",
    applies=_grad_out_of_o_order,
    raises=False,
    backward=True,
)


def _sliced_grad_output(p) -> bool:
    """Whether ``p`` hands the backward a dO in the sliced layout: rows Dv + 3 elements apart, its
    first element generally off a 16-byte boundary (``Problem._place``)."""
    return p.do_layout == "sliced"


#: A finding of flashprop's backward properties on an H100 (torch 2.11.0+cu130, session 40):
#: Problem(b=2, hq=3, hkv=3, nq=285, nk=13, d=128, dv=72, dtype='bfloat16', grad_layout='sliced')
#: raised "RuntimeError: Expected mha_graph.execute(...).is_good() to be true" in the backward,
#: and varlen-sequence-alone's dense run of Problem(b=1, hq=2, hkv=2, nq=300, nk=192, d=216,
#: dv=120, dtype='bfloat16', layout='transposed', alibi=('head', 1.0), seqlens=((300, 192),),
#: grad_layout='sliced') faulted with "CUDA error: misaligned address", which ends the process's
#: CUDA context (the next calls of other kernels in that worker failed with it). Torch checks only
#: dO's innermost stride before cuDNN (pytorch#141147), not its other strides' or its address's
#: 16-byte alignment; neither error is a clear one (ValueError, TypeError, NotImplementedError).
CUDNN_MISALIGNED_GRAD_OUTPUT = Limit(
    reason="SDPA cuDNN backward: a dO whose rows are not 16-byte aligned (the sliced layout, rows "
    "Dv + 3 apart) fails in cuDNN (RuntimeError from mha_graph.execute) or faults with a misaligned "
    "address that ends the CUDA context (torch 2.11, H100)",
    applies=_sliced_grad_output,
    raises=False,
    backward=True,
)


#: The largest visible logit below which a row rules its problem's cuDNN gradients out
#: (:data:`CUDNN_UNDERFLOW_GRADIENTS`): NaN rows were measured from a largest logit of about -12
#: on (session 47: the rows up to -11.8 right, from -13.3 on NaN; session 42: about -13).
_FAR_BELOW = -10.0

#: Logits computed at a time by :func:`_lowest_row_maximum` (a row chunk of all heads).
_CHUNK_LOGITS = 1 << 24


@functools.lru_cache(maxsize=256)  # a problem's declarations are asked again and again
def _lowest_row_maximum(p) -> float:
    """The smallest, over the query rows of ``p`` that see a key, of the row's largest logit
    ``scale q_i . k_j - slope_h |i - j|`` over its visible keys (the adapters' top-left causal
    alignment and window, ALiBi with the batch element's or sequence's slopes), from ``p``'s own
    values in its dtype, multiplied in float32 on its device in row chunks; ``inf`` when no row
    sees a key."""
    q, k = (t.to(p.dtype).to(p.device, torch.float32) for t in p.logical()[:2])
    k = k.repeat_interleave(p.hq // p.hkv, dim=1)
    slopes = p.variant_kwargs()["alibi_slopes"].to(p.device, torch.float32) if p.alibi is not None else None
    if p.seqlens is None:  # (batch element, its rows, its keys)
        blocks = [(b, 0, p.nq, 0, p.nk) for b in range(p.b)]
    else:  # one packed batch element: (sequence, its rows, its keys)
        cu_q, cu_k = (c.tolist() for c in p.cu_seqlens())
        blocks = [(s, cu_q[s], cu_q[s + 1], cu_k[s], cu_k[s + 1]) for s in range(len(p.seqlens))]
    lowest = math.inf
    for index, q0, q1, k0, k1 in blocks:
        nq, nk = q1 - q0, k1 - k0
        batch = 0 if p.seqlens is not None else index
        keys = k[batch, :, k0:k1]
        slope = None if slopes is None else (slopes[index] if slopes.dim() == 2 else slopes)
        alibi = score_mod(nq, nk, alignment="top-left", alibi_slopes=slope)
        step = max(1, _CHUNK_LOGITS // max(1, p.hq * nk))
        for r in range(0, nq if nk else 0, step):
            rows = range(r, min(nq, r + step))
            logits = p.effective_scale * q[batch, :, q0 + rows.start:q0 + rows.stop] @ keys.transpose(-1, -2)
            if alibi is not None:
                i = torch.arange(rows.start, rows.stop, device=p.device)[:, None]
                logits = alibi(logits, None, None, i, torch.arange(nk, device=p.device)[None, :])
            seen = visible_mask(nq, nk, causal=p.causal, alignment="top-left", q_start=rows.start,
                                q_stop=rows.stop, device=p.device, window=p.window)
            if seen is not None:
                logits = logits.masked_fill(~seen, -math.inf)
            top = logits.amax(dim=-1)
            top = top[top > -math.inf]
            if top.numel():
                lowest = min(lowest, float(top.min()))
    return lowest


def _underflow_rows(p) -> bool:
    """Whether some query row of ``p`` that sees a key has every visible logit below
    :data:`_FAR_BELOW` (:func:`_lowest_row_maximum`): ``dist='underflow'`` by construction, and
    ``negative`` values, far ALiBi biases or a few visible keys drawn far below 0 by chance."""
    return p.dist == "underflow" or _lowest_row_maximum(p) < _FAR_BELOW


#: A finding of flashprop's properties (torch 2.11.0+cu130; sessions 41, 42, 45 and 47, H100 and
#: H200): the cuDNN backward returned NaN gradients, the forward right, on rows whose logits all
#: lie far below 0. Session 41, every logit far below -88 (``dist='underflow'``), through a mask:
#: Problem(b=2, hq=1, hkv=1, nq=1, nk=127, d=8, dtype='float16', dist='underflow',
#: alibi=('batch-head', 0.0), seqlens=((1, 1), (0, 127))) gave NaN in every element of dk and dv;
#: Problem(b=1, hq=4, hkv=2, nq=256, nk=64, d=240, dtype='float16', dist='underflow',
#: seqlens=((256, 64),)) NaN in every element of dq (28 alibi-backward and 13 varlen-backward
#: examples of 313). Session 42 (H200), normal values pushed down by ALiBi, the rows far past the
#: keys: Problem(b=2, hq=1, hkv=1, nq=255, nk=63, d=8, dv=32, dtype='float16',
#: alibi=('batch-head', 0.25), seqlens=((255, 63), (0, 1))) gave NaN in dq's 124 last rows in a
#: fresh process, the rows whose largest logit is below about -13 (slopes of 0.20; with slope 0
#: it passed), and its sequence run alone densely NaN in 111 (varlen-sequence-alone). Session 45
#: (H100), the dense backward property, no mask at all: Problem(b=1, hq=1, hkv=1, nq=64, nk=64,
#: d=8, dtype='float16', dist='underflow') gave NaN in every element of dq (o, dk and dv right;
#: replayed in a fresh process in session 46, bf16 alike). Session 47 (H100), two more kinds:
#: ``negative`` values through a flat ALiBi (slope 0, so no bias at all), Problem(b=1, hq=1,
#: hkv=1, nq=64, nk=64, d=8, dtype='float16', dist='negative', alibi=('batch-head', 0.0)), NaN
#: in 472 elements of dq, the 59 rows whose largest logit is below -12 (computed on the CPU from
#: the same tensors: the rows from -11.8 up were right); and ``large`` values under the top-left
#: causal mask, where a decode-like row sees one key, Problem(b=1, hq=2, hkv=1, nq=1, nk=64, d=8,
#: dtype='float16', causal=True, dist='large', seqlens=((1, 64),)), whose one visible logit is
#: -31.4 and -12.3 in its two heads: the sequence's dense run gave NaN in every element of dq, dk
#: and dv (varlen-sequence-alone). Both were shrunk and replayed by Hypothesis in their worker.
#: The trigger is the row's largest visible logit, not the values' distribution nor the mask: the
#: limit computes it from each problem's values (:func:`_underflow_rows`).
CUDNN_UNDERFLOW_GRADIENTS = Limit(
    reason="SDPA cuDNN backward: rows whose every visible logit lies below "
    f"{_FAR_BELOW:g} (far below 0: underflowing values, a far ALiBi bias, or a few keys drawn low) "
    "gave NaN gradients, the forward right (torch 2.11; H100 and H200)",
    applies=_underflow_rows,
    raises=False,
    backward=True,
)


#: A finding of flashprop's variant properties on the H200 (torch 2.11.0+cu130), explained in
#: session 30: Problem(b=6, hq=2, hkv=2, nq=17, nk=259, d=24, dv=256, dtype='bfloat16',
#: dist='spikes', seed=381035881, alibi=('batch-head', 8.0), seqlens=((16, 0), (17, 1), (2, 17),
#: (15, 2), (1, 259), (2, 2))) gave max|o - golden| = 0.391, 2.99 times the bf16 yardstick's error
#: (the model allows 2): 20 of 580 varlen examples, all with bf16 and ALiBi slopes of 8. The
#: efficient backend takes the bias only in the query dtype (:data:`_WIDE_BIAS`), and a bias of
#: 8 x 259 = 2072 in bf16 sits on a grid of 16 (fp16: 1 at 1024-2048, 0.25 at 256-512), off by up to
#: half of that per logit. ``sdpa-math`` failed the same way from the same rounding in fp16
#: (8 of 1,002 varlen-backward examples, slopes of 8, before it was given the float32 bias), so
#: the limit covers both 16-bit dtypes.
EFFICIENT_STEEP_ALIBI = Limit(
    reason="SDPA efficient: fp16/bf16 with ALiBi slopes of 8 is up to 3x the yardstick's error: the "
    "backend takes the bias only in the query dtype, which rounds a bias of hundreds or thousands by "
    "0.25 to 16 per logit (torch 2.11, H200)",
    applies=lambda p: p.dtype in _LOW and p.alibi is not None and p.alibi[1] >= 8.0,
    raises=False,
)

#: What each CUDA backend did past 2^31 elements on the H200 (torch 2.11, CUDA 13; the huge and
#: spread properties of ``properties/test_huge.py``, 2026-11-30, docs/scale.md): the adapters
#: declare ``max_elements`` (2^31 - 1) and refuse larger tensors, or strided views spanning
#: more, naming the finding.
PAST_INT32 = {
    "FLASH_ATTENTION": "SDPA flash hit an illegal memory access at B=32769, N=4096, D=16 (q of "
    "2^31 + 2^16 elements); its offsets are not 64-bit there",
    "EFFICIENT_ATTENTION": "SDPA efficient failed with 'CUDA error: invalid argument' at "
    "H=131073, N=256, D=64",
    "CUDNN_ATTENTION": "SDPA cuDNN returned wrong gradients (dq, dk 100x past the tolerance) for "
    "the slice past element 2^31, of dense tensors and of strided views alike, and a zero "
    "output row at N=2^27+1, D=16",
}

sdpa_flash = _make(
    "sdpa_flash",
    SDPBackend.FLASH_ATTENTION,
    Capabilities(
        dtypes=_LOW,
        head_dims=range(1, 257),
        dv_equals_d=True,
        causal_alignment="top-left",
        returns_lse=False,
        deterministic_backward=False,
        devices=frozenset({"cuda"}),
        max_elements=INT32_ELEMENTS,
        limits=(
            FLASH_MISALIGNED_VIEWS,
            _dispatcher_limit(SDPBackend.FLASH_ATTENTION, "flash", "can_use_flash_attention", _PLAIN_CALLS),
        ),
        dropout=True,
        variant_backward=frozenset({"dropout"}),
    ),
    "SDPA flash backend (FlashAttention-2), CUDA fp16/bf16; takes no mask, so no variant but "
    "dropout (seeded through the CUDA generator, :func:`_seeded`).",
)
sdpa_efficient = _make(
    "sdpa_efficient",
    SDPBackend.EFFICIENT_ATTENTION,
    Capabilities(
        dtypes=frozenset({torch.float16, torch.bfloat16, torch.float32}),
        causal_alignment="top-left",
        returns_lse=False,
        deterministic_backward=False,
        devices=frozenset({"cuda"}),
        max_elements=INT32_ELEMENTS,
        limits=(
            EFFICIENT_MISALIGNED_VIEWS,
            EFFICIENT_STEEP_ALIBI,
            _dispatcher_limit(
                SDPBackend.EFFICIENT_ATTENTION, "efficient", "can_use_efficient_attention", _MASKED_CALLS
            ),
        ),
        **_MASKED_WITH_DROPOUT,
    ),
    "SDPA memory-efficient backend (xformers cutlass kernels), CUDA fp16/bf16/fp32; variants as masks; "
    "dropout seeded through the CUDA generator.",
)
sdpa_cudnn = _make(
    "sdpa_cudnn",
    SDPBackend.CUDNN_ATTENTION,
    Capabilities(
        dtypes=_LOW,
        head_dims=range(8, 257, 8),
        causal_alignment="top-left",
        returns_lse=False,
        deterministic_backward=False,
        devices=frozenset({"cuda"}),
        max_elements=INT32_ELEMENTS,
        limits=(
            CUDNN_MISALIGNED_VIEWS,
            CUDNN_MASKED_EMPTY_ROWS,
            CUDNN_STRIDED_GRAD_OUTPUT,
            CUDNN_MISALIGNED_GRAD_OUTPUT,
            CUDNN_UNDERFLOW_GRADIENTS,
            _dispatcher_limit(SDPBackend.CUDNN_ATTENTION, "cuDNN", "can_use_cudnn_attention", _MASKED_CALLS),
        ),
        **_MASKED_WITH_DROPOUT,
    ),
    "SDPA cuDNN backend (FlashAttention-3 class on Hopper), CUDA fp16/bf16; variants as masks; dropout "
    "seeded through the CUDA generator.",
)
