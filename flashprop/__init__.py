"""flashprop: a property-based correctness suite for fused attention kernels.

The installed namespace maps the repository's folders: ``flashprop.contract`` (capabilities,
the problem, the registry, shared input checks), ``flashprop.kernels`` (the kernels and
adapters), ``flashprop.refimpl`` (float64 golden, yardstick, blocked reference kernel),
``flashprop.harness`` (strategies, tolerance, the harness the properties use),
``flashprop.properties`` (the property tests), ``flashprop.plugin`` (the pytest plugin) and
``flashprop.cli`` (the ``flashprop`` command; ``flashprop.commands`` builds the pytest arguments of
its runs and the tools'). In a source checkout the same names resolve to the
folders at the repository root.

What a kernel author imports::

    from flashprop import FP8, Capabilities, KVCache, Limit
"""

from pathlib import Path

_HERE = Path(__file__).resolve().parent
if not (_HERE / "contract").is_dir() and (_HERE.parent / "contract" / "capabilities.py").is_file():
    # a source checkout: flashprop.contract is <root>/contract (and so on)
    __path__.append(str(_HERE.parent))

from flashprop.contract.capabilities import (  # noqa: E402
    FP8,
    FULL_SUPPORT,
    Capabilities,
    KVCache,
    Limit,
)
from flashprop.contract.registry import KernelUnavailable, load_kernel  # noqa: E402

__all__ = ["FP8", "FULL_SUPPORT", "Capabilities", "KVCache", "KernelUnavailable", "Limit", "load_kernel"]
