"""Problems past the 2^31 boundary, and the tensors behind them.

``BOUNDARY = 2**31`` is the first element offset that a signed 32-bit integer cannot hold: a
kernel that computes ``b * stride_b + h * stride_h + n * stride_n`` in 32 bits reads or writes
the wrong memory past it (a crash, or silently wrong rows). Two kinds of problem reach it:

**Huge** problems: dense contiguous tensors of more than 2^31 elements, cheap in FLOPs (few
queries or keys per head, or a small head dim), laid out so that the boundary falls along one
axis (:data:`AXES`):

    heads    B in {1, 2}, many heads of Nq, Nk <= 4096: the boundary falls in a head of q (and of
             k, v when they are as large); each kv head with its query heads is one problem
    batch    few heads, many batch elements: the boundary falls in a batch element
    rows     one long sequence: q (1, 1, Nq, D) with Nq * D > 2^31, Dv = D and a few keys; the
             boundary falls in the last block of query rows, which starts on a multiple of 128
    varlen   packed sequences (T, H, D) with T * H * D > 2^31: the boundary falls in a sequence

Their tensors come from the device's random generator (:func:`huge_inputs`: gigabytes drawn
on the CPU would take minutes), except the compared units (the one holding the boundary in each
tensor, and the last one), which hold the values of their own small :class:`Problem` (a
*unit problem*, :class:`Unit`): the kernel run on a unit alone is then an ordinary problem, with
its golden and its tolerance (``properties/test_huge.py``).

**Spread** problems (``layout`` one of :data:`SPREAD_LAYOUTS`): the problem's own small
tensors, as views whose S slices along one axis lie ``gap`` elements apart in one allocation
(``gap`` a multiple of 8: 16-byte aligned), the last one starting at
``(S - 1) gap >= 2^31 - 8 floor(W / 16)`` for slices of W elements, within ``8 (S - 1)`` of it:
at least half of the last slice lies past element 2^31, and it straddles 2^31 when it can.
Views with an outer stride that large are legal input, and are what broke real kernels (a
``dout`` viewed out of a concatenation, Dao-AILab/flash-attention#2611; keys stored
sequence-major, pytorch/pytorch#190857). On the CPU the allocation costs address space, not
memory: only the pages the views touch are ever backed, so the CPU tests reach real 2^31-element
offsets in megabytes. ``spread-batch`` puts the gap between batch elements, ``spread-heads``
between heads, ``spread-rows`` between rows (token positions).
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from hypothesis import assume
from hypothesis import strategies as st

from ..contract.capabilities import Capabilities
from ..contract.problem import KernelInputs, Problem
from .strategies import Sizes, problems

#: The first element offset a signed 32-bit integer cannot hold.
BOUNDARY = 2**31
AXES = ("heads", "batch", "rows", "varlen")
#: Spread layouts and how many leading dims of (B, H, N, D) form the slices the gap separates.
SPREAD_LAYOUTS = {"spread-batch": 1, "spread-heads": 2, "spread-rows": 3}
#: Head dims the huge problems draw (among those declared).
HUGE_HEAD_DIMS = (16, 40, 64, 72, 128, 256)
#: Sequence lengths of the heads and batch axes: tile multiples, their neighbours and others.
HUGE_SEQLENS = (1, 17, 63, 64, 127, 128, 129, 255, 256, 511, 512, 1000, 1024, 2048, 4096)
#: CUDA's largest grid y and z dimension: kernels that put batch and heads there launch at most
#: this many of them (``triton``, ``cuda`` refuse more; half the heads and batch draws stay within).
GRID_LIMIT = 65535
#: Rows of the last block of the rows axis: it starts on a multiple of this (every declared
#: tile divides it, so the block's tiles are those of the whole problem).
ROW_BLOCK_ALIGN = 128
#: Batch elements and kv heads of the spread problems (small: only the strides are large).
SPREAD_SIZES = Sizes(max_n=48, max_batch=3, max_kv_heads=3, max_group=2, max_head_dim=128,
                     max_work=400_000)


# ------------------------------------------------------------------------------ memory
def host_reserve_limit() -> int:
    """Bytes one CPU allocation may reserve on this machine (address space, not memory: the
    spread layouts touch only a few pages of theirs). Linux: per ``vm.overcommit_memory``, 0
    (heuristic) refuses an allocation larger than RAM + swap, 1 refuses none, 2 (strict)
    allows what is left of the commit limit; elsewhere 0 (the CPU spread tests skip)."""
    try:
        mode = int(open("/proc/sys/vm/overcommit_memory").read())
        info = {}
        for line in open("/proc/meminfo"):
            name, value = line.split(":")
            info[name] = int(value.split()[0]) * 1024
    except (OSError, ValueError):
        return 0
    if mode == 1:
        return 1 << 50
    if mode == 2:
        return info.get("CommitLimit", 0) - info.get("Committed_AS", 0)
    return info.get("MemTotal", 0) + info.get("SwapTotal", 0)


def device_free_bytes(device: str) -> int:
    """Free memory of the current CUDA device (what a huge problem may use)."""
    if device != "cuda":
        return 0
    free, _ = torch.cuda.mem_get_info()
    return free


@contextlib.contextmanager
def exclusive_device(device: str) -> Iterator[None]:
    """Hold this GPU's scale lock (an ``flock`` in the temp dir, one per GPU by UUID) while a
    huge example runs: ``ci/gpu_check.py`` runs xdist workers (and kernels) at once, and two
    40 GiB examples on one GPU would both run out of memory. Returns the cached memory to the
    device before releasing it. No-op on the CPU."""
    if device != "cuda":
        yield
        return
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    name = str(getattr(props, "uuid", torch.cuda.current_device()))
    path = os.path.join(tempfile.gettempdir(), f"flashprop-scale-{name}.lock")
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            with contextlib.suppress(RuntimeError):  # a lost CUDA context is reported elsewhere
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
            fcntl.flock(handle, fcntl.LOCK_UN)


# ------------------------------------------------------------------------------ shapes
def logical_shapes(p: Problem) -> dict[str, tuple[int, ...]]:
    """Shapes of q, k, v and o (= dO, dq's is q's) of a dense problem, (B, H, N, D)."""
    return {"q": (p.b, p.hq, p.nq, p.d), "k": (p.b, p.hkv, p.nk, p.d),
            "v": (p.b, p.hkv, p.nk, p.dv), "o": (p.b, p.hq, p.nq, p.dv)}


def huge_bytes(p: Problem) -> int:
    """An upper estimate of the device memory a huge problem's forward and backward take:
    inputs, dO and outputs, gradients, a float32 dQ accumulator, dK and dV expanded to the query
    heads (GQA kernels that sum them afterwards), and the compared units' copies."""
    item = p.dtype.itemsize
    if p.seqlens is not None:
        tq, tk = (sum(pair[i] for pair in p.seqlens) for i in (0, 1))
        q, o = tq * p.hq * p.d, tq * p.hq * p.dv
        k, v = tk * p.hkv * p.d, tk * p.hkv * p.dv
    else:
        sizes = {name: math.prod(shape) for name, shape in logical_shapes(p).items()}
        q, k, v, o = sizes["q"], sizes["k"], sizes["v"], sizes["o"]
    group = p.hq // p.hkv
    return item * (2 * q + 3 * o + 2 * k + 2 * v) + 4 * q + item * (group - 1) * (k + v) + (1 << 30)


def spread_geometry(shape: tuple[int, ...], layout: str) -> tuple[tuple[int, ...], int]:
    """Strides and span (elements from the first to one past the last) of a tensor of logical
    ``shape`` in spread ``layout``: the leading dims form S slices, each dense inside, slice s
    starting at ``s * gap``. A tensor with one slice is dense."""
    lead = SPREAD_LAYOUTS[layout]
    count, inner = math.prod(shape[:lead]), math.prod(shape[lead:])
    strides = [0] * len(shape)
    step = 1
    for i in range(len(shape) - 1, lead - 1, -1):
        strides[i] = step
        step *= shape[i]
    if count < 2:
        step = inner
        for i in range(lead - 1, -1, -1):
            strides[i] = step
            step *= shape[i]
        return tuple(strides), count * inner
    before = inner // 16  # eighths of the last slice that may lie below 2^31: at most half of it
    gap = 8 * -(-(BOUNDARY // 8 - before) // (count - 1))
    if gap < inner:
        raise ValueError(f"slices of {inner} elements do not fit {count} times below 2^31")
    step = gap
    for i in range(lead - 1, -1, -1):
        strides[i] = step
        step *= shape[i]
    return tuple(strides), (count - 1) * gap + inner


def spread_span_bytes(p: Problem) -> int:
    """Bytes of the largest allocation behind a spread problem's tensors."""
    return max(spread_geometry(s, p.layout)[1] for s in logical_shapes(p).values()) * p.dtype.itemsize


def spread_view(t: torch.Tensor, layout: str, dtype: torch.dtype, device: str) -> torch.Tensor:
    """Logical (B, H, N, D) ``t`` in spread ``layout``: a view into a fresh allocation of its
    span (on a GPU filled with NaN, so a read between the slices shows; on the CPU left
    untouched, so that only the views' own pages are ever backed)."""
    strides, span = spread_geometry(tuple(t.shape), layout)
    buf = torch.empty(span, dtype=dtype, device=device)
    if device != "cpu":
        buf.fill_(float("nan"))
    view = buf.as_strided(t.shape, strides)
    view.copy_(t.to(dtype))
    return view


def spread_inputs(p: Problem, requires_grad: bool) -> tuple[KernelInputs, torch.Tensor]:
    """A spread problem's kernel inputs (``q, k, v`` in its layout, the values of the same
    problem laid out contiguously) and its dO (in the same layout)."""
    q, k, v, do = p.replace(layout="contiguous").logical()
    views = [spread_view(t, p.layout, p.dtype, p.device) for t in (q, k, v, do)]
    for t in views[:3]:
        t.requires_grad_(requires_grad)
    return KernelInputs(tuple(views[:3]), {}, dict(zip("qkv", views[:3], strict=True))), views[3]


def boundary_note(p: Problem) -> str:
    """Where 2^31 falls in a spread problem's q (for failure reports)."""
    shape = logical_shapes(p)["q"]
    lead = SPREAD_LAYOUTS[p.layout]
    strides, span = spread_geometry(shape, p.layout)
    count = math.prod(shape[:lead])
    last = (count - 1) * strides[lead - 1] if count > 1 else 0
    return (f"q spans {span} elements (strides {strides}); its last {p.layout[7:]} slice starts at "
            f"element {last} = 2^31 - {BOUNDARY - last}")


# ------------------------------------------------------------------------------ declarations
def proxy(p: Problem) -> Problem:
    """The problem a kernel's ``limits`` are asked about: ``p`` with each sequence length cut
    to at most 5 (Nq == Nk, Nq < Nk and Nq > Nk kept as they are), dense and contiguous, its
    batch, heads and number of sequences kept (a limit on B x Hq, a grid dimension, must see
    them: the H200 found a huge varlen problem of 257 sequences x 256 heads drawn as declared
    while the proxy kept two sequences). A limit may build the problem's tensors (the SDPA
    adapters ask PyTorch's dispatcher about the very call), which at 2^31 elements takes
    minutes on the host; size limits belong in ``max_seqlen`` and ``max_elements``, which are
    checked on ``p`` itself."""
    nq = min(p.nq, 4 + (p.nq > p.nk))
    nk = min(p.nk, 4 + (p.nk > p.nq))
    seqlens = None if p.seqlens is None else tuple((min(a, 5), min(b, 5)) for a, b in p.seqlens)
    return p.replace(nq=nq, nk=nk, seqlens=seqlens, layout="contiguous")


def undeclared_reason(caps: Capabilities, p: Problem) -> str | None:
    """Why ``caps`` does not declare the huge or spread problem ``p`` (``None``: it does): its
    fields as they are, its ``limits`` on :func:`proxy` (a spread problem's on its dense twin,
    small already). A spread view spans more than 2^31 elements, beyond a ``max_elements`` of
    2^31 - 1."""
    small = p.replace(layout="contiguous") if p.layout in SPREAD_LAYOUTS else proxy(p)
    reason = caps.unsupported_reason(p, include_limits=False) or caps.unsupported_reason(small)
    if reason is None and p.layout in SPREAD_LAYOUTS and caps.max_elements is not None:
        span = spread_span_bytes(p) // p.dtype.itemsize
        if span > caps.max_elements:
            return f"a view spanning {span} elements > max_elements {caps.max_elements}"
    return reason


# ------------------------------------------------------------------------------ strategies
def _dtypes(caps: Capabilities) -> list[torch.dtype]:
    """16-bit first; float32 where declared; never float64 (16 GiB a tensor)."""
    order = (torch.float16, torch.bfloat16, torch.float32)
    return [dt for dt in order if dt in caps.dtypes]


def _head_dims(caps: Capabilities) -> list[int]:
    return [d for d in HUGE_HEAD_DIMS if d in caps.head_dims]


@st.composite
def huge_problems(draw, caps: Capabilities, axis: str, *, device: str, budget: int,
                  declared: bool = True) -> Problem:
    """A dense problem with a tensor past 2^31 elements along ``axis`` (:data:`AXES`) whose
    memory (:func:`huge_bytes`) fits ``budget`` bytes; ``declared``: one ``caps`` declares,
    else one it does not (the error contract at scale)."""
    dtypes, dims = _dtypes(caps), _head_dims(caps)
    assume(dtypes and dims)
    dtype = draw(st.sampled_from(dtypes))
    d = draw(st.sampled_from(dims))
    dv = d if caps.dv_equals_d or draw(st.booleans()) else draw(st.sampled_from(dims))
    causal = caps.causal and draw(st.booleans())
    scale = draw(st.sampled_from([None, 0.0625, 0.5]))
    if not caps.custom_scale:
        scale = None
    group = draw(st.sampled_from([1, 2, 4] if caps.gqa else [1]))
    tiles = {}
    for name, declared_tiles in (("block_m", caps.block_m), ("block_n", caps.block_n)):
        if declared_tiles:
            tiles[name] = draw(st.sampled_from(sorted(declared_tiles)))
    common = dict(d=d, dv=dv, dtype=dtype, causal=causal, scale=scale, device=device,
                  seed=draw(st.integers(0, 2**31 - 1)), **tiles)
    width = max(d, dv)
    if axis == "rows":
        nk = draw(st.sampled_from([1, 5, 16, 64, 129, 256]))
        row = BOUNDARY // d  # the row holding element 2^31 of q
        start = row // ROW_BLOCK_ALIGN * ROW_BLOCK_ALIGN
        nq = start + draw(st.integers(row - start + 1, row - start + 256))
        # Dv = D: element 2^31 of o, dO and dq lies in the same row as q's, the compared one
        p = Problem(b=1, hq=1, hkv=1, nq=nq, nk=nk, **{**common, "dv": d})
    elif axis == "varlen":
        assume(caps.varlen)
        length = draw(st.sampled_from([512, 1000, 2048]))
        # about 64 or 256 sequences: each 32M or 8M elements (the compared ones are drawn on the
        # CPU), and a description that lists them stays readable
        target = draw(st.sampled_from([64, 256]))
        hkv = -(-BOUNDARY // (target * length * group * width))
        assume(hkv <= 64)
        count = BOUNDARY // (length * hkv * group * width) + 1 + draw(st.integers(0, 2))
        lk = draw(st.sampled_from([length, length // 2 + 1]))
        p = Problem(b=count, hq=hkv * group, hkv=hkv, nq=length, nk=lk,
                    seqlens=((length, lk),) * count, **common)
    else:
        # half the draws (the simplest among them) keep B * Hq within a grid dimension, where
        # most kernels put them
        within_grid = [n for n in HUGE_SEQLENS if -(-BOUNDARY // (n * width)) + 2 <= GRID_LIMIT]
        nq = draw(st.sampled_from(HUGE_SEQLENS if draw(st.booleans()) else within_grid))
        shorter = [n for n in HUGE_SEQLENS if n <= 2 * nq]  # k, v at most twice q's size per head
        nk = draw(st.sampled_from(shorter)) if caps.unequal_lengths and draw(st.booleans()) else nq
        if axis == "heads":
            b = draw(st.sampled_from([1, 2]))
            hkv = -(-(BOUNDARY + 1) // (b * group * nq * width)) + draw(st.integers(0, 1))
        else:
            hkv = draw(st.sampled_from([1, 2]))
            b = -(-(BOUNDARY + 1) // (hkv * group * nq * width)) + draw(st.integers(0, 1))
        p = Problem(b=b, hq=hkv * group, hkv=hkv, nq=nq, nk=nk, **common)
    assume(huge_bytes(p) <= budget)
    reason = undeclared_reason(caps, p)
    if reason is None and declared:  # the units it runs alone must be declared too
        parts = units(p, caps.causal_alignment)
        reason = next(filter(None, (undeclared_reason(caps, u.problem) for u in parts)), None)
    assume((reason is None) == declared)
    if not declared:
        assume(caps.max_elements is not None and reason.startswith("a tensor of"))
    return p


def spread_problems(caps: Capabilities, layout: str, *, device: str, max_bytes: int,
                    declared: bool = True) -> st.SearchStrategy[Problem]:
    """A declared problem of :data:`SPREAD_SIZES` in spread ``layout`` whose q has at least two
    slices and whose largest allocation fits ``max_bytes``; ``declared=False``: one that spans
    more than the kernel's ``max_elements`` (the error contract at scale)."""
    lead = SPREAD_LAYOUTS[layout]

    def fits(p: Problem) -> bool:
        slices = math.prod(logical_shapes(p)["q"][:lead])
        if slices < 2 or spread_span_bytes(p) > max_bytes:
            return False
        reason = undeclared_reason(caps, p)
        if declared:
            return reason is None
        return reason is not None and reason.startswith("a view spanning") and (
            caps.unsupported_reason(p.replace(layout="contiguous")) is None)

    base = problems(caps, device=device, sizes=SPREAD_SIZES, layouts=("contiguous",),
                    dtypes=tuple(_dtypes(caps)) or None)
    spread = base.map(lambda p: p.replace(layout=layout))
    if layout == "spread-rows":
        # half the draws: one (batch, head) slice, whose rows alone span past 2^31; a kernel with
        # 64-bit batch and head offsets and 32-bit offsets within the slice (the triton kernel's
        # until WIDE_ROWS) is wrong only there
        one = spread.filter(lambda p: p.mode == "dense").map(lambda p: p.replace(b=1, hq=1, hkv=1))
        spread = st.one_of(spread, one)
    return spread.filter(fits)


# ------------------------------------------------------------------------------ units
def axis_of(p: Problem) -> str:
    """The axis (:data:`AXES`) along which huge problem ``p`` crosses 2^31: varlen when packed,
    rows for one long sequence (B = Hq = 1), heads when B <= 2 with more than 2 kv heads, else
    batch (the draws of :func:`huge_problems` are one of these by construction)."""
    if p.seqlens is not None:
        return "varlen"
    if p.b == 1 and p.hq == 1:
        return "rows"
    return "heads" if p.b <= 2 and p.hkv > 2 else "batch"


@dataclass(frozen=True)
class Unit:
    """One independent part of a huge problem, compared with the same problem run alone.

    Attributes:
        what: which part, and why it is compared (it holds element 2^31 of a tensor, or is last).
        problem: the part as a problem of its own, whose values the part holds.
        q_index: where its rows sit in q, dO, o and dq of the huge problem.
        lse_index: where its rows sit in lse.
        kv_index: where its keys sit in k, v, dk and dv.
    """

    what: str
    problem: Problem
    q_index: tuple
    lse_index: tuple
    kv_index: tuple


def alone_causal(p: Problem, alignment: str, first_row: int) -> bool:
    """The causal flag of rows ``first_row..Nq-1`` run alone against all keys: the same flag
    bottom-right (the last rows keep their diagonal), none top-left when each of those rows
    sees every key (row i sees keys j <= i)."""
    if not p.causal or alignment == "bottom-right":
        return p.causal
    return first_row < p.nk - 1


def units(p: Problem, alignment: str) -> list[Unit]:
    """The parts of huge problem ``p`` that are compared: per tensor past 2^31 elements the
    unit holding its element 2^31, and the last unit. Units are kv heads with their query heads
    (heads axis), batch elements (batch axis), sequences (varlen), or, for one long sequence,
    its last block of rows (from a multiple of 128 past the row holding element 2^31 of q)."""

    def seed(i: int) -> int:  # each unit its own values
        return (p.seed + 7919 * (i + 1)) % 2**31

    axis = axis_of(p)
    if axis == "rows":
        start = (BOUNDARY // p.d) // ROW_BLOCK_ALIGN * ROW_BLOCK_ALIGN
        sub = p.replace(nq=p.nq - start, causal=alone_causal(p, alignment, start), seed=seed(0))
        rows = (slice(0, 1), slice(0, 1), slice(start, p.nq))
        what = f"rows {start}..{p.nq - 1} (the last; element 2^31 of q is in row {BOUNDARY // p.d})"
        return [Unit(what, sub, rows, rows, ())]
    group = p.hq // p.hkv
    if axis == "varlen":
        lq, lk = p.seqlens[0]
        width = {"q": lq * p.hq * p.d, "k": lk * p.hkv * p.d, "v": lk * p.hkv * p.dv,
                 "o": lq * p.hq * p.dv}
        return [Unit(f"sequence {s} ({what})", p.replace(b=1, seqlens=((lq, lk),), seed=seed(s)),
                     (slice(s * lq, (s + 1) * lq),), (slice(None), slice(s * lq, (s + 1) * lq)),
                     (slice(s * lk, (s + 1) * lk),))
                for s, what in _picked(width, p.b).items()]
    heads = 1 if axis == "heads" else p.hkv  # kv heads per unit
    width = {"q": heads * group * p.nq * p.d, "k": heads * p.nk * p.d, "v": heads * p.nk * p.dv,
             "o": heads * group * p.nq * p.dv}
    out = []
    for u, what in _picked(width, p.b * (p.hkv // heads)).items():
        b, j = divmod(u, p.hkv // heads)
        sub = p.replace(b=1, hq=heads * group, hkv=heads, seed=seed(u))
        q_index = (slice(b, b + 1), slice(j * heads * group, (j + 1) * heads * group))
        name = f"batch element {b}" + (f", kv head {j} with its query heads" if heads == 1 else "")
        out.append(Unit(f"{name} ({what})", sub, q_index, q_index,
                        (slice(b, b + 1), slice(j * heads, (j + 1) * heads))))
    return out


def _picked(width: dict[str, int], count: int) -> dict[int, str]:
    """Unit index -> why it is compared: per tensor (``width``: its elements per unit) the unit
    holding its element 2^31, when it has one, and the last unit."""
    picked: dict[int, list[str]] = {}
    for name, per_unit in width.items():
        u = BOUNDARY // per_unit
        if u < count:
            at = BOUNDARY - u * per_unit
            picked.setdefault(u, []).append(f"element 2^31 of {name} is its element {at}")
    picked.setdefault(count - 1, []).append("the last")
    return {u: "; ".join(reasons) for u, reasons in sorted(picked.items())}


def huge_inputs(p: Problem, alignment: str, requires_grad: bool) -> tuple[KernelInputs, torch.Tensor]:
    """The huge problem's inputs and dO on its device: random (the device's generator, seeded
    by ``p.seed``, standard normal in ``p.dtype``) except the compared :func:`units`, which
    hold their own problems' values. One long sequence: k and v are its unit's, and dO is zero
    outside the unit's rows (so dK and dV are the unit's own)."""
    gen = torch.Generator(device=p.device).manual_seed(p.seed)

    def randn(*shape):
        return torch.randn(shape, generator=gen, dtype=p.dtype, device=p.device)

    parts = units(p, alignment)
    if p.seqlens is not None:
        tq, tk = p.b * p.seqlens[0][0], p.b * p.seqlens[0][1]
        q, k = randn(tq, p.hq, p.d), randn(tk, p.hkv, p.d)
        v, do = randn(tk, p.hkv, p.dv), randn(tq, p.hq, p.dv)
        for part in parts:
            sub_q, sub_k, sub_v, *_ = part.problem.kernel_inputs().args
            q[part.q_index], k[part.kv_index], v[part.kv_index] = sub_q, sub_k, sub_v
            do[part.q_index] = part.problem.grad_output()
        cu_q, cu_k = p.cu_seqlens()
        tensors = (q, k, v)
        args = (*tensors, cu_q, cu_k, p.seqlens[0][0], p.seqlens[0][1])
    else:
        shapes = logical_shapes(p)
        q = randn(*shapes["q"])
        if axis_of(p) == "rows":
            sub_q, k, v = parts[0].problem.inputs()
            k, v = k.detach().clone(), v.detach().clone()
            do = torch.zeros(shapes["o"], dtype=p.dtype, device=p.device)
            q[parts[0].q_index] = sub_q
            do[parts[0].q_index] = parts[0].problem.grad_output()
        else:
            k, v, do = randn(*shapes["k"]), randn(*shapes["v"]), randn(*shapes["o"])
            for part in parts:
                sub_q, sub_k, sub_v = part.problem.inputs()
                q[part.q_index], k[part.kv_index], v[part.kv_index] = sub_q, sub_k, sub_v
                do[part.q_index] = part.problem.grad_output()
        tensors = (q, k, v)
        args = tensors
    for t in tensors:
        t.requires_grad_(requires_grad)
    return KernelInputs(args, {}, dict(zip("qkv", tensors, strict=True))), do
