"""The pytest arguments that select a run of the property suite on kernels: one builder for every
tool that starts one (``flashprop fuzz``, the GPU check's property and fuzz runs, the mutant
runner).

A run selects the property tests (never the meta-tests: ``-m "not meta"``), a Hypothesis profile
(``ci``, ``fuzz``, ``gpu``: ``flashprop/plugin.py``), the kernels (``--kernel``, once each) and,
where given, the device and the examples per property. How much pytest prints, its cache, xdist
workers, shards and seeds, the tally and JUnit files and the time box are each tool's own, added
by it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def property_args(
    kernels: Iterable[str],
    *,
    profile: str,
    targets: Sequence[str] = ("properties",),
    pyargs: bool = False,
    device: str | None = None,
    max_examples: int | None = None,
) -> list[str]:
    """``pytest`` arguments running ``targets`` (paths, or with ``pyargs`` dotted module names of
    an installed flashprop) under ``profile`` on each of ``kernels``, with ``--device`` and
    ``--max-examples`` when given."""
    args = [*(["--pyargs"] if pyargs else []), *targets, "-m", "not meta", "--hypothesis-profile", profile]
    for kernel in kernels:
        args += ["--kernel", kernel]
    if device is not None:
        args += ["--device", device]
    if max_examples is not None:
        args += ["--max-examples", str(max_examples)]
    return args
