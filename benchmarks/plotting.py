"""matplotlib for the benchmark plots (the ``report`` extra), headless."""

from __future__ import annotations

from types import ModuleType

#: Why a plot is not written when matplotlib is missing.
MISSING = "matplotlib is not installed (pip install 'flashprop[report]')"


def pyplot() -> ModuleType | None:
    """``matplotlib.pyplot`` on the Agg backend (no display needed), or ``None`` without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt
