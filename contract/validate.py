"""Checks of variant inputs (``docs/variants.md``) shared by the adapters and the blocked kernel.

Each function raises ``TypeError`` (wrong type or dtype) or ``ValueError`` (wrong shape or value)
with a message naming the argument and what is wrong, so a malformed call is a clear refusal
under the error contract instead of a wrong answer or an obscure failure deeper down. The checks
of index tensors read their values on the host (a device synchronisation, once per call).

What an entry point calls before its kernel runs, one line per concern:

    check_variants(batch, heads, device, window_size=..., softcap=..., alibi_slopes=...,
                   sinks=..., dropout_p=..., dropout_seed=...)
                                                    -> Variants (every entry point)
    check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
                                                    -> the number of sequences (varlen)
    check_decode(q, k_cache, v_cache, cache_seqlens, block_table, num_splits, max_splits)
                                                    -> the cache capacity (KV-cache decode)
    check_fp8(q, k, v, q_descale, k_descale, v_descale)
                                                    -> Descales or None (FP8 dense, varlen)
    check_cache_scales(q, k_cache, v_cache, k_scale, v_scale)
                                                    -> Descales or None (FP8 KV cache)

The finer checks they are made of (``check_window``, ``check_cache``, ...) are public too.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Collection
from dataclasses import dataclass

import torch

from .fp8 import CACHE_QUERY_DTYPES, CACHE_SCALE_SHAPES, DESCALE_SHAPES, is_fp8, shape_name, shape_of

#: The most elements a 32-bit offset reaches. A kernel whose offsets are 32-bit declares
#: ``max_elements=INT32_ELEMENTS`` and refuses larger tensors with :func:`check_elements`.
#: The errors that count as a clear refusal (the error contract): what every check here raises.
CLEAR_ERRORS: tuple[type[Exception], ...] = (ValueError, TypeError, NotImplementedError)
INT32_ELEMENTS = 2**31 - 1


def extent(t: torch.Tensor) -> int:
    """The elements a tensor spans in its storage, first to last: 1 + sum((n_i - 1) * stride_i)
    (its ``numel`` when contiguous; more for a strided view)."""
    if t.numel() == 0:
        return 0
    return 1 + sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride(), strict=True))


def check_elements(who: str, limit: int, why: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """``NotImplementedError`` naming the tensor when q, k or v spans, or the output (q's
    shape with v's head dim) holds, more than ``limit`` elements; ``why`` says what breaks there.
    Dense (B, H, N, D) and packed (T, H, D) layouts alike."""
    output = q.numel() // q.shape[-1] * v.shape[-1] if q.numel() else 0
    sizes = {"q": extent(q), "k": extent(k), "v": extent(v), "the output": output}
    for name, size in sizes.items():
        if size > limit:
            raise NotImplementedError(f"{who}: {name} spans {size} elements, more than {limit}: {why}")


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _index_tensor(t: object, name: str, device: torch.device) -> torch.Tensor:
    """``t`` as an int32 tensor on ``device``, or a TypeError/ValueError naming ``name``."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be an int32 tensor, got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise TypeError(f"{name} must be int32, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, the queries on {device}")
    return t


def check_window(window_size: object) -> tuple[int, int]:
    """``window_size`` as ``(left, right)``: a pair of ints, each >= -1 (-1: unbounded side)."""
    if not isinstance(window_size, tuple | list) or len(window_size) != 2:
        raise TypeError(f"window_size must be a pair (left, right) of ints, got {window_size!r}")
    left, right = window_size
    if not (_is_int(left) and _is_int(right)):
        raise TypeError(f"window_size must be a pair of ints, got {window_size!r}")
    if left < -1 or right < -1:
        raise ValueError(f"window_size sides must be >= -1 (-1: unbounded), got {window_size!r}")
    return left, right


def check_softcap(softcap: object) -> float:
    """``softcap`` as a float: a finite number >= 0 (0: off)."""
    if not isinstance(softcap, int | float) or isinstance(softcap, bool):
        raise TypeError(f"softcap must be a number, got {type(softcap).__name__}")
    if not 0.0 <= softcap < float("inf"):
        raise ValueError(f"softcap must be finite and >= 0 (0: off), got {softcap!r}")
    return float(softcap)


def check_alibi(alibi_slopes: object, batch: int, heads: int, device: torch.device) -> torch.Tensor:
    """``alibi_slopes``: a float32 tensor of shape ``(heads,)`` or ``(batch, heads)`` on ``device``."""
    if not isinstance(alibi_slopes, torch.Tensor):
        raise TypeError(f"alibi_slopes must be a float32 tensor, got {type(alibi_slopes).__name__}")
    if alibi_slopes.dtype != torch.float32:
        raise TypeError(f"alibi_slopes must be float32, got {alibi_slopes.dtype}")
    if tuple(alibi_slopes.shape) not in ((heads,), (batch, heads)):
        raise ValueError(
            f"alibi_slopes must have shape ({heads},) or ({batch}, {heads}) (Hq or B, Hq), "
            f"got {tuple(alibi_slopes.shape)}"
        )
    if alibi_slopes.device != device:
        raise ValueError(f"alibi_slopes is on {alibi_slopes.device}, the queries on {device}")
    return alibi_slopes


def check_sinks(sinks: object, heads: int, device: torch.device) -> torch.Tensor:
    """``sinks``: one logit per query head, a float32 tensor of shape ``(heads,)`` on ``device``,
    whatever the inputs' dtype (``docs/variants.md``: a float64 problem's sinks are float32 too)."""
    if not isinstance(sinks, torch.Tensor):
        raise TypeError(f"sinks must be a float32 tensor, got {type(sinks).__name__}")
    if sinks.dtype != torch.float32:
        raise TypeError(f"sinks must be float32 whatever the inputs' dtype, got {sinks.dtype}")
    if tuple(sinks.shape) != (heads,):
        raise ValueError(f"sinks must have shape (Hq,) = ({heads},), got {tuple(sinks.shape)}")
    if sinks.device != device:
        raise ValueError(f"sinks are on {sinks.device}, the queries on {device}")
    return sinks


#: Dropout seeds are unsigned 64-bit integers (``refimpl/dropout.py`` hashes both halves).
DROPOUT_SEED_LIMIT = 2**64


def check_dropout(dropout_p: object, dropout_seed: object) -> tuple[float, int | None]:
    """``(dropout_p, dropout_seed)``: p a real number in [0, 1) (0: off); the seed an int in
    ``[0, 2^64)``, required when p > 0 (``docs/variants.md``: the mask is a function of the seed,
    never of a generator's state), ``None`` allowed at p = 0."""
    if not isinstance(dropout_p, int | float) or isinstance(dropout_p, bool):
        raise TypeError(f"dropout_p must be a float, got {type(dropout_p).__name__}")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1) (0: no dropout), got {dropout_p!r}")
    if dropout_seed is None:
        if dropout_p > 0:
            raise ValueError(f"dropout_p={dropout_p!r} needs an explicit dropout_seed (an int)")
        return 0.0, None
    if not _is_int(dropout_seed):
        raise TypeError(f"dropout_seed must be an int, got {type(dropout_seed).__name__}")
    if not 0 <= dropout_seed < DROPOUT_SEED_LIMIT:
        raise ValueError(f"dropout_seed must be in [0, 2**64), got {dropout_seed}")
    return float(dropout_p), dropout_seed


def dropout_threshold(p: float) -> int:
    """``ceil(p * 2^32)``: the contract's keep mask keeps an entry iff its 32-bit hash is at least
    this (``refimpl/dropout.py``; exact for a float p, 0 at p = 0)."""
    return math.ceil(p * 2.0**32)


@dataclass(frozen=True)
class Variants:
    """The checked variant keywords of one call.

    Attributes:
        window: ``(left, right)`` (-1: that side unbounded), or ``None``: no window.
        softcap: the cap t of ``s -> t * tanh(s / t)``; 0 is off.
        alibi_slopes: float32 slopes of shape (Hq,) or (B, Hq), or ``None``.
        sinks: the float32 sink logits (Hq,), or ``None``.
        dropout_p: the dropout probability; 0 is off.
        dropout_seed: the dropout's seed (``None`` when off).
    """

    window: tuple[int, int] | None = None
    softcap: float = 0.0
    alibi_slopes: torch.Tensor | None = None
    sinks: torch.Tensor | None = None
    dropout_p: float = 0.0
    dropout_seed: int | None = None


def check_variants(
    batch: int,
    heads: int,
    device: torch.device,
    *,
    window_size: object = None,
    softcap: object = 0.0,
    alibi_slopes: object = None,
    sinks: object = None,
    dropout_p: object = 0.0,
    dropout_seed: object = None,
) -> Variants:
    """The variant keywords of a call with ``batch`` sequences (batch elements) and ``heads`` query
    heads of inputs on ``device``, checked (``None`` and 0 mean off). ALiBi slopes and sinks are
    float32 whatever the inputs' dtype."""
    p, seed = check_dropout(dropout_p, dropout_seed)
    return Variants(
        window=None if window_size is None else check_window(window_size),
        softcap=check_softcap(softcap),
        alibi_slopes=None if alibi_slopes is None else check_alibi(alibi_slopes, batch, heads, device),
        sinks=None if sinks is None else check_sinks(sinks, heads, device),
        dropout_p=p,
        dropout_seed=seed,
    )


def check_num_splits(num_splits: object, max_splits: int | None) -> int:
    """Decode's ``num_splits``: an int >= 0 (0: the kernel chooses); more than ``max_splits`` (what
    the kernel declares; ``None``: no limit) raises ``NotImplementedError``."""
    if not _is_int(num_splits):
        raise TypeError(f"num_splits must be an int, got {type(num_splits).__name__}")
    if num_splits < 0:
        raise ValueError(f"num_splits must be >= 0 (0: the kernel chooses), got {num_splits}")
    if max_splits is not None and num_splits > max_splits:
        raise NotImplementedError(f"num_splits={num_splits}: at most {max_splits} split(s) supported")
    return num_splits


def check_dense(q: object, k: object, v: object) -> tuple[int, int]:
    """The dense entry point's tensors: q (B, Hq, Nq, D), k (B, Hkv, Nk, D), v (B, Hkv, Nk, Dv),
    of one dtype on one device, Hq a multiple of Hkv; returns ``(Hq, Hq // Hkv)``. What a kernel
    supports of them (dtypes, devices, head dims) is its own check."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"expected 4-d q, k, v (B, H, N, D); got {q.dim()}, {k.dim()}, {v.dim()} dims")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not q.device == k.device == v.device:
        raise ValueError(f"q, k, v must share a device, got {q.device}, {k.device}, {v.device}")
    b, hq, _, d = q.shape
    bk, hkv, nk, dk = k.shape
    if (bk, hkv, nk) != tuple(v.shape[:3]) or b != bk:
        raise ValueError(f"incompatible shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if d != dk:
        raise ValueError(f"q head dim {d} != k head dim {dk}")
    if hkv == 0 or hq % hkv != 0:
        raise ValueError(f"Hq={hq} is not a multiple of Hkv={hkv}")
    return hq, hq // hkv


def check_packed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Varlen tensors: token-major q (Tq, Hq, D), k (Tk, Hkv, D), v (Tk, Hkv, Dv), Hq % Hkv == 0."""
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(
            f"varlen q, k, v must be 3-d (T, H, D), got {q.dim()}, {k.dim()}, {v.dim()} dims"
        )
    if k.shape[:2] != v.shape[:2] or q.shape[2] != k.shape[2]:
        raise ValueError(
            f"incompatible varlen shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise ValueError(f"Hq={q.shape[1]} is not a multiple of Hkv={k.shape[1]}")


def _check_one_cu(cu: object, side: str, max_seqlen: object, device: torch.device) -> torch.Tensor:
    """One boundary tensor's structure (``cu_seqlens_{side}``, side q or k): int32 on ``device``,
    1-d of B + 1 >= 2 entries, its ``max_seqlen_{side}`` a non-negative int."""
    name, max_name = f"cu_seqlens_{side}", f"max_seqlen_{side}"
    cu = _index_tensor(cu, name, device)
    if cu.dim() != 1 or cu.numel() < 2:
        raise ValueError(f"{name} must be 1-d of length B + 1 >= 2, got shape {tuple(cu.shape)}")
    if not _is_int(max_seqlen):
        raise TypeError(f"{max_name} must be an int, got {type(max_seqlen).__name__}")
    if max_seqlen < 0:
        raise ValueError(f"{max_name} must be >= 0, got {max_seqlen}")
    return cu


def _check_cu_values(cu: torch.Tensor, side: str, total: int, max_seqlen: int) -> None:
    name = f"cu_seqlens_{side}"
    values = cu.tolist()
    if values[0] != 0:
        raise ValueError(f"{name} must start at 0, got {values[0]}")
    lengths = [b - a for a, b in itertools.pairwise(values)]
    if min(lengths) < 0:
        raise ValueError(f"{name} must be non-decreasing, got {values}")
    if values[-1] != total:
        raise ValueError(f"{name} must end at the number of packed tokens {total}, got {values[-1]}")
    if max_seqlen < max(lengths):
        raise ValueError(f"max_seqlen_{side}={max_seqlen} is below the longest sequence "
                         f"({max(lengths)} tokens)")


def check_cu_values(cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, total_q: int, total_k: int,
                    max_seqlen_q: int, max_seqlen_k: int) -> None:
    """The values :func:`check_cu_seqlens` checks with ``values=True``, read on the host: each
    boundary tensor starts at 0, is non-decreasing and ends at its packed token count, and no
    sequence is longer than its ``max_seqlen``."""
    _check_cu_values(cu_seqlens_q, "q", total_q, max_seqlen_q)
    _check_cu_values(cu_seqlens_k, "k", total_k, max_seqlen_k)


def check_cu_seqlens(
    cu_seqlens_q: object,
    cu_seqlens_k: object,
    total_q: int,
    total_k: int,
    max_seqlen_q: object,
    max_seqlen_k: object,
    device: torch.device,
    *,
    values: bool = True,
) -> int:
    """Varlen boundaries: int32, length B + 1 (the same for q and k), starting at 0,
    non-decreasing, ending at the packed token counts; ``max_seqlen_q/k`` ints no shorter than
    the longest sequence. Returns the number of sequences B. ``values=False`` leaves the
    boundaries' values (:func:`check_cu_values`) to a kernel that reads within bounds whatever
    they are and checks them while its kernels run (``kernels.triton_checks``)."""
    cu_q = _check_one_cu(cu_seqlens_q, "q", max_seqlen_q, device)
    cu_k = _check_one_cu(cu_seqlens_k, "k", max_seqlen_k, device)
    if cu_q.numel() != cu_k.numel():
        raise ValueError(
            "cu_seqlens_q and cu_seqlens_k must have the same length B + 1, "
            f"got {cu_q.numel()} and {cu_k.numel()}"
        )
    if values:
        check_cu_values(cu_q, cu_k, total_q, total_k, max_seqlen_q, max_seqlen_k)
    return cu_q.numel() - 1


def check_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: object,
    cu_seqlens_k: object,
    max_seqlen_q: object,
    max_seqlen_k: object,
    *,
    values: bool = True,
) -> int:
    """A varlen call's packed tensors (:func:`check_packed`) and sequence boundaries
    (:func:`check_cu_seqlens`, ``values`` as there); returns the number of sequences B."""
    check_packed(q, k, v)
    return check_cu_seqlens(
        cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0], max_seqlen_q, max_seqlen_k, q.device,
        values=values,
    )


def check_cache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: object,
    block_table: object | None,
    *,
    values: bool = True,
) -> int:
    """KV-cache decode inputs: q (B, Nq, Hq, D); the cache (B, Ncache, Hkv, D) contiguous, or
    (num_pages, page_size, Hkv, D) paged with an int32 ``block_table`` (B, max_pages) of entries in
    ``[0, num_pages)``; int32 ``cache_seqlens`` (B,) in ``[0, capacity]``. Returns the capacity
    (Ncache, or ``max_pages * page_size``). ``values=False`` leaves the entries' and lengths'
    ranges to :func:`check_cache_values`, which a kernel that reads any values within bounds may
    run while its kernels run (``kernels.triton_checks.start_cache_check``)."""
    if q.dim() != 4 or k_cache.dim() != 4 or v_cache.dim() != 4:
        raise ValueError(
            f"decode q and caches must be 4-d, got {q.dim()}, {k_cache.dim()}, {v_cache.dim()} dims"
        )
    b, _, hq, d = q.shape
    if k_cache.shape[:3] != v_cache.shape[:3] or k_cache.shape[3] != d:
        raise ValueError(
            f"incompatible decode shapes q {tuple(q.shape)}, k_cache {tuple(k_cache.shape)}, "
            f"v_cache {tuple(v_cache.shape)}"
        )
    hkv = k_cache.shape[2]
    if hkv == 0 or hq % hkv:
        raise ValueError(f"Hq={hq} is not a multiple of Hkv={hkv}")
    if block_table is None:
        if k_cache.shape[0] != b:
            raise ValueError(f"a contiguous cache needs batch {b} first, got k_cache {tuple(k_cache.shape)}")
        capacity = k_cache.shape[1]
    else:
        table = _index_tensor(block_table, "block_table", q.device)
        if table.dim() != 2 or table.shape[0] != b:
            raise ValueError(f"block_table must have shape ({b}, max_pages), got {tuple(table.shape)}")
        if k_cache.shape[1] == 0:
            raise ValueError(f"a paged cache needs page_size >= 1, got k_cache {tuple(k_cache.shape)}")
        capacity = table.shape[1] * k_cache.shape[1]
    lengths = _index_tensor(cache_seqlens, "cache_seqlens", q.device)
    if tuple(lengths.shape) != (b,):
        raise ValueError(f"cache_seqlens must have shape ({b},), got {tuple(lengths.shape)}")
    if values:
        check_cache_values(k_cache, cache_seqlens, block_table, capacity)
    return capacity


def check_cache_values(
    k_cache: torch.Tensor, cache_seqlens: torch.Tensor, block_table: torch.Tensor | None, capacity: int
) -> None:
    """The values :func:`check_cache` checks with ``values=True``: ``block_table`` entries in
    ``[0, num_pages)``, ``cache_seqlens`` in ``[0, capacity]`` (read on the host)."""
    if block_table is not None:
        num_pages = k_cache.shape[0]
        if block_table.numel() and not bool(((block_table >= 0) & (block_table < num_pages)).all()):
            raise ValueError(
                f"block_table entries must be page indices in [0, {num_pages}), got "
                f"{int(block_table.min())}..{int(block_table.max())}"
            )
    if cache_seqlens.numel() and not bool(((cache_seqlens >= 0) & (cache_seqlens <= capacity)).all()):
        raise ValueError(
            f"cache_seqlens must be in [0, {capacity}] (the capacity), got {cache_seqlens.tolist()}"
        )


def check_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: object,
    block_table: object | None,
    num_splits: object,
    max_splits: int | None,
    *,
    values: bool = True,
) -> int:
    """A KV-cache decode call's tensors and lengths (:func:`check_cache`, ``values`` as there) and
    its ``num_splits`` (:func:`check_num_splits`); returns the cache capacity."""
    capacity = check_cache(q, k_cache, v_cache, cache_seqlens, block_table, values=values)
    check_num_splits(num_splits, max_splits)
    return capacity


# ----------------------------------------------------------------------------------- FP8
@dataclass(frozen=True)
class Descales:
    """The checked descales of an FP8 call (``contract/fp8.py``), each expanded to (B, Hkv)
    float32 (B: batch elements, or varlen sequences); 1 where none was given. ``q`` is ``None``
    in decode, whose queries are not FP8."""

    q: torch.Tensor | None
    k: torch.Tensor
    v: torch.Tensor

    def per_query_head(self, hq: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The factors as the kernels apply them, per batch element and query head (B, Hq)
        float32: the logits' ``q_descale * k_descale`` (k's alone in decode) and ``v_descale``,
        query head h taking its kv head's ``h // (Hq // Hkv)``."""
        group = hq // self.k.shape[1]
        qk = self.k if self.q is None else self.q * self.k
        return qk.repeat_interleave(group, dim=1), self.v.repeat_interleave(group, dim=1)


def _descale(d: object, name: str, batch: int, kv_heads: int, device: torch.device,
             shapes: Collection[str], contract: tuple[str, ...]) -> torch.Tensor:
    if d is None:
        return torch.ones((batch, kv_heads), dtype=torch.float32, device=device)
    if not isinstance(d, torch.Tensor):
        raise TypeError(f"{name} must be a float32 tensor, got {type(d).__name__}")
    if d.dtype != torch.float32:
        raise TypeError(f"{name} must be float32, got {d.dtype}")
    found = shape_name(d, batch, kv_heads)
    if found not in contract:
        allowed = ", ".join(f"{shape_of(n, batch, kv_heads)} ({n})" for n in contract)
        raise ValueError(f"{name} must have one of the shapes {allowed}, got {tuple(d.shape)}")
    if found not in shapes:
        raise NotImplementedError(f"{name} of shape {tuple(d.shape)} ({found}): only {sorted(shapes)} "
                                  "supported")
    if d.device != device:
        raise ValueError(f"{name} is on {d.device}, the inputs on {device}")
    return d.expand(batch, kv_heads)


def check_fp8(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_descale: object = None,
    k_descale: object = None,
    v_descale: object = None,
    *,
    batch: int | None = None,
    shapes: Collection[str] = DESCALE_SHAPES,
) -> Descales | None:
    """FP8 inputs of the dense (B, H, N, D) or varlen (T, H, D) entry point: q, k, v in one FP8
    format (float8_e4m3fn or float8_e5m2; one dtype is :func:`check_dense`'s and
    :func:`check_packed`'s check) with float32 descales of shape (), (Hkv,) or (B, Hkv) (``batch``:
    the varlen sequences; default q's B); ``shapes``: those the kernel takes (another is
    ``NotImplementedError``). ``None`` when the inputs are not FP8, and then no descale may be
    given (a descale dequantises FP8 values: on 16-bit inputs it would be ignored or misapplied)."""
    given = [n for n, d in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale))
             if d is not None]
    if not is_fp8(q):
        if given:
            raise TypeError(f"{', '.join(given)} given for {q.dtype} inputs: descales dequantise FP8 "
                            "(float8_e4m3fn, float8_e5m2) q, k, v")
        return None
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"FP8 q, k, v must share one format, got {q.dtype}, {k.dtype}, {v.dtype}")
    b = q.shape[0] if batch is None else batch
    kv_heads = k.shape[1]
    args = (b, kv_heads, q.device, shapes, DESCALE_SHAPES)
    return Descales(*(_descale(d, n, *args) for d, n in ((q_descale, "q_descale"), (k_descale, "k_descale"),
                                                          (v_descale, "v_descale"))))


def check_cache_scales(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_scale: object = None,
    v_scale: object = None,
    *,
    shapes: Collection[str] = CACHE_SCALE_SHAPES,
) -> Descales | None:
    """An FP8 KV cache in decode (FlashInfer's and vLLM's convention): k_cache and v_cache in one
    FP8 format, q float16 or bfloat16, float32 ``k_scale``, ``v_scale`` of shape () or (Hkv,)
    (``shapes``: those the kernel takes; another is ``NotImplementedError``). ``None`` when the
    cache is not FP8, and then no scale may be given."""
    given = [n for n, s in (("k_scale", k_scale), ("v_scale", v_scale)) if s is not None]
    if not (is_fp8(k_cache) or is_fp8(v_cache)):
        if given:
            raise TypeError(f"{', '.join(given)} given for a {k_cache.dtype} cache: the scales dequantise "
                            "an FP8 (float8_e4m3fn, float8_e5m2) cache")
        return None
    if k_cache.dtype != v_cache.dtype:
        raise TypeError(f"an FP8 cache's k_cache and v_cache must share one format, got {k_cache.dtype}, "
                        f"{v_cache.dtype}")
    if q.dtype not in CACHE_QUERY_DTYPES:
        raise TypeError(f"an FP8 KV cache is read with float16 or bfloat16 queries, got q {q.dtype} (FP8 "
                        "queries with descales are the dense and varlen entry points')")
    b, kv_heads = q.shape[0], k_cache.shape[2]
    args = (b, kv_heads, q.device, shapes, CACHE_SCALE_SHAPES)
    return Descales(None, _descale(k_scale, "k_scale", *args), _descale(v_scale, "v_scale", *args))
