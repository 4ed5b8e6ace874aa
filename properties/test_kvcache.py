"""KV-cache decode consistency: the cache's layout and the split-KV schedule change nothing.

- paged-equals-contiguous: the same cache paged (any declared page size, a shuffled block table,
  NaN-filled spare pages) and contiguous (or paged with another page size) give the same answer;
- decode-consistency: decoding the last Nq queries against a causal cache of L keys equals the
  last Nq rows of a causal prefill of those L tokens through the dense entry point;
- split-kv-invariance: every ``num_splits`` (1 up to more than the key blocks, so some splits see
  no key) agrees with ``num_splits=1``.

Two runs are compared within the sum of their tolerance-model budgets (harness.agreement).
Every problem a property runs, the other layout, the prefills and ``num_splits=1`` too, is one
the kernel declares (``related=``): a draw whose derived problem is undeclared is not run.
"""

from __future__ import annotations

import pytest
import torch
from flashprop.contract.problem import KernelInputs, Problem
from flashprop.contract.registry import Kernel
from flashprop.harness.agreement import assert_agree, budgets, references_on, restrict, total
from flashprop.harness.check import Outputs, run_kernel, run_property
from flashprop.harness.variant_problems import variant_problems


def _pairs(a: Outputs, b: Outputs) -> list:
    return [("o", a.o, b.o), ("lse", a.lse, b.lse)]


def _twice(p: Problem, refs) -> dict[str, float]:
    return total(*[budgets(p.dtype, refs)] * 2)


def _other_layouts(kernel: Kernel, p: Problem) -> list[Problem]:
    """The same cache in the other declared layouts that hold it: contiguous, then the other
    page sizes that divide its capacity."""
    kv = kernel.capabilities.kvcache
    options = ([None] if kv.contiguous else []) + [s for s in kv.page_sizes if s != p.page_size]
    return [p.replace(page_size=size) for size in options if size is None or p.nk % size == 0]


def _other_layout(kernel: Kernel, p: Problem) -> Problem:
    """The layout ``p`` is compared with: the first of :func:`_other_layouts` the kernel
    declares (a ``Limit`` may rule some out), else the first (which the declaration refuses)."""
    others = _other_layouts(kernel, p)
    return next((o for o in others if kernel.capabilities.unsupported_reason(o) is None), others[0])


def test_paged_equals_contiguous(run, kernel, device, sizes):
    """A paged cache behind a shuffled block table gives what the same keys give contiguously
    (or in another declared page size)."""
    caps = kernel.capabilities
    if not caps.declares_variant("paged"):
        pytest.skip(f"kernel {kernel.name} does not declare a paged KV cache")
    kv = caps.kvcache
    if not kv.contiguous and len(kv.page_sizes) < 2:
        pytest.skip(f"kernel {kernel.name} declares one cache layout only (page_size {kv.page_sizes[0]}, "
                    "no contiguous cache): there is no other layout to compare it with")
    prop = "paged-equals-contiguous"

    def check(kernel: Kernel, p: Problem) -> None:
        other = _other_layout(kernel, p)
        a, b = run_kernel(kernel, p, prop), run_kernel(kernel, other, prop)
        what = f"page_size {p.page_size} against {other.page_size or 'a contiguous cache'}"
        assert_agree(kernel, p, prop, what, _pairs(a, b), _twice(p, references_on(kernel, p)))

    strategy = variant_problems(caps, "paged", device=device, sizes=sizes,
                                where=lambda p: bool(_other_layouts(kernel, p)),
                                related=lambda p: [_other_layout(kernel, p)])
    run_property(run, kernel, prop, strategy, check, weight=0.5)


def test_decode_consistency(run, kernel, device, sizes):
    """Decoding the last Nq queries of a sequence against its cache (causal) equals the last Nq
    rows of the causal prefill of the whole sequence through the dense entry point."""
    caps = kernel.capabilities
    if caps.kvcache is None:
        pytest.skip(f"kernel {kernel.name} does not declare KV-cache decode")
    if not caps.causal:
        pytest.skip(f"kernel {kernel.name} does not declare causal")
    if caps.causal_alignment != "bottom-right":
        pytest.skip(f"kernel {kernel.name} declares top-left causal alignment: its decode queries are "
                    "not the last positions of a prefill (the property needs bottom-right)")
    prop = "decode-consistency"

    def check(kernel: Kernel, p: Problem) -> None:
        inp = p.kernel_inputs()
        decoded = run_kernel(kernel, p, prop, inputs=inp)
        refs = references_on(kernel, p)
        q, k, v, _ = p.logical()
        g = torch.Generator().manual_seed(p.seed + 4)
        for b, prefill in _prefills(p).items():
            length = prefill.nq
            earlier = torch.randn(1, p.hq, length - p.nq, p.d, generator=g, dtype=q.dtype)
            qb = torch.cat([earlier, q[b : b + 1]], dim=2)
            tensors = tuple(
                prefill._place(t) for t in (qb, k[b : b + 1, :, :length], v[b : b + 1, :, :length])
            )
            kw = {
                name: val
                for name, val in inp.kwargs.items()
                if name not in ("cache_seqlens", "block_table", "num_splits")
            }
            if p.alibi is not None and p.alibi[0] == "batch-head":
                kw["alibi_slopes"] = kw["alibi_slopes"][b : b + 1]
            prefill_inputs = KernelInputs(tensors, kw, {})
            full = run_kernel(kernel, prefill, prop, inputs=prefill_inputs)
            last = Outputs(
                full.o[0, :, length - p.nq :].transpose(0, 1),
                None if full.lse is None else full.lse[0, :, length - p.nq :],
            )
            row = Outputs(decoded.o[b], None if decoded.lse is None else decoded.lse[b])
            limits = total(
                budgets(p.dtype, restrict(refs, (slice(b, b + 1),))),
                budgets(p.dtype, references_on(kernel, prefill, prefill_inputs)),
            )
            what = f"batch element {b}: decode of the last {p.nq} of {length} tokens against the prefill"
            assert_agree(kernel, p, prop, what, _pairs(row, last), limits)

    strategy = variant_problems(caps, "kvcache", device=device, sizes=sizes, causal=True,
                                where=lambda p: bool(_prefills(p)), related=lambda p: _prefills(p).values())
    run_property(run, kernel, prop, strategy, check, weight=0.5)


def _prefills(p: Problem) -> dict[int, Problem]:
    """Per batch element b whose cache holds at least its Nq queries: the causal prefill of its
    ``cache_seqlens[b]`` tokens through the dense entry point (one sequence, same variants)."""
    return {b: p.replace(b=1, nq=length, nk=length, cache=None, page_size=None, num_splits=None)
            for b, length in enumerate(p.cache) if length >= p.nq}


def test_split_kv_invariance(run, kernel, device, sizes):
    """Every ``num_splits`` gives what ``num_splits=1`` gives, including more splits than key
    blocks (splits that see no key: lse -inf, and the combine must not make NaN)."""
    caps = kernel.capabilities
    if not caps.declares_variant("splits"):
        pytest.skip(f"kernel {kernel.name} does not declare split-KV (max_splits > 1)")
    prop = "split-kv-invariance"

    def check(kernel: Kernel, p: Problem) -> None:
        one = p.replace(num_splits=1)
        a, b = run_kernel(kernel, p, prop), run_kernel(kernel, one, prop)
        assert_agree(
            kernel,
            p,
            prop,
            f"num_splits={p.num_splits} against 1",
            _pairs(a, b),
            _twice(p, references_on(kernel, p)),
        )

    # half the draws at max_splits: more splits than key blocks (the variant's own draws reach
    # it a sixth of the time)
    strategy = variant_problems(
        caps, "splits", device=device, sizes=sizes,
        derive=lambda p: p.replace(num_splits=caps.kvcache.max_splits) if p.seed % 2 else p,
        related=lambda p: [p.replace(num_splits=1)],
    )
    run_property(run, kernel, prop, strategy, check, weight=0.5)
