"""The kernel contract (capabilities, registry, loader) and the kernels under test."""

from flashprop.kernels.capabilities import FULL_SUPPORT, Capabilities, KVCache, Limit
from flashprop.kernels.registry import (
    BUILTIN,
    Kernel,
    KernelUnavailable,
    default_kernel,
    load_kernel,
    observe_outputs,
)

__all__ = [
    "BUILTIN",
    "FULL_SUPPORT",
    "Capabilities",
    "KVCache",
    "Kernel",
    "KernelUnavailable",
    "Limit",
    "default_kernel",
    "load_kernel",
    "observe_outputs",
]
