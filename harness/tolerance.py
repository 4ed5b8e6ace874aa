"""The tolerance model: one place for every error budget in the suite.

Self-calibrating, per tensor (o, lse, dq, dk, dv) and dtype, as the FlashAttention, PyTorch SDPA
and FlexAttention tests do:

    max|X_kernel - X_golden|  <=  r(tensor, dtype) * max|X_yardstick - X_golden|  +  floor

where the golden is float64 (refimpl.golden) and the yardstick is the same attention computed
plainly in the input dtype (refimpl.yardstick): r says how many times worse than a plain
implementation in the same dtype a kernel may be. The floor covers problems where the plain
implementation happens to be (nearly) exact, e.g. N = 1:

    floor = FLOOR_ULPS * eps(dtype) * max(1, magnitude)

that is a few units in the last place of the tensor's natural magnitude: max|X_golden| for o and
lse, and for gradients the golden's absolute-value bound (refimpl.golden, ``bounds=True``), since
a gradient can cancel to ~0 while the terms that produce it (and their rounding) stay large. The floor has a
second term for the size L of the logits, from the problem's conditioning (:func:`conditioning`):

    L = max(scale * max_{i,j} sum_d |q_id| |k_jd|,  max|lse|)

The first is the raw logits' size (before a softcap or a bias; :func:`raw_logit_size`): q.k
summed in any order is known only to about eps * sum_d |q_d k_d|, however small the sum (it can
cancel, and a softcap's tanh passes that error on wherever it does not saturate); the second
covers what the score mods add (ALiBi's bias, a sink). An error of eps * L in a logit perturbs
exp() by that relative amount, and so the weights that average V (o moves by up to that times
max|V|, however small o is: ``values``) and every gradient:

    floor += LOGIT_ULPS * eps(accumulation dtype) * L * max(1, magnitude, values)

In float64 this term is what calibrates: the yardstick rounds as the golden does (the same
matmuls in the same precision), so ``r x yardstick error`` is about 0 there, and a float64 kernel
summing in another order (``ref-reordered``) differs from the golden by about the golden's own error,
which ``meta/test_meta_tolerance.py`` measures against mpmath: at most :data:`GOLDEN_ULPS` units
of ``eps(float64) * max(1, L) * max(1, magnitude, values)``, a quarter of this term or less. A
kernel that declares ``fp32_matmul="tf32"`` is judged against a yardstick whose float32 matmuls
also run in tf32.

FP8 (``docs/variants.md``). The golden reads FP8 inputs exactly (dequantised in float64); o is
bfloat16 and judged at bfloat16's r and floor. Below that, the contract lets a kernel round the
probabilities P to V's FP8 format for the PV product, as FlashAttention-3 does, and the
yardstick rounds them so too (``refimpl/yardstick.py``): its error carries their typical size.
One rounding of P is not another's, though (a kernel's running max is not the yardstick's row
max, so their P round differently, and on one output element the yardstick can be nearly exact:
``meta/test_meta_fp8.py`` keeps two correct answers that ``r x yardstick error`` and bfloat16's
floor alone fail), so o's floor also has the worst case of the rounding the contract allows, computed by
the golden for the very problem (:func:`refimpl.golden.attention_rounding_bound`,
:attr:`Conditioning.rounding`):

    floor += max_bhid  u / l_i * sum_{j: s_ij < m_i} max(e_ij, t) |v_jd|

(u the format's unit roundoff, t its smallest normal, ``e_ij = exp(s_ij - m_i)``; the row's
largest logit is rounded exactly by every such kernel). It is a bound, not a constant: 1/16 of
the weighted mean of |V| for e4m3 at most, less where P is peaked, 0 where one key takes it all.

Exact requirements come before the budget: NaN where the golden is finite fails, -inf in lse
must sit exactly where the golden has -inf (empty rows), and empty rows must give o = 0 exactly.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ..contract.fp8 import dequantised, is_fp8
from ..contract.problem import Problem

#: r: allowed multiple of the yardstick's error, per tensor and dtype. In fp16/bf16 the kernel's
#: fp32 accumulation beats the yardstick, as in FlashAttention's tests (2 forward, 3 backward).
#: In fp32/fp64 both round at the same precision and only the summation order differs; a
#: tiled kernel's sequential k-loop can be several times worse than BLAS's blocked sums
#: (measured up to 6.5x on N = 33, D = 109, logits ~1e3), hence the wider r there.
RATIO: dict[str, dict[torch.dtype, float]] = {
    "o": {torch.float16: 2.0, torch.bfloat16: 2.0, torch.float32: 8.0, torch.float64: 16.0},
    "lse": {torch.float16: 2.0, torch.bfloat16: 2.0, torch.float32: 8.0, torch.float64: 16.0},
    "dq": {torch.float16: 3.0, torch.bfloat16: 3.0, torch.float32: 10.0, torch.float64: 16.0},
    "dk": {torch.float16: 3.0, torch.bfloat16: 3.0, torch.float32: 10.0, torch.float64: 16.0},
    "dv": {torch.float16: 3.0, torch.bfloat16: 3.0, torch.float32: 10.0, torch.float64: 16.0},
    "dsinks": {torch.float16: 3.0, torch.bfloat16: 3.0, torch.float32: 10.0, torch.float64: 16.0},
}
#: Logit-size floor, in units of eps(accumulation dtype) * L * magnitude.
LOGIT_ULPS = 16.0
#: The float64 golden's own error bound, in units of eps(float64) * max(1, L) * max(1, magnitude,
#: values), as meta/test_meta_tolerance.py checks it against mpmath on tiny problems (measured:
#: at most 0.92 units on 1,501 of them, every tensor, docs/tolerance.md). The floor's logit term
#: is LOGIT_ULPS / GOLDEN_ULPS = 4 times it: a kernel as accurate as the golden, in any order,
#: differs from it by at most twice the golden's error.
GOLDEN_ULPS = 4.0
#: Key chunk of :func:`raw_logit_size` (memory O(Nq * chunk), as the golden's).
CHUNK = 1024
#: Floor, in units of eps(dtype) times the golden's magnitude.
FLOOR_ULPS: dict[torch.dtype, float] = {
    torch.float16: 2.0,
    torch.bfloat16: 2.0,
    torch.float32: 16.0,
    torch.float64: 64.0,
}


@dataclass(frozen=True)
class Comparison:
    """The outcome of comparing one tensor of a kernel with the golden."""

    name: str
    ok: bool
    error: float
    where: tuple[int, ...] | None
    actual: float | None
    expected: float | None
    budget: float
    yardstick_error: float
    floor: float
    ratio: float
    reason: str = ""

    @classmethod
    def outright(cls, name: str, reason: str) -> Comparison:
        """A failure that needs no budget: a missing tensor, a wrong shape or dtype."""
        return cls(name, False, float("inf"), None, None, None, 0.0, 0.0, 0.0, 0.0, reason)

    def describe(self) -> str:
        head = f"{self.name}: " + (self.reason + "; " if self.reason else "")
        at = ""
        if self.where is not None:
            at = f" at {self.where} (kernel {self.actual:.6g}, golden {self.expected:.6g})"
        return (
            f"{head}max|err| = {self.error:.3e}{at}; budget {self.budget:.3e} = "
            f"r {self.ratio:g} x yardstick error {self.yardstick_error:.3e} + floor {self.floor:.3e}; "
            f"err / yardstick error = {_safe_div(self.error, self.yardstick_error)}"
        )


def _safe_div(a: float, b: float) -> str:
    return f"{a / b:.3g}" if b > 0 else ("0" if a == 0 else "inf")


def _finite_abs_diff(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a - b| where both are finite, 0 elsewhere."""
    both = torch.isfinite(a) & torch.isfinite(b)
    return torch.where(both, (a - b).abs(), torch.zeros((), dtype=a.dtype, device=a.device))


def _first_true(mask: torch.Tensor) -> torch.Tensor:
    """The flat index of ``mask``'s first True entry (0 when there is none), on its device:
    argmax returns the first of the maximal entries."""
    return mask.reshape(-1).to(torch.uint8).argmax()


def unravel(flat: int, shape: torch.Size) -> tuple[int, ...]:
    """The index in a tensor of ``shape`` of its row-major flat index ``flat``: what
    ``torch.unravel_index`` gives, in plain integers (its first call imports sympy, a quarter of
    a second on a CPU, seconds per process on a GPU machine)."""
    where = []
    for size in reversed(shape):
        flat, i = divmod(flat, size)
        where.append(i)
    return tuple(reversed(where))


@torch.no_grad()
def raw_logit_size(q: torch.Tensor, k: torch.Tensor, scale: float, chunk: int = CHUNK) -> float:
    """``scale * max_{b,h,i,j} sum_d |q_bhid| |k_b,g(h),j,d|`` over every query-key pair of a head
    (visible or not: an upper bound of the visible pairs', with no mask to apply; a non-finite
    entry, as a decode cache's past its length, counts 0), with GQA's
    head map g(h) = h // (Hq // Hkv): what rounding the raw logit ``scale * q_i . k_j`` scales
    with, in any summation order (``|fl(x . y) - x . y| <= gamma_D sum_d |x_d y_d|``). Exact, in
    float64, over key chunks of ``chunk`` (memory O(B Hq Nq chunk)); q (B, Hq, Nq, D),
    k (B, Hkv, Nk, D). 0 when there is no pair."""
    b, hq, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    if q.numel() == 0 or k.numel() == 0:
        return 0.0
    # query heads h of kv head j are j * group .. (j + 1) * group - 1: a group's rows in one matmul
    qa = _finite_abs(q).reshape(b, hkv, (hq // hkv) * nq, d)
    ka = _finite_abs(k).to(qa.device)
    largest = max(float((qa @ ka[:, :, s : s + chunk].transpose(-1, -2)).max()) for s in range(0, nk, chunk))
    return abs(scale) * largest


def _finite_abs(t: torch.Tensor) -> torch.Tensor:
    """|t| in float64, with 0 for the non-finite entries."""
    a = t.detach().abs().to(torch.float64)
    return torch.where(torch.isfinite(a), a, torch.zeros((), dtype=a.dtype, device=a.device))


@dataclass(frozen=True)
class Conditioning:
    """What a problem's floor scales with, from its inputs (:func:`conditioning`).

    Attributes:
        raw_logits: :func:`raw_logit_size` of the problem's q and k.
        values: max|V|, which o averages.
        rounding: the most the rounding the contract allows below o's dtype may move o: FP8's
            probabilities (:func:`refimpl.golden.attention_rounding_bound`); 0 for the others.
    """

    raw_logits: float
    values: float
    rounding: float = 0.0

    def logit_size(self, lse: torch.Tensor) -> float:
        """L: the larger of the raw logits' size and max|lse| over the golden's finite lse."""
        return max(self.raw_logits, finite_max_abs(lse))

    def values_for(self, name: str) -> float:
        """What tensor ``name`` averages, for :func:`budget`'s ``values``: max|V| for o, else 0."""
        return self.values if name == "o" else 0.0

    def rounding_for(self, name: str) -> float:
        """:func:`budget`'s ``rounding`` of tensor ``name``: :attr:`rounding` for o, else 0."""
        return self.rounding if name == "o" else 0.0

    @classmethod
    def of(cls, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
           chunk: int = CHUNK) -> Conditioning:
        """The conditioning of dense (B, H, N, D) ``q, k, v`` at softmax scale ``scale``
        (:func:`raw_logit_size` over key chunks of ``chunk``)."""
        return cls(raw_logit_size(q, k, scale, chunk), finite_max_abs(v))

    @classmethod
    def of_entry(cls, mode: str, args: tuple, scale: float, kwargs: dict | None = None) -> Conditioning:
        """The conditioning of an entry point's leading ``q, k, v`` (``docs/contract.md``): dense
        (B, H, N, D); varlen packed (T, H, D); decode q (B, Nq, H, D) with a cache (B, Nk, Hkv, D)
        or pages (P, page, Hkv, D). Outside the dense layout every query is paired with every key
        of its head group, across sequences: an upper bound, as :func:`conditioning`'s. FP8
        tensors count as the values they stand for under the call's descales (``kwargs``)."""
        q, k, v = args[:3]
        if any(is_fp8(t) for t in (q, k, v)):
            q, k, v = dequantised(mode, args, kwargs or {})
        if mode == "dense":
            return cls.of(q, k, v, scale)
        q, k, v = (t.detach().reshape(-1, *t.shape[-2:]).transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        return cls.of(q, k, v, scale)


@functools.lru_cache(maxsize=16)
def conditioning(problem: Problem) -> Conditioning:
    """The :class:`Conditioning` of ``problem``'s values (its dense logical q, k, v: a varlen
    problem's packed sequence as one, a decode problem's whole cache), on its device."""
    q, k, v, _ = problem.logical()
    dev = torch.device(problem.device)
    return Conditioning.of(q.to(dev), k.to(dev), v, problem.effective_scale)


def finite_max_abs(t: torch.Tensor) -> float:
    """max|t| over its finite entries (0 when there is none)."""
    return float(_finite_abs(t).amax()) if t.numel() else 0.0


def budget(
    name: str,
    dtype: torch.dtype,
    yardstick_error: float,
    magnitude: float,
    logit_size: float = 0.0,
    values: float = 0.0,
    rounding: float = 0.0,
) -> tuple[float, float]:
    """``(budget, floor)`` for tensor ``name`` of a ``dtype`` problem: ``magnitude`` as
    :func:`compare`'s, ``logit_size`` L (:meth:`Conditioning.logit_size`) and ``values`` (what
    the tensor averages: max|V| for o; 0 for the others) scale the logit term; ``rounding``
    (:meth:`Conditioning.rounding_for`: FP8's P) joins the floor as it is."""
    acc_eps = torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps
    floor = (FLOOR_ULPS[dtype] * torch.finfo(dtype).eps * max(1.0, magnitude)
             + LOGIT_ULPS * acc_eps * logit_size * max(1.0, magnitude, values) + rounding)
    return RATIO[name][dtype] * yardstick_error + floor, floor


def compare(
    name: str,
    actual: torch.Tensor,
    golden: torch.Tensor,
    yardstick: torch.Tensor,
    dtype: torch.dtype,
    magnitude: float | None = None,
    logit_size: float = 0.0,
    values: float = 0.0,
    rounding: float = 0.0,
) -> Comparison:
    """Judge ``actual`` against ``golden`` (float64) with the yardstick's error as the scale.

    ``magnitude`` is the tensor's natural magnitude for the floor (default: max|golden|);
    ``logit_size`` is the problem's L and ``values`` what the tensor averages (max|V| for o), the
    floor's logit term (:func:`budget`, :func:`conditioning`); ``rounding`` the floor's FP8 term.
    The errors are over the entries finite in both; a NaN where the golden has none, or an inf
    where the other is not the same inf, fails outright and is where the failure points (its
    first entry). The reductions stay on the tensors' device: two transfers to the host."""
    a = actual.detach().to(torch.float64)
    g = golden.detach().to(device=a.device, dtype=torch.float64)
    y = yardstick.detach().to(device=a.device, dtype=torch.float64)
    if a.shape != g.shape:
        return Comparison.outright(name, f"shape {tuple(a.shape)} != expected {tuple(g.shape)}")
    largest = y_err = err = 0.0
    where = act = exp = None
    reason = ""
    if g.numel():
        diff = _finite_abs_diff(a, g)
        bad_nan = torch.isnan(a) & ~torch.isnan(g)
        inf_mismatch = (torch.isinf(a) | torch.isinf(g)) & (a != g)
        scalars = (_finite_abs(g).amax(), _finite_abs_diff(y, g).amax(), diff.amax(), bad_nan.sum(),
                   inf_mismatch.sum(), diff.reshape(-1).argmax(), _first_true(bad_nan),
                   _first_true(inf_mismatch))
        found = torch.stack([t.to(torch.float64) for t in scalars]).tolist()
        largest, y_err, err, nans, infs, at_max, at_nan, at_inf = found
        if nans:
            at, reason = at_nan, f"NaN in {int(nans)} elements where the golden is finite"
        elif infs:
            at, reason = at_inf, f"inf pattern differs from the golden in {int(infs)} elements"
        else:
            at = at_max
        where = unravel(int(at), g.shape)
        act, exp = torch.stack([a[where], g[where]]).tolist()
    magnitude = largest if magnitude is None else magnitude
    limit, floor = budget(name, dtype, y_err, magnitude, logit_size, values, rounding)
    ok = not reason and err <= limit
    return Comparison(name, ok, err, where, act, exp, limit, y_err, floor, RATIO[name][dtype], reason)
