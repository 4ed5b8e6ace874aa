"""FP8 (``docs/variants.md``): the relations the descales must keep, beyond the golden.

Golden agreement of FP8 problems is ``test_variants.py``'s (``fp8-forward`` and
``fp8-cache-forward``, from the variant table). These compare runs of one kernel:

    fp8-descale-equivariance   each FP8 tensor's values times 2^-j (or 2^j) and its descale times
                               2^j (2^-j) give the same answer: only the product of the two is
                               the value (a kernel that reads the FP8 values as they are, or
                               applies a descale where it should not, answers differently)
    fp8-head-independence      changing the descales of one head group (one kv head, of one batch
                               element or sequence for (B, Hkv) descales) changes that group's
                               rows only, and to the golden's answer for the new descales (a
                               kernel that reads one descale for every head fails here)
    fp8-cache-dequantised      decode from an FP8 cache with its scales gives what the same kernel
                               gives from that cache dequantised to q's dtype, unscaled (where
                               q's dtype holds those values)

Two runs are compared within the sum of their tolerance-model budgets plus the difference of
their goldens (``harness.agreement``; 0 when a rescaling by a power of two is exact, more where
it rounds subnormal values or a dequantised cache is rounded to q's dtype): the triangle
inequality, no new tolerance.
"""

from __future__ import annotations

import pytest
import torch
from flashprop.contract.fp8 import FORMATS
from flashprop.contract.problem import KernelInputs, Problem
from flashprop.contract.registry import Kernel
from flashprop.harness.agreement import (
    FORWARD,
    assert_agree,
    budgets,
    pairs,
    references_on,
    total,
)
from flashprop.harness.check import Outputs, assert_close_to_golden, run_kernel, run_property
from flashprop.harness.strategies import Sizes
from flashprop.harness.variant_problems import variant_problems

#: The FP8 variants: FP8 q, k, v (dense, varlen) and an FP8 KV cache (decode).
VARIANTS = ("fp8", "fp8-cache")
#: The powers of two the descales are moved by.
EXPONENTS = (1, 2, 4)


def _require(kernel: Kernel, variant: str) -> None:
    if not kernel.capabilities.declares_variant(variant):
        pytest.skip(f"kernel {kernel.name} does not declare variant {variant!r}")


def _scale_names(p: Problem) -> tuple[tuple[int, str], ...]:
    """The FP8 tensors of ``p``'s call by position, with their descale keywords."""
    if p.cache is not None:
        return (1, "k_scale"), (2, "v_scale")
    return (0, "q_descale"), (1, "k_descale"), (2, "v_descale")


def _goldens_apart(a: tuple[Outputs, Outputs], b: tuple[Outputs, Outputs]) -> dict[str, float]:
    """max|g_a - g_b| per forward tensor over the entries finite in both goldens."""
    out = {}
    for name in FORWARD:
        ga, gb = getattr(a[0], name), getattr(b[0], name)
        both = torch.isfinite(ga) & torch.isfinite(gb)
        out[name] = float((ga - gb)[both].abs().max()) if both.any() else 0.0
    return out


def _limits(kernel: Kernel, p: Problem, a: KernelInputs, b: KernelInputs) -> dict[str, float]:
    """Both runs' budgets plus their goldens' difference, per tensor."""
    refs_a, refs_b = references_on(kernel, p, a), references_on(kernel, p, b)
    return total(budgets(p.dtype, refs_a), budgets(p.dtype, refs_b), _goldens_apart(refs_a, refs_b))


def _strategy(kernel: Kernel, variant: str, device: str, sizes: Sizes, **kw):
    return variant_problems(kernel.capabilities, variant, device=device, sizes=sizes, **kw)


# ------------------------------------------------------------------------------ equivariance
def _rescaled(p: Problem) -> tuple[KernelInputs, list[str]]:
    """``p``'s inputs with each FP8 tensor's values times ``2^e`` and its descale times ``2^-e``:
    ``e = +j`` where the largest value has room for it, else ``-j`` (j drawn from
    :data:`EXPONENTS` per tensor by the problem's seed), and what was done, one line a tensor."""
    inp = p.kernel_inputs()
    top = torch.finfo(FORMATS[p.fp8[0]]).max
    g = torch.Generator().manual_seed(p.seed + 5)
    done = []
    for pos, name in _scale_names(p):
        t = inp.args[pos]
        j = EXPONENTS[int(torch.randint(len(EXPONENTS), (), generator=g))]
        largest = float(t.float().nan_to_num(0.0).abs().max()) if t.numel() else 0.0
        e = j if largest * 2.0**j <= top else -j
        t.copy_((t.float() * 2.0**e).to(t.dtype))  # in place: the layout's strides and poison stay
        inp.kwargs[name] = inp.kwargs[name] * 2.0**-e
        done.append(f"{name}: values x 2^{e}, descale x 2^{-e}")
    return inp, done


@pytest.mark.parametrize("variant", VARIANTS)
def test_fp8_descale_equivariance(run, kernel, device, sizes, variant):
    """The values times 2^e and the descale times 2^-e, tensor by tensor: the same answer."""
    _require(kernel, variant)
    prop = "fp8-descale-equivariance"

    def check(kernel: Kernel, p: Problem) -> None:
        base = p.kernel_inputs()
        moved, done = _rescaled(p)
        a, b = run_kernel(kernel, p, prop, inputs=base), run_kernel(kernel, p, prop, inputs=moved)
        what = "rescaled FP8 inputs against the problem's own: " + "; ".join(done)
        assert_agree(kernel, p, prop, what, pairs(a, b), _limits(kernel, p, base, moved))

    run_property(run, kernel, prop, _strategy(kernel, variant, device, sizes), check, weight=0.5)


# ------------------------------------------------------------------------------ head groups
def _group(p: Problem) -> tuple[int | None, int]:
    """The head group whose descales :func:`test_fp8_head_independence` changes: its batch
    element (or sequence; ``None`` for descales of shape (Hkv,): every batch element) and kv head,
    drawn by the problem's seed."""
    g = torch.Generator().manual_seed(p.seed + 6)
    h = int(torch.randint(p.hkv, (), generator=g))
    b = int(torch.randint(p.b, (), generator=g)) if p.fp8[1] == "batch-head" else None
    return b, h


def _groups(p: Problem) -> int:
    """How many head groups ``p``'s descales tell apart."""
    return {"tensor": 1, "head": p.hkv, "batch-head": p.hkv * p.b}[p.fp8[1]]


def _in_group(p: Problem, name: str, shape: tuple[int, ...], group: tuple[int | None, int]) -> torch.Tensor:
    """Which entries of output ``name`` (o or lse, of ``shape``) belong to ``group``'s query heads
    (and its batch element or sequence)."""
    b, h = group
    heads = slice(h * (p.hq // p.hkv), (h + 1) * (p.hq // p.hkv))
    mask = torch.zeros(shape, dtype=torch.bool)
    if p.mode == "varlen":  # o (Tq, Hq, Dv), lse (Hq, Tq)
        start = sum(q for q, _ in p.seqlens[:b]) if b is not None else 0
        rows = slice(start, start + p.seqlens[b][0]) if b is not None else slice(None)
        if name == "o":
            mask[rows, heads] = True
        else:
            mask[heads, rows] = True
    elif p.mode == "kvcache" and name == "o":  # o (B, Nq, Hq, Dv)
        mask[slice(None) if b is None else b, :, heads] = True
    else:  # o (B, Hq, Nq, Dv), lse (B, Hq, Nq)
        mask[slice(None) if b is None else b, heads] = True
    return mask


def _regrouped(p: Problem) -> tuple[KernelInputs, tuple[int | None, int], str]:
    """``p``'s inputs with the descales of one head group (:func:`_group`) times 2, 1/2 or 4 each
    (drawn by the seed: not all 1), the group and what was done."""
    inp = p.kernel_inputs()
    group = _group(p)
    g = torch.Generator().manual_seed(p.seed + 7)
    factors = [(2.0, 0.5, 4.0)[int(torch.randint(3, (), generator=g))] for _ in _scale_names(p)]
    b, h = group
    for (_, name), c in zip(_scale_names(p), factors, strict=True):
        d = inp.kwargs[name].clone()
        d[(h,) if b is None else (b, h)] *= c
        inp.kwargs[name] = d
    where = f"kv head {h}" + ("" if b is None else f" of batch element {b}")
    done = ", ".join(f"{name} x {c:g}" for (_, name), c in zip(_scale_names(p), factors, strict=True))
    return inp, group, f"descales of {where} changed ({done})"


@pytest.mark.parametrize("variant", VARIANTS)
def test_fp8_head_independence(run, kernel, device, sizes, variant):
    """New descales for one head group: the other groups' rows are unchanged, the group's own
    are the golden's for the new descales."""
    _require(kernel, variant)
    caps = kernel.capabilities
    shapes = caps.fp8.descales if variant == "fp8" else caps.fp8.cache_scales
    if shapes <= {"tensor"}:
        pytest.skip(f"kernel {kernel.name} declares descales per tensor only: no head groups to tell apart")
    prop = "fp8-head-independence"

    def check(kernel: Kernel, p: Problem) -> None:
        base = p.kernel_inputs()
        moved, group, what = _regrouped(p)
        a, b = run_kernel(kernel, p, prop, inputs=base), run_kernel(kernel, p, prop, inputs=moved)
        limits = total(budgets(p.dtype, references_on(kernel, p, base)),
                       budgets(p.dtype, references_on(kernel, p, moved)))
        others = []
        for name, ta, tb in pairs(a, b):
            if ta is None or tb is None:
                continue
            outside = ~_in_group(p, name, tuple(ta.shape), group).to(ta.device)
            others.append((name, ta[outside], tb[outside]))
        assert_agree(kernel, p, prop, f"{what}: the other head groups' rows moved", others, limits)
        assert_close_to_golden(kernel, p, prop, b, ("o", "lse"), refs=references_on(kernel, p, moved))

    strategy = _strategy(kernel, variant, device, sizes, where=lambda p: _groups(p) >= 2)
    run_property(run, kernel, prop, strategy, check, weight=0.5)


# ------------------------------------------------------------------------------ the cache
def _dequantised_twin(p: Problem) -> Problem:
    """The decode problem of ``p`` with a cache in q's dtype instead of FP8."""
    return p.replace(fp8=None)


def _fits(p: Problem) -> bool:
    """Whether the values ``p``'s FP8 cache stands for are finite in q's dtype (``far`` keys of
    ``large`` values pass float16's 65504: that cache has no twin in float16)."""
    _, k, v, _ = p.logical()
    return all(bool(torch.isfinite(t.to(p.dtype)).all()) for t in (k, v))


def test_fp8_cache_equals_the_dequantised_cache(run, kernel, device, sizes):
    """Decode from an FP8 cache with ``k_scale``, ``v_scale`` gives what decode from the values it
    stands for (the cache dequantised, in q's dtype, no scales) gives."""
    _require(kernel, "fp8-cache")
    prop = "fp8-cache-dequantised"

    def check(kernel: Kernel, p: Problem) -> None:
        twin = _dequantised_twin(p)
        fp8_inputs = p.kernel_inputs()
        plain_inputs = twin.kernel_inputs(logical=p.logical()[:3])
        a = run_kernel(kernel, p, prop, inputs=fp8_inputs)
        b = run_kernel(kernel, twin, prop, inputs=plain_inputs)
        refs_a, refs_b = references_on(kernel, p, fp8_inputs), references_on(kernel, twin, plain_inputs)
        limits = total(budgets(p.dtype, refs_a), budgets(p.dtype, refs_b), _goldens_apart(refs_a, refs_b))
        assert_agree(kernel, p, prop, f"the FP8 cache against itself dequantised to {p.dtype}",
                     pairs(a, b), limits)

    strategy = _strategy(kernel, "fp8-cache", device, sizes, where=_fits,
                         related=lambda p: [_dequantised_twin(p)])
    run_property(run, kernel, prop, strategy, check, weight=0.5)
