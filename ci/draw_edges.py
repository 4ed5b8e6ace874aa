#!/usr/bin/env python3
"""How often the strategies reach the edges where kernels break, per 1,000 drawn problems.

    python ci/draw_edges.py                       # the CPU's sizes: lengths and values
    python ci/draw_edges.py --device cuda         # a GPU's sizes: lengths only (no tensors)
    python ci/draw_edges.py --examples 2000

For a kernel that declares everything (every dtype, layout and variant: ``FULL``), draws N
problems from each strategy the properties use (``dense``: :func:`strategies.problems`; one per
variant: :func:`variant_problems.variant_problems`) and counts, per strategy, the problems that
reach each edge:

    len16, len64, len128   a sequence length (Nq, Nk; every varlen sequence's; the decode
                           queries, cache lengths and capacity) at k t - 1, k t or k t + 1, k >= 1
    overflow               a row whose every visible logit (scaled, after the softcap and ALiBi,
                           the window and causal mask applied) is above +88, where float32
                           ``exp`` overflows
    underflow              a row whose every visible logit is below -88 (``exp`` underflows)
    sink-above             a row whose sink logit is more than 88 above every visible key logit
    sink-below             a row whose sink logit is more than 88 below every visible key logit

The value edges are counted on the problem's own tensors (``Problem.kernel_inputs``, read the
way the float64 golden reads them: ``refimpl.layouts`` per sequence and on the valid cache).
``--device cuda`` counts the lengths at a GPU's sizes, where multiples of 64 and 128 fit (the
CPU's bound of 48 leaves only 16's, and the decode capacities up to 96 reach 64's).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout: flashprop/

from flashprop.contract.capabilities import ALIBI_SHAPES, Capabilities, KVCache
from flashprop.contract.masks import mask_mod, score_mod
from flashprop.contract.problem import Problem
from flashprop.harness.strategies import TILE_EDGES, Sizes, device_sizes, problems
from flashprop.harness.variant_problems import variant_problems
from flashprop.refimpl.golden import default_scale, expand_kv
from flashprop.refimpl.layouts import kvcache_apply, varlen_apply
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

#: float32 ``exp`` overflows above about 88.72 and underflows (to a subnormal, then 0) below -87.3.
EXP_RANGE = 88.0
#: A kernel that declares everything the strategies can draw.
FULL = Capabilities(window=True, softcap=True, alibi=ALIBI_SHAPES, sinks=True, varlen=True,
                    kvcache=KVCache(page_sizes=(1, 4, 16, 64, 256), max_splits=8))
#: The strategies counted: dense, and each variant's (its other modifiers join at random).
STRATEGIES = ("dense", "window", "softcap", "alibi", "sinks", "varlen", "kvcache", "paged")
LENGTH_EDGES = tuple(f"len{t}" for t in TILE_EDGES)
VALUE_EDGES = ("overflow", "underflow", "sink-above", "sink-below")


def strategy(name: str, device: str, sizes: Sizes) -> st.SearchStrategy[Problem]:
    if name == "dense":
        return problems(FULL, device=device, sizes=sizes)
    return variant_problems(FULL, name, device=device, sizes=sizes)


def draw(name: str, n: int, device: str, sizes: Sizes) -> list[Problem]:
    """``n`` problems of strategy ``name``, derandomized (the same ones every run)."""
    drawn: list[Problem] = []

    @settings(max_examples=n, derandomize=True, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(strategy(name, device, sizes))
    def collect(p: Problem) -> None:
        drawn.append(p)

    collect()
    return drawn


def lengths(p: Problem) -> list[int]:
    """Every sequence length of ``p``: Nq and Nk, each varlen sequence's, or the decode queries,
    each cache length and the capacity."""
    if p.seqlens is not None:
        return [n for pair in p.seqlens for n in pair]
    if p.cache is not None:
        return [p.nq, p.nk, *p.cache]
    return [p.nq, p.nk]


def at_edge(n: int, t: int) -> bool:
    """``n`` is ``k t - 1``, ``k t`` or ``k t + 1`` for some ``k >= 1``."""
    return n >= t - 1 and n % t in (0, 1, t - 1)


def row_extremes(q, k, v, *, causal=False, scale=None, alignment="bottom-right", window_size=None,
                 softcap=0.0, alibi_slopes=None, sinks=None):
    """A dense "reference" whose o is, per row, (min, max) of the visible logits and the sink
    (NaN without), and whose lse is the number of visible keys: ``refimpl.layouts`` lifts it to
    varlen and decode as it lifts the golden. q (B, Hq, Nq, D), k (B, Hkv, Nk, D)."""
    b, hq, nq, _ = q.shape
    nk = k.shape[2]
    q64, k64 = q.detach().double(), expand_kv(k.detach().double(), hq // k.shape[1])
    s = default_scale(q.shape[-1], scale) * (q64 @ k64.transpose(-1, -2))
    idx = (torch.arange(b)[:, None, None, None], torch.arange(hq)[None, :, None, None],
           torch.arange(nq)[None, None, :, None], torch.arange(nk)[None, None, None, :])
    modify = score_mod(nq, nk, alignment=alignment, softcap=softcap, alibi_slopes=alibi_slopes)
    if modify is not None:
        s = modify(s, *idx)
    visible = torch.ones_like(s, dtype=torch.bool)
    masked = mask_mod(nq, nk, causal=causal, alignment=alignment, window=window_size)
    if masked is not None:
        visible = visible & masked(*idx)
    if not nk:
        nothing = s.new_zeros((b, hq, nq, 3))
        return nothing, nothing[..., 0]
    low = s.masked_fill(~visible, float("inf")).amin(-1, keepdim=True)
    high = s.masked_fill(~visible, float("-inf")).amax(-1, keepdim=True)
    z = (torch.full_like(low, float("nan")) if sinks is None
         else sinks.detach().double()[None, :, None, None].expand_as(low))
    return torch.cat([low, high, z], dim=-1), visible.sum(-1).double()


def value_edges(p: Problem) -> set[str]:
    """The value edges (:data:`VALUE_EDGES`) some row of ``p`` reaches."""
    inp = p.kernel_inputs()
    kw = dict(causal=p.causal, scale=p.scale, **{n: t.detach() if torch.is_tensor(t) else t
                                                 for n, t in inp.kwargs.items()})
    if p.mode == "dense":
        out, seen = row_extremes(*inp.args, **kw)
    elif p.mode == "varlen":
        out, seen = varlen_apply(row_extremes, *inp.args[:5], **kw)
        seen = seen.transpose(0, 1)
    else:
        out, seen = kvcache_apply(row_extremes, *inp.args, **kw)
        seen = seen.transpose(1, 2)
    rows = out.reshape(-1, 3)[seen.reshape(-1) > 0]  # rows that see a key
    low, high, z = rows.unbind(-1)
    found = {"overflow": low > EXP_RANGE, "underflow": high < -EXP_RANGE,
             "sink-above": z - high > EXP_RANGE, "sink-below": low - z > EXP_RANGE}
    return {edge for edge, rows_at in found.items() if bool(rows_at.any())}


def count(name: str, n: int, device: str, sizes: Sizes, values: bool) -> Counter[str]:
    """Per edge, how many of ``n`` problems of strategy ``name`` reach it (the value edges only
    with ``values``: they build the tensors)."""
    counts: Counter[str] = Counter()
    for p in draw(name, n, device, sizes):
        counts.update(f"len{t}" for t in TILE_EDGES if any(at_edge(m, t) for m in lengths(p)))
        if values:
            counts.update(value_edges(p))
    return counts


def table(device: str, n: int) -> str:
    """The markdown table: per strategy, per 1,000 problems, how many reach each edge."""
    sizes = device_sizes(device)
    values = device == "cpu"
    edges = LENGTH_EDGES + (VALUE_EDGES if values else ())
    lines = [f"| strategy ({device}, max_n {sizes.max_n}) | " + " | ".join(edges) + " |",
             "|---|" + "---|" * len(edges)]
    for name in STRATEGIES:
        counts = count(name, n, device, sizes, values)
        lines.append(f"| {name} | " + " | ".join(f"{1000 * counts[e] / n:.0f}" for e in edges) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--examples", type=int, default=1000)
    args = parser.parse_args(argv)
    if args.examples < 1:
        parser.error("--examples must be at least 1")
    print(table(args.device, args.examples))
    return 0


if __name__ == "__main__":
    sys.exit(main())
