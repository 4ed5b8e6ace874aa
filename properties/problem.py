"""A whole attention problem: shapes, dtype, flags, memory layout, value distribution, seed.

A :class:`Problem` is cheap to draw and to shrink: tensors are made from it by torch's RNG from
``seed`` (on the CPU, in float32 or float64, then cast and moved), so the same problem gives the
same tensors on every machine. :meth:`Problem.repro` prints the few lines that rebuild it.

Layouts (every one a legal input, DESIGN.md):
    contiguous   dense, inside a NaN-filled allocation (reads past either end give NaN)
    transposed   stored (B, N, H, D) and viewed as (B, H, N, D)
    sliced       a view into a larger NaN-filled buffer: NaN neighbours in every dimension
    strided      the head dim has stride 2, NaN in between

Value distributions for q and k (v and dO are always standard normal):
    normal       N(0, 1)
    large        N(0, 64): logits of order +-100, stresses exp range and the max subtraction
    negative     every logit very negative (q >= 0, k <= 0): exp underflows without the max
    rank1        q and k rows are multiples of one direction: sharp, nearly one-hot softmax
    ties         all keys equal: uniform softmax, ties in the running max
    spikes       N(0, 1) plus a few entries of magnitude 30
"""

from __future__ import annotations

import ast
import math
from dataclasses import asdict, dataclass, replace

import torch

LAYOUTS = ("contiguous", "transposed", "sliced", "strided")
DISTRIBUTIONS = ("normal", "large", "negative", "rank1", "ties", "spikes")
DTYPE_NAMES = {
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
    torch.float64: "float64",
}
DTYPES_BY_NAME = {name: dtype for dtype, name in DTYPE_NAMES.items()}
_POISON_PAD = 64


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

    def replace(self, **changes) -> Problem:
        return replace(self, **changes)

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
        return q, k, v, do

    def _place(self, t: torch.Tensor) -> torch.Tensor:
        """Put logical tensor ``t`` (B, H, N, D) into memory per ``layout``; same values."""
        t = t.to(self.dtype)
        nan = float("nan")
        if self.layout == "contiguous":
            buf = torch.full((t.numel() + 2 * _POISON_PAD,), nan, dtype=t.dtype)
            view = buf[_POISON_PAD : _POISON_PAD + t.numel()].view(t.shape)
        elif self.layout == "transposed":
            view = torch.empty(t.shape[0], t.shape[2], t.shape[1], t.shape[3], dtype=t.dtype).transpose(1, 2)
        elif self.layout == "sliced":
            b, h, n, d = t.shape
            buf = torch.full((b + 1, h + 1, n + 2, d + 3), nan, dtype=t.dtype)
            view = buf[1:, 1:, 1 : n + 1, 2 : d + 2]
        elif self.layout == "strided":
            buf = torch.full((*t.shape[:3], 2 * t.shape[3]), nan, dtype=t.dtype)
            view = buf[..., ::2]
        else:
            raise ValueError(f"unknown layout {self.layout!r}")
        view.copy_(t)
        return _to_device(view, self.device)

    def inputs(self, requires_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``q, k, v`` in ``dtype`` and ``layout`` on ``device``."""
        q, k, v, _ = self._values()
        out = tuple(self._place(t) for t in (q, k, v))
        for t in out:
            t.requires_grad_(requires_grad)
        return out

    def grad_output(self) -> torch.Tensor:
        """The upstream gradient ``dO`` (contiguous)."""
        return self._values()[3].to(self.dtype).to(self.device)

    # ---------------------------------------------------------------- reporting
    def describe(self) -> str:
        fields = {k: v for k, v in asdict(self).items() if v is not None}
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
        fields = {k: v for k, v in asdict(self).items() if v is not None}
        parts = [f"{k}={v!r}" for k, v in fields.items() if k != "dtype"]
        parts.append(f"dtype=torch.{DTYPE_NAMES[self.dtype]}")
        return "Problem(" + ", ".join(parts) + ")"

    def repro(self, kernel: str, *, backward: bool = False) -> str:
        """Copy-paste Python (run from the flashprop root) that rebuilds the tensors and calls the kernel."""
        tiles = "".join(
            f", {name}={val}" for name, val in (("block_m", self.block_m), ("block_n", self.block_n)) if val
        )
        lines = [
            "import torch",
            "from kernels import load_kernel",
            "from properties.problem import Problem",
            "from refimpl import attention_golden",
            f"p = {self.constructor()}",
            f"q, k, v = p.inputs(requires_grad={backward})",
            f"o, lse = load_kernel({kernel!r})(q, k, v, causal=p.causal, scale=p.scale{tiles})",
            "o_ref, lse_ref = attention_golden(q, k, v, causal=p.causal, scale=p.scale)",
            "print((o.double() - o_ref).abs().max())",
        ]
        if backward:
            lines += [
                "o.backward(p.grad_output())",
                "print(q.grad, k.grad, v.grad)",
            ]
        return "\n".join(lines)


def _to_device(view: torch.Tensor, device: str) -> torch.Tensor:
    """Move a view to ``device`` keeping its strides and its NaN-poisoned neighbourhood."""
    if device == "cpu":
        return view
    base = view._base if view._base is not None else view
    moved = base.to(device)
    return moved.as_strided(view.shape, view.stride(), view.storage_offset())
