"""Diagnosis of a failure by differential testing: which neighbouring convention the kernel follows.

When a kernel's forward output misses the golden, the usual causes are conventions, not
arithmetic: a top-left causal mask, the wrong default scale, a base-2 lse, float64 inputs
computed in float32, empty rows left NaN or averaged, keys read from the next head or batch
element, GQA heads mapped ``h % Hkv``. Each :class:`Neighbour` computes the golden under one such
convention (on the same inputs, in float64); if the kernel's o and lse are within the failing
comparison's own budgets of it, the failure report says so in one line, with the fix.

Only dense problems are diagnosed (the neighbours are conventions of the dense contract).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from flashprop.contract.problem import Problem
from flashprop.harness.tolerance import budget
from flashprop.refimpl import attention_golden, attention_yardstick

Golden = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class Neighbour:
    """A neighbouring convention: when it applies, its golden, and the one-line diagnosis."""

    applies: Callable[[Problem, str], bool]
    golden: Callable[[Problem, tuple[torch.Tensor, ...], str], Golden]
    message: Callable[[Problem, str], str]


def _golden(p: Problem, qkv, alignment: str, **changes) -> Golden:
    kw = dict(causal=p.causal, scale=p.scale, alignment=alignment)
    kw.update(changes)
    return attention_golden(*qkv, **kw)


def _rolled(qkv, dim: int) -> tuple[torch.Tensor, ...]:
    q, k, v = qkv
    return q, k.roll(-1, dims=dim), v.roll(-1, dims=dim)


def _gqa_modulo(p: Problem, qkv, alignment: str) -> Golden:
    q, k, v = qkv
    heads = torch.arange(p.hq) % p.hkv
    return _golden(p, (q, k[:, heads], v[:, heads]), alignment)


def _other(alignment: str) -> str:
    return "top-left" if alignment == "bottom-right" else "bottom-right"


NEIGHBOURS: tuple[Neighbour, ...] = (
    Neighbour(
        lambda p, a: p.causal and p.nq != p.nk,
        lambda p, qkv, a: _golden(p, qkv, _other(a)),
        lambda p, a: f"matches the {_other(a)} causal golden: declare causal_alignment='{_other(a)}' "
        f"or align the mask {a} (key j visible iff j <= i"
        + (" + Nk - Nq)" if a == "bottom-right" else ")"),
    ),
    Neighbour(
        lambda p, a: p.scale is None and p.d != 1,
        lambda p, qkv, a: _golden(p, qkv, a, scale=1.0),
        lambda p, a: "matches the golden with scale 1: the default scale is 1/sqrt(D) = "
        f"{1 / math.sqrt(p.d):.6g}",
    ),
    Neighbour(
        lambda p, a: p.scale is not None and not math.isclose(p.scale, 1 / math.sqrt(p.d)),
        lambda p, qkv, a: _golden(p, qkv, a, scale=None),
        lambda p, a: "matches the golden with the default scale 1/sqrt(D): the kernel ignores the explicit "
        "scale (honour it, or declare custom_scale=False so that it is refused)",
    ),
    Neighbour(
        lambda p, a: True,
        lambda p, qkv, a: (lambda o, lse: (o, lse / math.log(2)))(*_golden(p, qkv, a)),
        lambda p, a: "matches the golden with lse in base 2 (log2 sum 2^s): the convention is the natural "
        "log; multiply the lse by ln 2",
    ),
    Neighbour(
        lambda p, a: p.hkv >= 2,
        lambda p, qkv, a: _golden(p, _rolled(qkv, 1), a),
        lambda p, a: "matches the golden with each query head reading the NEXT kv head's keys and values: "
        "a head index or head stride off by one",
    ),
    Neighbour(
        lambda p, a: p.b >= 2,
        lambda p, qkv, a: _golden(p, _rolled(qkv, 0), a),
        lambda p, a: "matches the golden with each batch element reading the NEXT element's keys and "
        "values: a batch index or batch stride off by one",
    ),
    Neighbour(
        lambda p, a: p.hq != p.hkv and p.hkv > 1,
        _gqa_modulo,
        lambda p, a: "matches the golden with query head h reading kv head h % Hkv: GQA maps query head h "
        "to kv head h // (Hq / Hkv)",
    ),
)


def _within(actual: torch.Tensor | None, expected: torch.Tensor, limit: float) -> bool:
    if actual is None:
        return True
    a, e = actual.detach().to(torch.float64).cpu(), expected.to(torch.float64).cpu()
    if a.shape != e.shape or not torch.equal(torch.isnan(a), torch.isnan(e)):
        return False
    infinite = torch.isinf(e)
    if not torch.equal(torch.isinf(a), infinite) or not torch.equal(a[infinite], e[infinite]):
        return False
    finite = torch.isfinite(e)
    return bool((a[finite] - e[finite]).abs().max() <= limit) if finite.any() else True


def _empty_rows(p: Problem, o: torch.Tensor, golden: Golden, limits: dict[str, float], v) -> list[str]:
    """Rows that see no key: NaN there, or mean(V) (a finite mask value), and right elsewhere."""
    empty = torch.isinf(golden[1]) & (golden[1] < 0)
    if not empty.any():
        return []
    o64 = o.detach().to(torch.float64).cpu()
    rest = ~empty
    if not _within(o64[rest], golden[0][rest].cpu(), limits["o"]):
        return []
    if torch.isnan(o64[empty]).all():
        return ["NaN only on rows that see no key: the convention is o = 0 and lse = -inf there "
                "(guard the division by l = 0, and exp(-inf - -inf))"]
    group = p.hq // p.hkv
    mean_v = v.detach().to(torch.float64).cpu().repeat_interleave(group, dim=1).mean(2, keepdim=True)
    if _within(o64[empty], mean_v.expand(o64.shape)[empty], limits["o"]):
        return ["rows that see no key give mean(V): the mask is a finite value (-1e4, -65504, a dtype's "
                "min) that exp() does not zero; mask with -inf and give o = 0, lse = -inf"]
    return []


def _float32_only(p: Problem, out_o, out_lse, golden: Golden, qkv) -> list[str]:
    """A float64 problem answered to float32 precision only."""
    if p.dtype != torch.float64:
        return []
    q32 = tuple(t.detach().to(torch.float32) for t in qkv)
    o32, lse32 = attention_yardstick(*q32, causal=p.causal, scale=p.scale)
    ok = True
    for actual, g, y, name in ((out_o, golden[0], o32, "o"), (out_lse, golden[1], lse32, "lse")):
        if actual is None:
            continue
        finite = torch.isfinite(g)
        y_err = float((y.double().cpu() - g.cpu())[finite.cpu()].abs().max()) if finite.any() else 0.0
        size = float(g[finite].abs().max()) if finite.any() else 0.0
        ok = ok and _within(actual, g, budget(name, torch.float32, y_err, size, size)[0])
    if not ok:
        return []
    return ["matches the golden only to float32 precision: the kernel computes float64 inputs in float32; "
            "compute in float64, or declare dtypes without torch.float64 so that float64 is refused"]


def diagnose(p: Problem, alignment: str, o: torch.Tensor, lse: torch.Tensor | None,
             limits: dict[str, float]) -> list[str]:
    """One-line diagnoses of a failing forward output (``limits``: the failing comparison's
    budgets for o and lse), by the neighbouring conventions it matches."""
    if p.mode != "dense" or p.variants:
        return []
    qkv = tuple(t.detach() for t in p.inputs())
    golden = _golden(p, qkv, alignment)
    found = _empty_rows(p, o, golden, limits, qkv[2]) + _float32_only(p, o, lse, golden, qkv)
    for n in NEIGHBOURS:
        if not n.applies(p, alignment):
            continue
        alt_o, alt_lse = n.golden(p, qkv, alignment)
        if _within(o, alt_o, limits["o"]) and _within(lse, alt_lse, limits.get("lse", math.inf)):
            found.append(n.message(p, alignment))
    return [f"diagnosis: {line}" for line in found]
