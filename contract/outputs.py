"""What an entry point returns: o's and lse's shapes and dtypes (README's conventions table,
``docs/variants.md``), read off the call's own inputs.

    entry      o                  lse
    dense      (B, Hq, Nq, Dv)    (B, Hq, Nq)     q (B, Hq, Nq, D), v (B, Hkv, Nk, Dv)
    varlen     (Tq, Hq, Dv)       (Hq, Tq)        q (Tq, Hq, D), v (Tk, Hkv, Dv)
    kvcache    (B, Nq, Hq, Dv)    (B, Hq, Nq)     q (B, Nq, Hq, D), v_cache (..., Hkv, Dv)

o is in the inputs' dtype, bfloat16 for FP8 q, k, v (FlashAttention-3's rule; in decode from an
FP8 cache o is in q's dtype, float16 or bfloat16). lse is float32 for FP8, 16-bit and float32
inputs, float64 for float64 ones: the precision the softmax is accumulated in. An lse in a
16-bit dtype is rounded to about 1e-3 relative, which a backward's ``P = exp(S - lse)`` and a
split-KV combine's weights ``exp(lse_s - lse)`` turn into errors of the same size, so its dtype
is part of the contract, as its shape is (FlashAttention's ``softmax_lse`` is float32,
(B, Hq, Nq), or (Hq, Tq) packed).
"""

from __future__ import annotations

import torch

from .fp8 import FP8_DTYPES, OUTPUT_DTYPE

#: The shapes of o and lse per entry point, as the contract writes them.
LAYOUTS: dict[str, dict[str, str]] = {
    "dense": {"o": "(B, Hq, Nq, Dv)", "lse": "(B, Hq, Nq)"},
    "varlen": {"o": "(Tq, Hq, Dv)", "lse": "(Hq, Tq)"},
    "kvcache": {"o": "(B, Nq, Hq, Dv)", "lse": "(B, Hq, Nq)"},
}


def output_dtype(dtype: torch.dtype) -> torch.dtype:
    """The contract's o dtype for queries of ``dtype``: bfloat16 for FP8, else ``dtype``."""
    return OUTPUT_DTYPE if dtype in FP8_DTYPES else dtype


def lse_dtype(dtype: torch.dtype) -> torch.dtype:
    """The contract's lse dtype for inputs of ``dtype``: float64 for float64, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def expected_shapes(mode: str, q: torch.Tensor, v: torch.Tensor) -> dict[str, tuple[int, ...]]:
    """The shapes of o and lse of a ``mode`` call on queries ``q`` and values ``v`` (the value
    cache, for ``kvcache``)."""
    dv = v.shape[-1]
    if mode == "dense":
        b, hq, nq, _ = q.shape
        return {"o": (b, hq, nq, dv), "lse": (b, hq, nq)}
    if mode == "varlen":
        tq, hq, _ = q.shape
        return {"o": (tq, hq, dv), "lse": (hq, tq)}
    if mode == "kvcache":
        b, nq, hq, _ = q.shape
        return {"o": (b, nq, hq, dv), "lse": (b, hq, nq)}
    raise ValueError(f"unknown entry point {mode!r}; expected one of {sorted(LAYOUTS)}")


def mismatch(name: str, mode: str, actual: object, shape: tuple[int, ...], dtype: torch.dtype) -> str | None:
    """Why ``actual`` is not the ``name`` output (``o`` or ``lse``) the contract asks of a ``mode``
    call whose inputs are in ``dtype`` and whose ``name`` has ``shape``; ``None`` when it is."""
    if not isinstance(actual, torch.Tensor):
        return f"{name} is a {type(actual).__name__}, not a tensor"
    want = output_dtype(dtype) if name == "o" else lse_dtype(dtype)
    if actual.dtype != want:
        rule = ("the inputs' dtype, bfloat16 for FP8 inputs" if name == "o"
                else "float32 for 16-bit, float32 and FP8 inputs, float64 for float64 ones")
        return f"{name} dtype {actual.dtype} != {want} (the contract's {name}: {rule}; inputs {dtype})"
    if tuple(actual.shape) != tuple(shape):
        return (f"{name} shape {tuple(actual.shape)} != {LAYOUTS[mode][name]} = {tuple(shape)} "
                f"(the {mode} entry point's {name})")
    return None


def mismatches(mode: str, args: tuple, o: object, lse: object | None) -> list[str]:
    """Why the outputs ``o`` and ``lse`` (``None``: not returned, not judged here) of a ``mode``
    call on positional ``args`` are not the contract's, one reason per tensor (none: they are)."""
    q, v = args[0], args[2]
    shapes = expected_shapes(mode, q, v)
    found = [mismatch(name, mode, t, shapes[name], q.dtype) for name, t in (("o", o), ("lse", lse))
             if t is not None or name == "o"]
    return [why for why in found if why is not None]
