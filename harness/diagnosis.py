"""Diagnosis of a failure by differential testing: which neighbouring convention the kernel follows.

When a kernel's forward output misses the golden, the usual causes are conventions, not
arithmetic. Each :class:`Neighbour` computes the golden under one such convention, on the same
inputs, in float64; if the kernel's o and lse are within the failing comparison's own budgets
of it, the failure report says so in one line, with the fix:

- causal: the other alignment (top-left / bottom-right); the diagonal excluded (``j < i + c``,
  the same as the mask one row late); one key past the diagonal (``j <= i + c + 1``, the mask
  one row early);
- scale: 1, 1/D or sqrt(D) instead of the default 1/sqrt(D); an explicit scale ignored;
- lse in base 2;
- keys and values of the next kv head or the next batch element; GQA heads mapped ``h % Hkv``.

A neighbour is a dense function ``fn(q, k, v, **kw)`` (the golden's keywords: causal, scale,
alignment and the variants), lifted to the problem's entry point the way :mod:`refimpl.layouts`
lifts the golden (varlen: each sequence alone; decode: each batch element on its cache), so
variant problems are diagnosed too: a window, softcap, ALiBi or sinks are passed on to the
neighbour's golden unchanged. Two neighbours need what a variant changes and skip it: the
diagonal-excluded golden is built by dropping the last key (bottom-right) or the first query
(top-left), which moves ALiBi's distances and a window's left edge of 0 (so it skips ALiBi and
``window=(0, r)``); the next batch element is a dense notion (varlen and decode call the
neighbour per sequence).

Where no neighbour matches, row patterns are judged against the golden itself: NaN or mean(V)
on rows that see no key, float64 inputs computed in float32, and a softmax without its max
subtraction (the output off, inf or NaN, on exactly the rows whose logits overflow or underflow
exp in a working dtype, and right on the others). For a backward failure whose forward is right,
:func:`diagnose_gradients` says which gradients match and which do not, and which are zero or
the golden's times a constant.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from ..contract.fp8 import dequantised_call
from ..contract.problem import KernelInputs, Problem
from ..refimpl import attention_golden, attention_yardstick
from ..refimpl.layouts import kvcache_apply, varlen_apply
from .symptoms import FORWARD
from .tolerance import Comparison, budget, conditioning

Golden = tuple[torch.Tensor, torch.Tensor]
#: A dense attention ``fn(q, k, v, **kw) -> (o, lse)`` on (B, H, N, D) tensors, with the
#: golden's keywords (``causal``, ``scale``, ``alignment``, ``window_size``, ``softcap``, ...).
Dense = Callable[..., Golden]
PREFIX = "diagnosis: "


def clause(line: str) -> str:
    """A diagnosis line's first clause (``diagnosis: <clause>: <fix and evidence>``): the
    convention or pattern it names."""
    return line.removeprefix(PREFIX).split(": ", 1)[0]


@dataclass(frozen=True)
class Neighbour:
    """A neighbouring convention: when it applies, its golden as a dense function, and the
    one-line diagnosis (its first clause, up to ``": "``, names the convention: the cause key
    of :mod:`harness.causes`)."""

    applies: Callable[[Problem, str], bool]
    dense: Callable[[Problem, str], Dense]
    message: Callable[[Problem, str], str]


def lifted(p: Problem, fn: Dense, inputs: KernelInputs, alignment: str) -> Golden:
    """``fn`` on the problem's entry point: dense as it is, varlen per sequence, decode per batch
    element on its gathered cache (:mod:`refimpl.layouts`)."""
    kw = dict(causal=p.causal, scale=p.scale, alignment=alignment, **inputs.kwargs)
    if p.mode == "varlen":
        return varlen_apply(fn, *inputs.args[:5], **kw)
    if p.mode == "kvcache":
        return kvcache_apply(fn, *inputs.args, **kw)
    return fn(*inputs.args, **kw)


def _golden_with(**changes) -> Dense:
    """The golden with some keywords changed."""
    return lambda q, k, v, **kw: attention_golden(q, k, v, **{**kw, **changes})


def _other(alignment: str) -> str:
    return "top-left" if alignment == "bottom-right" else "bottom-right"


def _diagonal(alignment: str) -> str:
    return "i + Nk - Nq" if alignment == "bottom-right" else "i"


# ------------------------------------------------------------------------------ causal masks


def _diagonal_excluded(q, k, v, *, alignment: str, window_size=None, **kw) -> Golden:
    """Causal with key j visible iff ``j < i + c``. Bottom-right: the golden on all keys but the
    last (``c`` is one less, and the last key is past every row's diagonal); top-left: row 0 sees
    nothing and row i sees what row i - 1 of the golden on ``q[1:]`` sees. A window's left edge
    ``i + c - l`` stays put: ``l - 1`` around the moved diagonal (``l = 0`` is not handled)."""
    if window_size is not None and window_size[0] > 0:
        window_size = (window_size[0] - 1, window_size[1])
    kw = dict(kw, causal=True, alignment=alignment, window_size=window_size)
    if alignment == "bottom-right":
        return attention_golden(q, k[:, :, :-1], v[:, :, :-1], **kw)
    first = attention_golden(q[:, :, :1], k[:, :, :0], v[:, :, :0], **kw)
    rest = attention_golden(q[:, :, 1:], k, v, **kw)
    return torch.cat([first[0], rest[0]], dim=2), torch.cat([first[1], rest[1]], dim=2)


def _one_key_ahead(p: Problem, alignment: str) -> Dense:
    """Causal with key j visible iff ``j <= i + c + 1`` (a window's left edge kept)."""
    left = -1 if p.window is None else p.window[0]
    return _golden_with(causal=False, window_size=(left, 1))


# ------------------------------------------------------------------------------ scales

#: The scale conventions a kernel may follow: their names and their value for head dim D.
SCALES: tuple[tuple[str, Callable[[int], float]], ...] = (
    ("1/sqrt(D)", lambda d: 1 / math.sqrt(d)),
    ("1/D", lambda d: 1 / d),
    ("sqrt(D)", math.sqrt),
    ("1", lambda d: 1.0),
)


def _scale_neighbour(name: str, value: Callable[[int], float]) -> Neighbour:
    def message(p: Problem, a: str) -> str:
        shown = f"{name} = {value(p.d):.6g}" if "D" in name else f"{name} (no scale)"
        head = f"matches the golden with scale {shown}"
        if p.scale is None:
            return f"{head}: the default scale is 1/sqrt(D) = {1 / math.sqrt(p.d):.6g}"
        return (f"{head}: the kernel ignores the explicit scale {p.scale:.6g} (honour it, or declare "
                "custom_scale=False so that it is refused)")

    return Neighbour(lambda p, a: not math.isclose(value(p.d), p.effective_scale),
                     lambda p, a: _golden_with(scale=value(p.d)), message)


# ------------------------------------------------------------------------------ heads, batch


def _rolled(dim: int) -> Dense:
    """The golden with each query reading the keys and values of the next index along ``dim``."""
    return lambda q, k, v, **kw: attention_golden(q, k.roll(-1, dims=dim), v.roll(-1, dims=dim), **kw)


def _gqa_modulo(q, k, v, **kw) -> Golden:
    heads = torch.arange(q.shape[1], device=k.device) % k.shape[1]
    return attention_golden(q, k[:, heads], v[:, heads], **kw)


def _base2(q, k, v, **kw) -> Golden:
    o, lse = attention_golden(q, k, v, **kw)
    return o, lse / math.log(2)


NEIGHBOURS: tuple[Neighbour, ...] = (
    Neighbour(
        lambda p, a: p.causal and p.nq != p.nk,
        lambda p, a: _golden_with(alignment=_other(a)),
        lambda p, a: f"matches the {_other(a)} causal golden: declare causal_alignment='{_other(a)}' "
        f"or align the mask {a} (key j visible iff j <= {_diagonal(a)})",
    ),
    Neighbour(
        lambda p, a: p.causal and p.alibi is None and (p.window is None or p.window[0] != 0),
        lambda p, a: _diagonal_excluded,
        lambda p, a: f"matches the causal golden with the diagonal excluded (key j visible iff "
        f"j < {_diagonal(a)}, or the mask one row late): the convention is j <= {_diagonal(a)}, each "
        "query sees the key at its own position (<= where the mask has <)",
    ),
    Neighbour(
        lambda p, a: p.causal,
        _one_key_ahead,
        lambda p, a: f"matches the causal golden with one key past the diagonal visible (key j visible "
        f"iff j <= {_diagonal(a)} + 1, the mask one row early): the convention is j <= {_diagonal(a)}",
    ),
    *(_scale_neighbour(name, value) for name, value in SCALES),
    Neighbour(
        lambda p, a: True,
        lambda p, a: _base2,
        lambda p, a: "matches the golden with lse in base 2 (log2 sum 2^s): the convention is the natural "
        "log; multiply the lse by ln 2",
    ),
    Neighbour(
        lambda p, a: p.hkv >= 2,
        lambda p, a: _rolled(1),
        lambda p, a: "matches the golden with each query head reading the NEXT kv head's keys and values: "
        "a head index or head stride off by one",
    ),
    Neighbour(
        lambda p, a: p.b >= 2 and p.mode == "dense",
        lambda p, a: _rolled(0),
        lambda p, a: "matches the golden with each batch element reading the NEXT element's keys and "
        "values: a batch index or batch stride off by one",
    ),
    Neighbour(
        lambda p, a: p.hq != p.hkv and p.hkv > 1,
        lambda p, a: _gqa_modulo,
        lambda p, a: "matches the golden with query head h reading kv head h % Hkv: GQA maps query head h "
        "to kv head h // (Hq / Hkv)",
    ),
)


# ------------------------------------------------------------------------------ row patterns


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


def _rows(p: Problem, o: torch.Tensor) -> torch.Tensor:
    """o laid out as its lse with the value dim last, in float64 on the CPU: dense (B, H, N, Dv)
    as it is; varlen (Tq, H, Dv) -> (H, Tq, Dv); decode (B, Nq, H, Dv) -> (B, H, Nq, Dv)."""
    o = o.detach().to(torch.float64).cpu()
    if p.mode == "varlen":
        return o.transpose(0, 1)
    return o.transpose(1, 2) if p.mode == "kvcache" else o


def _empty_rows(p: Problem, o: torch.Tensor, golden: Golden, limits: dict[str, float], v) -> list[str]:
    """Rows that see no key: NaN there, or mean(V) (a finite mask value; dense problems), and
    right elsewhere."""
    lse = golden[1].cpu()
    empty = torch.isinf(lse) & (lse < 0)
    if not empty.any():
        return []
    o64, g64 = _rows(p, o), _rows(p, golden[0])
    rest = ~empty
    if not _within(o64[rest], g64[rest], limits["o"]):
        return []
    if torch.isnan(o64[empty]).all():
        return ["NaN only on rows that see no key: the convention is o = 0 and lse = -inf there "
                "(guard the division by l = 0, and exp(-inf - -inf))"]
    if p.mode != "dense":
        return []
    group = p.hq // p.hkv
    mean_v = v.detach().to(torch.float64).cpu().repeat_interleave(group, dim=1).mean(2, keepdim=True)
    if _within(o64[empty], mean_v.expand(o64.shape)[empty], limits["o"]):
        return ["rows that see no key give mean(V): the mask is a finite value (-1e4, -65504, a dtype's "
                "min) that exp() does not zero; mask with -inf and give o = 0, lse = -inf"]
    return []


def _keys(p: Problem) -> int:
    """The most keys one row can see."""
    return max(pair[1] for pair in p.seqlens) if p.seqlens else p.nk


def _off(actual: torch.Tensor, expected: torch.Tensor, limit: float) -> torch.Tensor:
    """Per element, whether ``actual`` misses ``expected`` (float64, CPU): NaN or inf where it is
    not, or finite and farther than ``limit``."""
    same = (actual == expected) | (torch.isnan(actual) & torch.isnan(expected))
    close = torch.isfinite(actual) & torch.isfinite(expected) & ((actual - expected).abs() <= limit)
    return ~(same | close)


def _overflow(p: Problem, o: torch.Tensor, lse: torch.Tensor | None, golden: Golden,
              limits: dict[str, float], v: torch.Tensor) -> list[str]:
    """A softmax without its max subtraction: ``exp(s)`` overflows a working dtype T (float32, or
    float16 where P is cast to it for the PV product; float64 for float64 problems) on the rows
    whose lse exceeds ln(max T), and underflows (to subnormals, or to 0) on rows whose largest
    logit lies below ln(smallest normal T) (at least lse - ln Nk). The rows off the golden are
    rows of such logits (a margin of 1), and so is every row surely past T's range. The rows off
    must carry the failure's own marks: inf or NaN, o = 0 exactly (every term underflowed), or,
    on rows whose logits lie within T's subnormals, an error that they can make (each of Nk
    terms rounded to its spacing ``tiny * eps`` moves o by at most
    ``Nk * tiny * eps * 2 max|V| / exp(lse)``) with an lse not above the golden's (lost terms
    only shrink the sum): a row off with a finite lse far above the golden's saw a key it
    should not, whatever its logits."""
    g_lse = golden[1].detach().to(torch.float64).cpu()
    o64, g64 = _rows(p, o), _rows(p, golden[0])
    seen = torch.isfinite(g_lse)
    off = _off(o64, g64, limits["o"]).any(-1)
    if lse is not None:
        off |= _off(lse.detach().to(torch.float64).cpu(), g_lse, limits.get("lse", math.inf))
    off &= seen
    if not off.any():
        return []
    nonfinite = ~torch.isfinite(o64).all(-1)
    if lse is not None:
        nonfinite |= ~torch.isfinite(lse.detach().cpu())
    finite_v = v.detach()[torch.isfinite(v.detach())]
    big_v = float(finite_v.abs().max()) if finite_v.numel() else 0.0
    for t in (torch.float64,) if p.dtype == torch.float64 else (torch.float32, torch.float16):
        info, name = torch.finfo(t), str(t).removeprefix("torch.")
        high = math.log(info.max)
        low, lowest = math.log(info.tiny), math.log(info.tiny * info.eps)
        over = seen & (g_lse > high - 1)
        under = seen & (g_lse < low + math.log(max(_keys(p), 1)) + 1)
        sure = seen & ((g_lse > high + 1) | (g_lse < lowest - 1))
        small = seen & ~over & ~under
        if (off & small).any() or (sure & ~off).any():
            continue
        # every row off carries the failure's own marks: inf or NaN, o = 0 (every term lost), or
        # (logits within T's subnormals) an error rounding to them makes, lse not above the golden's
        err = torch.where(torch.isfinite(o64), (o64 - g64).abs(), 0).amax(-1)
        grain = info.tiny * info.eps * max(_keys(p), 1) * 2 * big_v * torch.exp(-g_lse)
        rounded = under & ~sure & (err <= grain + limits["o"])
        if lse is not None:
            rounded &= lse.detach().to(torch.float64).cpu() <= g_lse + limits.get("lse", math.inf)
        if not bool((nonfinite | (o64 == 0).all(-1) | rounded)[off].all()):
            continue
        where = []
        if (off & over).any():
            top = float(g_lse[off & over].max())
            where.append(f"overflows {name} (lse up to {top:.4g}, past ln(max {name}) = {high:.4g})")
        if (off & under).any():
            bottom = float(g_lse[off & under].min())
            where.append(f"underflows {name} (lse down to {bottom:.4g}, ln(smallest normal) = {low:.4g})")
        how = "inf/NaN" if bool(nonfinite[off].all()) else "off the golden"
        rest = (f"matches it on the {int(small.sum())} rows whose logits are small" if small.any()
                else "no row has small logits")
        return [f"a softmax without its max subtraction: the output is {how} on the {int(off.sum())} rows "
                f"where exp(s) {' or '.join(where)}, and {rest}: exponentiate s - m, m the row's "
                "running max (from -inf, rescaling by exp(m_old - m_new))"]
    return []


def _only_past_exp(alt: Golden, p: Problem, o: torch.Tensor, lse: torch.Tensor | None, golden: Golden,
                   limits: dict[str, float]) -> bool:
    """Whether a neighbour's golden ``alt`` differs from the golden only on rows whose logits lie
    past exp's range in the working dtype (float32; float64 for float64 problems: the golden's lse
    above ln(max) or below ln(smallest normal) + ln(Nk), a margin of 1, as :func:`_overflow`'s),
    where the kernel's o and lse bear the marks of an exp out of range (inf or NaN, or a row with
    o = 0 and lse = -inf). There an exp that overflows or underflows matches it by accident (a row
    whose every term underflows is a row that sees no key: the diagonal excluded, at Nq > Nk), so
    the match is no evidence of the convention."""
    g_lse = golden[1].detach().to(torch.float64).cpu()
    differs = _off(_rows(p, alt[0]), _rows(p, golden[0]), limits["o"]).any(-1)
    differs |= _off(alt[1].detach().to(torch.float64).cpu(), g_lse, limits.get("lse", math.inf))
    info = torch.finfo(torch.float64 if p.dtype == torch.float64 else torch.float32)
    past = torch.isfinite(g_lse) & ((g_lse > math.log(info.max) - 1)
                                    | (g_lse < math.log(info.tiny) + math.log(max(_keys(p), 1)) + 1))
    o64 = _rows(p, o)
    empty = (o64 == 0).all(-1)
    if lse is not None:
        kernel_lse = lse.detach().to(torch.float64).cpu()
        empty &= kernel_lse == -math.inf
    marked = ~torch.isfinite(o64).all(-1) | empty
    if lse is not None:
        marked |= torch.isnan(kernel_lse) | (kernel_lse == math.inf)
    return bool(differs.any()) and not bool((differs & ~(past & marked)).any())


def _float32_only(p: Problem, out_o, out_lse, golden: Golden, inputs: KernelInputs,
                  alignment: str) -> list[str]:
    """A float64 problem answered to float32 precision only."""
    if p.dtype != torch.float64:
        return []

    def single(t):
        return t.detach().to(torch.float32) if isinstance(t, torch.Tensor) and t.is_floating_point() else t

    in32 = KernelInputs(tuple(map(single, inputs.args)), {n: single(t) for n, t in inputs.kwargs.items()}, {})
    o32, lse32 = lifted(p, attention_yardstick, in32, alignment)
    cond = conditioning(p)
    logit_size = cond.logit_size(golden[1])
    ok = True
    for actual, g, y, name in ((out_o, golden[0], o32, "o"), (out_lse, golden[1], lse32, "lse")):
        if actual is None:
            continue
        finite = torch.isfinite(g)
        y_err = float((y.double() - g)[finite].abs().max()) if finite.any() else 0.0
        size = float(g[finite].abs().max()) if finite.any() else 0.0
        limit = budget(name, torch.float32, y_err, size, logit_size, cond.values_for(name))[0]
        ok = ok and _within(actual, g, limit)
    if not ok:
        return []
    return ["matches the golden only to float32 precision: the kernel computes float64 inputs in float32; "
            "compute in float64, or declare dtypes without torch.float64 so that float64 is refused"]


def work(p: Problem) -> int:
    """The problem's work ``b*hq*nq*nk*max(d, dv)`` (varlen: summed over its sequences)."""
    pairs = p.seqlens if p.seqlens is not None else ((p.nq, p.nk),) * p.b
    return sum(q * k for q, k in pairs) * p.hq * max(p.d, p.dv)


#: The most work (:func:`work`) a problem's neighbours are computed for, per device: about a
#: dozen float64 goldens, once per failing property (the shrunk failure it reports:
#: :class:`harness.check.PropertyFailure` computes diagnoses late). On the CPU
#: ``b*hq*nq*nk*d`` = 2^24 is, say, 4 heads of 256 x 256 rows at D = 64: about a second. The row
#: patterns need only the golden the comparison has.
NEIGHBOUR_WORK = {"cpu": 1 << 24, "cuda": 1 << 32}


def diagnose(p: Problem, alignment: str, o: torch.Tensor, lse: torch.Tensor | None,
             limits: dict[str, float], golden: Golden) -> list[str]:
    """One-line diagnoses of a failing forward output (``limits``: the failing comparison's
    budgets for o and lse, ``golden`` its o and lse): the neighbouring conventions it matches
    (problems of at most :data:`NEIGHBOUR_WORK`), else the row patterns."""
    inputs = p.kernel_inputs()
    if p.fp8 is not None:  # the neighbours (rolled heads, GQA maps) move values with their descales
        inputs = KernelInputs(*dequantised_call(p.mode, inputs.args, inputs.kwargs), {})
    found = []
    small = work(p) <= NEIGHBOUR_WORK.get(p.device.split(":")[0], 0)
    for n in NEIGHBOURS if small else ():
        if not n.applies(p, alignment):
            continue
        alt_o, alt_lse = lifted(p, n.dense(p, alignment), inputs, alignment)
        if (_within(o, alt_o, limits["o"]) and _within(lse, alt_lse, limits.get("lse", math.inf))
                and not _only_past_exp((alt_o, alt_lse), p, o, lse, golden, limits)):
            found.append(n.message(p, alignment))
    if lse is not None and lse.shape != golden[1].shape:
        lse = None  # judged on o alone (the comparison of lse reports its shape)
    if not found and o.shape == golden[0].shape:  # a whole convention explains every row, these some
        found = (_empty_rows(p, o, golden, limits, inputs.args[2])
                 + _overflow(p, o, lse, golden, limits, inputs.args[2])
                 + _float32_only(p, o, lse, golden, inputs, alignment))
    return [PREFIX + line for line in found]


# ------------------------------------------------------------------------------ gradients

#: Where to look when the forward is right and exactly these gradients are off.
GRADIENT_HINTS: dict[frozenset[str], str] = {
    frozenset({"dv"}): "dV = P^T dO is wrong while P is right (dq and dk need it): look at dV's "
    "accumulation and store",
    frozenset({"dk"}): "dK = scale * dS^T Q is wrong while dS is right (dq needs it)",
    frozenset({"dq"}): "dQ = scale * dS K is wrong while dS is right (dk needs it)",
    frozenset({"dq", "dk"}): "both come from dS = P * (dP - Delta) while P is right (dv needs only P): "
    "look at dP = dO V^T, Delta = rowsum(dO * O) and the scale",
    frozenset({"dk", "dv"}): "the key-side gradients, while dq is right: look at the loop that "
    "accumulates dK and dV (a key tile, the key tail or a GQA group's heads left out)",
    frozenset({"dsinks"}): "dsinks = -sum over rows of exp(z - lse) * Delta",
}


def _listed(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _factor(c: float, scale: float, group: int) -> str:
    """What a gradient's constant factor against the golden's suggests."""
    for value, why in ((scale, "the scale: a factor of the scale applied once too often"),
                       (1 / scale if scale else math.inf, "1/scale: the scale factor left out"),
                       (-1.0, "-1: the sign is wrong"),
                       (float(group), "the GQA group size: summed over the group once too often"),
                       (1 / group, "1/group: only one query head of each GQA group taken")):
        if value != 1.0 and math.isclose(c, value, rel_tol=1e-2):
            return f" (= {why})"
    return ""


def diagnose_gradients(p: Problem, results: Sequence[Comparison], actual: Mapping[str, torch.Tensor | None],
                       golden: Mapping[str, torch.Tensor]) -> list[str]:
    """Diagnoses of a backward failure whose forward is right (every judged o, lse within budget):
    which gradients match the golden and which do not, and a gradient off by a constant factor
    (least squares ``c = <a, g> / <g, g>``, ``a`` within the budget of ``c g``)."""
    grads = [r for r in results if r.name not in FORWARD]
    if any(not r.ok for r in results if r.name in FORWARD) or not grads:
        return []
    bad, good = [r.name for r in grads if not r.ok], [r.name for r in grads if r.ok]
    found = []
    if bad and good:
        verb = ("does", "do")
        hint = GRADIENT_HINTS.get(frozenset(bad))
        found.append(f"{_listed(bad)} {verb[len(bad) > 1]} not match the golden: {_listed(good)} "
                     f"{verb[len(good) > 1]}, and so does the forward" + (f"; {hint}" if hint else ""))
    zero: list[str] = []  # the gradients that are 0 where the golden's are not
    factors: list[tuple[list[str], float]] = []  # gradients that are c x the golden's, by c
    for r in grads:
        a, g = actual.get(r.name), golden[r.name]
        if r.ok or r.reason or a is None:
            continue
        a, g = a.detach().to(torch.float64).cpu(), g.to(torch.float64).cpu()
        norm = float((g * g).sum())
        if norm == 0:
            continue
        c = float((a * g).sum()) / norm
        if not a.count_nonzero():
            zero.append(r.name)
        elif not math.isclose(c, 1.0, rel_tol=1e-3) and _within(a, c * g, r.budget):
            same = next((names for names, f in factors if math.isclose(f, c, rel_tol=1e-3)), None)
            if same is None:
                factors.append(([r.name], c))
            else:
                same.append(r.name)
    if zero:
        found.append(f"{_listed(zero)} {('is', 'are')[len(zero) > 1]} zero where the golden's is not: never "
                     "accumulated or never stored (a loop that skips its tiles, an output not written back)")
    for names, c in factors:
        found.append(f"{_listed(names)} {('is', 'are')[len(names) > 1]} the golden's times a constant: "
                     f"{c:.4g} x the golden's" + _factor(c, p.effective_scale, p.hq // p.hkv))
    return [PREFIX + line for line in found]
