"""Varlen (packed sequences) consistency: each sequence is its own problem.

- varlen-sequence-alone: each sequence run alone through the kernel's dense entry point gives
  the same rows as the packed run, and (with a backward) the same dq, dk, dv rows for the same
  rows of dO (the entry points agree with each other);
- varlen-permutation: permuting the sequences in the pack permutes the outputs;
- varlen-isolation: replacing every other sequence's tokens changes no row (and, with a backward,
  no gradient) of a sequence.

Two runs are compared within the sum of their tolerance-model budgets (harness.agreement).
"""

from __future__ import annotations

import pytest
import torch
from flashprop.contract.problem import KernelInputs, Problem
from flashprop.contract.registry import Kernel
from flashprop.harness.agreement import assert_agree, budgets, references_on, total
from flashprop.harness.check import Outputs, reference_for, run_kernel, run_property
from flashprop.harness.tolerance import budget
from flashprop.harness.variant_problems import variant_problems
from flashprop.refimpl.layouts import sequence_kwargs, sequence_slices


def _require_varlen(kernel: Kernel) -> None:
    if not kernel.capabilities.varlen:
        pytest.skip(f"kernel {kernel.name} does not declare varlen")


def _rows(out: Outputs, sq: slice) -> Outputs:
    """The packed outputs of one sequence's queries: o[sq], lse[:, sq] (a golden's conditioning
    kept: the pack's, an upper bound of the sequence's)."""
    return Outputs(out.o[sq], None if out.lse is None else out.lse[:, sq], conditioning=out.conditioning)


def _pairs(a: Outputs, b: Outputs) -> list:
    return [("o", a.o, b.o), ("lse", a.lse, b.lse)]


def _limits(p: Problem, refs: tuple[Outputs, Outputs], sq: slice) -> dict[str, float]:
    part = tuple(_rows(r, sq) for r in refs)
    return total(*[budgets(p.dtype, part)] * 2)


def test_varlen_sequence_alone(run, kernel, device, sizes):
    """Sequence s of the pack equals the dense entry point on (q_s, k_s, v_s) as (1, H, N, D):
    o and lse, and with a backward dq, dk and dv for dO's rows of s (the sinks' gradient, a sum
    over the pack, is not compared)."""
    _require_varlen(kernel)
    caps = kernel.capabilities
    backward = caps.backward and "varlen" in caps.variant_backward
    prop = "varlen-sequence-alone"

    def check(kernel: Kernel, p: Problem) -> None:
        alone_problems = _alone(p, caps.any_strides)
        backward_here = backward and all(caps.backward_reason(a) is None
                                         for a in (p, *alone_problems.values()))
        inp = p.kernel_inputs(requires_grad=backward_here)
        packed = run_kernel(kernel, p, prop, inputs=inp, backward=backward_here)
        refs = references_on(kernel, p)
        q, k, v, cu_q, cu_k = (t.detach() for t in inp.args[:5])
        do = p.grad_output()
        for s, (sq, sk) in enumerate(sequence_slices(cu_q, cu_k)):
            if s not in alone_problems:
                continue
            alone_p = alone_problems[s]
            dense = tuple(_as_given(t[sl].transpose(0, 1)[None], caps.any_strides)
                          .requires_grad_(backward_here) for t, sl in ((q, sq), (k, sk), (v, sk)))
            kw = sequence_kwargs(inp.kwargs, s)
            if p.alibi is not None and p.alibi[0] == "batch-head":  # its row, as (B=1, Hq)
                kw["alibi_slopes"] = kw["alibi_slopes"].reshape(1, -1)
            grads = dict(zip("qkv", dense, strict=True)) if backward_here else {}
            alone = run_kernel(kernel, alone_p, prop, inputs=KernelInputs(dense, kw, grads),
                               backward=backward_here,
                               grad_output=_as_given(do[sq].transpose(0, 1)[None], caps.any_strides))
            what = f"sequence {s} (tokens q {sq.start}:{sq.stop}, k {sk.start}:{sk.stop}) run alone densely"
            rows = Outputs(alone.o[0].transpose(0, 1), None if alone.lse is None else alone.lse[0])
            assert_agree(kernel, p, prop, what, _pairs(_rows(packed, sq), rows), _limits(p, refs, sq))
            if backward_here:
                compared = [(name, getattr(packed, name)[sl], getattr(alone, name)[0].transpose(0, 1))
                            for name, sl in (("dq", sq), ("dk", sk), ("dv", sk))]
                assert_agree(kernel, p, prop, f"{what}: its gradients", compared,
                             _gradient_limits(kernel, p, sq, sk))

    strategy = variant_problems(caps, "varlen", device=device, sizes=sizes, backward=backward,
                                related=lambda p: _alone(p, caps.any_strides).values())
    run_property(run, kernel, prop, strategy, check, weight=0.5)


def _gradient_limits(kernel: Kernel, p: Problem, sq: slice, sk: slice) -> dict[str, float]:
    """Two runs' agreement limits on one sequence's gradient rows (dq[sq], dk[sk], dv[sk]): twice
    the tolerance model's budget of each on the pack's golden, restricted to those rows."""
    golden, yard = reference_for(kernel, p, backward=True)
    logit = golden.conditioning.logit_size(golden.lse)
    limits = {}
    for name, sl in (("dq", sq), ("dk", sk), ("dv", sk)):
        g, y = getattr(golden, name)[sl], getattr(yard, name)[sl].to(torch.float64)
        err = float((y - g).abs().max()) if g.numel() else 0.0
        limits[name] = 2 * budget(name, p.dtype, err, golden.bounds[name], logit)[0]
    return limits


def _as_given(view: torch.Tensor, views: bool) -> torch.Tensor:
    """A sequence's rows of a packed tensor as the dense run takes them: the view itself (a
    kernel that declares any strides), else a contiguous copy."""
    return view.detach() if views else view.detach().contiguous()


#: The layout of a packed (T, H, D) tensor's rows of one sequence viewed as (1, H, N, D): the
#: token-major pack is a transposed dense tensor and the reverse; sliced and strided stay so.
_ALONE_LAYOUT = {"contiguous": "transposed", "transposed": "contiguous"}


def _alone(p: Problem, views: bool = True) -> dict[int, Problem]:
    """Per sequence s of the pack with queries and keys: s alone as a dense problem (B = 1), in
    the layouts its run passes: ``views`` of the packed q, k, v and dO (a kernel that declares any
    strides), else contiguous copies."""
    layout, grad = "contiguous", None
    if views:
        layout = _ALONE_LAYOUT.get(p.layout, p.layout)
        grad = _ALONE_LAYOUT.get(p.do_layout, p.do_layout)
    return {s: p.replace(b=1, nq=nq, nk=nk, seqlens=None, layout=layout,
                         grad_layout=None if grad == "contiguous" else grad)
            for s, (nq, nk) in enumerate(p.seqlens) if nq and nk}


def _order(p: Problem) -> list[int]:
    """The order varlen-permutation packs ``p``'s sequences in (from the seed)."""
    return torch.randperm(p.b, generator=torch.Generator().manual_seed(p.seed)).tolist()


def _repacked(p: Problem) -> Problem:
    """``p`` with its sequences packed in :func:`_order`."""
    return p.replace(seqlens=tuple(p.seqlens[s] for s in _order(p)))


def _permuted(inp: KernelInputs, order: list[int]) -> tuple[KernelInputs, list[slice]]:
    """The pack with its sequences in ``order``; also each original sequence's new q slice."""
    q, k, v, cu_q, cu_k, mq, mk = inp.args
    spans = list(sequence_slices(cu_q, cu_k))
    new_q = torch.cat([q[spans[s][0]] for s in order])
    new_k = torch.cat([k[spans[s][1]] for s in order])
    new_v = torch.cat([v[spans[s][1]] for s in order])
    lengths_q = [spans[s][0].stop - spans[s][0].start for s in order]
    lengths_k = [spans[s][1].stop - spans[s][1].start for s in order]

    def cu(lengths):
        return torch.tensor([0, *lengths], dtype=torch.int64).cumsum(0).to(torch.int32).to(cu_q.device)

    kw = dict(inp.kwargs)
    slopes = kw.get("alibi_slopes")
    if slopes is not None and slopes.dim() == 2:
        kw["alibi_slopes"] = slopes[order]
    starts = cu(lengths_q).tolist()
    where = [slice(0, 0)] * len(order)
    for pos, s in enumerate(order):
        where[s] = slice(starts[pos], starts[pos + 1])
    return KernelInputs((new_q, new_k, new_v, cu(lengths_q), cu(lengths_k), mq, mk), kw, {}), where


def test_varlen_permutation(run, kernel, device, sizes):
    """Permuting the sequences of a pack permutes the rows of o and lse."""
    _require_varlen(kernel)
    prop = "varlen-permutation"

    def check(kernel: Kernel, p: Problem) -> None:
        inp = p.kernel_inputs()
        order = _order(p)
        perm_inp, where = _permuted(inp, order)
        a = run_kernel(kernel, p, prop, inputs=inp)
        b = run_kernel(kernel, _repacked(p), prop, inputs=perm_inp)
        refs = references_on(kernel, p)
        for s, (sq, _) in enumerate(sequence_slices(inp.args[3], inp.args[4])):
            what = f"sequences packed in order {order}; sequence {s} compared"
            assert_agree(
                kernel, p, prop, what, _pairs(_rows(a, sq), _rows(b, where[s])), _limits(p, refs, sq)
            )

    strategy = variant_problems(kernel.capabilities, "varlen", device=device, sizes=sizes,
                                where=lambda p: p.b >= 2, related=lambda p: [_repacked(p)])
    run_property(run, kernel, prop, strategy, check, weight=0.5)


def test_varlen_isolation(run, kernel, device, sizes):
    """Sequence 0's rows and gradients do not depend on the other sequences' tokens: replacing
    every other token of q, k and v by 8x larger fresh values changes none of them."""
    _require_varlen(kernel)
    caps = kernel.capabilities
    backward = caps.backward and "varlen" in caps.variant_backward
    prop = "varlen-isolation"

    def check(kernel: Kernel, p: Problem) -> None:
        backward_here = backward and caps.backward_reason(p) is None
        inp = p.kernel_inputs(requires_grad=backward_here)
        sq, sk = next(sequence_slices(inp.args[3], inp.args[4]))
        g = torch.Generator().manual_seed(p.seed + 3)
        changed = []
        for t, sl in zip(inp.args[:3], (sq, sk, sk), strict=True):
            fresh = (8 * torch.randn(t.shape, generator=g, dtype=p.gen_dtype)).to(t.dtype).to(t.device)
            fresh[sl] = t.detach()[sl]
            changed.append(fresh.requires_grad_(backward_here))
        other = KernelInputs(
            (*changed, *inp.args[3:]), dict(inp.kwargs), dict(zip("qkv", changed, strict=True))
        )
        if "sinks" in inp.grads:
            other.grads["sinks"] = inp.grads["sinks"]
        a = run_kernel(kernel, p, prop, inputs=inp, backward=backward_here)
        b = run_kernel(kernel, p, prop, inputs=other, backward=backward_here)
        refs = references_on(kernel, p)
        what = "every token outside sequence 0 replaced; sequence 0 compared"
        assert_agree(kernel, p, prop, what, _pairs(_rows(a, sq), _rows(b, sq)), _limits(p, refs, sq))
        if backward_here:
            compared = [(name, getattr(a, name)[sl], getattr(b, name)[sl])
                        for name, sl in (("dq", sq), ("dk", sk), ("dv", sk))]
            assert_agree(kernel, p, prop, f"{what}: gradients of sequence 0", compared,
                         _gradient_limits(kernel, p, sq, sk))

    strategy = variant_problems(caps, "varlen", device=device, sizes=sizes, backward=backward,
                                where=lambda p: p.b >= 2 and p.seqlens[0][0] > 0)
    run_property(run, kernel, prop, strategy, check, weight=0.5)
