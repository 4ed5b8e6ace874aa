"""Meta-tests of the grouping of failures by cause (harness/causes.py) on reports that the golden
comparison writes (harness/check.py): one bug, one entry, whichever properties and problems it
fails; two bugs of one kernel, two entries; the shrunk problem joins what has no other key; the
reports of properties that compare with the golden themselves (long-golden, precision) join the
diagnosed cause whose symptom they have, listed apart."""

from __future__ import annotations

import pytest
import torch
from flashprop.contract.capabilities import Capabilities
from flashprop.contract.problem import Problem
from flashprop.contract.registry import Kernel
from flashprop.harness import report
from flashprop.harness.causes import cause_line, group
from flashprop.harness.check import (
    PropertyFailure,
    assert_close_to_golden,
    failure,
    gradient_names,
    judge,
    reference_for,
    run_kernel,
)
from flashprop.harness.failures import Failure
from flashprop.harness.run_context import RunContext
from flashprop.harness.symptoms import Relation, Symptom, undirected
from flashprop.properties import test_long_golden, test_precision
from flashprop.refimpl import attention_golden, attention_yardstick

pytestmark = pytest.mark.meta

FORWARD = Problem(b=2, hq=2, nq=5, nk=7, d=8, dv=8)
BACKWARD = Problem(hq=2, hkv=1, nq=6, nk=4, d=16, dv=8, causal=True)
ODD = Problem(nq=3, nk=3, d=40, dv=40, layout="transposed")
SINKS = Problem(nq=4, nk=5, d=8, dv=8, sinks="mixed")


def _kernel(name: str, fn, **caps) -> Kernel:
    fn.capabilities = Capabilities(window=True, sinks=True, **caps)
    return Kernel(name=name, fn=fn, capabilities=fn.capabilities)


def _report(kernel: Kernel, prop: str, problem: Problem, names: tuple[str, ...]) -> Failure:
    """The failure of the golden comparison of ``names`` on ``problem``."""
    out = run_kernel(kernel, problem, prop, backward=any(n.startswith("d") for n in names))
    with pytest.raises(PropertyFailure) as raised:
        assert_close_to_golden(kernel, problem, prop, out, names)
    return raised.value.failure


def _o_off_when_causal_else_lse(q, k, v, *, causal=False, scale=None, **variants):
    """Two bugs: o off by 1% on causal problems, lse off by 0.5 on the others (a yardstick with
    autograd, so the backward follows the forward)."""
    o, lse = attention_yardstick(q, k, v, causal=causal, scale=scale, **variants)
    return (1.01 * o, lse) if causal else (o, lse + 0.5)


def _dv_flipped(q, k, v, *, causal=False, scale=None, **variants):
    """A right forward; dV comes out with its key rows reversed."""
    return attention_yardstick(q, k, v.detach() + (v - v.detach()).flip(-2), causal=causal, scale=scale,
                               **variants)


def test_one_bug_is_one_entry_and_two_bugs_are_two():
    """o off the golden (undiagnosed) fails forward, backward and odd-head-dims on three problems:
    one cause; the same kernel's lse bug on non-causal problems is another."""
    kernel = _kernel("meta-two-bugs", _o_off_when_causal_else_lse)
    failures = [
        _report(kernel, "forward", FORWARD.replace(causal=True), ("o", "lse")),
        _report(kernel, "backward", BACKWARD, ("o", *gradient_names(BACKWARD))),
        _report(kernel, "odd-head-dims", ODD.replace(causal=True), ("o", "lse", "dq", "dk", "dv")),
        _report(kernel, "single-token", Problem(nq=1, nk=3, d=8, dv=8), ("o", "lse")),
        _report(kernel, "window-forward", FORWARD.replace(window=(2, 1)), ("o", "lse")),
    ]
    groups = group(failures)
    assert [(g.properties, g.cause) for g in groups] == [
        (("backward", "forward", "odd-head-dims"), "forward o (off)"),
        (("single-token", "window-forward"), "forward lse (above it)"),
    ]
    assert groups[0].smallest.prop == "odd-head-dims"  # least work: 3 x 3 x 40
    assert groups[0].headline.startswith("off the golden: o (")
    assert groups[1].headline == "off the golden: lse (above it); within budget: o"


def _causal_one_key_early(q, k, v, *, causal=False, scale=None, **variants):
    """Causal rows see one key past the diagonal (j <= i + Nk - Nq + 1)."""
    if causal:
        return attention_yardstick(q, k, v, scale=scale, window_size=(-1, 1), **variants)
    return attention_yardstick(q, k, v, scale=scale, **variants)


def test_a_diagnosis_every_member_has_joins_the_larger_cause():
    """A causal mask one key early: at Nq = Nk + 1 it is also the top-left mask, and that problem
    is diagnosed top-left first; its failure joins the cause that explains them all (one key past
    the diagonal), rather than an entry telling to declare top-left, and the report shown is one
    whose first diagnosis is that cause, though that problem is the smallest."""
    kernel = _kernel("meta-one-key-early", _causal_one_key_early)
    square = Problem(nq=4, nk=4, d=8, dv=8, causal=True)
    failures = [
        _report(kernel, "forward", square, ("o", "lse")),
        _report(kernel, "odd-head-dims", square.replace(d=40, dv=40, nq=6, nk=6), ("o", "lse")),
        _report(kernel, "single-token", Problem(nq=2, nk=1, d=8, dv=8, causal=True), ("o", "lse")),
    ]
    assert failures[2].diagnoses[0].startswith("diagnosis: matches the top-left causal golden")
    (only,) = group(failures)
    assert only.properties == ("forward", "odd-head-dims", "single-token"), only
    early = ("matches the causal golden with one key past the diagonal visible (key j visible iff "
             "j <= i + Nk - Nq")
    assert only.cause == f"{early} + #, the mask one row early)", only.cause
    assert only.smallest.prop == "forward", only.smallest  # its report names the cause first
    assert only.headline == f"{early} + 1, the mask one row early)", only.headline


def test_one_wrong_gradient_is_one_entry_with_and_without_sinks():
    """The dV bug under the backward and the sinks-backward properties: one cause, whichever
    other gradients (dsinks) are judged."""
    kernel = _kernel("meta-dv-flipped", _dv_flipped)
    failures = [_report(kernel, prop, p, ("o", *gradient_names(p)))
                for prop, p in (("backward", BACKWARD), ("sinks-backward", SINKS))]
    (only,) = group(failures)
    assert only.properties == ("backward", "sinks-backward")
    assert only.cause == "dv does not match the golden"


def test_a_report_without_a_cause_joins_the_mismatch_of_its_problem():
    """A property's own check (no comparison with the golden) on the shrunk problem of a golden
    mismatch joins it; two such checks on another problem are one entry; an error's group takes
    no one; a repro's lines name no cause (only the record's fields do)."""
    kernel = _kernel("meta-off", _o_off_when_causal_else_lse)
    causal = FORWARD.replace(causal=True)
    mismatch = _report(kernel, "forward", causal, ("o", "lse"))

    def own(prop: str, p: Problem, detail: str, error: str | None = None) -> Failure:
        return failure(kernel, p, prop, [detail] if detail else [], error=error)

    relation = "kernel(2q, scale=s) != kernel(q, scale=2s)"
    folded = [own(prop, p, relation)
              for prop, p in (("scale-folding", causal), ("shift-invariance", ODD), ("kv-permutation", ODD))]
    error = "the kernel raised RuntimeError: no kernel for D = 8"
    raised, loner = own("gqa", SINKS, "", error), own("empty-rows", SINKS, "o != 0 on the empty rows")
    groups = {g.properties: g for g in group([mismatch, *folded, raised, loner])}
    assert set(groups) == {("forward", "scale-folding"), ("kv-permutation", "shift-invariance"), ("gqa",),
                           ("empty-rows",)}
    assert groups[("forward", "scale-folding")].smallest is mismatch
    assert groups[("kv-permutation", "shift-invariance")].headline == "one shrunk problem, no cause named"
    assert groups[("empty-rows",)].cause is None and groups[("gqa",)].headline == error
    spoofed = loner.replace(repro=f"{loner.repro}\n{error}")
    assert cause_line(spoofed) is None and cause_line(raised) == error


def test_the_symptom_names_nan_and_the_direction_of_lse():
    """NaN in o is its own kind of symptom (not the same cause as a finite o off the golden)."""
    def nan_row(q, k, v, *, causal=False, scale=None):
        o, lse = attention_golden(q, k, v, causal=causal, scale=scale)
        o[..., 0, :] = float("nan")
        return o.to(q.dtype), lse.float()

    kernel = _kernel("meta-nan-row", nan_row)
    (only,) = group([_report(kernel, "forward", FORWARD, ("o", "lse"))])
    assert only.cause == "forward o (NaN)", only.headline


def test_metamorphic_disagreements_of_one_kind_are_one_cause():
    """Two runs of the kernel that disagree with NaN in o, under two relations and problems: one
    cause; a relation off in lse is another."""
    kernel = _kernel("meta-relations", _dv_flipped)

    def relation(prop: str, p: Problem, tensor: str, kind: str, line: str) -> Failure:
        found = Relation(tensor, kind, line)
        return failure(kernel, p, prop, ["the relation's two runs", line], relation=found)

    groups = group([
        relation("shift-invariance", ODD, "o", "NaN", "o: NaN in 8 elements, first at (0, 0, 1, 0)"),
        relation("scale-folding", FORWARD, "o", "NaN", "o: NaN in 1 elements, first at (0, 0, 0, 0)"),
        relation("split-kv-merge", SINKS, "lse", "off",
                 "lse: max|a - b| = 1.2e-01 at (0, 0, 0) (1 vs 2) > budget 4e-03"),
    ])
    assert [(g.properties, g.cause) for g in groups] == [
        (("scale-folding", "shift-invariance"), "relation o (NaN)"),
        (("split-kv-merge",), "relation lse (off)"),
    ]
    assert groups[0].headline == "o: NaN in 8 elements, first at (0, 0, 1, 0)"  # ODD: least work


def test_an_output_off_the_contract_is_one_cause():
    """lse in the input dtype (float16) fails every property that runs the kernel, whatever the
    problem: one cause, named by run_kernel's check of the outputs."""
    kernel = _kernel("meta-lse-float16", lambda q, k, v, *, causal=False, scale=None, **variants: (
        attention_yardstick(q, k, v, causal=causal, scale=scale, **variants)))
    failures = []
    windowed = FORWARD.replace(window=(1, 1))
    for prop, p in (("forward", FORWARD), ("backward", BACKWARD), ("window-forward", windowed)):
        with pytest.raises(PropertyFailure) as raised:
            run_kernel(kernel, p.replace(dtype=torch.float16), prop, backward=prop == "backward")
        failures.append(raised.value.failure)
    (only,) = group(failures)
    assert only.properties == ("backward", "forward", "window-forward")
    assert only.headline.startswith("lse dtype torch.float16 != torch.float32"), only.headline


def _inverse_d(q, k, v, *, causal=False, scale=None, **variants):
    """Scores scaled by 1/D, not 1/sqrt(D) (a yardstick with autograd; lse in float32)."""
    o, lse = attention_yardstick(q, k, v, causal=causal, scale=1 / q.shape[-1] if scale is None else scale,
                                 **variants)
    return o, lse.float()


def _inverse_d_or_gqa_modulo(q, k, v, *, causal=False, scale=None, **variants):
    """Two bugs: without GQA, scores scaled by 1/D; with it, query head h reads kv head h % Hkv
    (not h // (Hq / Hkv))."""
    if q.shape[1] == k.shape[1]:
        return _inverse_d(q, k, v, causal=causal, scale=scale, **variants)
    heads = torch.arange(q.shape[1]) % k.shape[1]
    o, lse = attention_yardstick(q, k[:, heads], v[:, heads], causal=causal, scale=scale, **variants)
    return o, lse.float()


def _lse_off(q, k, v, *, causal=False, scale=None, **variants):
    """A right o, lse off by 0.5."""
    o, lse = attention_yardstick(q, k, v, causal=causal, scale=scale, **variants)
    return o, lse.float() + 0.5


def _long_golden(kernel: Kernel, problem: Problem, prop: str = test_long_golden.PROP) -> Failure:
    """The long-golden property's failure on ``problem``: its comparisons and their symptom, made
    without the tensors, no diagnosis (under another ``prop``: a spread property's, which judges
    the same way)."""
    found = test_long_golden.judge_example(kernel, problem, test_long_golden.LONG["cpu"]["scores"])
    assert found is not None
    f = found.failure.replace(prop=prop)
    assert f.symptom is not None and not f.diagnoses, f
    return f


def _precision(kernel: Kernel, problem: Problem) -> Failure:
    """The precision property's failure on ``problem`` (mean errors over their bounds)."""
    with pytest.raises(PropertyFailure) as raised:
        test_precision._checker("precision")(kernel, problem)
    return raised.value.failure


def test_a_symptom_made_without_the_tensors_has_the_key_made_with_them():
    """Made from the comparisons alone (long-golden, the spread layouts), a symptom has the key
    of the one made with the judged tensors (lse's direction read as off): NaN in o, o off, lse
    off (above it), dV off; comparisons within budget make none."""
    def nan_row(q, k, v, *, causal=False, scale=None):
        o, lse = attention_golden(q, k, v, causal=causal, scale=scale)
        o[..., 0, :] = float("nan")
        return o.to(q.dtype), lse.float()

    found = []
    for fn, prop, p, names in (
        (nan_row, "forward", FORWARD, ("o", "lse")),
        (_inverse_d, "backward", BACKWARD, ("o", *gradient_names(BACKWARD))),
        (_lse_off, "forward", FORWARD, ("o", "lse")),
        (_dv_flipped, "sinks-backward", SINKS, ("o", *gradient_names(SINKS))),
    ):
        kernel = _kernel(f"meta-{fn.__name__}", fn)
        backward = len(names) > 2
        out = run_kernel(kernel, p, prop, backward=backward)
        results = judge(kernel, p, out, names)
        golden = reference_for(kernel, p, backward=backward)[0]
        made = Symptom.of(results, {n: getattr(out, n) for n in names},
                          {n: getattr(golden, n) for n in names})
        alone = Symptom.of(results)
        assert alone is not None and alone.key() == undirected(made.key()), (alone, made)
        found.append(alone.key())
        assert Symptom.of([r for r in results if r.ok]) is None  # within budget: no symptom
    assert found == ["forward o (NaN)", "forward o (off)", "forward lse (off)", "backward dv (off)"]


def test_undiagnosed_failures_with_the_symptom_of_a_diagnosis_join_it():
    """A 1/D scale, diagnosed on the small problems of forward (o off) and single-token (lse off,
    o right: one key, so every value equals the golden's), fails long-golden, precision and a
    spread property on problems it is not diagnosed on, with o off, o off and lse off: one
    entry, those three listed apart as inferred, the report shown a diagnosed one's."""
    kernel = _kernel("meta-inverse-d", _inverse_d)
    diagnosed = [_report(kernel, "forward", FORWARD, ("o", "lse")),
                 _report(kernel, "single-token", Problem(nq=1, nk=1, d=8, dv=8), ("o", "lse"))]
    assert all("diagnosis: matches the golden with scale 1/D" in str(f) for f in diagnosed), diagnosed
    undiagnosed = [_long_golden(kernel, Problem(hq=2, nq=9, nk=17, d=16, dv=16, causal=True)),
                   _long_golden(kernel, Problem(b=2, nq=1, nk=1, d=8, dv=8), "spread-batch"),
                   _precision(kernel, Problem(nq=3, nk=64, d=8, dv=8, dtype=torch.float16))]
    (only,) = group([*diagnosed, *undiagnosed])
    assert only.cause == "matches the golden with scale #/D = #", only.cause
    assert only.inferred == ("long-golden", "precision", "spread-batch"), only.inferred
    assert only.properties == ("forward", "long-golden", "precision", "single-token", "spread-batch")
    assert only.smallest.prop == "single-token"
    assert only.headline.startswith("matches the golden with scale 1/D"), only.headline
    tallies = report.Tallies()  # the session's are left alone
    for f in [*diagnosed, *undiagnosed]:
        tallies.by_property[f.kernel, f.prop] = report.Tally(failed=1, last_failure=f)
    heading, *lines = tallies.failure_lines()
    assert heading.startswith(f"[1] {kernel.name}: 5 properties fail with one cause (3 of them by its "
                              "symptom, not diagnosed): matches the golden with scale 1/D"), heading
    assert lines[:3] == ["    properties: forward, single-token",
                         "    with the same symptom, not diagnosed: long-golden, precision, spread-batch",
                         "    the smallest problem among those diagnosed (single-token):"]
    markdown = "\n".join(tallies.markdown_lines())
    assert "properties: forward, single-token; with the same symptom, not diagnosed: long-golden" in markdown


def test_a_symptom_joins_the_larger_diagnosis_and_another_symptom_stays_apart():
    """One kernel, two diagnosed bugs with o off (a 1/D scale on forward and single-token, the GQA
    head map on gqa-consistency) stay two entries; a long-golden failure with o off joins the
    larger; a failure with lse off alone (the kernel's members all have o off) keeps its own."""
    kernel = _kernel("meta-two-diagnoses", _inverse_d_or_gqa_modulo)
    gqa = Problem(hq=4, hkv=2, nq=5, nk=6, d=8, dv=8)
    scale = [_report(kernel, prop, p, ("o", "lse")) for prop, p in (
        ("forward", FORWARD.replace(hkv=2)), ("single-token", Problem(nq=1, nk=3, d=8, dv=8)))]
    heads = _report(kernel, "gqa-consistency", gqa, ("o", "lse"))
    long_o = _long_golden(kernel, Problem(hq=2, hkv=2, nq=9, nk=17, d=16, dv=16, causal=True))
    lse_only = _long_golden(Kernel(name=kernel.name, fn=_lse_off, capabilities=kernel.capabilities),
                            Problem(nq=9, nk=17, d=16, dv=16), "spread-rows")
    groups = group([*scale, heads, long_o, lse_only])
    scaled = "matches the golden with scale #/D = #"
    assert [(g.properties, g.inferred, g.cause) for g in groups] == [
        (("forward", "long-golden", "single-token"), ("long-golden",), scaled),
        (("gqa-consistency",), (), "matches the golden with query head h reading kv head h % Hkv"),
        (("spread-rows",), (), "forward lse (off)"),
    ]


def _softmax_without_max(q, k, v, *, causal=False, scale=None):
    """exp(s) unshifted: inf/NaN where the logits overflow float32."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    e = torch.exp((q @ k.transpose(-1, -2)) * scale)
    total = e.sum(-1, keepdim=True)
    return e @ v / total, torch.log(total).squeeze(-1)


def test_distinct_failures_of_one_property_are_reported_whole_and_diagnosed():
    """A property failing at two places (Hypothesis raises the group of its distinct failures): each
    is reported with its diagnoses, a property's own check (no comparison with the golden) with
    those of its problem's plain call, and both are one cause of one property."""
    from flashprop.harness import check
    from hypothesis import Phase
    from hypothesis import strategies as st

    run = RunContext(database=None, phases=(Phase.explicit,))  # the session's tallies are left alone
    kernel = _kernel("meta-no-max", _softmax_without_max, dtypes=frozenset({torch.float32}), backward=False)
    prop, overflowing = "meta-two-sites", Problem(nq=1, nk=1, d=4, dv=4, dist="overflow")

    def two_sites(kernel: Kernel, p: Problem) -> None:
        out = run_kernel(kernel, p, prop)
        if p.nk > 1:  # a check of its own: no error, symptom or diagnosis in its record
            raise PropertyFailure(failure(kernel, p, prop, ["o is not finite"]))
        assert_close_to_golden(kernel, p, prop, out, ("o", "lse"))

    with pytest.raises(Exception) as raised:  # the group of its distinct failures Hypothesis raises
        check.run_property(run, kernel, prop, st.just(overflowing), two_sites,
                           explicit=(overflowing, overflowing.replace(nk=2)))
    members = raised.value.exceptions
    assert len(members) == 2 and all(isinstance(e, PropertyFailure) for e in members), members
    softmax = "diagnosis: a softmax without its max subtraction: "
    assert all(e.failure.diagnoses[0].startswith(softmax) for e in members), [str(e) for e in members]
    own = next(e.failure for e in members if "o is not finite" in e.failure.details)
    assert own.details[-1].startswith("its call on this problem alone is off the golden: o (NaN)"), own
    (only,) = run.tallies.failure_groups()
    assert only.properties == (prop,) and only.cause == "a softmax without its max subtraction", only
