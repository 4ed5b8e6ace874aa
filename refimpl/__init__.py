"""Reference implementations: float64 golden, low-precision yardstick, online-softmax algebra,
and a blocked FlashAttention-2 kernel in plain PyTorch."""

from flashprop.refimpl.golden import attention_golden, attention_golden_backward
from flashprop.refimpl.masks import causal_offset, visible_mask
from flashprop.refimpl.yardstick import attention_yardstick

__all__ = [
    "attention_golden",
    "attention_golden_backward",
    "attention_yardstick",
    "causal_offset",
    "visible_mask",
]
