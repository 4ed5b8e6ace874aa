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


def variant_hash(compile_info: dict[str, Any]) -> str:
    """A name for one compiled variant: Triton's serialised specialisation (kernel name,
    signature, constexprs, attributes, options)."""
    return hashlib.sha256(compile_info["specialization_data"].encode()).hexdigest()[:32]


class CompileLocks:
    """This process's compile locks under ``directory`` (what :func:`install` hands Triton's hooks):
    the locks it holds, when each of its compilations began, and where its Triton time went
    (:attr:`stats`)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.held: dict[str, int] = {}  # variant hash -> file descriptor holding its lock
        self.started: dict[str, float] = {}  # variant hash -> when its compilation (or cache load) began
        self.stats = CompileStats()

    def _release(self, name: str) -> None:
        fd = self.held.pop(name, None)
        if fd is not None:
            os.close(fd)  # closing the descriptor drops its flock

    def before_compile(self, compile_info: dict[str, Any]) -> None:
        """Wait (at most ``WAIT_SECONDS``) for the lock of this variant and keep it."""
        for name in list(self.held):  # a compilation that raised never reached after_compile
            self._release(name)
        name = variant_hash(compile_info)
        fd = os.open(os.path.join(self.directory, name), os.O_CREAT | os.O_RDWR, 0o644)
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
        self.stats.waited += waited
        self.stats.wait_seconds += now - start
        self.started[name] = now
        if fd >= 0:
            self.held[name] = fd

    def after_compile(self, compile_info: dict[str, Any]) -> None:
        """Release this variant's lock: it is in the on-disk cache now."""
        name = variant_hash(compile_info)
        self._release(name)
        started = self.started.pop(name, None)
        if started is not None:
            self.stats.variants += 1
            self.stats.compile_seconds += time.monotonic() - started

    def cache_hook(self, *, compile: dict[str, Any], **_: Any) -> bool:
        """Triton's ``jit_cache_hook``: lock the variant, then compile (or load it) as usual."""
        self.before_compile(compile)
        return False

    def post_compile_hook(self, *, compile: dict[str, Any], **_: Any) -> None:
        """Triton's ``jit_post_compile_hook``."""
        self.after_compile(compile)


def installed() -> CompileLocks | None:
    """The compile locks this process's Triton compilations go through (None: none): Triton's
    hooks hold them."""
    triton = sys.modules.get("triton")
    if triton is None:
        return None
    locks = getattr(triton.knobs.runtime.jit_cache_hook, "__self__", None)
    return locks if isinstance(locks, CompileLocks) else None


def install(directory: str) -> CompileLocks:
    """Set Triton's compilation hooks to lock per variant under ``directory``."""
    import triton

    os.makedirs(directory, exist_ok=True)
    locks = CompileLocks(directory)
    triton.knobs.runtime.jit_cache_hook = locks.cache_hook
    triton.knobs.runtime.jit_post_compile_hook = locks.post_compile_hook
    return locks


def stats() -> CompileStats:
    """This process's compile stats: those of its installed locks (empty when none are)."""
    locks = installed()
    return CompileStats() if locks is None else locks.stats


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
