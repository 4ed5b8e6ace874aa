"""Adapters for PyTorch's ``scaled_dot_product_attention`` backends.

Each adapter pins one backend with ``torch.nn.attention.sdpa_kernel`` and declares what that
backend supports. SDPA's ``is_causal`` is top-left aligned (query i sees key j iff j <= i), so
the adapters declare ``causal_alignment="top-left"`` and the reference follows. SDPA returns no
lse. A problem the pinned backend refuses ("No available kernel") is re-raised as
``NotImplementedError`` naming the backend: a clear refusal under the error contract.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from kernels.capabilities import Capabilities, Limit

_LOW = frozenset({torch.float16, torch.bfloat16})


def _cuda_reason() -> str | None:
    return None if torch.cuda.is_available() else "needs a CUDA device (torch sees none)"


def _make(backend: SDPBackend, caps: Capabilities, doc: str) -> Callable:
    def attention(q, k, v, *, causal: bool = False, scale: float | None = None):
        if q.device.type not in caps.devices:
            raise NotImplementedError(f"SDPA {backend.name} does not run on {q.device.type}")
        if q.dtype not in caps.dtypes:
            raise TypeError(f"SDPA {backend.name} does not take {q.dtype}")
        try:
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(
                    q, k, v, is_causal=causal, scale=scale, enable_gqa=q.shape[1] != k.shape[1]
                )
        except RuntimeError as err:
            if "No available kernel" in str(err):
                raise NotImplementedError(f"SDPA {backend.name} refused the problem: {err}") from err
            raise

    attention.__doc__ = doc
    attention.capabilities = caps
    if "cuda" not in caps.devices or "cpu" in caps.devices:
        return attention
    attention.unavailable_reason = _cuda_reason
    return attention


sdpa_math = _make(
    SDPBackend.MATH,
    Capabilities(causal_alignment="top-left", returns_lse=False),
    "SDPA math backend: plain PyTorch ops, CPU and CUDA, every dtype.",
)
def _dispatcher_limit(backend: str, can_use_name: str) -> Limit:
    """Problems PyTorch's own SDPA dispatcher check rejects for ``backend``.

    ``torch.backends.cuda.can_use_*_attention`` is the check behind "No available kernel"; its
    rules change between releases (on the H200, torch 2.11: flash refuses causal with
    Nq != Nk and a last-dim stride != 1; efficient refuses D or Dv not a multiple of 8 in
    fp16/bf16 (4 in fp32) and GQA; cuDNN refuses Nk = 1 and more), so the adapters ask it
    rather than copy its rules. Refused problems are undeclared: the error-contract property
    checks that they raise (NotImplementedError), every other property skips them. The check
    is asked with gradients on, so the refusal covers backward-only restrictions too.
    """
    can_use = getattr(torch.backends.cuda, can_use_name, None)

    def applies(p) -> bool:
        if can_use is None or p.device != "cuda" or not torch.cuda.is_available():
            return False
        q, k, v = p.inputs(requires_grad=p.dtype.is_floating_point)
        try:
            params = torch.backends.cuda.SDPAParams(q, k, v, None, 0.0, p.causal, p.hq != p.hkv)
        except TypeError:  # releases before enable_gqa
            params = torch.backends.cuda.SDPAParams(q, k, v, None, 0.0, p.causal)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return not can_use(params, False)

    return Limit(
        reason=f"PyTorch's SDPA dispatcher rejects it for {backend} "
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

sdpa_flash = _make(
    SDPBackend.FLASH_ATTENTION,
    Capabilities(
        dtypes=_LOW,
        head_dims=range(1, 257),
        dv_equals_d=True,
        causal_alignment="top-left",
        returns_lse=False,
        deterministic_backward=False,
        devices=frozenset({"cuda"}),
        limits=(FLASH_MISALIGNED_VIEWS, _dispatcher_limit("flash", "can_use_flash_attention")),
    ),
    "SDPA flash backend (FlashAttention-2), CUDA fp16/bf16.",
)
sdpa_efficient = _make(
    SDPBackend.EFFICIENT_ATTENTION,
    Capabilities(
        dtypes=frozenset({torch.float16, torch.bfloat16, torch.float32}),
        causal_alignment="top-left",
        returns_lse=False,
        deterministic_backward=False,
        devices=frozenset({"cuda"}),
        limits=(
            EFFICIENT_MISALIGNED_VIEWS,
            _dispatcher_limit("efficient", "can_use_efficient_attention"),
        ),
    ),
    "SDPA memory-efficient backend (xformers cutlass kernels), CUDA fp16/bf16/fp32.",
)
sdpa_cudnn = _make(
    SDPBackend.CUDNN_ATTENTION,
    Capabilities(
        dtypes=_LOW,
        head_dims=range(8, 257, 8),
        causal_alignment="top-left",
        returns_lse=False,
        deterministic_backward=False,
        devices=frozenset({"cuda"}),
        limits=(CUDNN_MISALIGNED_VIEWS, _dispatcher_limit("cuDNN", "can_use_cudnn_attention")),
    ),
    "SDPA cuDNN backend (FlashAttention-3 class on Hopper), CUDA fp16/bf16.",
)
