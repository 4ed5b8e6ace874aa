"""Reference implementations: float64 golden, low-precision yardstick, online-softmax algebra,
and a blocked FlashAttention-2 kernel in plain PyTorch."""

from .golden import attention_golden, attention_golden_backward
from .yardstick import attention_yardstick

__all__ = [
    "attention_golden",
    "attention_golden_backward",
    "attention_yardstick",
]
