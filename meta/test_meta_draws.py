"""The strategies reach the edges where kernels break, often (ci/draw_edges.py counts them).

Per strategy the properties draw from (dense, and the variants' that go through a mask: window,
ALiBi, varlen, decode, paged; and sinks), at least 5% of the problems drawn for a kernel that
declares everything have a sequence length at a tile edge (a multiple of 16, 64 or 128, or one
off it: 64 and 128 at a GPU's sizes, and at the CPU's in decode, whose capacities reach 96), a
row whose every visible logit is above +88 or below -88 (float32 ``exp`` over- and
underflows), and, with sinks, a sink logit more than 88 above or below every key logit of its
row. The counts are on the problems' own tensors, masks and score mods applied. 300 problems
per strategy (the CPU's), a derandomized draw: the same problems every run.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from flashprop.contract.problem import Problem
from flashprop.harness.strategies import device_sizes

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "ci"))  # the script under test

import draw_edges

pytestmark = pytest.mark.meta

#: The least share of the drawn problems that must reach each edge.
MIN_SHARE = 0.05
EXAMPLES = 300
#: Per strategy, the edges it must reach at the CPU's sizes (max_n 48: 64 and 128 only in decode).
CPU_EDGES = {
    "dense": ("len16", "overflow", "underflow"),
    "window": ("len16", "overflow", "underflow"),
    "alibi": ("len16", "overflow", "underflow"),
    "varlen": ("len16", "overflow", "underflow"),
    "kvcache": ("len16", "len64", "len128", "overflow", "underflow"),
    "paged": ("len16", "len64", "len128", "overflow", "underflow"),
    # with sinks, the over- and underflowing rows are the other strategies' (a softcap joins half
    # the draws, and below 88 it keeps every logit inside exp's range)
    "sinks": ("len16", "sink-above", "sink-below"),
}


def _shares(counts, n: int, edges: tuple[str, ...]) -> dict[str, float]:
    return {edge: counts[edge] / n for edge in edges}


@pytest.mark.parametrize("strategy", sorted(CPU_EDGES))
def test_cpu_draws_reach_every_edge(strategy: str):
    """At the CPU's sizes, each edge is reached by at least 5% of the strategy's problems."""
    counts = draw_edges.count(strategy, EXAMPLES, "cpu", device_sizes("cpu"), values=True)
    shares = _shares(counts, EXAMPLES, CPU_EDGES[strategy])
    rare = {edge: share for edge, share in shares.items() if share < MIN_SHARE}
    assert not rare, f"{strategy}: edges drawn in fewer than {MIN_SHARE:.0%} of {EXAMPLES} problems: {rare}"


@pytest.mark.parametrize("strategy", ["dense", "window", "varlen", "kvcache"])
def test_gpu_draws_reach_every_tile_edge(strategy: str):
    """At a GPU's sizes (max_n 300) every tile width's edges are reached by at least 5% of the
    strategy's problems (lengths only: no tensor is built)."""
    counts = draw_edges.count(strategy, EXAMPLES, "cuda", device_sizes("cuda"), values=False)
    shares = _shares(counts, EXAMPLES, draw_edges.LENGTH_EDGES)
    rare = {edge: share for edge, share in shares.items() if share < MIN_SHARE}
    assert not rare, f"{strategy}: edges drawn in fewer than {MIN_SHARE:.0%} of {EXAMPLES} problems: {rare}"


@pytest.mark.parametrize("dist", ["overflow", "underflow"])
@pytest.mark.parametrize("d", [1, 8, 64, 256])
def test_far_distributions_put_every_logit_beyond_the_exp_range(dist: str, d: int):
    """``overflow`` (``underflow``): at the default scale every logit of every row is above +88
    (below -88), and a row's logits are not all equal (the softmax is not uniform)."""
    p = Problem(b=2, hq=4, hkv=2, nq=33, nk=47, d=d, dv=8, dist=dist, seed=d)
    out, seen = draw_edges.row_extremes(*p.kernel_inputs().args)
    low, high = out[..., 0], out[..., 1]
    assert bool((seen == p.nk).all())
    if dist == "overflow":
        assert float(low.min()) > draw_edges.EXP_RANGE
    else:
        assert float(high.max()) < -draw_edges.EXP_RANGE
    assert float((high - low).min()) > 1.0


@pytest.mark.parametrize("sinks", ["above", "below"])
def test_far_sinks_lie_beyond_the_exp_range_of_every_key_logit(sinks: str):
    """Sinks ``above`` (``below``) lie more than 88 above (below) every logit of their head, for
    every value distribution (the bound is Cauchy-Schwarz's on the problem's own q and k)."""
    for dist in ("normal", "large", "negative", "rank1", "ties", "spikes", "overflow", "underflow"):
        p = Problem(b=2, hq=4, hkv=2, nq=9, nk=17, d=16, dv=8, dist=dist, seed=3, sinks=sinks, scale=2.0)
        inp = p.kernel_inputs()
        out, _ = draw_edges.row_extremes(*inp.args, scale=p.scale, sinks=inp.kwargs["sinks"])
        low, high, z = out.unbind(-1)
        gap = z - high if sinks == "above" else low - z
        assert float(gap.min()) > draw_edges.EXP_RANGE, (dist, float(gap.min()))
        assert torch.isfinite(z).all()
