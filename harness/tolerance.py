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
second term for the logits' size L = max|lse|: a logit of size L is known only to about
eps * L in the accumulation precision (float32, or float64 for float64 inputs), which perturbs
exp() by that relative amount; a plain implementation can be lucky there (a near one-hot
softmax hides it), a tiled one that rescales by exp(m_old - m_new) is not:

    floor += LOGIT_ULPS * eps(accumulation dtype) * L * max(1, magnitude)

In float64 this term is what calibrates: the yardstick *is* a float64 computation like the
golden. A kernel that declares
``fp32_matmul="tf32"`` is judged against a yardstick whose float32 matmuls also run in tf32.

Exact requirements come before the budget: NaN where the golden is finite fails, -inf in lse
must sit exactly where the golden has -inf (empty rows), and empty rows must give o = 0 exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

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


def _finite_max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> tuple[float, tuple[int, ...] | None]:
    both = torch.isfinite(a) & torch.isfinite(b)
    diff = torch.where(both, (a - b).abs(), torch.zeros((), dtype=a.dtype, device=a.device))
    if diff.numel() == 0:
        return 0.0, None
    flat = int(diff.argmax())
    where = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), diff.shape))
    return float(diff.reshape(-1)[flat]), where


def budget(
    name: str, dtype: torch.dtype, yardstick_error: float, magnitude: float, logit_size: float = 0.0
) -> tuple[float, float]:
    """``(budget, floor)`` for tensor ``name`` of a ``dtype`` problem."""
    acc_eps = torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps
    floor = (FLOOR_ULPS[dtype] * torch.finfo(dtype).eps + LOGIT_ULPS * acc_eps * logit_size) * max(
        1.0, magnitude
    )
    return RATIO[name][dtype] * yardstick_error + floor, floor


def compare(
    name: str,
    actual: torch.Tensor,
    golden: torch.Tensor,
    yardstick: torch.Tensor,
    dtype: torch.dtype,
    magnitude: float | None = None,
    logit_size: float = 0.0,
) -> Comparison:
    """Judge ``actual`` against ``golden`` (float64) with the yardstick's error as the scale.

    ``magnitude`` is the tensor's natural magnitude for the floor (default: max|golden|);
    ``logit_size`` is max|lse| of the problem (the floor's logit term)."""
    a = actual.detach().to(torch.float64)
    g = golden.detach().to(device=a.device, dtype=torch.float64)
    y = yardstick.detach().to(device=a.device, dtype=torch.float64)
    if a.shape != g.shape:
        return Comparison.outright(name, f"shape {tuple(a.shape)} != expected {tuple(g.shape)}")
    if magnitude is None:
        finite_g = g[torch.isfinite(g)]
        magnitude = float(finite_g.abs().max()) if finite_g.numel() else 0.0
    y_err, _ = _finite_max_abs_diff(y, g)
    limit, floor = budget(name, dtype, y_err, magnitude, logit_size)
    err, where = _finite_max_abs_diff(a, g)
    reason = ""
    bad_nan = torch.isnan(a) & ~torch.isnan(g)
    inf_mismatch = (torch.isinf(a) | torch.isinf(g)) & (a != g)
    if bad_nan.any():
        where = tuple(int(i) for i in bad_nan.nonzero()[0])
        reason = f"NaN in {int(bad_nan.sum())} elements where the golden is finite"
    elif inf_mismatch.any():
        where = tuple(int(i) for i in inf_mismatch.nonzero()[0])
        reason = f"inf pattern differs from the golden in {int(inf_mismatch.sum())} elements"
    ok = not reason and err <= limit
    act = float(a[where]) if where is not None else None
    exp = float(g[where]) if where is not None else None
    return Comparison(name, ok, err, where, act, exp, limit, y_err, floor, RATIO[name][dtype], reason)
