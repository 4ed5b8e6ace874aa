"""Known failures: tests a kernel is expected to fail for now, each with its reason.

    python -m pytest --kernel my_kernel.py:attention --known-failures known.txt

The file lists one test per line: its pytest node id, as ``pytest --collect-only -q`` prints it,
then `` # `` and why it fails. The reason is required. An id without its ``[kernel]`` part
covers every kernel of the run; lines that start with ``#`` are comments::

    # my kernel, 2026-11-30
    properties/test_robustness.py::test_empty_rows  # NaN on rows that see no key (issue 12)
    properties/test_golden.py::test_backward_matches_golden[my_kernel.py:attention]  # dQ of GQA

A listed test runs as a strict expected failure (``pytest.mark.xfail(strict=True)``): its
failure is reported as expected, with the reason; a pass fails the run (``XPASS(strict)``),
so that the entry goes once the bug is fixed. Entries that match no collected test (a typo, or
a test that was not selected) are listed at the end of the run.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import pytest


@dataclass(frozen=True)
class KnownFailure:
    """One entry: the node id it covers, why the test fails, and where the entry is written."""

    node_id: str
    reason: str
    where: str

    def covers(self, node_id: str) -> bool:
        """The test ``node_id`` is this entry's, or this entry names it without its parameters."""
        return node_id == self.node_id or node_id.split("[", 1)[0] == self.node_id


class _Item(Protocol):
    nodeid: str

    def add_marker(self, marker: pytest.MarkDecorator) -> None: ...


def parse(path: Path) -> list[KnownFailure]:
    """The entries of a known-failures file; ``ValueError`` names a line without a reason."""
    entries = []
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        node_id, _, reason = (part.strip() for part in line.partition(" # "))
        if not reason:
            raise ValueError(f"{path}:{number}: expected 'NODE_ID  # reason', got {raw!r}")
        entries.append(KnownFailure(node_id, reason, f"{path}:{number}"))
    return entries


def mark(items: Iterable[_Item], entries: list[KnownFailure]) -> list[KnownFailure]:
    """Mark every item an entry covers as a strict expected failure; the entries that cover
    none of the items."""
    used = set()
    for item in items:
        entry = next((e for e in entries if e.covers(item.nodeid)), None)
        if entry is not None:
            reason = f"known failure ({entry.where}): {entry.reason}"
            item.add_marker(pytest.mark.xfail(reason=reason, strict=True))
            used.add(entry)
    return [e for e in entries if e not in used]
