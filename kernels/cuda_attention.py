"""FlashAttention-2 as a CUDA extension: forward and backward, registered as kernel ``cuda``.

The kernels live in ``kernels/cuda/`` (plain CUDA in ``flash_*.cu[h]``, the torch binding in
``flash_binding.cpp``). They are compiled for sm_90a (Hopper) by
``torch.utils.cpp_extension.load`` the first time they are needed, into
``$TORCH_EXTENSIONS_DIR/flashprop_cuda`` or ``~/.cache/flashprop/cuda``; a rebuild happens only
when a source or a flag changes. ``FLASHPROP_CUDA_FLAGS`` adds nvcc flags (tuning builds, e.g.
``-DFLASHPROP_FWD128_BLOCK_N=32``); ``FLASHPROP_VERBOSE_BUILD=1`` shows the build.

The forward and backward are PyTorch custom ops (``flashprop::cuda_attn_fwd`` and
``flashprop::cuda_attn_bwd``) with fake-tensor and autograd registrations, so they work under
``torch.compile`` and pass ``torch.library.opcheck``. Gradients flow from both ``o`` and ``lse``.

Importing this module never needs CUDA; :func:`unavailable_reason` says why the kernel cannot
run here (``None`` when it can) and :func:`attention` raises on such a machine.

Support (see ``attention.capabilities``): float16 and bfloat16; head dims D = Dv, multiples of 8
up to 256; any Nq, Nk >= 1; GQA/MQA; bottom-right causal masking; any strides (views the kernels
cannot address directly, e.g. a non-unit last-dim stride, are copied to a contiguous tensor
first). Forward and backward are deterministic: no atomics anywhere.
"""

import math
import os
from pathlib import Path

import torch
from flashprop.contract.capabilities import Capabilities, Limit
from flashprop.contract.entry_points import Keywords, entry_point
from flashprop.contract.validate import check_dense

__all__ = ["attention", "unavailable_reason"]

_SOURCE_DIR = Path(__file__).resolve().parent / "cuda"
_SOURCES = ("flash_binding.cpp", "flash_kernels.cu")
_CUDA_FLAGS = (
    "-O3",
    "--use_fast_math",
    "-gencode=arch=compute_90a,code=sm_90a",
    "-U__CUDA_NO_HALF_OPERATORS__",
    "-U__CUDA_NO_HALF_CONVERSIONS__",
    "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
)
# The C++ standard is left to torch (its headers decide; the kernels are C++17 and C++20 clean).
_SUPPORTED_DTYPES = frozenset({torch.float16, torch.bfloat16})
_HEAD_DIMS = range(8, 257, 8)

_extension = None
_build_error: str | None = None


def _build_dir() -> Path:
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    base = Path(root) if root else Path.home() / ".cache" / "flashprop" / "cuda"
    path = base / "flashprop_cuda"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _load_extension():
    """Build (or load the cached build of) the extension; raise RuntimeError on failure."""
    global _extension, _build_error
    if _extension is not None:
        return _extension
    if _build_error is not None:
        raise RuntimeError(_build_error)
    from torch.utils.cpp_extension import load

    try:
        _extension = load(
            name="flashprop_cuda",
            sources=[str(_SOURCE_DIR / name) for name in _SOURCES],
            extra_cflags=["-O3"],
            extra_cuda_cflags=[*_CUDA_FLAGS, *os.environ.get("FLASHPROP_CUDA_FLAGS", "").split()],
            extra_include_paths=[str(_SOURCE_DIR)],
            build_directory=str(_build_dir()),
            verbose=os.environ.get("FLASHPROP_VERBOSE_BUILD") == "1",
        )
    except Exception as exc:  # compiler errors arrive as RuntimeError, missing tools as OSError
        _build_error = f"build failed: {type(exc).__name__}: {exc}"
        raise RuntimeError(_build_error) from exc
    return _extension


def unavailable_reason() -> str | None:
    """Why the kernel cannot run on this machine, or ``None`` when it can (builds on first call)."""
    if torch.version.cuda is None:
        return "torch was built without CUDA"
    if not torch.cuda.is_available():
        return "no CUDA device"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != (9, 0):
        return f"compiled for sm_90a (Hopper) only; the device is sm_{major}{minor}"
    try:
        _load_extension()
    except RuntimeError as exc:
        return str(exc)
    return None


# ---- custom ops -----------------------------------------------------------------------------
# Defined once per process: importing this file a second time (e.g. by path) reuses the ops.

_NS = "flashprop"


def _define_ops() -> None:
    @torch.library.custom_op(f"{_NS}::cuda_attn_fwd", mutates_args=())
    def cuda_attn_fwd(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return _load_extension().fwd(q, k, v, causal, scale)

    @cuda_attn_fwd.register_fake
    def _(q, k, v, causal, scale):
        b, hq, nq, _ = q.shape
        return q.new_empty((b, hq, nq, v.shape[-1])), q.new_empty((b, hq, nq), dtype=torch.float32)

    @torch.library.custom_op(f"{_NS}::cuda_attn_bwd", mutates_args=())
    def cuda_attn_bwd(
        dout: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        o: torch.Tensor,
        lse: torch.Tensor,
        dlse: torch.Tensor,
        causal: bool,
        scale: float,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return _load_extension().bwd(dout, q, k, v, o, lse, dlse, causal, scale)

    @cuda_attn_bwd.register_fake
    def _(dout, q, k, v, o, lse, dlse, causal, scale):
        return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)

    def setup_context(ctx, inputs, output):
        q, k, v, causal, scale = inputs
        o, lse = output
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal = causal
        ctx.scale = scale

    def backward(ctx, grad_o, grad_lse):
        q, k, v, o, lse = ctx.saved_tensors
        if grad_o is None:
            grad_o = torch.zeros_like(o)
        if grad_lse is None:
            grad_lse = torch.zeros_like(lse)
        dq, dk, dv = torch.ops.flashprop.cuda_attn_bwd(
            grad_o, q, k, v, o, lse, grad_lse, ctx.causal, ctx.scale
        )
        return dq, dk, dv, None, None

    cuda_attn_fwd.register_autograd(backward, setup_context=setup_context)


if not hasattr(getattr(torch.ops, _NS), "cuda_attn_fwd"):
    _define_ops()


# ---- public entry point ---------------------------------------------------------------------


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None) -> float:
    """Validate a problem (clear ValueError / TypeError / NotImplementedError); return the scale.
    The dense layout's rules are ``contract.validate.check_dense``'s; what follows is this
    kernel's support."""
    check_dense(q, k, v)
    if q.dtype not in _SUPPORTED_DTYPES:
        raise TypeError(f"cuda kernel: dtype {q.dtype} not supported (float16, bfloat16)")
    if q.device.type != "cuda":
        raise NotImplementedError(f"cuda kernel: only CUDA tensors (got {q.device})")
    b, hq, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    if v.shape[3] != d:
        raise NotImplementedError(f"cuda kernel: value head dim Dv={v.shape[3]} != D={d}")
    if d not in _HEAD_DIMS:
        raise NotImplementedError(f"cuda kernel: head dim D={d} not supported (8, 16, ..., 256)")
    if min(b, hq, hkv, nq, nk) < 1:
        raise ValueError(f"empty dimension: q {tuple(q.shape)}, k {tuple(k.shape)}")
    if max(b, hq) > 65535:
        raise NotImplementedError(f"cuda kernel: batch {b} or heads {hq} above 65535")
    if scale is None:
        return 1.0 / math.sqrt(d)
    scale = float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale}")
    return scale


@entry_point("dense", ("causal", "scale"))
def attention(q, k, v, kw: Keywords) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashAttention-2 on CUDA: returns ``(o, lse)``, lse natural-log float32 (B, Hq, Nq).

    q (B, Hq, Nq, D), k (B, Hkv, Nk, D), v (B, Hkv, Nk, D); scale defaults to 1/sqrt(D);
    causal masking is bottom-right aligned (query i sees key j iff j <= i + Nk - Nq).
    """
    scale = _check(q, k, v, kw.scale)
    reason = unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"cuda kernel unavailable: {reason}")
    return torch.ops.flashprop.cuda_attn_fwd(q, k, v, bool(kw.causal), scale)


attention.capabilities = Capabilities(
    dtypes=_SUPPORTED_DTYPES,
    head_dims=_HEAD_DIMS,
    dv_equals_d=True,
    devices=frozenset({"cuda"}),
    backward=True,
    deterministic=True,
    deterministic_backward=True,
    limits=(
        Limit(
            reason="batch or heads above 65535: CUDA's grid z and y dimensions carry them",
            applies=lambda p: max(p.b, p.hq) > 65535,
        ),
    ),
)
