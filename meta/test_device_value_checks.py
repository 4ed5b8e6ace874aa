"""The triton kernel's device-side value checks agree with the contract's host checks, and the
kernels read within bounds on the malformed index inputs those checks refuse.

A GPU decode or varlen call checks ``cache_seqlens`` / ``block_table`` or ``cu_seqlens_q/k``
with one small kernel beside its own (``kernels/triton_checks.py``) and raises the host check's
error when a flag is set: a flag the check misses is a wrong answer, a flag it raises wrongly a
refused call. Meanwhile the call's kernels run on the malformed values, so they must read within
the tensors whatever the values: varlen boundaries are clamped into the pack
(``triton_attention_kernels._clamped``). The property suite reaches these paths only on a GPU (on
the CPU the entry points check on the host before launching), so here the check kernels run under
the interpreter against ``check_cache_values`` / ``check_cu_values``, and the varlen tile map and
sequence lookup against malformed boundaries. (On a GPU, session 43 ran the varlen forward and
backward on such packs with the check bypassed under compute-sanitizer's memcheck, an H100: no
access outside the tensors; docs/results/2026-12-06-s43.md.)
"""

from __future__ import annotations

import itertools
import os

import pytest
import torch
import triton
import triton.language as tl
from flashprop.kernels import triton_attention_kernels as tak

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1",
    reason="the check kernels on the CPU need TRITON_INTERPRET=1 (set by tox)",
)


def _refuses(check, *args) -> bool:
    try:
        check(*args)
    except ValueError:
        return True
    return False


# ------------------------------------------------------------------------------ decode
def _cache_flags(lengths: torch.Tensor, table: torch.Tensor | None, capacity: int, num_pages: int,
                 programs: int, block: int) -> list[int]:
    from flashprop.kernels.triton_checks import cache_value_check

    t = table if table is not None else lengths.view(1, -1)[:, :0]
    flags = torch.full((programs,), -1, dtype=torch.int32)
    cache_value_check[(programs,)](lengths, lengths.numel(), lengths.stride(0), capacity, t, t.numel(),
                                   t.shape[1], *t.stride(), num_pages, flags, BLOCK=block)
    return flags.tolist()


def _cache_refused(lengths: torch.Tensor, table: torch.Tensor | None, capacity: int,
                   num_pages: int) -> bool:
    from flashprop.contract.validate import check_cache_values

    return _refuses(check_cache_values, torch.empty((num_pages, 1, 1, 1)), lengths, table, capacity)


@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided"])
@pytest.mark.parametrize("programs", [1, 3])
def test_cache_check_flags_exactly_what_the_host_check_refuses(strided: bool, programs: int) -> None:
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
        flags = _cache_flags(lengths, table, capacity, num_pages, programs, block=16)
        assert all(f in (0, 1) for f in flags), flags
        assert any(flags) == _cache_refused(lengths, table, capacity, num_pages), (lengths, table, flags)


def test_a_table_of_no_pages_is_refused_entirely() -> None:
    """With no pages, every block-table entry is out of range (its range [0, -1] is empty)."""
    lengths = torch.zeros(2, dtype=torch.int32)
    table = torch.zeros((2, 1), dtype=torch.int32)
    assert any(_cache_flags(lengths, table, 1, 0, 1, block=16))
    assert _cache_refused(lengths, table, 1, 0)


# ------------------------------------------------------------------------------ varlen
def _cu(lengths: list[int]) -> list[int]:
    return [0, *torch.tensor(lengths).cumsum(0).tolist()]


def _as_tensor(values: list[int], strided: bool) -> torch.Tensor:
    t = torch.tensor(values, dtype=torch.int32)
    return torch.stack((t, torch.full_like(t, 99))).t().reshape(-1)[::2] if strided else t


#: (name, cu_seqlens_q, cu_seqlens_k, Tq, Tk, max_seqlen_q, max_seqlen_k): well-formed packs and
#: one break each, at the first, a middle and the last boundary, of 21 sequences (several
#: 16-entry blocks).
_LENGTHS = [3, 0, 17, 5, 1, 64, 0, 0, 9, 2, 33, 4, 4, 16, 7, 1, 0, 12, 8, 2, 40]
_WELL = _cu(_LENGTHS)
_T, _M = _WELL[-1], max(_LENGTHS)


def _broken(where: int, value: int) -> list[int]:
    out = list(_WELL)
    out[where] = value
    return out


_VARLEN_CASES = [
    ("well-formed", _WELL, _WELL, _T, _T, _M, _M),
    ("every sequence empty", [0, 0, 0], [0, 0, 0], 0, 0, 0, 0),
    ("max_seqlen larger", _WELL, _WELL, _T, _T, _M + 5, 10**6),
    ("a single empty sequence", [0, 0], [0, 0], 0, 0, 0, 0),
    ("q start not 0", _broken(0, 1), _WELL, _T, _T, _M, _M),
    ("k start negative", _WELL, _broken(0, -2), _T, _T, _M, _M),
    ("q end short", _WELL, _WELL, _T + 1, _T, _M, _M),
    ("k end long", _WELL, _broken(len(_WELL) - 1, _T + 3), _T, _T, _M, 10**6),
    ("q decreasing in the middle", _broken(11, _WELL[10] - 1), _WELL, _T, _T, _M, 10**6),
    ("k decreasing at the last", _WELL, _broken(len(_WELL) - 2, _T + 1), _T, _T, _M, 10**6),
    ("max_seqlen_q below the longest", _WELL, _WELL, _T, _T, _M - 1, _M),
    ("max_seqlen_k below the longest", _WELL, _WELL, _T, _T, _M, _M - 1),
]


@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided"])
@pytest.mark.parametrize("programs", [1, 3])
@pytest.mark.parametrize("case", _VARLEN_CASES, ids=[c[0] for c in _VARLEN_CASES])
def test_cu_seqlens_check_flags_exactly_what_the_host_check_refuses(case, strided: bool,
                                                                    programs: int) -> None:
    """Every program writes its flag; a flag is set exactly when ``check_cu_values`` raises."""
    from flashprop.contract.validate import check_cu_values
    from flashprop.kernels.triton_checks import cu_seqlens_check

    _, cu_q, cu_k, tq, tk, mq, mk = case
    q, k = _as_tensor(cu_q, strided), _as_tensor(cu_k, strided)
    flags = torch.full((programs,), -1, dtype=torch.int32)
    cu_seqlens_check[(programs,)](q, q.stride(0), tq, mq, k, k.stride(0), tk, mk, q.numel(), flags,
                                  BLOCK=16)
    assert all(f in (0, 1) for f in flags.tolist()), flags
    assert bool(flags.any()) == _refuses(check_cu_values, q, k, tq, tk, mq, mk), flags


def _clamped(cu: list[int], total: int) -> list[int]:
    """Each sequence's length as the kernels clamp its boundaries into [0, total]."""
    out = []
    for lo, hi in itertools.pairwise(cu):
        start = min(max(lo, 0), total)
        out.append(min(max(hi, start), total) - start)
    return out


_MALFORMED_PACKS = [
    ("well-formed", _WELL),
    ("sequences spanning the whole pack", [0, _T, -5, _T + 5, -1, _T, 0, _T, -9, _T]),
    ("decreasing", [0, 50, 10, 90, _T - 5, 3, _T]),
    ("negative and past the end", [-40, 7, _T + 100, -3, _T]),
    ("not starting at 0", [30, 31, 60, _T]),
]


@pytest.mark.parametrize("sort", [True, False], ids=["sorted", "pack-order"])
@pytest.mark.parametrize("case", _MALFORMED_PACKS, ids=[c[0] for c in _MALFORMED_PACKS])
def test_the_tile_map_stays_within_itself_and_the_pack_on_any_boundaries(
        case, sort: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the boundaries, every entry of the tile map is written, and each names a sequence
    of the pack and a tile within that sequence's clamped rows, or is -1 (past the pack's tiles);
    the passes reading it then read within the pack. On well-formed boundaries it lists every
    tile exactly once."""
    from flashprop.kernels import triton_attention

    _, cu = case
    if not sort:  # a pack past the sort limit keeps its order
        monkeypatch.setattr(triton_attention, "_MAP_SORT_MAX", 0)
    count = len(cu) - 1
    tile_map = triton_attention._tile_map(torch.tensor(cu, dtype=torch.int32), count, _T)
    lengths = _clamped(cu, _T)
    for row in range(4):
        bm = 16 << row
        seqs, tiles = tile_map[row].tolist()
        listed = set()
        for s, t in zip(seqs, tiles):
            assert (s, t) == (-1, -1) or (0 <= s < count and 0 <= t < -(-lengths[s] // bm)), (row, s, t)
            listed.add((s, t))
        if case[0] == "well-formed":
            every = {(s, t) for s in range(count) for t in range(-(-lengths[s] // bm))}
            assert listed - {(-1, -1)} == every and len(every) <= tile_map.shape[-1]


@triton.jit
def _lookup(CuQ, CuK, count, N_Q, N_K, Out):
    """Out[b] = ``_sequence``'s (q_start, n_q, k_start, n_k) of each sequence b < count."""
    for b in range(count):
        q_start, n_q, k_start, n_k = tak._sequence(CuQ, CuK, b, N_Q, N_K)
        tl.store(Out + 4 * b, q_start.to(tl.int32))
        tl.store(Out + 4 * b + 1, n_q)
        tl.store(Out + 4 * b + 2, k_start.to(tl.int32))
        tl.store(Out + 4 * b + 3, n_k)


def test_a_sequence_is_looked_up_within_the_pack_on_any_boundaries() -> None:
    """``_sequence`` (what every pass reads for its sequence) gives 0 <= start and
    start + length <= the pack's rows, for queries and keys, on every malformed pack above;
    well-formed boundaries unchanged."""
    for _, cu in _MALFORMED_PACKS:
        cu_q = torch.tensor(cu, dtype=torch.int32)
        cu_k = torch.tensor(list(reversed(cu)), dtype=torch.int32)  # malformed differently
        count, tk = len(cu) - 1, _T // 2
        out = torch.full((count, 4), -7, dtype=torch.int32)
        _lookup[(1,)](cu_q, cu_k, count, _T, tk, out)
        for (qs, nq, ks, nk), lq, lk in zip(out.tolist(), _clamped(cu, _T), _clamped(cu_k.tolist(), tk)):
            assert 0 <= qs and 0 <= nq == lq and qs + nq <= _T
            assert 0 <= ks and 0 <= nk == lk and ks + nk <= tk
        if cu == _WELL:
            assert out[:, 0].tolist() == cu[:-1] and out[:, 1].tolist() == _LENGTHS
