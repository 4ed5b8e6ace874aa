"""Precision: 16-bit inputs are accumulated in float32, and so is every intermediate a kernel
keeps on the way (the running sum and output accumulator, the soft-capped logits, split-KV
partial outputs and their lse, the lse it returns).

A kernel that accumulates in float32 (FlashAttention and every kernel of the contract) returns,
for fp16/bf16 inputs, the float32-accurate answer rounded once to the input dtype: on average its
error is about the error of rounding the exact (float64) answer to that dtype. A kernel that
rounds an intermediate to the input dtype adds an error of that intermediate's size. The
max-error budget of the golden property cannot see this (one bad rounding hides among the
output's own, and the 16-bit yardstick rounds the same intermediates); the mean can:

    mean|o_kernel - o_golden|      <=  MEAN_RATIO * mean|round(o_golden) - o_golden|  (+ P term)  +  floor
    mean|lse_kernel - lse_golden|  <=  LSE_RATIO  * mean|round(lse_golden) - lse_golden|  +  lse floor

(``round``: to the input dtype; lse over the rows the golden sees a key in). Each intermediate
has problems built so that rounding it shows:

- **accumulators** (dense): Nq 1..48, Nk 128..256, D 1..128, default scale, normal or tied
  keys, the smallest key tile declared (the most accumulation steps). err / rounding of correct
  kernels 1.00 to 1.69 (ref-blocked bf16 with 3-key tiles; 1.52 in fp16, triton fp16 1.52); of
  the same kernels keeping l and the output accumulator in the input dtype between key tiles
  2.85 (triton fp16, 16-key tiles) to 4.67 (ref-blocked fp16, 3-key tiles). Sharp softmaxes
  (large logits, spikes, a scale of 2) hide the accumulator behind one dominant key (mutant
  ratios down to 1.4), hence the flat ones here. MEAN_RATIO = 2.25 sits between the two.
- **softcap** (any declared entry point): rounding ``cap * tanh(s / cap)`` moves each logit by
  about eps * |s|, so the problems bend logits of a few tens: ``large`` q and k (logits of
  standard deviation 64 at the default scale) and a cap of 64 / U(0.75, 2) (32 to 85: tanh
  bends, it does not saturate to +-1, which 16 bits hold exactly). Measured over 120 drawn
  problems: correct ref-blocked o at most 1.36 x rounding, lse below 0.001 x; rounding the
  capped logits to fp16/bf16 at least 2.6 x the o bound or the lse bound (one of them), most
  far more. These problems may have any values, so o may be a cancelling sum (|o| << |v|)
  whose own rounding is far below what rounding P to the input dtype for P V (FlashAttention's
  operand, which the contract allows) moves it by: o's bound adds the P term, the mean over o of
  the golden's bound of that rounding (:func:`refimpl.golden.attention_rounding_bound` with
  ``p_dtype`` the input dtype: ``u / l_i * sum_j max(e_ij, t) |v_jd|``). Without it the correct
  ref-blocked failed 15 of 871 campaign examples (a one-ulp o of -0.0587 from values of about
  1, ``SOFTCAP_CANCELLING`` below). A rounded softcap moves each P by eps * |s|, the tens of
  times P's own rounding that these logits give, so the term leaves the property its power.
- **split-KV and decode** (the KV-cache entry point): tied keys (every ``P = exp(s - m)`` is 1
  exactly, so a correct kernel's only error is the output's final rounding: 1.00 to 1.002 x)
  and values of mean +CANCEL on the first half of each sequence's keys and -CANCEL on the
  rest (:func:`cancelling_inputs`): a split's partial output is about +-CANCEL and the combine
  cancels them to an o of about 1 / sqrt(L), so a partial rounded to 16 bits costs about
  eps * CANCEL against the final rounding's eps / sqrt(L) (measured: at least 9 x the o bound;
  a partial lse rounded to 16 bits at least 2.4 x the lse bound). The partials themselves are
  float32 sums of about CANCEL, so when a draw cancels o far below 1 / sqrt(L) their float32
  rounding exceeds o's own: o's bound adds FP32_ROUNDINGS float32 unit roundoffs of the mean
  over o of ``sum_j P_ij |v_jd|`` (:func:`fp32_term`, the golden on |v|, which bounds every
  partial's size). Without it the correct triton kernel failed a CPU campaign
  (``DECODE_CANCELLING``: o = -2e-4 from partials of +-4); a 16-bit partial errs by thousands of
  times the term.
- **lse** (all of the above): a float32 lse is about 1e-3 x (fp16) or 1e-4 x (bf16) the
  rounding of the golden lse to the input dtype (measured at most 0.0007 x); one rounded to
  the input dtype anywhere (the decode lse, a partial lse) is about 1 x. LSE_RATIO = 0.1.

The contract (README's conventions) also fixes lse's dtype: float32 for 16-bit and float32
inputs; every property checks it (``contract/outputs.py``, in ``harness.check.run_kernel``).
A failure's repro rebuilds the inputs and calls the kernel; the mean errors in the report are
what failed (the golden property's max-error budget passes such kernels).
"""

from __future__ import annotations

import pytest
import torch
from flashprop.contract.capabilities import Capabilities
from flashprop.contract.fp8 import unit_roundoff
from flashprop.contract.problem import KernelInputs, Problem
from flashprop.contract.registry import Kernel
from flashprop.harness.check import (
    REFERENCES,
    ROUNDING,
    Outputs,
    PropertyFailure,
    failure,
    run_kernel,
    run_property,
)
from flashprop.harness.strategies import Sizes, declared, problems
from flashprop.harness.symptoms import Symptom, error_kind
from flashprop.harness.variant_problems import variant_problems
from hypothesis import strategies as st

#: Allowed multiple of the mean error of rounding the golden output to the input dtype.
MEAN_RATIO = 2.25
#: Floor, in units of eps(dtype) times the golden output's mean magnitude.
FLOOR_EPS = 0.05
#: Allowed multiple of the mean error of rounding the golden lse to the input dtype.
LSE_RATIO = 0.1
#: lse floor, in units of eps(float32) times max(1, the golden lse's mean magnitude).
LSE_FLOOR_ULPS = 16.0
LOW_PRECISION = (torch.float16, torch.bfloat16)
FLAT_SOFTMAX = ("normal", "ties")
#: The softcap problems' logit scale: ``large`` q and k give logits of this standard deviation.
LARGE_LOGITS = 64.0
#: The means (+ and -) of the two halves of each sequence's values in the decode problems.
CANCEL = 4.0
#: The float32 term's allowance, in float32 unit roundoffs of the weighted mean of |v|: correct
#: split-KV kernels measured 1.2 (triton) and 1.5 (ref-blocked) on ``DECODE_CANCELLING``; a
#: partial rounded to 16 bits errs by about 2^13 such units (fp16; bf16 2^16).
FP32_ROUNDINGS = 8.0
#: Decode problems: caches up to 2 * max_n = 192 positions, so splits see many tiles.
DECODE_SIZES = Sizes(max_n=96, max_batch=2, max_kv_heads=1, max_group=2, max_head_dim=64)
#: Where a repro imports :func:`cancelling_inputs` from (a checkout or an installed flashprop).
REPRO_MODULE = "flashprop.properties.test_precision"


def _smallest_key_tile(caps: Capabilities) -> dict[str, int]:
    return {"block_n": min(caps.block_n)} if caps.block_n else {}


@st.composite
def long_key_problems(draw, caps: Capabilities, *, device: str) -> Problem:
    """A declared 16-bit problem with 128..256 keys, a few queries, the smallest declared key tile."""
    base: Problem = draw(
        problems(
            caps,
            device=device,
            sizes=Sizes(max_n=48, max_batch=1, max_kv_heads=1, max_group=2, max_head_dim=128),
            dtypes=LOW_PRECISION,
            explicit_scale=False,
            layouts=("contiguous",),
            dists=FLAT_SOFTMAX,
        )
    )
    return declared(caps, base.replace(nk=draw(st.integers(128, 256)), dv=max(base.dv, 16),
                                       **_smallest_key_tile(caps)))


@st.composite
def softcap_problems(draw, caps: Capabilities, *, device: str, sizes: Sizes) -> Problem:
    """A declared 16-bit softcap problem (any declared entry point, no other modifier) whose cap
    bends its logits: ``large`` q and k at the default scale, cap = LARGE_LOGITS / U(0.75, 2)."""
    base: Problem = draw(variant_problems(caps, "softcap", device=device, sizes=sizes,
                                          modifiers=("softcap",), dtypes=LOW_PRECISION))
    cap = round(LARGE_LOGITS / draw(st.floats(0.75, 2.0)), 3)
    return declared(caps, base.replace(dist="large", scale=None, softcap=cap))


@st.composite
def decode_problems(draw, caps: Capabilities, *, device: str) -> Problem:
    """A declared 16-bit KV-cache problem with tied keys (split-KV when declared, no modifier),
    caches of up to 192 positions on the smallest declared key tile."""
    variant = "splits" if caps.declares_variant("splits") else "kvcache"
    base: Problem = draw(variant_problems(caps, variant, device=device, sizes=DECODE_SIZES, modifiers=(),
                                          dtypes=LOW_PRECISION))
    return declared(caps, base.replace(dist="ties", **_smallest_key_tile(caps)))


def _cancelling_logical(p: Problem) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The decode problem's logical q, k, v with ``+CANCEL`` added to the values of the first
    half of each sequence's keys (positions ``j < ceil(L_b / 2)``) and ``-CANCEL`` to the rest."""
    q, k, v, _ = p.logical()
    half = (torch.tensor(p.cache) + 1) // 2
    sign = torch.where(torch.arange(p.nk)[None, :] < half[:, None], 1.0, -1.0).to(v.dtype)
    return q, k, v + CANCEL * sign[:, None, :, None]


def cancelling_inputs(p: Problem) -> tuple[KernelInputs, torch.Tensor]:
    """The decode problem's entry-point arguments on :func:`_cancelling_logical`'s values, and its
    ``dO``: split-KV partials of about +-CANCEL that cancel in the combine."""
    return p.kernel_inputs(logical=_cancelling_logical(p)), p.grad_output()


def _reference_kwargs(kernel: Kernel, p: Problem, inputs: KernelInputs) -> dict:
    return dict(causal=p.causal, scale=p.scale, alignment=kernel.capabilities.causal_alignment,
                **inputs.kwargs)


def _golden(kernel: Kernel, p: Problem, inputs: KernelInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """The float64 golden ``(o, lse)`` of the problem's entry point on ``inputs``."""
    return REFERENCES[p.mode][0](*inputs.args, **_reference_kwargs(kernel, p, inputs))


def p_rounding_term(kernel: Kernel, p: Problem, inputs: KernelInputs) -> float:
    """The P term of o's bound: the mean over o of the most that rounding each probability to the
    input dtype for P V (as the contract allows) moves it, from the golden."""
    bound, _ = ROUNDING[p.mode](*inputs.args, p_dtype=p.dtype, **_reference_kwargs(kernel, p, inputs))
    return float(bound.mean()) if bound.numel() else 0.0


def fp32_term(kernel: Kernel, p: Problem, logical: tuple[torch.Tensor, ...]) -> float:
    """The float32 term of o's bound on cancelling values: FP32_ROUNDINGS float32 unit roundoffs
    of the mean over o of ``sum_j P_ij |v_jd|`` (the golden on ``|v|``), which bounds the size of
    what a float32 kernel sums on the way, split-KV partials included."""
    q, k, v = logical
    golden_abs, _ = _golden(kernel, p, p.kernel_inputs(logical=(q, k, v.abs())))
    if not golden_abs.numel():
        return 0.0
    return FP32_ROUNDINGS * unit_roundoff(torch.float32) * float(golden_abs.mean())


def _mean_errors(p: Problem, out: Outputs, golden_o: torch.Tensor, golden_lse: torch.Tensor,
                 p_term: float = 0.0, f32_term: float = 0.0) -> tuple[list[str], Symptom | None]:
    """What is wrong with the mean errors of o and lse (the bounds above, o's with ``p_term`` and
    ``f32_term``; empty when nothing), and the symptom: the tensors over their bounds, with their
    errors' kinds."""
    details, off = [], []
    rounding = float((golden_o.to(p.dtype).double() - golden_o).abs().mean())
    error = float((out.o.double() - golden_o.to(out.o.device)).abs().mean())
    floor = FLOOR_EPS * torch.finfo(p.dtype).eps * float(golden_o.abs().mean())
    if not error <= MEAN_RATIO * rounding + p_term + f32_term + floor:
        off.append(("o", error_kind(error)))
        term = f" + P's rounding {p_term:.3e}" if p_term else ""
        term += f" + float32 sums {f32_term:.3e}" if f32_term else ""
        details.append(
            f"o: mean|err| = {error:.3e} > {MEAN_RATIO} x mean rounding error {rounding:.3e}{term} + "
            f"floor {floor:.3e}; err / rounding = {error / rounding if rounding else float('inf'):.3g} "
            "(correct fp32-accumulating kernels measure 1.0 to 1.7)"
        )
    seen = torch.isfinite(golden_lse)
    if out.lse is not None and bool(seen.any()):
        g = golden_lse[seen]
        lse_rounding = float((g.to(p.dtype).double() - g).abs().mean())
        lse_error = float((out.lse.double().cpu()[seen.cpu()] - g.cpu()).abs().mean())
        lse_floor = LSE_FLOOR_ULPS * torch.finfo(torch.float32).eps * max(1.0, float(g.abs().mean()))
        if not lse_error <= LSE_RATIO * lse_rounding + lse_floor:
            off.append(("lse", error_kind(lse_error)))
            details.append(
                f"lse: mean|err| = {lse_error:.3e} > {LSE_RATIO} x mean error of rounding it to {p.dtype} "
                f"{lse_rounding:.3e} + floor {lse_floor:.3e}; err / rounding = "
                f"{lse_error / lse_rounding if lse_rounding else float('inf'):.3g} (a float32 lse measures "
                "below 0.001, one rounded to the input dtype about 1)"
            )
    return details, Symptom(tuple(off)) if off else None


def _checker(prop: str, cancelling: bool = False, p_rounding: bool = False):
    """The check of property ``prop``: the mean errors of o and lse on the problem's own inputs,
    or (``cancelling``, o's bound with the float32 term) on :func:`cancelling_inputs`;
    ``p_rounding``: o's bound has the P term."""

    def check(kernel: Kernel, p: Problem) -> None:
        logical = _cancelling_logical(p) if cancelling else None
        inputs = p.kernel_inputs(logical=logical)
        built = (REPRO_MODULE, "cancelling_inputs(p)") if cancelling else None
        out = run_kernel(kernel, p, prop, inputs=inputs)
        p_term = p_rounding_term(kernel, p, inputs) if p_rounding else 0.0
        f32 = fp32_term(kernel, p, logical) if logical is not None else 0.0
        details, symptom = _mean_errors(p, out, *_golden(kernel, p, inputs), p_term=p_term, f32_term=f32)
        if details:
            raise PropertyFailure(failure(kernel, p, prop, details, judged=(), inputs=built, symptom=symptom))

    return check


#: softcap-precision's check: its problems may cancel, so o's bound counts P's rounding.
check_softcap = _checker("softcap-precision", p_rounding=True)
#: The correct ref-blocked's false alarm before the P term (a 68-minute CPU campaign, session 31):
#: o = -0.0587 from values of about 1, one fp16 ulp off, 3.9 x o's rounding over two elements.
SOFTCAP_CANCELLING = Problem(b=1, hq=2, hkv=1, nq=1, nk=64, d=1, dv=1, dtype=torch.float16, dist="large",
                             seed=1556, softcap=64.0, cache=(15,), page_size=64)


#: decode-precision's check: on cancelling values, o's bound counts float32 sums.
check_decode = _checker("decode-precision", cancelling=True)
#: The correct triton kernel's false alarm before the float32 term (a CPU campaign, session 36):
#: two split partials of +4.002 and -4.066 cancel to o = -2.0e-4, whose fp16 rounding (3.7e-8 x
#: 2.25) is below the partials' own float32 rounding (err 2.9e-7; 3.7e-7 in ref-blocked).
DECODE_CANCELLING = Problem(b=1, hq=1, hkv=1, nq=4, nk=240, d=1, dv=1, dtype=torch.float16, dist="ties",
                            seed=1, block_m=16, block_n=16, cache=(127,), page_size=48, num_splits=2)


def _require_low_precision(kernel: Kernel) -> None:
    if not any(dt in kernel.capabilities.dtypes for dt in LOW_PRECISION):
        pytest.skip(f"kernel {kernel.name} declares no 16-bit dtype")


def test_low_precision_inputs_accumulate_in_fp32(run, kernel, device):
    """fp16/bf16 inputs: mean output and lse errors near a float32 computation's."""
    _require_low_precision(kernel)
    run_property(run, kernel, "precision", long_key_problems(kernel.capabilities, device=device),
                 _checker("precision"), weight=0.5)


def test_softcap_in_fp32(run, kernel, device, sizes):
    """fp16/bf16 softcap problems: the capped logits are not rounded to the input dtype."""
    _require_low_precision(kernel)
    if not kernel.capabilities.declares_variant("softcap"):
        pytest.skip(f"kernel {kernel.name} does not declare softcap")
    strategy = softcap_problems(kernel.capabilities, device=device, sizes=sizes)
    run_property(run, kernel, "softcap-precision", strategy, check_softcap, weight=0.5)


def test_decode_in_fp32(run, kernel, device):
    """fp16/bf16 KV-cache decode: split-KV partial outputs and lse, and the returned lse, are
    not rounded to the input dtype."""
    _require_low_precision(kernel)
    if not kernel.capabilities.declares_variant("kvcache"):
        pytest.skip(f"kernel {kernel.name} does not declare a KV-cache entry point")
    run_property(run, kernel, "decode-precision", decode_problems(kernel.capabilities, device=device),
                 check_decode, weight=0.5)
