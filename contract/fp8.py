"""FP8 in the contract (``docs/variants.md``): the formats, the descale shapes, and what an FP8
tensor with its descale stands for.

An FP8 tensor ``x8`` with descale ``d`` stands for the values ``x = x8 * d`` (FlashAttention-3's
``q_descale``, ``k_descale``, ``v_descale``; FlashInfer's and vLLM's ``k_scale``, ``v_scale``
mean the same: the factor that turns the stored value into the real one). A descale is float32
and has one of the shapes

    tensor       ()           one descale for the whole tensor
    head         (Hkv,)       one per kv head
    batch-head   (B, Hkv)     one per batch element (varlen: sequence) and kv head (FA3's)

and query head h uses the descale of its kv head ``h // (Hq // Hkv)`` (the head group), as a
kv head's keys and values do. :func:`dequantise` is that definition, in any precision (the
golden's is float64, exact: an FP8 value has at most 4 significant bits, a descale 24).

:func:`quantise` is how the suite makes FP8 inputs from drawn values: round to nearest (ties to
even) of ``x / d``, saturated at the format's largest finite value (a real quantiser clamps: it
never writes e4m3's NaN or e5m2's infinity for a finite input).
"""

from __future__ import annotations

import torch

#: The FP8 formats by name: OCP e4m3 (no infinity, largest 448) and e5m2 (IEEE-like, largest 57344).
FORMATS: dict[str, torch.dtype] = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
FORMAT_NAMES: dict[torch.dtype, str] = {dtype: name for name, dtype in FORMATS.items()}
FP8_DTYPES: frozenset[torch.dtype] = frozenset(FORMATS.values())
#: Descale shapes of the dense and varlen entry points (``q_descale``, ``k_descale``, ``v_descale``).
DESCALE_SHAPES: tuple[str, ...] = ("tensor", "head", "batch-head")
#: Scale shapes of an FP8 KV cache in decode (``k_scale``, ``v_scale``): per tensor or per kv head.
CACHE_SCALE_SHAPES: tuple[str, ...] = ("tensor", "head")
#: The 16-bit dtypes an FP8 call returns o in: bfloat16 for FP8 q (FA3's rule), and q's own dtype
#: (float16 or bfloat16) in decode from an FP8 cache.
OUTPUT_DTYPE = torch.bfloat16
CACHE_QUERY_DTYPES: frozenset[torch.dtype] = frozenset({torch.float16, torch.bfloat16})


def is_fp8(t: object) -> bool:
    """Whether ``t`` is a tensor in one of :data:`FORMATS`."""
    return isinstance(t, torch.Tensor) and t.dtype in FP8_DTYPES


def shape_of(name: str, batch: int, kv_heads: int) -> tuple[int, ...]:
    """The tensor shape of descale shape ``name`` (:data:`DESCALE_SHAPES`)."""
    return {"tensor": (), "head": (kv_heads,), "batch-head": (batch, kv_heads)}[name]


def shape_name(descale: torch.Tensor, batch: int, kv_heads: int) -> str | None:
    """The name of ``descale``'s shape for ``batch`` and ``kv_heads``, ``None`` when it has none."""
    return next((n for n in DESCALE_SHAPES if tuple(descale.shape) == shape_of(n, batch, kv_heads)), None)


def unit_roundoff(dtype: torch.dtype) -> float:
    """Half the spacing of ``dtype`` just above 1: the relative error of rounding to nearest a
    value in its normal range (2^-4 for e4m3, 2^-3 for e5m2)."""
    return torch.finfo(dtype).eps / 2


def per_query_head(descale: torch.Tensor, batch: int, heads: int, kv_heads: int,
                   dtype: torch.dtype) -> torch.Tensor:
    """``descale`` (any of :data:`DESCALE_SHAPES`) as (B, H, 1, 1) in ``dtype``: head h of ``heads``
    reads kv head ``h // (heads // kv_heads)``'s."""
    d = descale.to(dtype).expand(batch, kv_heads)
    return d.repeat_interleave(heads // kv_heads, dim=1)[:, :, None, None]


def dequantise(x8: torch.Tensor, descale: torch.Tensor | None, kv_heads: int,
               dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The values (B, H, N, D) FP8 ``x8`` stands for, ``x8 * descale`` per head group, in
    ``dtype``; ``descale=None`` is 1 (FA3's default). A non-FP8 ``x8`` is returned in ``dtype``."""
    x = x8.to(dtype)
    if descale is None:
        return x
    return x * per_query_head(descale, x.shape[0], x.shape[1], kv_heads, dtype).to(x.device)


def quantise(x: torch.Tensor, descale: torch.Tensor, kv_heads: int, fmt: str) -> torch.Tensor:
    """``x`` (B, H, N, D) as FP8 of format ``fmt`` under ``descale``: ``x / descale`` per head
    group, rounded to nearest even and saturated at the format's largest finite value."""
    dtype = FORMATS[fmt]
    top = torch.finfo(dtype).max
    d = per_query_head(descale, x.shape[0], x.shape[1], kv_heads, x.dtype).to(x.device)
    return (x / d).clamp(-top, top).to(dtype)


def dequantised(mode: str, args: tuple, kwargs: dict,
                dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ``q, k, v`` of an entry point's call (``mode``: dense, varlen or kvcache; ``args`` and
    ``kwargs`` as the kernel gets them) as the values they stand for, in ``dtype``, in the call's
    own layouts: the descales (``q_descale``, ``k_descale``, ``v_descale``; a varlen call's
    (B, Hkv) rows per sequence) or the cache's ``k_scale``, ``v_scale`` applied."""
    q, k, v = args[:3]
    if mode == "kvcache":  # caches (..., Hkv, D) with scales () or (Hkv,)
        out = [q.to(dtype)]
        for t, name in ((k, "k_scale"), (v, "v_scale")):
            s = kwargs.get(name)
            out.append(t.to(dtype) if s is None else t.to(dtype) * s.to(dtype).to(t.device)[..., None])
        return out[0], out[1], out[2]
    if mode == "dense":
        hkv = k.shape[1]
        return tuple(dequantise(t, kwargs.get(f"{n}_descale"), hkv, dtype)
                     for t, n in zip((q, k, v), "qkv", strict=True))
    cu = {"q": args[3], "k": args[4], "v": args[4]}  # varlen: packed (T, H, D)
    hkv = k.shape[1]
    out = []
    for t, n in zip((q, k, v), "qkv", strict=True):
        d = kwargs.get(f"{n}_descale")
        if d is None:
            out.append(t.to(dtype))
            continue
        lengths = cu[n].diff().long().to(t.device)
        rows = d.to(dtype).expand(len(lengths), hkv).to(t.device)
        per_token = rows.repeat_interleave(lengths, dim=0).repeat_interleave(t.shape[1] // hkv, dim=1)
        out.append(t.to(dtype) * per_token[..., None])
    return out[0], out[1], out[2]


#: The keywords that carry descales: the dense and varlen entry points' and an FP8 cache's.
DESCALE_KEYWORDS = ("q_descale", "k_descale", "v_descale", "k_scale", "v_scale")


def dequantised_call(mode: str, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """A ``mode`` call's arguments with its FP8 q, k, v replaced by the float64 values they stand
    for (:func:`dequantised`) and the descale keywords dropped: the same attention, unquantised."""
    q, k, v = dequantised(mode, args, kwargs)
    return (q, k, v, *args[3:]), {n: t for n, t in kwargs.items() if n not in DESCALE_KEYWORDS}
