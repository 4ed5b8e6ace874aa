"""The triton varlen passes' tile map lists each tile of the pack once, longest sequence first.

``kernels.triton_attention_kernels._pack_tile_map`` decides which programs of the varlen
forward and dQ (query tiles, over cu_seqlens_q) and dK/dV (key tiles, over cu_seqlens_k) run
which (sequence, tile): a tile it leaves out is a block of o and lse, or of a gradient, never
written, one it lists twice is written twice, and the entries past the pack's tiles must be -1
(their programs exit). The property suite sees only the outputs, on whichever tile size a run
takes (the interpreter's 32, the GPU's tuned 64 or 128), so here every row of the map runs under
the interpreter against the list built in Python, on packs with zero-length sequences, ties, one
longer than a chunk of the kernel's loop, and more sequences than a chunk; in both orders (the
longest first, and pack order past the kernel's sort limit).
"""

from __future__ import annotations

import os

import pytest
import torch

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1",
    reason="the tile map kernel on the CPU needs TRITON_INTERPRET=1 (set by tox)",
)


def _expected(lengths: list[int], block_m: int, map_len: int, by_length: bool) -> tuple[list[int], list[int]]:
    order = sorted(range(len(lengths)), key=lambda s: -lengths[s]) if by_length else range(len(lengths))
    seqs = [s for s in order for _ in range(-(-lengths[s] // block_m))]
    tiles = [t for s in order for t in range(-(-lengths[s] // block_m))]
    pad = [-1] * (map_len - len(seqs))
    return seqs + pad, tiles + pad


@pytest.mark.parametrize("lengths", [
    [5], [0], [0, 0, 3], [16, 17, 0, 128, 129, 1], [300, 2, 0, 45],
    [(7 * i) % 23 for i in range(70)],  # more sequences than one chunk of 64, zeros among them
], ids=lambda v: f"B{len(v)}")
@pytest.mark.parametrize("by_length", [True, False], ids=["longest-first", "pack-order"])
def test_tile_map_rows_list_every_tile_once_in_order(lengths: list[int], by_length: bool,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from flashprop.kernels import triton_attention
    from flashprop.kernels.triton_attention import TILE_SIZES, _tile_map

    if not by_length:  # a pack past the sort limit keeps its order
        monkeypatch.setattr(triton_attention, "_MAP_SORT_MAX", len(lengths) - 1)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    total = int(cu[-1])
    tile_map = _tile_map(cu, len(lengths), total)
    map_len = -(-total // 16) + len(lengths)
    assert tuple(tile_map.shape) == (len(TILE_SIZES), 2, map_len)
    for row, block_m in enumerate(TILE_SIZES):
        seqs, tiles = _expected(lengths, block_m, map_len, by_length)
        assert tile_map[row, 0].tolist() == seqs, block_m
        assert tile_map[row, 1].tolist() == tiles, block_m
        # a pass's grid, cdiv(T, BM) + B programs per head, covers every listed tile
        assert -(-total // block_m) + len(lengths) >= sum(s >= 0 for s in seqs)
