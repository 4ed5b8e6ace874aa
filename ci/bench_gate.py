#!/usr/bin/env python3
"""The benchmark gate from a checkout: ``python ci/bench_gate.py BASELINE RESULTS.json ...`` is
``flashprop gate``; the code, and what it compares, are in ``benchmarks/gate.py``."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.gate import main

if __name__ == "__main__":
    sys.exit(main())
