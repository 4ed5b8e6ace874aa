"""``flashprop bench --against REV|KERNEL``: a candidate kernel timed against a base kernel in
one process, interleaved round by round, each row judged by the interval of its time ratio.

The candidate is the ``--bench-kernels`` kernel as the working tree has it (or as it is at
``--candidate REV``); the base is the same kernel at the git revision ``REV`` of the working
folder's repository (:mod:`.revision`: a temporary worktree, imported under another module name),
or a second kernel spec (a registered name, ``module:attr`` or ``file.py:attr``). Each row is a
configuration of the benchmark grid (``benchmarks.grid``; the ``--bench-*`` options narrow it,
``--row LABEL`` picks rows by label).

Per row, under the grid's timing protocol (``benchmarks.timing``: on CUDA each call after an L2
flush and a spin, timed by CUDA events; on the CPU wall-clock time, torch single-threaded): both
kernels are warmed up (``warm_up``: compilation, autotuning, the spin sized for each), then timed
for n rounds, one call of each per round, the candidate first in even rounds and the base first in
odd ones. n is ``--rounds``, else enough for AB_TARGET_SECONDS of timed pairs, within
AB_MIN_ROUNDS..AB_MAX_ROUNDS. The ratio candidate / base, its interval and the verdict are
:mod:`.ab`'s (median of the rounds' log-ratios, seeded bootstrap, REGRESSION only when the whole
interval lies beyond the threshold, default 5%).

Output: the table (base ms, candidate ms, ratio, interval, rounds, verdict per row) under the
clock's line; ``--json FILE`` the same with every round's times; ``--out DIR`` writes ``ab.md``;
the rows are appended to the history (:mod:`.history`; ``--history FILE``, default
``DIR/flashprop-history.jsonl`` with ``--out``, else ``.flashprop/flashprop-history.jsonl``).
Exit status 0 pass, 1 a regression, 2 a usage error or nothing compared.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from flashprop.contract.registry import (
    BUILTIN,
    Kernel,
    KernelSpecError,
    KernelUnavailable,
    default_kernel,
    load_kernel,
)
from flashprop.contract.validate import CLEAR_ERRORS

from .ab import DEFAULT_CONFIDENCE, FASTER, OK, REGRESSION, UNCLEAR, ratio_interval, verdict
from .bench_attention import make_call, skip_reason, unsupported_reason
from .conftest import grid_from, option_or_env, reported_launch
from .grid import SUBSETS, Config, configs
from .history import HISTORY_NAME, Record, append, context
from .revision import RevisionError, commit_of, describe, import_kernel_at, repository_root, worktree
from .timing import CLOCKS, RoundSetup, time_once, warm_up

AB_TARGET_SECONDS = 1.0
AB_MIN_ROUNDS = {"cuda": 30, "cpu": 10}
AB_MAX_ROUNDS = 200
BASE_ALIAS, CANDIDATE_ALIAS = "flashprop_ab_base", "flashprop_ab_candidate"
SKIPPED = "skipped"
#: The grid options ``--against`` reads (``benchmarks/conftest.py``'s, environment included).
GRID_OPTIONS = ("--bench-seqlens", "--bench-head-dims", "--bench-dtypes", "--bench-modes",
                "--bench-variants")


class UsageError(ValueError):
    """A command line ``--against`` cannot run (no such row, an unknown subset)."""


@dataclass(frozen=True)
class Comparison:
    """One row of an A/B run: the candidate's and the base's median seconds, the ratio
    (candidate / base), its interval, the verdict (or ``skipped`` and why), every round's times."""

    kernel: str
    config: str
    base: str
    verdict: str
    rounds: int = 0
    base_s: float | None = None
    candidate_s: float | None = None
    ratio: float | None = None
    lo: float | None = None
    hi: float | None = None
    reason: str | None = None
    candidate_times: list[float] = field(default_factory=list)
    base_times: list[float] = field(default_factory=list)
    candidate_launch: dict[str, str] = field(default_factory=dict)
    base_launch: dict[str, str] = field(default_factory=dict)

    def launch_note(self) -> str:
        """The passes the two sides launched differently (an autotuner that picked other tiles
        in one of them moves the ratio by more than its interval says), or ``""``."""
        mine, theirs = self.candidate_launch, self.base_launch
        differ = [p for p in dict.fromkeys([*theirs, *mine]) if mine.get(p) != theirs.get(p)]
        if not (mine and theirs and differ):
            return ""
        return "; launches differ: " + ", ".join(
            f"{p} base {theirs.get(p, '-')}, candidate {mine.get(p, '-')}" for p in differ)


def ab_rounds(pair_seconds: float, device: str) -> int:
    """Rounds that take AB_TARGET_SECONDS of timed pairs, within the device's minimum and
    AB_MAX_ROUNDS."""
    wanted = math.ceil(AB_TARGET_SECONDS / max(pair_seconds, 1e-6))
    return max(AB_MIN_ROUNDS[device], min(AB_MAX_ROUNDS, wanted))


def interleaved(calls: tuple[Callable[[], object], Callable[[], object]], device: str,
                setups: tuple[RoundSetup, RoundSetup], rounds: int) -> tuple[list[float], list[float]]:
    """Seconds of each of the two calls per round (``timing.time_once``, each after its own
    round setup), the first call first in even rounds, the second first in odd ones."""
    times: tuple[list[float], list[float]] = ([], [])
    for i in range(rounds):
        for side in ((0, 1) if i % 2 == 0 else (1, 0)):
            times[side].append(time_once(calls[side], device, setups[side]))
    return times


def compare(candidate: Kernel, base: Kernel, cfg: Config, device: str,
            setups: tuple[RoundSetup, RoundSetup], threshold: float, rounds: int | None,
            confidence: float = DEFAULT_CONFIDENCE) -> Comparison:
    """Time ``candidate`` against ``base`` on ``cfg`` (module docstring)."""
    row = {"kernel": candidate.name, "config": cfg.label, "base": base.name}
    reason = skip_reason(candidate, candidate.name, cfg) or unsupported_reason(base, base.name, cfg)
    if reason is not None:
        return Comparison(**row, verdict=SKIPPED, reason=reason)
    calls, warm, launches = [], [], []
    for kern, setup in zip((candidate, base), setups):
        try:
            call = make_call(kern, cfg)
            warm.append(warm_up(call, device, setup))
            calls.append(call)
            launches.append(reported_launch(kern.fn))
        except CLEAR_ERRORS as err:
            return Comparison(**row, verdict=SKIPPED, reason=f"{kern.name} refused it: "
                              f"{type(err).__name__}: {err}")
        except torch.cuda.OutOfMemoryError as err:
            torch.cuda.empty_cache()
            return Comparison(**row, verdict=SKIPPED, reason=f"{kern.name}: out of memory ({err})")
    n = rounds or ab_rounds(warm[0].seconds + warm[1].seconds, device)
    c_times, b_times = interleaved((calls[0], calls[1]), device, setups, n)
    interval = ratio_interval(c_times, b_times, confidence=confidence)
    return Comparison(**row, verdict=verdict(interval, threshold), rounds=n,
                      base_s=statistics.median(b_times), candidate_s=statistics.median(c_times),
                      ratio=interval.ratio, lo=interval.lo, hi=interval.hi,
                      candidate_times=c_times, base_times=b_times, candidate_launch=launches[0],
                      base_launch=launches[1])



def table(rows: list[Comparison], confidence: float = DEFAULT_CONFIDENCE) -> list[str]:
    """A markdown table: kernel, configuration, base ms, candidate ms, ratio, interval, rounds,
    verdict (and, when the two sides launched other tiles, which)."""
    lines = [f"| kernel | configuration | base ms | candidate ms | candidate / base | "
             f"{confidence:.0%} interval | rounds | verdict |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.verdict == SKIPPED:
            lines.append(f"| {r.kernel} | {r.config} | - | - | - | - | 0 | skipped: {r.reason} |")
            continue
        lines.append(f"| {r.kernel} | {r.config} | {1e3 * r.base_s:.4g} | {1e3 * r.candidate_s:.4g} | "
                     f"{r.ratio:.4f} | {r.lo:.4f} .. {r.hi:.4f} | {r.rounds} | "
                     f"{r.verdict}{r.launch_note()} |")
    return lines


def summary(rows: list[Comparison], threshold: float) -> tuple[str, int]:
    """The closing line and the exit status: 1 on a regression, 2 when nothing was compared."""
    counts = {v: sum(r.verdict == v for r in rows) for v in (REGRESSION, OK, UNCLEAR, FASTER, SKIPPED)}
    compared = len(rows) - counts[SKIPPED]
    status = 1 if counts[REGRESSION] else 2 if not compared else 0
    word = {0: "pass", 1: "FAIL", 2: "NOTHING COMPARED"}[status]
    return (f"bench --against {word}: {counts[REGRESSION]} regression(s), interval wholly beyond "
            f"+{threshold:.0%} ({counts[OK]} ok, {counts[UNCLEAR]} unclear, {counts[FASTER]} faster, "
            f"{counts[SKIPPED]} skipped)"), status


def is_kernel_spec(text: str) -> bool:
    """Whether ``--against``'s value names a kernel (a registered name, ``module:attr``,
    ``file.py:attr``) rather than a git revision."""
    return text in BUILTIN or ":" in text


def selected_configs(ns: argparse.Namespace, device: str) -> list[Config]:
    """The grid's configurations the command line selects (``--bench-*``, ``--row``)."""
    spec = grid_from(lambda option: option_or_env(option, getattr(ns, option[2:].replace("-", "_"), None)),
                     device)
    subset = option_or_env("--bench-subset", ns.bench_subset)
    if subset and subset not in SUBSETS:
        raise UsageError(f"--bench-subset {subset!r}: known subsets {sorted(SUBSETS)}")
    found = configs(spec, device, subset)
    if not ns.row:
        return found
    labels = {cfg.label: cfg for cfg in found}
    unknown = [row for row in ns.row if row not in labels]
    if unknown:
        shown = "; ".join(list(labels)[:6]) + (" ..." if len(labels) > 6 else "")
        raise UsageError(f"--row {unknown[0]!r} is not a row of the {device} grid the options select "
                         f"(its rows: {shown}; --bench-seqlens/-head-dims/-dtypes/-modes widen it)")
    return [labels[row] for row in ns.row]


@dataclass(frozen=True)
class Sides:
    """The (candidate, base) kernel pairs of a run and how the table names the two sides."""

    pairs: list[tuple[Kernel, Kernel]]
    candidate: str
    base: str
    base_commit: str | None
    candidate_commit: str | None


def load_sides(ns: argparse.Namespace, device: str, stack: contextlib.ExitStack) -> Sides:
    """Load each candidate and its base; the worktrees stay open (in ``stack``) while they run."""
    specs = [s for s in (ns.bench_kernels or "").split(",") if s] or [default_kernel(device)]
    repo = repository_root(Path.cwd())
    base_rev = None if is_kernel_spec(ns.against) else ns.against
    if (base_rev or ns.candidate) and repo is None:
        raise RevisionError(f"{Path.cwd()} is not in a git repository: --against REV and --candidate "
                            "REV name revisions of the working folder's repository")
    base_commit = commit_of(base_rev, repo) if base_rev else None
    cand_commit = commit_of(ns.candidate, repo) if ns.candidate else None
    base_tree = stack.enter_context(worktree(repo, base_commit)) if base_commit else None
    cand_tree = stack.enter_context(worktree(repo, cand_commit)) if cand_commit else None
    pairs = []
    for spec in specs:
        cand = (import_kernel_at(spec, cand_tree, repo, CANDIDATE_ALIAS, f"{spec}@{_short(ns.candidate)}")
                if cand_tree else load_kernel(spec))
        base = (import_kernel_at(spec, base_tree, repo, BASE_ALIAS, f"{spec}@{_short(base_rev)}")
                if base_tree else load_kernel(ns.against))
        pairs.append((cand, base))
    where = (f"at {_named(ns.candidate, cand_commit)}" if cand_commit
             else f"as the working tree has it ({describe(repo) or 'not in git'})" if repo
             else "from the working folder")
    base = f"at {_named(base_rev, base_commit)}" if base_commit else f"kernel {ns.against}"
    return Sides(pairs, where, base, base_commit, cand_commit)


def _named(rev: str, commit: str) -> str:
    """``REV (commit)``, or the commit alone when REV is its hash."""
    return commit[:12] if _short(rev) == commit[:12] else f"{rev} ({commit[:12]})"


def _short(rev: str) -> str:
    """A revision as the table names it: a full commit hash cut to 12 digits, a name as given."""
    full = len(rev) == 40 and all(c in "0123456789abcdef" for c in rev)
    return rev[:12] if full else rev


def _history(ns: argparse.Namespace, rows: list[Comparison], device: str, threshold: float) -> Path | None:
    """Append the compared rows to the history file; its path (``None`` with --no-history)."""
    if ns.no_history:
        return None
    path = Path(ns.history) if ns.history else (Path(ns.out) if ns.out else Path(".flashprop")) / HISTORY_NAME
    shared = context(device)
    if ns.candidate:
        repo = repository_root(Path.cwd())
        shared["revision"] = describe(repo, ns.candidate) if repo else ns.candidate
    records = [
        Record(**shared, source="ab", kernel=r.kernel, config=r.config, metric="1/s",
               speed=1.0 / r.candidate_s, band=threshold / (1 + threshold), status=r.verdict,
               detail={"base": r.base, "base_s": r.base_s, "candidate_s": r.candidate_s,
                       "ratio": r.ratio, "lo": r.lo, "hi": r.hi, "rounds": r.rounds})
        for r in rows if r.verdict != SKIPPED
    ]
    append(path, records)
    return path


def run(ns: argparse.Namespace) -> int:
    """``flashprop bench --against``: load, time every selected row, print and write the results
    (module docstring); the exit status."""
    device = ns.device or ("cuda" if torch.cuda.is_available() else "cpu")
    threshold = ns.threshold
    threads = torch.get_num_threads()
    try:
        if threshold is None or threshold <= 0:
            raise UsageError(f"--threshold must be positive, got {threshold}")
        chosen = selected_configs(ns, device)
        with contextlib.ExitStack() as stack:
            sides = load_sides(ns, device, stack)
            if device == "cpu":
                torch.set_num_threads(1)  # as the grid: kernel and base alike
            setups = (RoundSetup(device), RoundSetup(device))
            rows = [compare(cand, base, cfg, device, setups, threshold, ns.rounds)
                    for cand, base in sides.pairs for cfg in chosen]
    except (UsageError, RevisionError, KernelSpecError, KernelUnavailable) as err:
        print(f"flashprop bench --against: {err}", file=sys.stderr)
        return 2
    finally:
        torch.set_num_threads(threads)
    clock = CLOCKS[device]
    head = [f"Clock: {clock.counts}. Protocol: `{clock.protocol}`.",
            f"A/B: candidate {sides.candidate} against base {sides.base}; each row interleaved round "
            f"by round; threshold +{threshold:.0%}; {DEFAULT_CONFIDENCE:.0%} bootstrap intervals over "
            "rounds (benchmarks/ab.py)", ""]
    lines = [*head, *table(rows)]
    closing, status = summary(rows, threshold)
    history = _history(ns, rows, device, threshold)
    print("\n".join(lines))
    print(closing)
    if history is not None:
        print(f"flashprop bench --against: rows appended to the history {history} (flashprop bench --report)")
    if ns.json:
        data = {"command": "flashprop bench --against", "candidate": sides.candidate, "base": sides.base,
                "base_commit": sides.base_commit, "candidate_commit": sides.candidate_commit,
                "device": device, "timing": clock.protocol, "threshold": threshold,
                "confidence": DEFAULT_CONFIDENCE, "status": status, "summary": closing,
                "rows": [asdict(r) for r in rows]}
        Path(ns.json).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.json).write_text(json.dumps(data, indent=1) + "\n")
    if ns.out:
        Path(ns.out).mkdir(parents=True, exist_ok=True)
        (Path(ns.out) / "ab.md").write_text("\n".join(["# flashprop A/B", "", *lines, "", closing, ""]))
    return status
