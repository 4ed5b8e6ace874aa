"""The property harness: run a kernel on a drawn problem, judge it, report a failure well.

Every property is a function ``check(kernel, problem)`` that raises :class:`PropertyFailure`
with :func:`failure`'s message. :func:`run_property` drives it with Hypothesis under the run's
:class:`harness.run_context.RunContext` (its settings, replay target and time box), so failures
are shrunk to a minimal problem, and keeps the context's per-property tallies
(:class:`harness.report.Tallies`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NoReturn

import pytest
import torch
from hypothesis import Phase, example, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable, UnsatisfiedAssumption

from ..contract.fp8 import is_fp8
from ..contract.outputs import mismatch as output_mismatch
from ..contract.outputs import mismatches as output_mismatches
from ..contract.problem import LAYOUTS, KernelInputs, Problem
from ..contract.registry import Kernel
from ..contract.validate import CLEAR_ERRORS
from ..refimpl import attention_golden, attention_golden_backward, attention_yardstick
from ..refimpl.golden import attention_rounding_bound
from ..refimpl.layouts import (
    kvcache_golden,
    kvcache_rounding_bound,
    kvcache_yardstick,
    varlen_golden,
    varlen_golden_backward,
    varlen_rounding_bound,
    varlen_yardstick,
)
from .campaign import database_key, end_worker
from .diagnosis import NEIGHBOUR_WORK, diagnose, diagnose_gradients, work
from .failures import Failure
from .report import LEFT_OUT
from .run_context import RunContext
from .strategies import drawing
from .symptoms import Relation, Symptom
from .timebox import Shrinking
from .tolerance import Comparison, Conditioning, compare, conditioning, finite_max_abs

#: Per entry point (``Problem.mode``): float64 golden, golden backward, yardstick.
REFERENCES = {
    "dense": (attention_golden, attention_golden_backward, attention_yardstick),
    "varlen": (varlen_golden, varlen_golden_backward, varlen_yardstick),
    "kvcache": (kvcache_golden, None, kvcache_yardstick),
}
#: Per entry point: the golden's bound of the rounding of P the contract allows (with FP8 q, k, v:
#: o's floor, ``harness.tolerance``; with ``p_dtype``: the precision property's P term).
ROUNDING = {"dense": attention_rounding_bound, "varlen": varlen_rounding_bound,
            "kvcache": kvcache_rounding_bound}
#: Gradient names, in the order the golden backward returns them.
GRADIENTS = ("dq", "dk", "dv", "dsinks")



class PropertyFailure(AssertionError):
    """A property does not hold: its :class:`harness.failures.Failure` record, and as message
    its report.

    ``later`` computes the diagnoses, too costly for every failing example a shrink goes through
    (a dozen goldens each): :attr:`brief` is the record without them, what the tallies keep while
    shrinking; :attr:`failure` (and ``str()``) has them, computed once, for the failure that is
    reported (the shrunk one)."""

    def __init__(self, failure: Failure, later: Callable[[], list[str]] | None = None) -> None:
        super().__init__(failure.problem)
        self.brief = failure
        self._later = later
        self._full: Failure | None = None if later else failure

    @property
    def failure(self) -> Failure:
        if self._full is None:
            self._full = self.brief.replace(diagnoses=(*self.brief.diagnoses, *self._later()))
        return self._full

    def __str__(self) -> str:
        return self.failure.render()


class KernelRefused(Exception):
    """The kernel raised a clear error (ValueError, TypeError, NotImplementedError)."""


class ContextBroken(BaseException):
    """The CUDA context is lost (``failure``: the record of the problem where it showed; ``cause``:
    the one-line sentence a dead worker's report gives, e.g. "the kernel raised ...").
    :func:`run_property` notes it in the run's :attr:`RunContext.broken` and fails the test; a
    BaseException, so that no property's own ``except Exception`` takes it for the kernel's
    error."""

    def __init__(self, failure: Failure, cause: str) -> None:
        super().__init__(f"the CUDA context is broken; the problem that broke it:\n{failure}")
        self.failure, self.cause = failure, cause


class TimeBoxSpent(pytest.skip.Exception):
    """A property's share of the time box is spent (raised at its next example). A skip to
    Hypothesis, which stops at once (in its explicit phase too, unshrunk); :func:`run_property`
    ends the property there, a pass with the examples it ran (one at least)."""


#: What an error says when the CUDA context is lost (:class:`ContextBroken`).
_CUDA_FATAL = (
    "illegal memory access",
    "unspecified launch failure",
    "device-side assert",
    "misaligned address",
    "illegal instruction",
    "CUDA error: an illegal",
)


def _fatal(err: BaseException) -> bool:
    """Whether ``err`` says that the CUDA context is lost (:data:`_CUDA_FATAL`)."""
    return any(s in str(err) for s in _CUDA_FATAL)


def _fault_after(problem: Problem) -> str | None:
    """The fault a failed call left on the GPU, surfaced by synchronizing (``None``: none, or a CPU
    problem). A call that raises may have launched work that faults later (cuDNN's backward on a
    misaligned dO raised RuntimeError, then a misaligned address ended the context): without this,
    the fault surfaces in the next call, which may be another kernel's."""
    if not problem.device.startswith("cuda") or not torch.cuda.is_initialized():
        return None
    try:
        torch.cuda.synchronize()
    except Exception as fault:
        return f"{type(fault).__name__}: {fault}" if _fatal(fault) else None
    return None


def failure(
    kernel: Kernel,
    problem: Problem,
    prop: str,
    details: list[str],
    *,
    backward: bool = False,
    judged: Sequence[str] | None = None,
    inputs: tuple[str, str] | None = None,
    error: str | None = None,
    symptom: Symptom | None = None,
    relation: Relation | None = None,
    malformed: tuple[str, Sequence[str]] | None = None,
) -> Failure:
    """The record of ``prop`` failing on ``problem`` (:mod:`harness.failures`): the problem, the
    ``details``, what names the cause (``error``, ``symptom``, ``relation``: the record's fields),
    a repro that calls the kernel as the suite did and judges ``judged`` against the golden
    (default: o and lse, and the gradients with ``backward``; :meth:`Problem.repro`, ``inputs``
    and ``malformed``, a malformed call that must be refused, as there) and the command that
    replays the property on that problem alone."""
    if judged is None:
        judged = ("o", "lse", *(gradient_names(problem) if backward else ()))
    replay = replay_command(kernel.name, prop, problem)
    repro = problem.repro(kernel.name, judged=judged, returns_lse=kernel.capabilities.returns_lse,
                          inputs=inputs, replay=replay, malformed=malformed)
    return Failure(kernel.name, prop, problem.describe(), tuple(details), error=error, symptom=symptom,
                   relation=relation, repro=repro, replay=replay)


def replay_command(kernel: str, prop: str, problem: Problem) -> str:
    """The command that runs property ``prop`` on ``problem`` only (``--replay``): pytest aimed
    at the running test function (from ``PYTEST_CURRENT_TEST``) when its file is reachable from
    the working folder (a checkout), else (flashprop installed, its tests collected with
    ``--pyargs``: their node ids are relative to the installed package) the ``flashprop replay``
    command, which works from any folder with the user's python, collecting the running test
    alone (:func:`module_test`)."""
    current = os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0].split("[")[0]
    target = current or "properties"
    arg = f"{prop}:{problem.describe()}"
    quoted = f'"{arg}"' if not set(arg) & set('"$`\\!') else shlex.quote(arg)  # readable quoting
    if target.startswith("::") or not Path(target.split("::")[0]).exists():
        found = module_test(current) if current else None  # only inside that test
        test = f" --test {found}" if found else ""
        return (f"python -m flashprop.cli replay {shlex.quote(kernel)} {quoted} "
                f"--device {problem.device}{test}")
    return (
        f"python -m pytest {target} -q -p no:cacheprovider "
        f"--kernel {shlex.quote(kernel)} --device {problem.device} --replay {quoted}"
    )


def module_test(node_id: str) -> str | None:
    """The test of pytest node id ``node_id`` (its parameters cut) as ``MODULE::FUNCTION``, what
    ``flashprop replay --test`` collects: the last part of its module's name and its function. A
    node id without its file (pytest given the module itself, ``--pyargs MODULE::FUNCTION``, as a
    replay is) names the module by the loaded property module that defines the function."""
    path, _, function = node_id.partition("::")
    if path:
        return f"{Path(path).stem}::{function}"
    package = f"{__package__.rpartition('.')[0]}.properties."
    found = [name.rpartition(".")[2] for name, module in list(sys.modules.items())
             if name.startswith(package) and callable(getattr(module, function, None))]
    return f"{found[0]}::{function}" if len(found) == 1 else None


@dataclass
class Outputs:
    o: torch.Tensor
    lse: torch.Tensor | None
    dq: torch.Tensor | None = None
    dk: torch.Tensor | None = None
    dv: torch.Tensor | None = None
    dsinks: torch.Tensor | None = None
    #: Golden only: absolute-value bounds of the gradients (the floor's magnitude).
    bounds: dict[str, float] | None = None
    #: Golden only: the inputs' conditioning (the floor's logit and values terms).
    conditioning: Conditioning | None = None


def run_kernel(
    kernel: Kernel,
    problem: Problem,
    prop: str,
    *,
    backward: bool = False,
    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | KernelInputs | None = None,
    scale: float | None = None,
    grad_output: torch.Tensor | None = None,
    declared: bool = True,
    malformed: str | None = None,
) -> Outputs:
    """Call the problem's entry point on its tensors (or on ``inputs``: the whole
    :class:`KernelInputs`, or a dense problem's ``q, k, v`` with the problem's variant keywords);
    gradients for q, k, v (and sinks) if ``backward``.

    A clear error on a ``declared`` problem, or any other exception, is a
    :class:`PropertyFailure`; an error that broke the CUDA context is a :class:`ContextBroken`
    (:func:`run_property` ends the test on it). On an undeclared problem (``declared=False``, the
    error contract) a clear error raises :class:`KernelRefused` instead. ``malformed``: ``inputs``
    are the problem's with that malformed input applied
    (``harness.variant_problems.malformed_inputs``), which a failure's repro rebuilds.
    """
    if inputs is None:
        inputs = problem.kernel_inputs(requires_grad=backward)
    elif not isinstance(inputs, KernelInputs):
        variants = problem.variant_kwargs(requires_grad=backward)
        grads = dict(zip("qkv", inputs, strict=True))
        if "sinks" in variants:
            grads["sinks"] = variants["sinks"]
        inputs = KernelInputs(tuple(inputs), variants, grads)
    scale = problem.scale if scale is None else scale
    bad = None if malformed is None else (malformed, tuple(inputs.kwargs))
    try:
        o, lse = kernel.call(
            problem.mode, inputs.args, inputs.kwargs, causal=problem.causal, scale=scale,
            block_m=problem.block_m, block_n=problem.block_n,
        )
        wrong = output_mismatches(problem.mode, inputs.args, o, lse)  # before autograd trips on them
        grads: dict[str, torch.Tensor | None] = {}
        if backward and not wrong:
            do = problem.grad_output() if grad_output is None else grad_output
            wrt = list(inputs.grads.values())
            found = torch.autograd.grad(o, wrt, do, allow_unused=True)
            grads = {f"d{name}": g for name, g in zip(inputs.grads, found, strict=True)}
        if isinstance(o, torch.Tensor) and o.is_cuda:
            torch.cuda.synchronize()
    except CLEAR_ERRORS as err:
        text = f"{type(err).__name__}: {err}"
        if not declared:
            raise KernelRefused(text) from err
        raise PropertyFailure(
            failure(kernel, problem, prop, [], error=f"the kernel refused a declared problem: {text}",
                    backward=backward)
        ) from err
    except Exception as err:
        text = f"{type(err).__name__}: {err}"
        fatal = _fatal(err)
        fault = None if fatal else _fault_after(problem)
        said = text if fault is None else f"{text}\nand synchronizing after it raised {fault}"
        message = failure(kernel, problem, prop, [], error=f"the kernel raised {said}", backward=backward,
                          malformed=bad)
        if fatal or fault is not None:
            then = "" if fault is None else f"; synchronizing after it raised {fault.splitlines()[0]}"
            raise ContextBroken(message, f"the kernel raised {text.splitlines()[0]}{then}") from err
        raise PropertyFailure(message) from err
    if kernel.capabilities.returns_lse and lse is None:
        lost = "declares returns_lse but returned only o"
        raise PropertyFailure(failure(kernel, problem, prop, [], error=lost, malformed=bad))
    if wrong:  # o's and lse's dtype and shape are the contract's (contract.outputs), in every property
        raise PropertyFailure(failure(kernel, problem, prop, wrong[1:], error=wrong[0], backward=backward,
                                      malformed=bad))
    return Outputs(o, lse, **grads)


def gradient_names(problem: Problem) -> tuple[str, ...]:
    """The gradients a backward problem is judged on: dq, dk, dv, and dsinks with sinks."""
    return GRADIENTS if problem.sinks is not None else GRADIENTS[:3]


def with_rounding(cond: Conditioning, mode: str, args: tuple, kw: dict) -> Conditioning:
    """``cond`` with the FP8 rounding term of a ``mode`` call on FP8 ``args`` (:data:`ROUNDING`,
    ``kw`` the references' keywords); as it is for any other call."""
    bound = ROUNDING.get(mode)
    if bound is None or not is_fp8(args[0]):
        return cond
    return replace(cond, rounding=finite_max_abs(bound(*args, **kw)[0]))


@functools.lru_cache(maxsize=16)
def references(problem: Problem, alignment: str, tf32: bool, backward: bool) -> tuple[Outputs, Outputs]:
    """Golden (float64) and yardstick (input dtype) outputs for ``problem``, cached."""
    return references_with(problem, alignment, tf32, backward)


def references_with(
    problem: Problem, alignment: str, tf32: bool, backward: bool, extra: dict | None = None
) -> tuple[Outputs, Outputs]:
    """:func:`references` with ``extra`` keywords for both references (a kernel's own dropout keep
    mask, ``dropout_mask``: the dropout properties), uncached."""
    golden_fn, golden_bwd, yard_fn = REFERENCES[problem.mode]
    inp = problem.kernel_inputs()
    kw = dict(causal=problem.causal, scale=problem.scale, alignment=alignment, **inp.kwargs, **(extra or {}))
    o, lse = golden_fn(*inp.args, **kw)
    golden = Outputs(o, lse, conditioning=with_rounding(conditioning(problem), problem.mode, inp.args, kw))
    names = gradient_names(problem)
    if backward:
        q, k, v, *rest = inp.args
        # the golden backward takes the forward just computed instead of computing it again
        found = golden_bwd(q, k, v, problem.grad_output(), *rest, bounds=True, forward=(o, lse), **kw)
        for name, t in zip(names, found[: len(names)], strict=True):
            setattr(golden, name, t)
        golden.bounds = {
            n: float(t.abs().max()) if t.numel() else 0.0
            for n, t in zip(names, found[len(names) :], strict=True)
        }
    yin = problem.kernel_inputs(requires_grad=backward)
    ykw = dict(causal=problem.causal, scale=problem.scale, alignment=alignment, **yin.kwargs, **(extra or {}))
    with yardstick_precision(tf32, yin.args[0]), torch.set_grad_enabled(backward):
        oy, lsey = yard_fn(*yin.args, **ykw)
        yard = Outputs(oy.detach(), lsey.detach())
        if backward:
            found = torch.autograd.grad(oy, list(yin.grads.values()), problem.grad_output())
            for name, t in zip(names, found, strict=True):
                setattr(yard, name, t)
    return golden, yard


@contextlib.contextmanager
def yardstick_precision(tf32: bool, q: torch.Tensor):
    """Run the yardstick's float32 CUDA matmuls in tf32 when the kernel declares tf32 products."""
    if not (tf32 and q.is_cuda):
        yield
        return
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def reference_for(kernel: Kernel, problem: Problem, backward: bool = False) -> tuple[Outputs, Outputs]:
    caps = kernel.capabilities
    return references(problem, caps.causal_alignment, caps.fp32_matmul == "tf32", backward)


def budget_dtype(problem: Problem, name: str) -> torch.dtype:
    """The dtype whose precision tensor ``name`` is judged at: the problem's, but for dsinks, which
    is float32 as the sinks are (``docs/variants.md``): a float64 problem's dsinks is known only
    to float32 precision, however exactly the kernel computes it."""
    return torch.float32 if name == "dsinks" and problem.dtype == torch.float64 else problem.dtype


def judge(kernel: Kernel, problem: Problem, out: Outputs, names: tuple[str, ...],
          refs: tuple[Outputs, Outputs] | None = None) -> list[Comparison]:
    """Compare the named tensors of ``out`` with golden; lse only when the kernel returns it. An o
    or lse of another dtype or shape than the contract's (:mod:`contract.outputs`) fails outright.
    ``refs``: the golden and yardstick to judge by (default: the problem's, :func:`reference_for`)."""
    golden, yard = refs or reference_for(kernel, problem, backward=any(n in GRADIENTS for n in names))
    cond = golden.conditioning  # the floor's logit term: raw logits, lse and values' sizes
    logit_size = cond.logit_size(golden.lse)
    results = []
    for name in names:
        if name == "lse" and out.lse is None:
            continue
        actual = getattr(out, name)
        if actual is None:
            results.append(Comparison.outright(name, "no gradient returned"))
            continue
        expected = getattr(golden, name)
        wrong = output_mismatch(name, problem.mode, actual, expected.shape, problem.dtype) if name in (
            "o", "lse") else None
        if wrong is not None:
            results.append(Comparison.outright(name, wrong))
            continue
        magnitude = golden.bounds.get(name) if golden.bounds else None
        dtype = budget_dtype(problem, name)
        results.append(compare(name, actual, expected, getattr(yard, name), dtype, magnitude, logit_size,
                               cond.values_for(name), cond.rounding_for(name)))
    return results


def assert_close_to_golden(
    kernel: Kernel, problem: Problem, prop: str, out: Outputs, names: tuple[str, ...],
    refs: tuple[Outputs, Outputs] | None = None,
) -> None:
    """Fail unless each named tensor of ``out`` is within its budget of the golden: the report
    has every comparison, the symptom (:class:`harness.symptoms.Symptom`) and the diagnoses
    (:mod:`harness.diagnosis`: a neighbouring convention or row pattern of a wrong forward; for a
    wrong backward with a right forward, which gradients match). ``refs`` as :func:`judge`'s."""
    results = judge(kernel, problem, out, names, refs)
    bad = [r for r in results if not r.ok]
    if bad:
        golden = (refs or reference_for(kernel, problem, backward=any(n in GRADIENTS for n in names)))[0]
        actual = {r.name: getattr(out, r.name) for r in results}
        expected = {r.name: getattr(golden, r.name) for r in results}
        details = [r.describe() for r in results]

        def diagnoses() -> list[str]:
            if not any(r.name in ("o", "lse") for r in bad):
                return diagnose_gradients(problem, results, actual, expected)
            limits = {r.name: r.budget for r in results if r.name in ("o", "lse")}
            if "o" not in limits:
                return []
            return diagnose(problem, kernel.capabilities.causal_alignment, out.o, out.lse, limits,
                            (golden.o, golden.lse))

        raise PropertyFailure(failure(kernel, problem, prop, details, judged=names,
                                      symptom=Symptom.of(results, actual, expected)), later=diagnoses)


def _context_broke(run: RunContext, kernel: Kernel, prop: str, broke: ContextBroken) -> NoReturn:
    """``kernel`` broke the CUDA context: a dead context cannot run anything again. A campaign
    worker ends itself, its problem noted with the cause: xdist starts a fresh worker (a fresh
    context) for the rest. A lone process reports this problem once, as it is (the run's
    :attr:`RunContext.broken`): the shrinking Hypothesis still does fails at once
    (:func:`run_property`) and does not overwrite it."""
    if run.tallies.noting():
        end_worker(run.tallies, broke.cause)
    run.broken[kernel.name] = broke.failure
    run.tallies.record(kernel.name, prop, "failed", 0.0, broke.failure)
    pytest.fail(str(broke), pytrace=False)


def _diagnosed_by_its_call(run: RunContext, kernel: Kernel, prop: str, found: Failure) -> Failure:
    """A failure that names no error, diagnosis or symptom (a property's own check: a metamorphic
    relation, empty rows, gradcheck), on a problem whose plain call is off the golden too and
    diagnosed (:func:`assert_close_to_golden`): with that call's symptom line and diagnoses, so
    that it joins the cause they name (a softmax that overflows breaks the relations and the
    derivatives on the rows it breaks). Problems of the plain layouts, without dropout, within
    the neighbours' work limit (``diagnosis.NEIGHBOUR_WORK``) only; any other outcome leaves
    ``found`` as it is."""
    if found.error or found.diagnoses or found.symptom or kernel.name in run.broken:
        return found
    try:
        p = Problem.parse(found.problem)
    except (ValueError, SyntaxError, TypeError, KeyError):
        return found
    if (p.layout not in LAYOUTS or p.dropout is not None
            or work(p) > NEIGHBOUR_WORK.get(p.device.split(":")[0], 0)):
        return found
    names = ("o", "lse") if kernel.capabilities.returns_lse else ("o",)
    try:
        assert_close_to_golden(kernel, p, prop, run_kernel(kernel, p, prop), names)
    except PropertyFailure as off:
        seen = off.failure
        if seen.error or not seen.diagnoses or seen.symptom is None:
            return found
        alone = f"its call on this problem alone is {seen.symptom.line()}"
        return found.replace(details=(*found.details, alone), diagnoses=seen.diagnoses)
    except ContextBroken as broke:
        _context_broke(run, kernel, prop, broke)
    except Exception:  # the call or the golden could not be made here: the failure as it was found
        return found
    return found


def _reported(run: RunContext, kernel: Kernel, prop: str, err: PropertyFailure,
              note: str | None) -> PropertyFailure:
    """The shrunk failure as it is reported: its record whole (diagnoses, or those of its plain
    call: :func:`_diagnosed_by_its_call`) and the note of a shrink cut short; ``err`` itself when
    neither adds anything."""
    found = _diagnosed_by_its_call(run, kernel, prop, err.failure)
    found = found if note is None else found.replace(note=note)
    return err if found is err.failure else PropertyFailure(found)


def run_property(
    run: RunContext,
    kernel: Kernel,
    prop: str,
    problems: st.SearchStrategy[Problem],
    check: Callable[[Kernel, Problem], str | None],
    *,
    weight: float = 1.0,
    explicit: Sequence[Problem] = (),
) -> None:
    """Drive ``check`` with Hypothesis over ``problems`` under the run's context ``run`` (its
    settings, ``--replay``, ``--shards``, time box and tallies); tally each example.

    ``check`` returns ``"refused"`` when the kernel clearly refused an undeclared problem
    (error-contract properties), else ``None`` for a pass; it raises on failure. ``weight``
    scales the profile's ``max_examples`` for expensive properties. ``explicit``: problems run
    first, whatever is drawn after (Hypothesis's explicit examples; not in a replay, and under
    ``--shards`` by shard 0 alone). The example database keeps the test's examples under
    :func:`campaign.database_key` (the kernel, its declaration, the test case and ``prop``), in
    use under ``--shards`` and ``--hypothesis-seed`` too.
    """
    if run.broken:
        message = next(iter(run.broken.values()))
        pytest.skip(
            f"the CUDA context is broken since {message.render().splitlines()[0]} (reported there); "
            "run the campaign on xdist workers (-n), which replace a broken worker"
        )
    base = run.hypothesis_settings()
    n = max(1, round(base.max_examples * weight))
    shard = run.campaign.current_shard()
    tallies = run.tallies
    if run.replay is not None:
        if prop != run.replay.prop:
            pytest.skip(f"--replay runs property {run.replay.prop!r} only")
        problems, n, explicit = st.just(run.replay.problem), 1, ()
        base = settings(base, database=None, phases=[Phase.generate])
    elif prop in run.skip_properties:  # before the time box's share: a probe sees the skip
        pytest.skip(f"{LEFT_OUT}{prop}")
    elif shard is not None:  # --shards: this shard's share, drawn from its seed (Campaign.running)
        n = shard.share(prop, n)
        base = settings(base, derandomize=False)
        explicit = explicit if shard.index == 0 else ()
    if Phase.explicit not in base.phases:
        explicit = ()

    ran_before = tallies[kernel.name, prop].run  # this call's examples: those after
    errors: list[BaseException] = []  # check raised, not a failure: Hypothesis shrinks it, uncut
    slot = run.time_box.share()
    shrinking = Shrinking(None if slot is None else slot[0], run.shrink_seconds)
    tallies.expect(kernel.name, prop, n + len(explicit))

    def examples(problem: Problem) -> None:
        if kernel.name in run.broken:  # shrinking after a broken context: nothing can run
            pytest.fail("the CUDA context is broken; the problem that broke it:\n"
                        f"{run.broken[kernel.name]}", pytrace=False)
        tally = tallies[kernel.name, prop]
        run.campaign.stop_if_asked(tally.run)
        # a share spent stops the property from its second example on: each property runs one
        if (slot is not None and tally.run > ran_before and time.monotonic() > slot[0]
                and not tally.failed and not errors):
            run.time_box.note_cut()  # a property that found a failure shrinks it whatever the time
            raise TimeBoxSpent(f"{prop}'s share ({slot[1]:.0f} s) was spent after "
                               f"{tally.run - ran_before} examples")
        if tallies.noting():
            tallies.begin(kernel.name, prop, problem.describe(), replay_command(kernel.name, prop, problem))
        if shrinking.over():  # the shrink's time is spent: only the failures found fail again
            found = shrinking.failure_of(problem)
            if found is not None:
                raise found  # the same exception: Hypothesis sees one failure
            shrinking.cut += 1
            return
        start = time.perf_counter()
        try:
            outcome = judged(kernel, problem) or "passed"
        except PropertyFailure as err:
            # A stop signal that came during the example (GNU timeout signals the whole process
            # group) may have caused the failure: a compiler child it killed fails the kernel's
            # call (ptxas "error code -15"). The example is not counted: the property stops here.
            run.campaign.stop_if_asked(tally.run)
            counted("failed", time.perf_counter() - start, err.brief)
            shrinking.failed(problem, err)
            raise
        except ContextBroken as broke:
            _context_broke(run, kernel, prop, broke)
        counted(outcome, time.perf_counter() - start)

    def counted(outcome: str, seconds: float, found: Failure | None = None) -> None:
        """One example in the tallies, and the progress line when one is due."""
        tallies.record(kernel.name, prop, outcome, seconds, found)
        run.time_box.tick(tallies.examples, tallies.failed_examples, tallies.properties_run())

    def judged(kernel: Kernel, problem: Problem) -> str | None:
        """``check``, noting an exception that is not a failure, a rejection or a skip."""
        try:
            return check(kernel, problem)
        except (PropertyFailure, ContextBroken, UnsatisfiedAssumption, pytest.skip.Exception):
            raise
        except BaseException as err:
            if _fatal(err):  # outside the kernel's call (inputs, golden): the context is lost all the same
                text = f"{type(err).__name__}: {err}"
                lost = (f"the CUDA context was lost outside the kernel's call ({text.splitlines()[0]}): a "
                        "fault an earlier call in this process left behind surfaced here")
                raise ContextBroken(failure(kernel, problem, prop, [], error=lost), lost) from err
            errors.append(err)
            raise

    for problem in reversed(explicit):
        examples = example(problem)(examples)
    try:
        test = settings(base, max_examples=n)(given(problems)(examples))
        # Hypothesis keys the database by the test function's source, one for every property here
        test._hypothesis_internal_database_key = database_key(kernel, prop, run.running.case)
        with drawing() as drawn:  # what the declaration check saw of the draws
            test()
    except PropertyFailure as err:  # the shrunk failure: its record whole (diagnoses), and whether cut
        found = _reported(run, kernel, prop, err, shrinking.note())
        tallies.keep_failure(kernel.name, prop, found.failure)
        if found is err:
            raise
        raise found from None
    except TimeBoxSpent:
        tallies.note_time_box(kernel.name, prop)  # a pass: every example it ran passed
    except Unsatisfiable:
        undeclared = drawn.nothing_declared()
        if undeclared is None:  # the property's own conditions draw nothing: its defect
            raise
        pytest.skip(f"kernel {kernel.name} declares none of the problems {prop} needs ({undeclared})")
    except Exception as err:
        members = getattr(err, "exceptions", None)  # Hypothesis found distinct failures: a group
        if not members or not any(isinstance(e, PropertyFailure) for e in members):
            raise
        note = shrinking.note()
        reported = [_reported(run, kernel, prop, e, note) if isinstance(e, PropertyFailure) else e
                    for e in members]
        for i, found in enumerate(e for e in reported if isinstance(e, PropertyFailure)):
            tallies.keep_failure(kernel.name, prop, found.failure, part=i)
        raise err.derive(reported) from None
