"""What a failure's repro script prints: each output it computed against the golden.

The script that :meth:`contract.problem.Problem.repro` writes rebuilds the problem's tensors,
calls the kernel's entry point as the suite did and passes what it got to :func:`show`, which
judges it with the suite's own :func:`harness.check.judge` (the float64 golden of
``reference_for`` and the tolerance model's budget: ``budget = r x yardstick error + floor``),
prints one line per output (PASS or FAIL, max|err|, where, the budget) and exits with status 1
when any output fails. The repro of a malformed call (the error contract's malformed inputs)
makes the call inside :func:`must_refuse`, which exits with status 1 unless it raises a clear
error.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from ..contract.problem import Problem
from ..contract.registry import Kernel
from ..contract.validate import CLEAR_ERRORS
from .check import GRADIENTS, Outputs, judge
from .scale_problems import SPREAD_LAYOUTS

#: The outputs a repro may judge, in the order they are printed.
JUDGEABLE = ("o", "lse", *GRADIENTS)


def show(p: Problem, kernel: Kernel, *, replay: str | None = None, **outputs: torch.Tensor | None) -> None:
    """Judge the ``outputs`` of ``kernel`` on ``p`` against the golden and print the verdicts.

    The keywords name what is judged: ``o`` (always), and any of ``lse``, ``dq``, ``dk``, ``dv``,
    ``dsinks``; a gradient given as None (autograd found none) fails, an lse given as None is
    not judged (a kernel that returns only o). A spread problem (``harness.scale_problems``: a
    view whose last slice lies past element 2^31 of its allocation) is judged against the
    golden of the same values laid out densely, as its property judges it. Exits the process
    with status 1 when an output fails. When every output is within budget and ``replay`` (the
    failure's replay command) is given, the failure is not in this one call but in what the
    property compares it with (another run, transformed inputs, its derivatives): the replay
    command runs here, and its exit status is the script's."""
    unknown = sorted(set(outputs) - set(JUDGEABLE))
    if unknown or "o" not in outputs:
        raise TypeError(f"show judges o and any of {', '.join(JUDGEABLE[1:])}; got {sorted(outputs)}")
    names = tuple(n for n in JUDGEABLE if n in outputs)
    judged_on = p.replace(layout="contiguous") if p.layout in SPREAD_LAYOUTS else p
    results = judge(kernel, judged_on, Outputs(**{"lse": None, **outputs}), names)
    print(f"kernel {kernel.name!r} on {p.describe()}, against the float64 golden:")
    for r in results:
        print(f"  {'PASS' if r.ok else 'FAIL'} {r.describe()}")
    if "lse" in outputs and outputs["lse"] is None:
        print("  lse: not judged (the kernel returned o alone)")
    failed = [r.name for r in results if not r.ok]
    if failed:
        print(f"FAIL: {', '.join(failed)} off the golden")
        sys.exit(1)
    print(f"PASS: {', '.join(r.name for r in results)} within budget on this one call")
    if replay is not None:
        print(f"the property compares this call with others: running it on this problem alone:\n  {replay}")
        sys.stdout.flush()
        command = shlex.split(replay)
        done = subprocess.run([sys.executable, *command[1:]] if command[0] == "python" else command)
        sys.exit(done.returncode)


@contextmanager
def must_refuse(corruption: str) -> Iterator[None]:
    """The call inside gets malformed input (``corruption``, a name of
    ``harness.variant_problems.MALFORMED``): a clear error (ValueError, TypeError,
    NotImplementedError) is what the contract asks: PASS, and the script goes on (to exit 0); an
    answer, or any other error, prints FAIL and exits with status 1."""
    clear = ", ".join(e.__name__ for e in CLEAR_ERRORS)
    try:
        yield
    except CLEAR_ERRORS as err:
        print(f"PASS: malformed input ({corruption}) refused: {type(err).__name__}: {err}")
        return
    except Exception as err:
        print(f"FAIL: malformed input ({corruption}) raised {type(err).__name__}: {err}; "
              f"the contract asks for a clear error ({clear})")
        sys.exit(1)
    print(f"FAIL: malformed input ({corruption}) was answered instead of refused with a clear error "
          f"({clear})")
    sys.exit(1)
