#!/usr/bin/env python3
"""A planted slowdown of the ``triton`` forward in a scratch copy of this checkout, for the A/B,
noise-band and bisect checks of ``docs/benchmarks.md`` (never applied to this checkout itself).

    python ci/plant_slowdown.py DIR --scratch                    # DIR: a copy of the checkout, one commit
    python ci/plant_slowdown.py DIR --fraction 0.05              # plant 5% in DIR's working tree
    python ci/plant_slowdown.py DIR --fraction 0.2 --commits 8 --at 5   # 8 commits, the 5th plants it

``--scratch`` copies the checkout's files (git's list of them; no ``.git``) into a new folder DIR
and commits them there as one commit (``base``). The plant wraps the forward's launch in
``kernels/triton_attention.py``'s ``_forward``: the first PLANT_MEASURED calls at a shape measure
the launch's GPU time (CUDA events, a spin before them covering the host's enqueueing, as the
benchmarks' protocol does; the first call autotunes, so the plant takes the fastest of the
others), and every later call waits ``fraction`` of that time after its launch: on the GPU a
``torch.cuda._sleep`` spin (GPU time, what the benchmarks' CUDA events count; its cycles per second
and an empty spin's own time measured once), interpreted on the CPU a host ``time.sleep``. The
forward stays correct; its time grows by ``fraction``.
``--commits N --at K`` (DIR must be a git repository with no changes) makes N commits, the K-th
planting the slowdown and the others appending a line to ``PLANTED_NOTES``, and prints the
first and last commit's hashes (GOOD and BAD of a bisect).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The module whose ``_forward`` holds the forward's ``_launch("fwd", ...)`` line (the host side).
KERNEL = Path("kernels/triton_attention.py")
PLANTED_NOTES = "planted-notes.txt"
PLANT_MEASURED = 3
_IDENTITY = ["-c", "user.name=flashprop plant", "-c", "user.email=plant@flashprop.invalid"]
_LAUNCH = re.compile(r'^(?P<indent>\s+)_launch\("fwd", (?P<args>.*)\)$', re.MULTILINE)

HELPER = '''

# ---- planted by ci/plant_slowdown.py in a scratch copy: a slowdown of the forward ----
_PLANTED_FRACTION = {fraction!r}
_planted_seconds: dict = {{}}
_planted_spin: list = []  # cycles per second of torch.cuda._sleep, seconds of an empty one


def _planted_gpu_seconds(fn) -> float:
    """GPU seconds of ``fn``'s launches between CUDA events, a spin keeping the GPU busy while
    the host enqueues them (so the host's launch latency is not counted)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(20_000_000)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def _planted_slowdown(launch, q, k, v, meta) -> None:
    """Launch; after {measured} measured launches at this shape and switches, wait
    _PLANTED_FRACTION of the fastest of them but the first: on CUDA a spin of that much GPU time
    (less an empty spin's own), interpreted a host sleep."""
    import time

    cuda = not INTERPRET and torch.cuda.is_available()
    switches = tuple(sorted((n, x) for n, x in meta.items() if isinstance(x, bool | int | str)))
    key = (tuple(q.shape), tuple(k.shape), tuple(v.shape), q.dtype, switches)
    seen = _planted_seconds.setdefault(key, [])
    if len(seen) < {measured}:
        if cuda:
            seen.append(_planted_gpu_seconds(launch))
        else:
            began = time.perf_counter()
            launch()
            seen.append(time.perf_counter() - began)
        return
    launch()
    wait = _PLANTED_FRACTION * min(seen[1:])
    if not cuda:
        time.sleep(wait)
        return
    if not _planted_spin:
        cycles = 10_000_000
        per_second = cycles / (_planted_gpu_seconds(lambda: torch.cuda._sleep(cycles))
                               - _planted_gpu_seconds(lambda: torch.cuda._sleep(1)))
        _planted_spin.extend([per_second, min(_planted_gpu_seconds(lambda: torch.cuda._sleep(1))
                                              for _ in range(3))])
    per_second, empty = _planted_spin
    torch.cuda._sleep(max(1, int((wait - empty) * per_second)))
'''


def plant(root: Path, fraction: float) -> None:
    """Wrap the forward's launch in ``root``'s triton kernel with the planted wait."""
    path = root / KERNEL
    text = path.read_text()
    if "_planted_slowdown" in text:
        raise SystemExit(f"plant_slowdown: {path} is planted already")
    found = list(_LAUNCH.finditer(text))
    if len(found) != 1:
        raise SystemExit(f"plant_slowdown: expected one '_launch(\"fwd\", ...)' line in {path}, "
                         f"found {len(found)}")
    m = found[0]
    wrapped = f'{m["indent"]}_planted_slowdown(lambda: _launch("fwd", {m["args"]}), q, k, v, meta)'
    text = text[: m.start()] + wrapped + text[m.end():]
    path.write_text(text + HELPER.format(fraction=fraction, measured=PLANT_MEASURED))


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *_IDENTITY, *args], cwd=root, check=True, capture_output=True,
                          text=True).stdout.strip()


def scratch(target: Path) -> None:
    """Copy the checkout's files into ``target`` (new) and commit them there as ``base``."""
    if target.exists():
        raise SystemExit(f"plant_slowdown: {target} exists; --scratch makes a new folder")
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, text=True)
    if listed.returncode == 0:
        files = [ROOT / name for name in listed.stdout.split("\0") if name]
    else:  # a copy without .git: every file but caches and build outputs
        skip = {".git", ".tox", "__pycache__", ".hypothesis", ".pytest_cache", ".bench", ".flashprop"}
        files = [p for p in ROOT.rglob("*") if p.is_file() and not skip & set(p.relative_to(ROOT).parts)]
    for source in files:
        if source.is_file():
            dest = target / source.relative_to(ROOT)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest)
    git(target, "init", "-q")
    git(target, "add", "-A")
    git(target, "commit", "-qm", "base")


def history(root: Path, fraction: float, commits: int, at: int) -> tuple[str, str]:
    """``commits`` commits in ``root``, the ``at``-th planting the slowdown; (first, last) hashes."""
    if not 1 < at <= commits:
        raise SystemExit(f"plant_slowdown: --at must lie in 2..{commits}")
    if git(root, "status", "--porcelain"):
        raise SystemExit(f"plant_slowdown: {root} has uncommitted changes")
    hashes = []
    for i in range(1, commits + 1):
        if i == at:
            plant(root, fraction)
            message = f"commit {i}: plant a {fraction:.0%} slowdown of the triton forward"
        else:
            with (root / PLANTED_NOTES).open("a") as notes:
                notes.write(f"commit {i}\n")
            message = f"commit {i}: notes"
        git(root, "add", "-A")
        git(root, "commit", "-qm", message)
        hashes.append(git(root, "rev-parse", "HEAD"))
    return hashes[0], hashes[-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path, help="the scratch checkout")
    parser.add_argument("--scratch", action="store_true", help="create DIR as a copy of this checkout")
    parser.add_argument("--fraction", type=float, help="the slowdown, e.g. 0.05 for 5%%")
    parser.add_argument("--commits", type=int, help="make this many commits (with --at)")
    parser.add_argument("--at", type=int, help="the commit that plants the slowdown (1-based)")
    args = parser.parse_args(argv)
    target = args.dir.resolve()
    if _inside(target, ROOT):
        raise SystemExit("plant_slowdown: DIR must lie outside this checkout (a scratch copy)")
    if args.scratch:
        scratch(target)
        print(f"plant_slowdown: {target}: a copy of {ROOT}, committed as 'base'")
    if args.fraction is None:
        return 0
    if args.fraction <= 0:
        raise SystemExit("plant_slowdown: --fraction must be positive")
    if args.commits:
        good, bad = history(target, args.fraction, args.commits, args.at or args.commits)
        print(f"plant_slowdown: {args.commits} commits in {target}; GOOD {good} BAD {bad}; "
              f"the slowdown is in commit {args.at}")
    else:
        plant(target, args.fraction)
        print(f"plant_slowdown: {target / KERNEL}: the forward waits {args.fraction:.0%} of its time")
    return 0


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


if __name__ == "__main__":
    sys.exit(main())
