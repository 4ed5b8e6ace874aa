"""The triton decode's value check kernel agrees with the contract's host check.

``kernels.triton_decode._value_check`` is what a GPU decode call waits for before it returns (a
malformed ``cache_seqlens`` or ``block_table`` raises through ``check_cache_values``, a well-formed
one returns the decode): a flag it misses is a wrong answer from clamped reads, a flag it raises
wrongly a refused call. The property suite reaches it only on a GPU (on the CPU the entry point
checks on the host), so here it runs under the interpreter against ``check_cache_values`` on
contiguous and strided tensors, with out-of-range values at the first, the last and a middle
entry, and with more entries than its programs' first blocks cover.
"""

from __future__ import annotations

import os

import pytest
import torch

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1",
    reason="the value check kernel on the CPU needs TRITON_INTERPRET=1 (set by tox)",
)


def _flags(lengths: torch.Tensor, table: torch.Tensor | None, capacity: int, num_pages: int,
           programs: int, block: int) -> list[int]:
    from flashprop.kernels.triton_decode import _value_check

    t = table if table is not None else lengths.view(1, -1)[:, :0]
    flags = torch.full((programs,), -1, dtype=torch.int32)
    _value_check[(programs,)](lengths, lengths.numel(), lengths.stride(0), capacity, t, t.numel(),
                              t.shape[1], *t.stride(), num_pages, flags, BLOCK=block)
    return flags.tolist()


def _host_refuses(lengths: torch.Tensor, table: torch.Tensor | None, capacity: int,
                  num_pages: int) -> bool:
    from flashprop.contract.validate import check_cache_values

    k_cache = torch.empty((num_pages, 1, 1, 1))
    try:
        check_cache_values(k_cache, lengths, table, capacity)
    except ValueError:
        return True
    return False


@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided"])
@pytest.mark.parametrize("programs", [1, 3])
def test_value_check_flags_exactly_what_the_host_check_refuses(strided: bool, programs: int) -> None:
    """Every program writes its flag (none left at -1); a flag is set exactly when the host check
    raises, for each single bad entry placed anywhere in lengths or table, on either side of the
    range."""
    gen = torch.Generator().manual_seed(0)
    batch, max_pages, num_pages, page = 5, 13, 40, 16  # 65 table entries: several 16-entry blocks
    capacity = max_pages * page

    def fresh() -> tuple[torch.Tensor, torch.Tensor]:
        lengths = torch.randint(0, capacity + 1, (batch * (2 if strided else 1),), generator=gen,
                                dtype=torch.int32)
        table = torch.randint(0, num_pages, (max_pages, batch) if strided else (batch, max_pages),
                              generator=gen, dtype=torch.int32)
        return (lengths[::2], table.t()) if strided else (lengths, table)

    cases = []
    lengths, table = fresh()
    cases.append((lengths, table))
    cases.append((lengths, None))
    for where in (0, batch // 2, batch - 1):
        for bad in (-1, capacity + 1):
            lengths, table = fresh()
            lengths[where] = bad
            cases.append((lengths, table))
    for flat in (0, batch * max_pages // 2, batch * max_pages - 1):
        for bad in (-1, num_pages):
            lengths, table = fresh()
            table[flat // max_pages, flat % max_pages] = bad
            cases.append((lengths, table))
    lengths, table = fresh()
    lengths[1] = capacity  # the bounds themselves are in range
    table[2, 3], table[4, 0] = 0, num_pages - 1
    cases.append((lengths, table))
    for lengths, table in cases:
        flags = _flags(lengths, table, capacity, num_pages, programs, block=16)
        assert all(f in (0, 1) for f in flags), flags
        assert any(flags) == _host_refuses(lengths, table, capacity, num_pages), (lengths, table, flags)


def test_a_table_of_no_pages_is_refused_entirely() -> None:
    """With no pages, every block-table entry is out of range (its range [0, -1] is empty)."""
    lengths = torch.zeros(2, dtype=torch.int32)
    table = torch.zeros((2, 1), dtype=torch.int32)
    assert any(_flags(lengths, table, 1, 0, 1, block=16))
    assert _host_refuses(lengths, table, 1, 0)
