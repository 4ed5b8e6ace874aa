"""A whole attention problem: shapes, dtype, flags, memory layout, value distribution, seed.

A :class:`Problem` is cheap to draw and to shrink: tensors are made from it by torch's RNG from
``seed`` (on the CPU, in float32 or float64, then cast and moved), so the same problem gives the
same tensors on every machine. :meth:`Problem.repro` prints the few lines that rebuild it.

Layouts (every one a legal input: the contract takes any strides):
    contiguous   dense, inside a NaN-filled allocation (reads past either end give NaN)
    transposed   stored (B, N, H, D) and viewed as (B, H, N, D)
    sliced       a view into a larger NaN-filled buffer: NaN neighbours in every dimension
    strided      the head dim has stride 2, NaN in between
``grad_layout`` places dO the same ways (``None``: contiguous), apart from q, k and v.

Value distributions for q and k (v and dO are always standard normal):
    normal       N(0, 1)
    large        N(0, 64): logits of order +-100, stresses exp range and the max subtraction
    negative     every logit very negative (q >= 0, k <= 0): exp underflows without the max
    rank1        q and k rows are multiples of one direction: sharp, nearly one-hot softmax
    ties         all keys equal: uniform softmax, ties in the running max
    spikes       N(0, 1) plus a few entries of magnitude 30
    overflow     every logit of every row far above +88 (120 to 240 at the default scale, spread
                 about 3 within a row): float32 ``exp`` overflows unless the row max is subtracted
    underflow    every logit far below -88 (the same, negated): every ``exp`` underflows to 0
                 unless the row max is subtracted

Variants (``docs/variants.md``), each off by default (a dense problem):
    window       ``window_size=(left, right)``
    softcap      ``softcap`` (0: off)
    alibi        ``(shape, max_slope)``: slopes ``max_slope * U(1/4, 1)`` of shape (Hq,) or (B, Hq)
    sinks        the sink logits' distribution: ``negative`` (about -20: no effect), ``positive``
                 (about +3: they dominate small rows), ``mixed`` (N(0, 16)), ``above`` and
                 ``below`` (about 120 above, below, a bound on every logit of the head: the
                 keys' weights ``exp(s - z)`` underflow to 0, or the sink's ``exp(z - max s)``)
    seqlens      varlen: ``((nq_0, nk_0), ...)``, one pair per sequence; ``b`` is their number,
                 ``nq``/``nk`` the largest. Tensors are packed token-major (T, H, D)
    cache        KV-cache decode: ``cache_seqlens`` per batch element; ``nk`` is the capacity;
                 q is (B, Nq, Hq, D), the cache (B, Nk, Hkv, D) or, with ``page_size``, paged
                 (num_pages, page_size, Hkv, D) behind a shuffled ``block_table`` whose unused
                 pages are NaN; cache entries past a sequence's length are NaN
    num_splits   split-KV for decode (``None``: the keyword is not passed)
    dropout      ``(dropout_p, dropout_seed)``: seeded dropout of the probabilities (dense and
                 varlen; ``refimpl/dropout.py``), passed as given, p = 0 included
    fp8          ``(format, shape, placement)``: FP8 inputs (``contract/fp8.py``). Dense and varlen:
                 q, k, v in ``format`` (``e4m3``, ``e5m2``) with ``q_descale``, ``k_descale``,
                 ``v_descale`` of ``shape`` (``tensor``, ``head``, ``batch-head``) and ``dtype``
                 bfloat16 (o's); decode: the cache in ``format`` with ``k_scale``, ``v_scale``
                 (``tensor``, ``head``), q in ``dtype``. The drawn values are quantised under
                 descales drawn per head group (:data:`FP8_PLACEMENTS` says where the values land
                 in the format's range); :meth:`Problem.logical` gives the values the FP8 tensors
                 stand for

The values of q, k, v and dO do not depend on the variant fields but fp8, which quantises them (a
decode problem draws the values of the dense problem with the same B, Nq, Nk and lays them out
differently; varlen draws those of one sequence of length Tq, Tk and cuts it).
:meth:`Problem.kernel_inputs` gives the arguments of the problem's entry point,
:meth:`Problem.logical` the dense (B, H, N, D) tensors behind them.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

from . import fp8 as fp8_format
from .variants import TABLE

LAYOUTS = ("contiguous", "transposed", "sliced", "strided")
DISTRIBUTIONS = ("normal", "large", "negative", "rank1", "ties", "spikes", "overflow", "underflow")
DTYPE_NAMES = {
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
    torch.float64: "float64",
}
DTYPES_BY_NAME = {name: dtype for dtype, name in DTYPE_NAMES.items()}
_POISON_PAD = 64
#: Variant fields whose default is not None (omitted from descriptions when off).
_VARIANT_FIELDS = {"softcap": 0.0}
#: Sink logits per distribution: ``centre + spread * N(0, 1) + side * L_h``, where ``L_h`` bounds
#: every logit of query head h (:meth:`Problem.logit_bounds`): ``above`` lies more than 100 above
#: them all, ``below`` more than 100 below, beyond float32 ``exp``'s range (about 88) either way.
SINKS: dict[str, tuple[float, float, int]] = {
    "negative": (-20.0, 1.0, 0),
    "positive": (3.0, 2.0, 0),
    "mixed": (0.0, 4.0, 0),
    "above": (120.0, 4.0, 1),
    "below": (-120.0, 4.0, -1),
}
#: Where an FP8 problem's values land in the format's range: per head group, the largest |value|
#: is quantised to about ``top * 2^-u`` (u uniform in [0, 1), drawn per descale) with ``top``
#:     full       the format's largest value (448, 57344): values near the top of the range
#:     saturated  4 times it: the largest values clamp at the format's largest (saturation)
#:     subnormal  4 times its smallest normal: most values subnormal or zero
#:     far        as full, of q's values times 2^-12, k's times 2^12 (the logits unchanged) and v's
#:                times 2^10: descales 2^12 away from the others'
FP8_PLACEMENTS = ("full", "saturated", "subnormal", "far")
#: ``far``: the factors of q's, k's and v's drawn values.
FP8_FAR = {"q": 2.0**-12, "k": 2.0**12, "v": 2.0**10}
#: ``overflow`` and ``underflow``: the logits' centre at the default scale 1/sqrt(D) (each row's
#: is 1 to 2 times it) and their spread within a row (standard deviation).
FAR_LOGIT, FAR_SPREAD = 120.0, 3.0


@dataclass
class KernelInputs:
    """The arguments of one call of a problem's entry point.

    ``args`` are positional (``q, k, v`` for dense; plus ``cu_seqlens_q, cu_seqlens_k,
    max_seqlen_q, max_seqlen_k`` for varlen; ``q, k_cache, v_cache`` for decode), ``kwargs`` the
    keywords (variants; ``cache_seqlens``, ``block_table``, ``num_splits`` for decode) and
    ``grads`` the tensors gradients are taken for (``q``, ``k``, ``v`` and ``sinks`` if any)."""

    args: tuple
    kwargs: dict[str, Any]
    grads: dict[str, torch.Tensor]


@dataclass(frozen=True)
class Problem:
    b: int = 1
    hq: int = 1
    hkv: int = 1
    nq: int = 16
    nk: int = 16
    d: int = 16
    dv: int = 16
    dtype: torch.dtype = torch.float32
    causal: bool = False
    scale: float | None = None
    layout: str = "contiguous"
    dist: str = "normal"
    seed: int = 0
    block_m: int | None = None
    block_n: int | None = None
    device: str = "cpu"
    window: tuple[int, int] | None = None
    softcap: float = 0.0
    alibi: tuple[str, float] | None = None
    sinks: str | None = None
    seqlens: tuple[tuple[int, int], ...] | None = None
    cache: tuple[int, ...] | None = None
    page_size: int | None = None
    num_splits: int | None = None
    dropout: tuple[float, int] | None = None
    fp8: tuple[str, str, str] | None = None
    grad_layout: str | None = None

    def replace(self, **changes) -> Problem:
        return replace(self, **changes)

    @property
    def mode(self) -> str:
        """Which entry point the problem calls: ``dense``, ``varlen`` or ``kvcache``."""
        if self.seqlens is not None:
            return "varlen"
        return "kvcache" if self.cache is not None else "dense"

    @property
    def variants(self) -> tuple[str, ...]:
        """The variants in use (``contract.variants.TABLE``'s names, in its order)."""
        return tuple(v.name for v in TABLE if v.used(self))

    @property
    def do_layout(self) -> str:
        """dO's layout: ``grad_layout``, contiguous when that is None."""
        return self.grad_layout or "contiguous"

    @property
    def effective_scale(self) -> float:
        return 1.0 / math.sqrt(self.d) if self.scale is None else self.scale

    @property
    def gen_dtype(self) -> torch.dtype:
        return torch.float64 if self.dtype == torch.float64 else torch.float32

    # ---------------------------------------------------------------- tensors
    def _values(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed)
        dt = self.gen_dtype

        def randn(*shape):
            return torch.randn(*shape, generator=g, dtype=dt)

        qs, ks = (self.b, self.hq, self.nq, self.d), (self.b, self.hkv, self.nk, self.d)
        q, k = randn(*qs), randn(*ks)
        v, do = randn(self.b, self.hkv, self.nk, self.dv), randn(self.b, self.hq, self.nq, self.dv)
        if self.dist == "large":
            q, k = 8 * q, 8 * k
        elif self.dist == "negative":
            q, k = 6 * q.abs(), -6 * k.abs()
        elif self.dist == "rank1":
            u = randn(self.d)
            u = u / u.norm().clamp_min(1e-6)
            q = randn(self.b, self.hq, self.nq, 1).abs() * 8 * u
            k = randn(self.b, self.hkv, self.nk, 1) * 8 * u
        elif self.dist == "ties":
            k = k[:, :, :1].expand(ks).clone()
        elif self.dist == "spikes":
            for t in (q, k):
                # distinct positions: an index_put with repeated indices is nondeterministic on
                # the CPU (threads race on which value lands), so two calls gave different
                # inputs and the golden was computed on other values than the kernel saw
                idx = torch.randperm(t.numel(), generator=g)[: max(1, t.numel() // 50)]
                t.view(-1)[idx] = 30 * torch.sign(randn(idx.numel()))
        elif self.dist in ("overflow", "underflow"):
            q, k = _far_logits(q, k, torch.rand(*qs[:3], 1, generator=g, dtype=dt),
                               1.0 if self.dist == "overflow" else -1.0)
        return q, k, v, do

    def logit_bounds(self) -> torch.Tensor:
        """Per query head h, a bound on every logit it sees: ``scale * max_i |q_i| * max_j |k_j|``
        over the batch (Cauchy-Schwarz; a softcap only shrinks a logit, ALiBi only lowers it)."""
        q, k = self.logical()[:2]
        group = self.hq // self.hkv
        qn = q.norm(dim=-1).amax(dim=(0, 2)) if q.numel() else torch.zeros(self.hq, dtype=q.dtype)
        kn = k.norm(dim=-1).amax(dim=(0, 2)) if k.numel() else torch.zeros(self.hkv, dtype=k.dtype)
        return self.effective_scale * qn * kn.repeat_interleave(group)

    def _sink_logits(self, g: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
        """The (Hq,) sink logits of distribution ``sinks`` (:data:`SINKS`)."""
        centre, spread, side = SINKS[self.sinks]
        z = centre + spread * torch.randn(self.hq, generator=g, dtype=dtype)
        return z + side * self.logit_bounds().to(dtype) if side else z

    def _place(self, t: torch.Tensor, layout: str | None = None) -> torch.Tensor:
        """Put logical tensor ``t`` (B, H, N, D), or a packed (T, H, D), into memory per ``layout``
        (default: the problem's; ``transposed`` swaps the storage order of the two dims before the
        last); same values."""
        layout = layout or self.layout
        t = t if fp8_format.is_fp8(t) else t.to(self.dtype)
        nan = float("nan")
        if layout == "contiguous":
            buf = torch.full((t.numel() + 2 * _POISON_PAD,), nan, dtype=t.dtype)
            view = buf[_POISON_PAD : _POISON_PAD + t.numel()].view(t.shape)
        elif layout == "transposed":
            view = torch.empty(t.transpose(-3, -2).shape, dtype=t.dtype).transpose(-3, -2)
        elif layout == "sliced":
            *outer, n, d = t.shape
            buf = torch.full((*(x + 1 for x in outer), n + 2, d + 3), nan, dtype=t.dtype)
            view = buf[(*(slice(1, None) for _ in outer), slice(1, n + 1), slice(2, d + 2))]
        elif layout == "strided":
            buf = torch.full((*t.shape[:-1], 2 * t.shape[-1]), nan, dtype=t.dtype)
            view = buf[..., ::2]
        else:
            raise ValueError(f"unknown layout {layout!r}")
        view.copy_(t)
        return _to_device(view, self.device)

    def inputs(self, requires_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``q, k, v`` in ``dtype`` and ``layout`` on ``device`` (a dense problem's; for a variant
        problem, the first three arguments of :meth:`kernel_inputs`)."""
        return self.kernel_inputs(requires_grad).args[:3]

    def logical(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The dense (B, H, N, D) values ``q, k, v, dO`` behind the problem, in the generating
        dtype on the CPU: a varlen problem's are one sequence of Tq queries and Tk keys."""
        values = self._drawn()
        if self.fp8 is None:
            return values
        q, k, v, do = values
        q, k, v = self._fp8_raw(q, k, v)
        scales = self.fp8_scales((q, k, v))
        quantised = self._fp8_quantised(q, k, v, scales)
        return (*self._fp8_dequantised(quantised, scales, q.dtype), do)

    def _drawn(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The drawn dense (B, H, N, D) values, before any quantisation: a varlen problem's one
        sequence of Tq queries and Tk keys."""
        if self.seqlens is None:
            return self._values()
        tq, tk = (sum(pair[i] for pair in self.seqlens) for i in (0, 1))
        return self.replace(b=1, nq=tq, nk=tk)._values()

    # ---------------------------------------------------------------- FP8
    def _fp8_names(self) -> tuple[str | None, str, str]:
        """The keywords of q's, k's and v's descales (q has none in decode: it is not FP8)."""
        if self.cache is not None:
            return None, "k_scale", "v_scale"
        return "q_descale", "k_descale", "v_descale"

    def _fp8_raw(self, q: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The drawn values before quantisation: ``far``'s factors applied (:data:`FP8_FAR`)."""
        if self.fp8[2] != "far":
            return q, k, v
        return q * FP8_FAR["q"], k * FP8_FAR["k"], v * FP8_FAR["v"]

    def _by_sequence(self, fn, t: torch.Tensor, d: torch.Tensor | None, which: str):
        """``fn(t, d)``, for varlen per sequence: the packed (1, H, T, D) ``t`` cut into its
        sequences' queries (``which`` q) or keys, each with its row of a (B, Hkv) ``d`` (else
        ``d`` itself), the results put back together along T."""
        if self.seqlens is None:
            return fn(t, d)
        lengths = [pair[0 if which == "q" else 1] for pair in self.seqlens]
        rows = d.expand(self.b, self.hkv) if d is not None and d.dim() == 2 else None
        parts = [fn(part, d if rows is None else rows[s]) for s, part in enumerate(t.split(lengths, dim=2))]
        return torch.cat(parts, dim=2) if parts[0].dim() == 4 else torch.stack(parts)

    def fp8_scales(self, raw: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
                   ) -> dict[str, torch.Tensor]:
        """The descales (float32, CPU) of an FP8 problem by keyword (``q_descale``, ``k_descale``,
        ``v_descale``, or decode's ``k_scale``, ``v_scale``), from its values before quantisation
        (``raw``: :meth:`_fp8_raw`'s, default the problem's own): per head group of the shape,
        ``amax / top * 2^u`` (:data:`FP8_PLACEMENTS`; 1 for a group of zeros or no values)."""
        if raw is None:
            raw = self._fp8_raw(*self._drawn()[:3])
        fmt, shape, placement = self.fp8
        info = torch.finfo(fp8_format.FORMATS[fmt])
        top = {"full": info.max, "saturated": 4 * info.max, "subnormal": 4 * info.smallest_normal,
               "far": info.max}[placement]
        g = torch.Generator().manual_seed(self.seed + 3)
        out = {}
        for name, t, which in zip(self._fp8_names(), raw, "qkv", strict=True):
            if name is None:
                continue
            amax = self._amax(t, shape, which)
            jitter = torch.exp2(torch.rand(amax.shape, generator=g, dtype=torch.float64))
            d = torch.where(amax > 0, amax.double() / top * jitter, torch.ones_like(jitter))
            out[name] = d.to(torch.float32)
        return out

    def _amax(self, t: torch.Tensor, shape: str, which: str) -> torch.Tensor:
        """max|t| per head group of descale ``shape``: (), (Hkv,) or (B, Hkv) (varlen: per
        sequence); 0 where a group holds no value. ``t`` is (B, H, N, D) (or packed)."""
        def per_batch_head(x: torch.Tensor, _: object = None) -> torch.Tensor:
            flat = x.detach().abs().reshape(x.shape[0], self.hkv, -1)
            return flat.amax(-1) if flat.shape[-1] else flat.new_zeros((x.shape[0], self.hkv))

        per_bh = self._by_sequence(per_batch_head, t, None, which)
        per_bh = per_bh.reshape(-1, self.hkv)
        if shape == "batch-head":
            return per_bh
        return per_bh.amax(0) if shape == "head" else per_bh.amax()

    def _fp8_quantised(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       scales: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Logical ``q, k, v`` as the problem's FP8 tensors under ``scales`` (q unchanged in decode)."""
        fmt = self.fp8[0]
        out = []
        for name, t, which in zip(self._fp8_names(), (q, k, v), "qkv", strict=True):
            if name is None:
                out.append(t)
                continue
            hkv = self.hkv

            def quantise(x: torch.Tensor, d: torch.Tensor, hkv: int = hkv) -> torch.Tensor:
                return fp8_format.quantise(x, d, hkv, fmt)

            out.append(self._by_sequence(quantise, t, scales[name], which))
        return out[0], out[1], out[2]

    def _fp8_dequantised(self, tensors: tuple[torch.Tensor, ...], scales: dict[str, torch.Tensor],
                         dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The values FP8 ``tensors`` (:meth:`_fp8_quantised`'s) stand for, in ``dtype``."""
        out = []
        for name, t, which in zip(self._fp8_names(), tensors, "qkv", strict=True):
            if name is None:
                out.append(t)
                continue

            def values(x: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
                return fp8_format.dequantise(x, d, self.hkv).to(dtype)

            out.append(self._by_sequence(values, t, scales[name], which))
        return out[0], out[1], out[2]

    def grad_output(self) -> torch.Tensor:
        """The upstream gradient ``dO``, shaped as the entry point's output (dense (B, Hq, Nq, Dv),
        varlen (Tq, Hq, Dv)) and placed in memory per ``grad_layout`` (``None``: contiguous): a
        model that stores its activations (B, N, H, D) hands the kernel a transposed dO."""
        do = self.logical()[3]
        if self.seqlens is not None:
            do = do[0].transpose(0, 1)
        return self._place(do, self.do_layout)

    def cu_seqlens(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Varlen ``cu_seqlens_q, cu_seqlens_k`` (int32, B + 1, on the problem's device)."""
        out = []
        for i in (0, 1):
            lengths = torch.tensor([0, *(pair[i] for pair in self.seqlens)], dtype=torch.int64)
            out.append(lengths.cumsum(0).to(torch.int32).to(self.device))
        return out[0], out[1]

    def variant_kwargs(self, requires_grad: bool = False) -> dict[str, Any]:
        """The variant keywords of the call: ``window_size``, ``softcap``, ``alibi_slopes``,
        ``sinks`` (float32 whatever the problem's dtype, as ``docs/variants.md`` fixes them) and
        ``dropout_p``, ``dropout_seed``, and an FP8 problem's descales (:meth:`fp8_scales`, on its
        device), only those in use."""
        kw: dict[str, Any] = {}
        if self.window is not None:
            kw["window_size"] = tuple(self.window)
        if self.softcap:
            kw["softcap"] = float(self.softcap)
        g = torch.Generator().manual_seed(self.seed + 1)
        if self.alibi is not None:
            shape, top = self.alibi
            dims = (self.hq,) if shape == "head" else (self.b, self.hq)
            kw["alibi_slopes"] = (top * (0.25 + 0.75 * torch.rand(dims, generator=g))).to(self.device)
        if self.sinks is not None:
            z = self._sink_logits(g, torch.float32)
            kw["sinks"] = z.to(self.device).requires_grad_(requires_grad)
        if self.dropout is not None:
            kw["dropout_p"], kw["dropout_seed"] = float(self.dropout[0]), int(self.dropout[1])
        if self.fp8 is not None:
            kw.update({name: d.to(self.device) for name, d in self.fp8_scales().items()})
        return kw

    def kernel_inputs(
        self,
        requires_grad: bool = False,
        logical: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    ) -> KernelInputs:
        """The arguments of the problem's entry point (``mode``), from the problem's own values or
        from ``logical`` dense (B, H, N, D) ``q, k, v`` of the same shapes as :meth:`logical`'s."""
        q, k, v = logical if logical is not None else self.logical()[:3]
        kw = self.variant_kwargs(requires_grad)
        if self.fp8 is not None:  # the values under the problem's descales (exact for its own)
            scales = {n: d.cpu() for n, d in kw.items() if n in self._fp8_names()}
            q, k, v = self._fp8_quantised(q, k, v, scales)
        if self.mode == "dense":
            args: tuple = tuple(self._place(t) for t in (q, k, v))
        elif self.mode == "varlen":
            cu_q, cu_k = self.cu_seqlens()
            longest = [max((pair[i] for pair in self.seqlens), default=0) for i in (0, 1)]
            args = (*(self._place(t[0].transpose(0, 1)) for t in (q, k, v)), cu_q, cu_k, *longest)
        else:
            args = (self._place(q.transpose(1, 2)), *self._cache(k, v, kw))
        for t in args[:3]:
            t.requires_grad_(requires_grad)
        grads = dict(zip("qkv", args[:3], strict=True))
        if "sinks" in kw:
            grads["sinks"] = kw["sinks"]
        return KernelInputs(args, kw, grads)

    def _cache(
        self, k: torch.Tensor, v: torch.Tensor, kw: dict[str, Any]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The decode cache of logical (B, Hkv, Nk, D) keys and values: NaN past each sequence's
        length; paged behind a shuffled block table whose spare pages are NaN. Adds the cache
        keywords to ``kw``."""
        kc, vc = (t.transpose(1, 2).clone() for t in (k, v))  # (B, Nk, Hkv, D)
        lengths = list(self.cache)
        for b, n in enumerate(lengths):
            kc[b, n:], vc[b, n:] = float("nan"), float("nan")
        kw["cache_seqlens"] = torch.tensor(lengths, dtype=torch.int32).to(self.device)
        if self.num_splits is not None:
            kw["num_splits"] = self.num_splits
        if self.page_size is None:
            return self._place(kc), self._place(vc)
        size, per_seq = self.page_size, self.nk // self.page_size
        g = torch.Generator().manual_seed(self.seed + 2)
        spare = self.seed % 3
        order = torch.randperm(self.b * per_seq + spare, generator=g)
        table = order[: self.b * per_seq].view(self.b, per_seq)
        pages = []
        for t in (kc, vc):
            paged = torch.full((len(order), size, *t.shape[2:]), float("nan"), dtype=t.dtype)
            paged[table.reshape(-1)] = t.reshape(self.b * per_seq, size, *t.shape[2:])
            pages.append(self._place(paged))
        kw["block_table"] = table.to(torch.int32).to(self.device)
        return pages[0], pages[1]

    # ---------------------------------------------------------------- reporting
    def _fields(self) -> dict:
        """The fields worth printing: dense fields unless None, variant fields unless off."""
        return {
            k: v
            for k, v in asdict(self).items()
            if v is not None and not (k in _VARIANT_FIELDS and v == _VARIANT_FIELDS[k])
        }

    def describe(self) -> str:
        fields = self._fields()
        fields["dtype"] = DTYPE_NAMES[self.dtype]
        return "Problem(" + ", ".join(f"{k}={v!r}" for k, v in fields.items()) + ")"

    @classmethod
    def parse(cls, text: str) -> Problem:
        """The problem that :meth:`describe` (or :meth:`constructor`) printed: ``Problem(b=2, ...,
        dtype='float16')``. Only literal keyword values are read (no code is run)."""
        tree = ast.parse(text.strip(), mode="eval").body
        if not (isinstance(tree, ast.Call) and isinstance(tree.func, ast.Name) and tree.func.id == "Problem"):
            raise ValueError(f"not a Problem(...) description: {text!r}")
        fields = {}
        for kw in tree.keywords:
            if kw.arg == "dtype" and isinstance(kw.value, ast.Attribute):  # torch.float16
                fields["dtype"] = kw.value.attr
            else:
                fields[kw.arg] = ast.literal_eval(kw.value)
        if "dtype" in fields:
            fields["dtype"] = DTYPES_BY_NAME[fields["dtype"]]
        return cls(**fields)

    def constructor(self) -> str:
        fields = self._fields()
        parts = [f"{k}={v!r}" for k, v in fields.items() if k != "dtype"]
        parts.append(f"dtype=torch.{DTYPE_NAMES[self.dtype]}")
        return "Problem(" + ", ".join(parts) + ")"

    def repro(
        self,
        kernel: str,
        *,
        judged: Sequence[str] = ("o", "lse"),
        returns_lse: bool = True,
        inputs: tuple[str, str] | None = None,
        replay: str | None = None,
        malformed: tuple[str, Sequence[str]] | None = None,
    ) -> str:
        """Python (a script, run from the folder the kernel spec is relative to) that rebuilds the
        problem's tensors, calls the problem's entry point (``mode``: ``attn``, ``attn.varlen`` or
        ``attn.kvcache``) written out with the keywords the suite passes (``Kernel.call``), takes
        the gradients of o (for ``dO = grad_output()``) when a gradient is ``judged``, and hands
        the ``judged`` outputs (``o``, ``lse``, ``dq``, ``dk``, ``dv``, ``dsinks``) to
        :func:`harness.repro.show`, which judges each against the golden as the suite does and
        exits 1 when one fails. A kernel that raises raises at its call. ``returns_lse``: the
        kernel returns ``(o, lse)`` (else ``o`` alone, and lse is not judged). ``inputs``:
        ``(module, expression)`` of a function returning ``(KernelInputs, dO)`` that builds the
        tensors instead (the huge and spread layouts of ``harness.scale_problems``). With nothing
        ``judged`` the script only makes the call. ``replay``: the command that replays the
        property on the problem, which ``show`` runs when this one call is within budget (the
        property compares runs, or runs transformed inputs). ``malformed``: ``(corruption,
        keywords)``, a malformed call (``harness.variant_problems.MALFORMED``) that must be
        refused: the script builds the corrupted inputs (``malformed_inputs``), passes the
        ``keywords`` of that call from them and makes the call under
        :func:`harness.repro.must_refuse`, which exits 1 unless it raises a clear error."""
        if malformed is not None:
            return self._malformed_repro(kernel, returns_lse, *malformed)
        judged = [n for n in judged if returns_lse or n != "lse"]
        backward = any(n in _GRADIENTS for n in judged)
        lines = ["import torch", "from flashprop.contract.problem import Problem",
                 "from flashprop.contract.registry import load_kernel"]
        if judged:
            lines.append("from flashprop.harness.repro import show")
        if inputs is not None:
            module, expression = inputs
            lines.append(f"from {module} import {expression.split('(')[0]}")
        lines += [
            f"p = {self.constructor()}",
            f"kernel = load_kernel({kernel!r})",
            "attn = kernel.fn",
            f"inp, do = {expression}" if inputs is not None
            else f"inp = p.kernel_inputs({'requires_grad=True' if backward else ''})",
            f"{', '.join(_ARGS[self.mode])} = inp.args",
        ]
        keywords = self._call_keywords()
        lines += [f"{name} = inp.kwargs[{name!r}]" for name, literal in keywords if literal is None]
        entry = "attn" if self.mode == "dense" else f"attn.{self.mode}"
        lines += _call(
            "o, lse" if returns_lse else "o",
            entry,
            _ARGS[self.mode],
            [f"{name}={name if literal is None else literal}" for name, literal in keywords],
        )
        if backward:
            wrt = ("q", "k", "v", *(("sinks",) if self.sinks is not None else ()))
            grad_output = "do" if inputs is not None else "p.grad_output()"
            lines.append(f"{', '.join('d' + t for t in wrt)} = torch.autograd.grad("
                         f"o, ({', '.join(wrt)}), {grad_output}, allow_unused=True)")
        if judged:
            then = [] if replay is None else [f"replay={replay!r}"]
            lines.append(f"show(p, kernel, {', '.join([*(f'{n}={n}' for n in judged), *then])})")
        return "\n".join(lines)

    def _malformed_repro(self, kernel: str, returns_lse: bool, corruption: str,
                         keywords: Sequence[str]) -> str:
        """:meth:`repro` of a malformed call: causal, scale and the tiles as the suite passes them,
        every other keyword (``keywords``) and the arguments from the corrupted inputs."""
        entry = "attn" if self.mode == "dense" else f"attn.{self.mode}"
        target = "o, lse" if returns_lse else "o"
        words = [f"causal={self.causal!r}", *([f"scale={self.scale!r}"] if self.scale is not None else []),
                 *(f"{name}={name}" for name in keywords),
                 *(f"{name}={val!r}" for name, val in (("block_m", self.block_m), ("block_n", self.block_n))
                   if val is not None)]
        return "\n".join([
            "import torch", "from flashprop.contract.problem import Problem",
            "from flashprop.contract.registry import load_kernel",
            "from flashprop.harness.repro import must_refuse",
            "from flashprop.harness.variant_problems import malformed_inputs",
            f"p = {self.constructor()}",
            f"kernel = load_kernel({kernel!r})",
            "attn = kernel.fn",
            f"inp = malformed_inputs(p, {corruption!r})",
            f"{', '.join(_ARGS[self.mode])} = inp.args",
            *(f"{name} = inp.kwargs[{name!r}]" for name in keywords),
            f"with must_refuse({corruption!r}):",
            *("    " + line for line in _call(target, entry, _ARGS[self.mode], words)),
        ])

    def _call_keywords(self) -> list[tuple[str, str | None]]:
        """The keywords the suite passes to the entry point (``Kernel.call``): causal, scale and
        the tiles unless None, and :meth:`kernel_inputs`'s keywords (the variants', the cache's),
        as ``(name, literal)``; ``literal`` is None for a tensor, taken from that ``kwargs``."""
        kw: list[tuple[str, str | None]] = [("causal", repr(self.causal))]
        if self.scale is not None:
            kw.append(("scale", repr(self.scale)))
        if self.window is not None:
            kw.append(("window_size", repr(tuple(self.window))))
        if self.softcap:
            kw.append(("softcap", repr(float(self.softcap))))
        kw += [(name, None) for name, field in (("alibi_slopes", self.alibi), ("sinks", self.sinks))
               if field is not None]
        if self.dropout is not None:
            kw += [("dropout_p", repr(float(self.dropout[0]))), ("dropout_seed", repr(int(self.dropout[1])))]
        if self.fp8 is not None:
            kw += [(name, None) for name in self._fp8_names() if name is not None]
        if self.cache is not None:
            kw.append(("cache_seqlens", None))
            if self.num_splits is not None:
                kw.append(("num_splits", repr(self.num_splits)))
            if self.page_size is not None:
                kw.append(("block_table", None))
        kw += [(name, repr(val)) for name, val in (("block_m", self.block_m), ("block_n", self.block_n))
               if val is not None]
        return kw


#: The positional arguments of each entry point, as the repro names them.
_ARGS = {
    "dense": ("q", "k", "v"),
    "varlen": ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k"),
    "kvcache": ("q", "k_cache", "v_cache"),
}
#: The gradients a repro may judge (of q, k, v and sinks).
_GRADIENTS = ("dq", "dk", "dv", "dsinks")
#: Columns a repro line keeps within before the call is folded.
_REPRO_WIDTH = 100


def _call(target: str, entry: str, args: Sequence[str], keywords: Sequence[str]) -> list[str]:
    """``target = entry(args, keywords)``: one line, or folded (the arguments on a line, the
    keywords on lines of at most ``_REPRO_WIDTH`` columns)."""
    line = f"{target} = {entry}({', '.join([*args, *keywords])})"
    if len(line) <= _REPRO_WIDTH:
        return [line]
    lines = [f"{target} = {entry}(", f"    {', '.join(args)},"]
    for word in keywords:
        if len(lines) > 2 and len(lines[-1]) + len(word) + 2 <= _REPRO_WIDTH:
            lines[-1] += f" {word},"
        else:
            lines.append(f"    {word},")
    return [*lines, ")"]


def _far_logits(
    q: torch.Tensor, k: torch.Tensor, rows: torch.Tensor, sign: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k (standard normal) made into ``overflow`` (``sign`` +1) or ``underflow`` (-1) values:
    ``q_id = (1 + rows_i) c (1 + sigma x_id)`` and ``k_jd = sign c (1 + sigma y_jd)`` with
    ``c^2 sqrt(D) = FAR_LOGIT``, so at the scale 1/sqrt(D) the logit of row i is
    ``sign (1 + rows_i) FAR_LOGIT (1 + sigma (mean_d x + mean_d y) + ...)``: centre 1 to 2 times
    FAR_LOGIT (``rows`` in [0, 1)), spread ``sigma sqrt(2/D) FAR_LOGIT = FAR_SPREAD`` (times the
    row's factor), every logit more than ten spreads from the centre beyond +-88."""
    d = q.shape[-1]
    c = math.sqrt(FAR_LOGIT / math.sqrt(d))
    sigma = FAR_SPREAD / (FAR_LOGIT * math.sqrt(2 / d))
    return (1 + rows) * c * (1 + sigma * q), sign * c * (1 + sigma * k)


def _to_device(view: torch.Tensor, device: str) -> torch.Tensor:
    """Move a view to ``device`` keeping its strides and its NaN-poisoned neighbourhood."""
    if device == "cpu":
        return view
    base = view._base if view._base is not None else view
    moved = base.to(device)
    return moved.as_strided(view.shape, view.stride(), view.storage_offset())
