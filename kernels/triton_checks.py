"""Value checks of the ``triton`` kernel's index inputs, run on the GPU while the call's kernels run.

A decode call's ``cache_seqlens`` and ``block_table`` and a varlen call's ``cu_seqlens_q/k`` are
tensors on the device. Checking their values on the host (``contract.validate``'s
``check_cache_values`` and ``check_cu_values``) reads them back, which waits for everything the
device has queued: the host then enqueues the call's kernels on an idle GPU, and a caller who
launches call after call loses their overlap. (Session 42: on the H200 the varlen forward's
benchmark rows, timed after a spin that covers the host's launch, lost 5-19% to that wait.)

So the kernels read within bounds whatever the values (lengths and boundaries are clamped into
the tensors' extents, page indices into the cache's pages: each kernel's docstring says how), and
the values are checked beside them:

1. before the call's launches, :func:`start_cache_check` or :func:`start_cu_seqlens_check`
   enqueues one small kernel on a side stream of the highest priority (one per device), which
   first waits for what the current stream has enqueued (whatever wrote the inputs); the kernel
   reduces the entries to one int32 flag per program, copied into pinned host memory;
2. the call enqueues its kernels;
3. the returned function waits for that copy alone and, when a flag is set, raises the host
   check's ValueError (its message names what is wrong); the call's outputs are dropped.

On the CPU (the interpreter) the host check runs at once, before the launches. A CUDA graph
cannot capture a call whose host reads the flags: it is refused with NotImplementedError.

Math. Decode: every length in [0, capacity], every block-table entry in [0, num_pages). Varlen,
for each of cu_seqlens_q (T = Tq, M = max_seqlen_q) and cu_seqlens_k (Tk, max_seqlen_k) of B + 1
entries: cu[0] = 0, cu[B] = T and 0 <= cu[s + 1] - cu[s] <= M for every s.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import triton
import triton.language as tl
from flashprop.contract.triton_interpreter import apply_interpreter_fixes
from flashprop.contract.validate import check_cache_values, check_cu_values
from torch import Tensor

apply_interpreter_fixes()  # interpreted, the check kernels' loops have runtime bounds (numpy >= 2.4)

#: A check's block of entries per step and its most programs (each reduces its share to one flag:
#: at most 16 int32 flags for the host to read).
CHECK_BLOCK, CHECK_PROGRAMS = 1024, 16


# ---------------------------------------------------------------------------------------------
# The check kernels
# ---------------------------------------------------------------------------------------------


@triton.jit
def _out_of_range(X, n, cols, stride_r, stride_c, lo, hi, BLOCK: tl.constexpr):
    """1 if any of the ``n`` entries of the (n // cols, cols) int32 tensor ``X`` lies outside
    [lo, hi], else 0; this program's share: every programs-th block of ``BLOCK`` entries."""
    bad = tl.zeros([BLOCK], dtype=tl.int32)
    for start in range(tl.program_id(0) * BLOCK, n, tl.num_programs(0) * BLOCK):
        idx = start + tl.arange(0, BLOCK)
        ok = idx < n
        addr = (idx // cols).to(tl.int64) * stride_r + (idx % cols).to(tl.int64) * stride_c
        x = tl.load(X + addr, mask=ok, other=lo)
        bad = bad | ((x < lo) | (x > hi)).to(tl.int32)
    return tl.max(bad, axis=0)


@triton.jit
def cache_value_check(Lens, n_lens, stride_len, capacity, Table, n_table, cols, stride_tr, stride_tc,
                      num_pages, Flags, BLOCK: tl.constexpr):
    """Flags[program] = 1 if this program found a length outside [0, capacity] or a block-table
    entry outside [0, num_pages), else 0. One launch for both tensors."""
    bad = _out_of_range(Lens, n_lens, n_lens, 0, stride_len, 0, capacity, BLOCK)
    bad = bad | _out_of_range(Table, n_table, cols, stride_tr, stride_tc, 0, num_pages - 1, BLOCK)
    tl.store(Flags + tl.program_id(0), bad)


@triton.jit
def _bad_boundaries(Cu, stride, n, total, max_len, BLOCK: tl.constexpr):
    """1 if the ``n`` int32 boundaries ``Cu`` break cu[0] = 0, cu[n - 1] = ``total`` or
    0 <= cu[s + 1] - cu[s] <= ``max_len``, else 0; this program's share of the differences:
    every programs-th block of ``BLOCK`` (every program checks both ends)."""
    bad = tl.zeros([BLOCK], dtype=tl.int32)
    for start in range(tl.program_id(0) * BLOCK, n - 1, tl.num_programs(0) * BLOCK):
        s = start + tl.arange(0, BLOCK)
        ok = s < n - 1
        lo = tl.load(Cu + s.to(tl.int64) * stride, mask=ok, other=0)
        hi = tl.load(Cu + (s + 1).to(tl.int64) * stride, mask=ok, other=0)
        length = hi.to(tl.int64) - lo
        bad = bad | ((length < 0) | (length > max_len)).to(tl.int32)
    first = tl.load(Cu)
    last = tl.load(Cu + (n - 1).to(tl.int64) * stride)
    return tl.maximum(tl.max(bad, axis=0), ((first != 0) | (last != total)).to(tl.int32))


@triton.jit
def cu_seqlens_check(CuQ, stride_q, total_q, max_q, CuK, stride_k, total_k, max_k, n, Flags,
                     BLOCK: tl.constexpr):
    """Flags[program] = 1 if this program found cu_seqlens_q or cu_seqlens_k (``n`` = B + 1
    entries each) breaking the boundaries' rules (:func:`_bad_boundaries`), else 0. One launch
    for both."""
    bad = _bad_boundaries(CuQ, stride_q, n, total_q, max_q, BLOCK)
    bad = bad | _bad_boundaries(CuK, stride_k, n, total_k, max_k, BLOCK)
    tl.store(Flags + tl.program_id(0), bad)


# ---------------------------------------------------------------------------------------------
# Host side
# ---------------------------------------------------------------------------------------------


@functools.cache
def _check_stream(index: int) -> torch.cuda.Stream:
    """The side stream the value checks of device ``index`` run on (one per device, of the highest
    priority, so that the check's program is dispatched before the call's blocks)."""
    return torch.cuda.Stream(device=index, priority=-1)


def _start(inputs: tuple[Tensor, ...], entries: int, launch: Callable[[int, Tensor], None],
           host_check: Callable[[], None], checked: str) -> Callable[[], None]:
    """Steps 1 and 3 of the module docstring for ``inputs`` (their largest has ``entries``
    entries): ``launch(programs, flags)`` enqueues the check kernel on the side stream; the
    returned function waits for the flags and runs ``host_check`` (which raises) when one is set.
    ``checked`` (e.g. "decode call checks cache_seqlens and block_table") words the refusal of a
    CUDA graph capture."""
    device = inputs[0].device
    if device.type != "cuda":
        host_check()
        return lambda: None
    if torch.cuda.is_current_stream_capturing():
        raise NotImplementedError(f"a {checked} on the host, which a CUDA graph cannot capture")
    if entries == 0:
        return lambda: None
    programs = min(CHECK_PROGRAMS, triton.cdiv(entries, CHECK_BLOCK))
    side = _check_stream(device.index if device.index is not None else torch.cuda.current_device())
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.device(device), torch.cuda.stream(side):
        flags = torch.empty(programs, dtype=torch.int32, device=device)
        launch(programs, flags)
        host = torch.empty(programs, dtype=torch.int32, pin_memory=True)
        host.copy_(flags, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record(side)
    for t in inputs:
        t.record_stream(side)  # the caller's tensors stay allocated until the check has read them

    def finish() -> None:
        copied.synchronize()
        if bool(host.any()):
            host_check()  # raises, with the message

    return finish



def start_cache_check(k_cache: Tensor, cache_seqlens: Tensor, block_table: Tensor | None,
                      capacity: int) -> Callable[[], None]:
    """Begin ``contract.validate.check_cache_values`` (lengths in [0, capacity], block-table
    entries in [0, num_pages)) as the module docstring describes; the returned function ends it.
    (Session 35: the check as a chain of torch reductions enqueued after the launches took a decode
    call 0.02-0.16 ms past the decode on the H100's short rows; this version's timing:
    docs/results/2026-12-05-s36.md.)"""
    table = block_table if block_table is not None else cache_seqlens.view(1, -1)[:, :0]

    def launch(programs: int, flags: Tensor) -> None:
        cache_value_check[(programs,)](
            cache_seqlens, cache_seqlens.numel(), cache_seqlens.stride(0), capacity,
            table, table.numel(), table.shape[1], *table.stride(), k_cache.shape[0], flags,
            BLOCK=CHECK_BLOCK,
        )

    inputs = (cache_seqlens,) if block_table is None else (cache_seqlens, block_table)
    return _start(inputs, max(cache_seqlens.numel(), table.numel()), launch,
                  lambda: check_cache_values(k_cache, cache_seqlens, block_table, capacity),
                  "decode call checks cache_seqlens and block_table")


def start_cu_seqlens_check(cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, total_q: int, total_k: int,
                           max_seqlen_q: int, max_seqlen_k: int) -> Callable[[], None]:
    """Begin ``contract.validate.check_cu_values`` (each boundary tensor from 0 to its packed
    total, non-decreasing, no sequence longer than its ``max_seqlen``) as the module docstring
    describes, on boundaries whose structure ``check_cu_seqlens(values=False)`` has checked (int32,
    1-d, B + 1 >= 2 entries each); the returned function ends it."""

    def launch(programs: int, flags: Tensor) -> None:
        cu_seqlens_check[(programs,)](
            cu_seqlens_q, cu_seqlens_q.stride(0), total_q, max_seqlen_q,
            cu_seqlens_k, cu_seqlens_k.stride(0), total_k, max_seqlen_k, cu_seqlens_q.numel(), flags,
            BLOCK=CHECK_BLOCK,
        )

    def host_check() -> None:
        check_cu_values(cu_seqlens_q, cu_seqlens_k, total_q, total_k, max_seqlen_q, max_seqlen_k)

    return _start((cu_seqlens_q, cu_seqlens_k), cu_seqlens_q.numel(), launch, host_check,
                  "varlen call checks cu_seqlens_q and cu_seqlens_k")
