"""One compilation per Triton kernel variant across parallel test processes.

``ci/gpu_check.py`` runs many pytest-xdist workers against one Triton kernel at once. They need the same
compiled variants (one per combination of constexprs and argument specialisations) at about the
same time, and each would compile every one of them, seconds apiece, although Triton's on-disk
cache would hand the first process's result to the others: on the H200's 32 cores, 32 processes
compiling the same variants made fuzzing compile-bound (0.1-0.7 examples/s).

With ``FLASHPROP_TRITON_COMPILE_LOCKS=DIR`` a process takes an exclusive ``flock`` on
``DIR/<variant hash>`` before it compiles a variant (Triton's ``jit_cache_hook``, called on an
in-memory cache miss, before the on-disk cache is looked up) and releases it once the variant is
compiled (``jit_post_compile_hook``). A process that waited then finds the variant in the on-disk
cache. A compilation that raises keeps its lock until the process's next compilation or its exit;
nobody waits longer than ``WAIT_SECONDS`` (they compile it themselves after that).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import sys
import time
from dataclasses import dataclass
from typing import Any

ENV = "FLASHPROP_TRITON_COMPILE_LOCKS"
WAIT_SECONDS = 300.0

_held: dict[str, int] = {}  # variant hash -> file descriptor holding its lock
_started: dict[str, float] = {}  # variant hash -> when its compilation (or cache load) began


@dataclass
class CompileStats:
    """Where this process's Triton time went: variants it compiled or loaded from the on-disk
    cache, seconds inside Triton's compile (loads included), seconds waiting for another
    process's compilation of the same variant."""

    variants: int = 0
    waited: int = 0
    compile_seconds: float = 0.0
    wait_seconds: float = 0.0

    def line(self) -> str:
        """What each process prints at its end (``flashprop: `` before it): :meth:`parse` and
        ``python -m flashprop.harness.compile_locks LOG...`` read it back."""
        return (f"Triton: {self.variants} kernel variants compiled or loaded in "
                f"{self.compile_seconds:.0f} s, {self.wait_seconds:.0f} s waiting for other "
                f"processes' compilations ({self.waited} variants)")

    @classmethod
    def parse(cls, text: str) -> CompileStats | None:
        """The stats in a :meth:`line` (seconds as printed, whole), or None if there is none."""
        found = _LINE.search(text)
        if found is None:
            return None
        return cls(variants=int(found["variants"]), waited=int(found["waited"]),
                   compile_seconds=float(found["compile"]), wait_seconds=float(found["wait"]))

    def __add__(self, other: CompileStats) -> CompileStats:
        return CompileStats(self.variants + other.variants, self.waited + other.waited,
                            self.compile_seconds + other.compile_seconds,
                            self.wait_seconds + other.wait_seconds)


_LINE = re.compile(r"Triton: (?P<variants>\d+) kernel variants compiled or loaded in "
                   r"(?P<compile>\d+) s, (?P<wait>\d+) s waiting for other processes' "
                   r"compilations \((?P<waited>\d+) variants\)")


STATS = CompileStats()


def variant_hash(compile_info: dict[str, Any]) -> str:
    """A name for one compiled variant: Triton's serialised specialisation (kernel name,
    signature, constexprs, attributes, options)."""
    return hashlib.sha256(compile_info["specialization_data"].encode()).hexdigest()[:32]


def _release(name: str) -> None:
    fd = _held.pop(name, None)
    if fd is not None:
        os.close(fd)  # closing the descriptor drops its flock


def before_compile(directory: str, compile_info: dict[str, Any]) -> None:
    """Wait (at most ``WAIT_SECONDS``) for the lock of this variant and keep it."""
    for name in list(_held):  # a compilation that raised never reached after_compile
        _release(name)
    name = variant_hash(compile_info)
    fd = os.open(os.path.join(directory, name), os.O_CREAT | os.O_RDWR, 0o644)
    start = time.monotonic()
    waited = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            waited = True
            if time.monotonic() > start + WAIT_SECONDS:
                os.close(fd)
                fd = -1
                break
            time.sleep(0.05)
    now = time.monotonic()
    STATS.waited += waited
    STATS.wait_seconds += now - start
    _started[name] = now
    if fd >= 0:
        _held[name] = fd


def after_compile(compile_info: dict[str, Any]) -> None:
    """Release this variant's lock: it is in the on-disk cache now."""
    name = variant_hash(compile_info)
    _release(name)
    started = _started.pop(name, None)
    if started is not None:
        STATS.variants += 1
        STATS.compile_seconds += time.monotonic() - started


def installed() -> bool:
    """Whether this process's Triton compilations go through these locks."""
    triton = sys.modules.get("triton")
    return triton is not None and getattr(triton.knobs.runtime.jit_cache_hook, "flashprop", False)


def install(directory: str) -> None:
    """Set Triton's compilation hooks to lock per variant under ``directory``."""
    import triton

    os.makedirs(directory, exist_ok=True)

    def cache_hook(*, compile: dict[str, Any], **_: Any) -> bool:
        before_compile(directory, compile)
        return False  # compile (or load from the on-disk cache) as usual

    def post_compile_hook(*, compile: dict[str, Any], **_: Any) -> None:
        after_compile(compile)

    cache_hook.flashprop = True
    triton.knobs.runtime.jit_cache_hook = cache_hook
    triton.knobs.runtime.jit_post_compile_hook = post_compile_hook


def install_from_environment() -> None:
    """``install`` when ``FLASHPROP_TRITON_COMPILE_LOCKS`` names a directory (not under the
    interpreter, which compiles nothing)."""
    directory = os.environ.get(ENV)
    if directory and os.environ.get("TRITON_INTERPRET") != "1":
        install(directory)


def summary(logs: list[str]) -> str:
    """One line for many processes' logs: their stats summed (empty if none printed any)."""
    found = [stats for log in logs if (stats := CompileStats.parse(log)) is not None]
    if not found:
        return ""
    total = sum(found, CompileStats())
    return (f"Triton in {len(found)} processes: {total.variants} kernel variants compiled or "
            f"loaded in {total.compile_seconds:.0f} s, {total.wait_seconds:.0f} s waiting for "
            f"other processes ({total.waited} variants)")


if __name__ == "__main__":  # python -m flashprop.harness.compile_locks LOG...: the summed line
    line = summary([open(path, errors="replace").read() for path in sys.argv[1:]])
    if line:
        print(line)
