"""The benchmark grid: which problems each kernel is timed on, and how many FLOPs they cost.

GPU grid (the FlashAttention papers' setting): B*N = 16384 tokens, H*D = 2048, so H = 32 for
D = 64 and H = 16 for D = 128, B = 16384 // N, N in 512 .. 16k, fp16 and bf16, causal or not,
forward and forward+backward. The CPU grid keeps the shape rules but scales the token and
hidden sizes down (256 tokens, H*D = 128, D = 64, float32) so that the pure-PyTorch and
interpreted kernels finish in seconds.

FLOPs: forward 4*B*H*N*N*D (halved when causal); backward 2.5x forward; forward+backward 3.5x.

Variant rows (``GridSpec.variants``, ``--bench-variants``): the dense rows' shapes with one
variant's keywords added to the call (:data:`VARIANTS`, :meth:`Config.variant_kwargs`); a
window row counts only the (query, key) pairs its band keeps. An ``fp8`` row (forward only) calls
the kernel on the row's inputs quantised to e4m3 with (B, H) descales (FlashAttention-3's
convention; o in bfloat16). Every variant row times the anchors on its dense twin
(:attr:`Config.anchor_config`; an fp8 row's in bf16): what a variant kernel is weighed against is
dense attention at the same shape. SDPA's backends have no softcap or sinks to time, and one that
emulates a variant through an explicit mask times the mask, not the variant (on the H200, cuDNN's
1k window through a mask took 9.3 ms where the ``triton`` window took 0.6,
``docs/results/2026-12-02-s31-h200.md``); the dense twin gives every variant row a ratio the gate
can track.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import torch
from flashprop.contract.fp8 import quantise
from flashprop.contract.problem import DTYPES_BY_NAME, Problem

MODES = ("fwd", "fwd+bwd")
MODE_FLOP_FACTOR = {"fwd": 1.0, "fwd+bwd": 3.5}
SHORT_DTYPE = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float64": "fp64"}
LONG_DTYPE = {short: name for name, short in SHORT_DTYPE.items()}
#: The rows' variants: the dense call, or it with a softcap of SOFTCAP (Gemma 2's attention
#: logits), ALiBi's slopes 2^(-8 (h + 1) / H) per head, one sink logit per head (gpt-oss), or a
#: sliding window of WINDOW keys on each side the row's mask allows (left only when causal).
VARIANTS = ("dense", "softcap", "alibi", "sinks", "window", "fp8")
SOFTCAP = 50.0
WINDOW = 1024
#: The fp8 rows' format and descale: standard normal values times 2^6 stay inside e4m3's range
#: (448) and mostly in its normal range.
FP8_FORMAT = "e4m3"
FP8_DESCALE = 2.0**-6


@dataclass(frozen=True)
class GridSpec:
    """The axes of a grid and the token / hidden budget that fixes B and H."""

    seqlens: tuple[int, ...]
    head_dims: tuple[int, ...]
    dtypes: tuple[str, ...]
    causal: tuple[bool, ...] = (False, True)
    modes: tuple[str, ...] = MODES
    tokens: int = 16384
    hidden: int = 2048
    variants: tuple[str, ...] = ("dense",)


GPU_GRID = GridSpec(
    seqlens=(512, 1024, 2048, 4096, 8192, 16384),
    head_dims=(64, 128),
    dtypes=("bfloat16", "float16"),
)
CPU_GRID = GridSpec(
    seqlens=(128, 256, 512),
    head_dims=(64,),
    dtypes=("float32",),
    tokens=256,
    hidden=128,
)


@dataclass(frozen=True)
class Config:
    """One benchmarked problem shape (kernel-independent)."""

    n: int
    d: int
    causal: bool
    dtype: str
    mode: str
    tokens: int
    hidden: int
    device: str
    variant: str = "dense"

    @property
    def b(self) -> int:
        return max(1, self.tokens // self.n)

    @property
    def h(self) -> int:
        return max(1, self.hidden // self.d)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES_BY_NAME[self.dtype]

    @property
    def window(self) -> tuple[int, int] | None:
        """The window row's ``window_size`` (None on other rows)."""
        return (WINDOW, 0 if self.causal else WINDOW) if self.variant == "window" else None

    @property
    def flops(self) -> float:
        """FLOPs of the mode: 4*B*H*N*N*D forward, halved when causal, times the mode factor; a
        window row's N*N is the number of (query, key) pairs its band keeps."""
        pairs = self.n * self.n / (2 if self.causal else 1)
        if self.window is not None:
            left, right = self.window
            pairs = sum(min(self.n - 1, i + right) - max(0, i - left) + 1 for i in range(self.n))
        return 4.0 * self.b * self.h * pairs * self.d * MODE_FLOP_FACTOR[self.mode]

    @property
    def label(self) -> str:
        """Stable human-readable key, e.g. ``fwd d64 causal N4096 bf16`` (a variant row's ends
        with the variant: ``... bf16 softcap``)."""
        mask = "causal" if self.causal else "full"
        variant = "" if self.variant == "dense" else f" {self.variant}"
        return f"{self.mode} d{self.d} {mask} N{self.n} {SHORT_DTYPE[self.dtype]}{variant}"

    @property
    def fp8_descale(self) -> torch.Tensor:
        """An fp8 row's descale, the same for q, k and v: (B, H) float32 of :data:`FP8_DESCALE`."""
        return torch.full((self.b, self.h), FP8_DESCALE, dtype=torch.float32, device=self.device)

    @property
    def anchor_config(self) -> Config:
        """The row the anchors are timed on: its dense twin (an fp8 row's in bf16)."""
        return replace(self, variant="dense")

    def variant_kwargs(self) -> dict[str, object]:
        """The keywords the row adds to the dense call (on the row's device; sinks require grad
        in fwd+bwd rows, so their gradient is part of the time; an fp8 row's descales)."""
        h = self.h
        if self.variant == "softcap":
            return {"softcap": SOFTCAP}
        if self.variant == "alibi":
            slopes = [2.0 ** (-8.0 * (i + 1) / h) for i in range(h)]
            return {"alibi_slopes": torch.tensor(slopes, dtype=torch.float32, device=self.device)}
        if self.variant == "sinks":
            g = torch.Generator(device=self.device).manual_seed(0)
            z = torch.randn(h, generator=g, device=self.device, dtype=torch.float32)
            return {"sinks": z.requires_grad_(self.mode == "fwd+bwd")}
        if self.variant == "window":
            return {"window_size": self.window}
        if self.variant == "fp8":
            descale = self.fp8_descale
            return {"q_descale": descale, "k_descale": descale, "v_descale": descale}
        return {}

    def problem(self) -> Problem:
        """The :class:`Problem` a kernel's capabilities are asked about."""
        return Problem(
            b=self.b,
            hq=self.h,
            hkv=self.h,
            nq=self.n,
            nk=self.n,
            d=self.d,
            dv=self.d,
            dtype=self.torch_dtype,
            causal=self.causal,
            device=self.device,
            window=self.window,
            softcap=SOFTCAP if self.variant == "softcap" else 0.0,
            alibi=("head", 1.0) if self.variant == "alibi" else None,
            sinks="mixed" if self.variant == "sinks" else None,
            fp8=(FP8_FORMAT, "batch-head", "full") if self.variant == "fp8" else None,
        )

    def inputs(self, seed: int = 0) -> tuple[torch.Tensor, ...]:
        """Contiguous ``q, k, v, do`` drawn directly on the device (fast at 16k tokens); an fp8
        row's q, k, v quantised (:func:`contract.fp8.quantise`) under its descales."""
        g = torch.Generator(device=self.device).manual_seed(seed)
        shape = (self.b, self.h, self.n, self.d)
        drawn = tuple(
            torch.randn(shape, generator=g, device=self.device, dtype=self.torch_dtype)
            for _ in range(4)
        )
        if self.variant != "fp8":
            return drawn
        descale = self.fp8_descale
        return (*(quantise(x, descale, self.h, FP8_FORMAT) for x in drawn[:3]), drawn[3])


#: Named subsets: sequence lengths per dtype (``ci/gpu_check.py`` uses ``gpu-check`` to stay
#: inside its time budget: the full bf16 grid from 1k, fp16 at N = 4k).
SUBSETS: dict[str, dict[str, tuple[int, ...]]] = {
    "gpu-check": {"bfloat16": (1024, 2048, 4096, 8192, 16384), "float16": (4096,)},
}

#: Kernels that loop in Python over tiles or interpret every program: timed only up to a
#: sequence length per device, with the reason given when skipped.
SIZE_LIMITS: dict[tuple[str, str], tuple[int, str]] = {
    ("ref-blocked", "cuda"): (1024, "pure-PyTorch reference kernel (a Python loop per tile)"),
    ("ref-blocked", "cpu"): (512, "pure-PyTorch reference kernel (a Python loop per tile)"),
    ("triton", "cpu"): (128, "Triton interpreter (seconds per call)"),
}


def configs(spec: GridSpec, device: str, subset: str | None = None) -> list[Config]:
    """Every configuration of ``spec`` (restricted to a named subset), in a stable order; fp8 rows
    are forward only (FP8 inputs have no backward in the contract) and bfloat16 (o's dtype)."""
    allowed = SUBSETS[subset] if subset else None
    unknown = sorted(set(spec.variants) - set(VARIANTS))
    if unknown:
        raise ValueError(f"unknown benchmark variants {unknown}: known {list(VARIANTS)}")
    return [
        Config(n, d, causal, dtype, mode, spec.tokens, spec.hidden, device, variant)
        for variant in spec.variants
        for dtype in spec.dtypes
        for d in spec.head_dims
        for causal in spec.causal
        for mode in spec.modes
        for n in spec.seqlens
        if (allowed is None or n in allowed.get(dtype, ()))
        and (variant != "fp8" or (mode == "fwd" and dtype == "bfloat16"))
    ]


def size_limit_reason(kernel: str, config: Config) -> str | None:
    """Why ``kernel`` is not timed at ``config``'s length on its device, or ``None``."""
    limit = SIZE_LIMITS.get((kernel, config.device))
    if limit is None or config.n <= limit[0]:
        return None
    return f"{kernel} on {config.device}: {limit[1]}; timed up to N={limit[0]} only"


def parse_ints(text: str | None, default: Sequence[int]) -> tuple[int, ...]:
    """``"1k,2k,4096"`` -> ``(1024, 2048, 4096)``; ``None`` or empty gives ``default``."""
    if not text:
        return tuple(default)
    out = []
    for item in text.replace(" ", ",").split(","):
        if item:
            out.append(int(item[:-1]) * 1024 if item.lower().endswith("k") else int(item))
    return tuple(out)


def parse_names(text: str | None, default: Iterable[str]) -> tuple[str, ...]:
    """Comma/space separated names; ``None`` or empty gives ``default``."""
    if not text:
        return tuple(default)
    return tuple(item for item in text.replace(",", " ").split() if item)
