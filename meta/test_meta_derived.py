"""Meta-tests: every problem a property runs is one the kernel declares, drawn or derived.

A recorder stands in for ``harness.check.run_kernel`` in every property module. Each call on a
declared problem (``declared=True``; the error contract's calls, whose refusals are the point,
pass ``declared=False``) must be a problem the kernel declares, and the tensors and keywords
the property hands over must be that problem's own (shapes, variant and cache keywords), so a
declared problem cannot stand in for the one really run (sinks dropped from the keywords of a
problem with sinks, say).

Each property runs on ref-blocked under a ``Limit`` that rules out a third of all problems by a
hash of their description: whatever a property derives (a window turned causal, the contiguous
copy of a paged cache, a sequence alone), it lands in the limit within a few examples unless
the strategy declared it (``related=``, ``derive=``). A property written to bypass the route is
caught by the same recorder. Kernels that refuse what they do not declare (a paged cache only,
no contiguous cache, no causal window) pass the kvcache and identity properties, skipping what
they rule out with the declaration's words.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from flashprop.contract.capabilities import Capabilities, KVCache, Limit
from flashprop.contract.problem import KernelInputs, Problem
from flashprop.contract.registry import Kernel
from flashprop.harness import check as harness_check
from flashprop.harness.check import PropertyFailure, run_kernel, run_property
from flashprop.harness.run_context import RunContext
from flashprop.harness.strategies import Sizes, problems
from flashprop.refimpl import blocked
from hypothesis import HealthCheck, Phase, settings

pytestmark = pytest.mark.meta

#: Small enough for ref-blocked to run every property in seconds; lengths reach 16's tile edges.
SIZES = Sizes(max_n=17, max_batch=2, max_kv_heads=2, max_group=2, max_head_dim=64, max_work=20_000,
              long_n=(129, 131))
PROPERTIES_DIR = Path(__file__).resolve().parent.parent / "properties"
#: Property modules not run here, and why.
NOT_RUN = {
    "test_error_contract": "draws undeclared problems on purpose (declared=False: refusal is the point)",
    "test_huge": "tensors past 2^31 elements (a GPU's, or 4 GiB views)",
    "test_long_golden": "N in the thousands on the CPU",
    "test_gradcheck": "calls the kernel through autograd.gradcheck on the drawn problem alone",
}
#: One problem in three is ruled out, by a hash of its description.
HASHED = Limit("meta: one problem in three, by a hash of its description",
               lambda p: zlib.crc32(p.describe().encode()) % 3 == 0)
#: The gradients of another third (a limit of the backward: dO's layout, say).
HASHED_BACKWARD = Limit("meta: the gradients of one problem in three, by another hash",
                        lambda p: zlib.crc32(b"dO" + p.describe().encode()) % 3 == 0,
                        raises=False, backward=True)


def _property_tests() -> list[tuple[str, str, dict]]:
    """``(module, function, parameters)`` of every property test case that takes the kernel and
    besides it the device, the sizes and parameters of its ``parametrize`` marks (a case each)."""
    found = []
    for path in sorted(PROPERTIES_DIR.glob("test_*.py")):
        if path.stem in NOT_RUN:
            continue
        module = importlib.import_module(f"flashprop.properties.{path.stem}")
        for name, fn in vars(module).items():
            if not (name.startswith("test_") and inspect.isfunction(fn) and fn.__module__ == module.__name__):
                continue
            cases = [{}]
            for mark in getattr(fn, "pytestmark", []):
                if mark.name == "parametrize":
                    cases = [{**case, mark.args[0]: value} for case in cases for value in mark.args[1]]
            params = set(inspect.signature(fn).parameters)
            if "kernel" in params and params <= {"run", "kernel", "device", "sizes", *cases[0]}:
                found += [(path.stem, name, case) for case in cases]
    return found


@contextlib.contextmanager
def _quick() -> Iterator[None]:
    """A derandomized profile of 20 examples without shrinking, deadlines or health checks (most
    draws are rejected), whatever profile is loaded; run_property reads the default."""
    settings.register_profile("flashprop-meta-derived-saved", settings.default)
    settings.register_profile("flashprop-meta-derived", settings.default, max_examples=20, derandomize=True,
                              deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
                              suppress_health_check=list(HealthCheck))
    settings.load_profile("flashprop-meta-derived")
    try:
        yield
    finally:
        settings.load_profile("flashprop-meta-derived-saved")


def _shapes(inputs) -> list[tuple[int, ...]]:
    return [tuple(t.shape) for t in inputs[:3]]


def mismatch(problem: Problem, inputs) -> str | None:
    """How the tensors and keywords handed to run_kernel differ from ``problem``'s own (its
    :meth:`Problem.kernel_inputs`), or ``None``: q, k, v shapes, the keyword names, the values
    of the keywords that are not tensors, the shapes of those that are."""
    if inputs is None:
        return None
    own = problem.kernel_inputs()
    args = inputs.args if isinstance(inputs, KernelInputs) else tuple(inputs)
    if _shapes(args) != _shapes(own.args):
        return f"q, k, v of shapes {_shapes(args)}; the problem's are {_shapes(own.args)}"
    if not isinstance(inputs, KernelInputs):
        return None
    if set(inputs.kwargs) != set(own.kwargs):
        return f"keywords {sorted(inputs.kwargs)}; the problem's are {sorted(own.kwargs)}"
    for name, value in inputs.kwargs.items():
        mine = own.kwargs[name]
        same = tuple(value.shape) == tuple(mine.shape) if torch.is_tensor(mine) else value == mine
        if not same:
            return f"keyword {name}={value!r}; the problem's is {mine!r}"
    return None


@dataclasses.dataclass
class Recorder:
    """Stands in for run_kernel in ``modules``; notes every declared call that is not right."""

    caps: Capabilities
    wrong: list[str] = dataclasses.field(default_factory=list)
    calls: int = 0

    def __call__(self, kernel: Kernel, problem: Problem, prop: str, *, inputs=None, declared: bool = True,
                 **kw):
        if declared:
            self.calls += 1
            why = self.caps.unsupported_reason(problem) or mismatch(problem, inputs)
            if why is None and kw.get("backward"):
                why = self.caps.backward_reason(problem)
            if why is not None:
                self.wrong.append(f"{prop}: {problem.describe()}: {why}")
        return harness_check.run_kernel(kernel, problem, prop, inputs=inputs, declared=declared, **kw)


@contextlib.contextmanager
def recording(caps, modules: list, monkeypatch: pytest.MonkeyPatch) -> Iterator[Recorder]:
    recorder = Recorder(caps)
    for module in modules:
        monkeypatch.setattr(module, "run_kernel", recorder)
    yield recorder


def _run(kernel: Kernel, test: Callable, case: dict | None = None) -> str:
    """Run a property test on ``kernel`` (with parameters ``case``): "passed", or "skipped:
    <reason>"; a failure raises. In a run context of its own (out of the session's summary)."""
    given = {"run": RunContext(), "kernel": kernel, "device": "cpu", "sizes": SIZES, **(case or {})}
    try:
        with _quick():
            test(**{name: given[name] for name in inspect.signature(test).parameters})
    except pytest.skip.Exception as skip:
        return f"skipped: {skip}"
    return "passed"


@pytest.mark.parametrize(("module", "name", "case"), _property_tests(),
                         ids=lambda x: "-".join(map(str, x.values())) if isinstance(x, dict) else x)
def test_every_problem_a_property_runs_is_declared(module: str, name: str, case: dict,
                                                   monkeypatch: pytest.MonkeyPatch):
    """Under a limit that rules out a third of all problems, and a backward limit another third of
    their gradients, no property hands run_kernel a problem the kernel does not declare (or whose
    gradients it does not, when it takes them), or tensors that are not the problem's."""
    caps = dataclasses.replace(blocked.attention.capabilities, limits=(HASHED, HASHED_BACKWARD))
    kernel = Kernel(name="meta-hashed-limit", fn=blocked.attention, capabilities=caps)
    mod = importlib.import_module(f"flashprop.properties.{module}")
    with recording(caps, [mod], monkeypatch) as recorder:
        _run(kernel, getattr(mod, name), case)
    assert not recorder.wrong, "\n".join(recorder.wrong[:5])


def test_the_property_cases_are_collected():
    """The parametrization above is not empty (a property signature it does not know would leave it
    so, and the test above would then pass by skipping): every property module not in
    :data:`NOT_RUN` gives at least one case."""
    modules = {module for module, _, _ in _property_tests()}
    expected = {path.stem for path in PROPERTIES_DIR.glob("test_*.py")} - set(NOT_RUN)
    assert modules == expected, sorted(expected - modules)


def _bypassing_property(run: RunContext, kernel: Kernel, device: str, sizes: Sizes) -> None:
    """A property that runs a derived problem (one more query) without declaring it."""

    def check(kernel: Kernel, p: Problem) -> None:
        run_kernel(kernel, p.replace(nq=p.nq + 1), "meta-bypass")

    run_property(run, kernel, "meta-bypass", problems(kernel.capabilities, device=device, sizes=sizes), check)


def _mislabelling_property(run: RunContext, kernel: Kernel, device: str, sizes: Sizes) -> None:
    """A property that runs a problem without its sinks under the problem with them."""

    def check(kernel: Kernel, p: Problem) -> None:
        inp = p.kernel_inputs()
        del inp.kwargs["sinks"]
        run_kernel(kernel, p, "meta-mislabel", inputs=inp)

    strategy = problems(kernel.capabilities, device=device, sizes=sizes,
                        derive=lambda p: p.replace(sinks="mixed"))
    run_property(run, kernel, "meta-mislabel", strategy, check)


def _gradient_bypassing_property(run: RunContext, kernel: Kernel, device: str, sizes: Sizes) -> None:
    """A property that takes gradients of problems drawn for the forward only."""

    def check(kernel: Kernel, p: Problem) -> None:
        run_kernel(kernel, p, "meta-grad-bypass", backward=True)

    run_property(run, kernel, "meta-grad-bypass", problems(kernel.capabilities, device=device, sizes=sizes),
                 check)


@pytest.mark.parametrize("prop", [_bypassing_property, _mislabelling_property, _gradient_bypassing_property],
                         ids=["bypass", "mislabel", "gradient-bypass"])
def test_the_recorder_catches_a_problem_that_skips_the_declaration(prop, monkeypatch: pytest.MonkeyPatch):
    """The recorder above is not blind: a derived problem run without declaring it, and a
    problem handed over with another problem's keywords, and gradients taken of problems drawn
    without their backward's declaration, are all noted."""
    caps = dataclasses.replace(blocked.attention.capabilities, limits=(HASHED, HASHED_BACKWARD))
    kernel = Kernel(name="meta-bypass", fn=blocked.attention, capabilities=caps)
    with recording(caps, [importlib.import_module(__name__)], monkeypatch) as recorder:
        _run(kernel, prop)
    assert recorder.wrong, "the recorder let an undeclared or mislabelled problem through"


def test_a_backward_limit_rules_out_the_gradients_alone():
    """A limit with ``backward=True`` leaves the problem declared for the forward (and outside the
    error contract) and rules out its gradients; it cannot claim a clear error."""
    caps = dataclasses.replace(blocked.attention.capabilities, limits=(
        Limit("meta: a sliced dO", lambda p: p.do_layout == "sliced", raises=False, backward=True),))
    p = Problem(b=1, hq=2, hkv=1, nq=5, nk=7, d=8, dv=8, dtype=torch.float32, grad_layout="sliced")
    assert caps.unsupported_reason(p) is None and not caps.must_raise(p)
    assert caps.backward_reason(p) == "known limit of the backward: meta: a sliced dO"
    assert caps.backward_reason(p.replace(grad_layout="transposed")) is None
    with pytest.raises(ValueError, match="backward limit must have raises=False"):
        Limit("meta", lambda p: True, backward=True)


# ------------------------------------------------------------------ kernels that refuse what they rule out
def _refusing(refuses: Callable[[str, dict], str | None]) -> Callable:
    """ref-blocked's three entry points, raising NotImplementedError where ``refuses(mode,
    keywords)`` names a reason: a kernel that refuses what its declaration rules out."""

    def entry(mode: str, fn: Callable) -> Callable:
        def call(*args, **kw):
            reason = refuses(mode, kw)
            if reason is not None:
                raise NotImplementedError(reason)
            return fn(*args, **kw)

        return call

    dense = entry("dense", blocked.attention)
    dense.varlen = entry("varlen", blocked.varlen)
    dense.kvcache = entry("kvcache", blocked.kvcache)
    return dense


def _contiguous_cache(mode: str, kw: dict) -> str | None:
    return "no contiguous cache in this build" if mode == "kvcache" and "block_table" not in kw else None


def _causal_window(mode: str, kw: dict) -> str | None:
    window = kw.get("window_size")
    if window == (-1, 0):
        return "window (-1, 0) not in this build"
    return "windows wider than 20 not in this build" if window is not None and max(window) > 20 else None


PAGED_ONLY = KVCache(contiguous=False, page_sizes=(4,), max_splits=4)
#: name -> (KV cache declared, limits, the kernel's refusals, property -> what it must do).
REFUSING = {
    "paged-only": (PAGED_ONLY, (), _contiguous_cache, {
        "test_paged_equals_contiguous": "skipped: kernel meta-paged-only declares one cache layout only",
        "test_decode_consistency": "passed", "test_split_kv_invariance": "passed"}),
    "two-page-sizes-only": (dataclasses.replace(PAGED_ONLY, page_sizes=(4, 8)), (), _contiguous_cache, {
        "test_paged_equals_contiguous": "passed", "test_decode_consistency": "passed"}),
    "contiguous-limited": (
        KVCache(page_sizes=(4,), max_splits=4),
        (Limit("no contiguous cache in this build", lambda p: p.cache is not None and p.page_size is None),),
        _contiguous_cache, {
            "test_paged_equals_contiguous": "skipped: kernel meta-contiguous-limited declares none of the "
                                            "problems paged-equals-contiguous needs",
            "test_decode_consistency": "passed", "test_split_kv_invariance": "passed"}),
    "window-limited": (
        None,
        (Limit("window (-1, 0) not in this build", lambda p: p.window == (-1, 0)),
         Limit("windows wider than 20 not in this build",
               lambda p: p.window is not None and max(p.window) > 20)),
        _causal_window, {
            "test_window_left_unbounded_right_zero_is_causal": "skipped: kernel meta-window-limited declares "
                                                               "none of the problems window-causal needs",
            "test_window_wider_than_sequence": "passed"}),
}


@pytest.mark.parametrize("case", sorted(REFUSING))
def test_a_kernel_refusing_what_it_rules_out_passes(case: str, monkeypatch: pytest.MonkeyPatch):
    """A kernel that declares a paged cache only, or a limit on the contiguous cache or on
    exactly the window an identity derives, and refuses those problems, passes the kvcache and
    identity properties: each either runs only declared problems or skips naming the
    declaration (it was failed for refusing a derived problem it never declared)."""
    kv, limits, refuses, expected = REFUSING[case]
    base = blocked.attention.capabilities
    caps = dataclasses.replace(base, kvcache=kv or base.kvcache, limits=limits)
    kernel = Kernel(name=f"meta-{case}", fn=_refusing(refuses), capabilities=caps)
    modules = [importlib.import_module(f"flashprop.properties.{m}")
               for m in ("test_kvcache", "test_variant_identities")]
    with recording(caps, modules, monkeypatch) as recorder:
        for name, outcome in expected.items():
            test = next(getattr(m, name) for m in modules if hasattr(m, name))
            try:
                got = _run(kernel, test)
            except PropertyFailure as err:
                pytest.fail(f"{name} failed a kernel that refuses only what it rules out:\n{err}")
            assert got.startswith(outcome), f"{name}: {got}"
    assert not recorder.wrong, "\n".join(recorder.wrong[:5])
    if any(outcome == "passed" for outcome in expected.values()):
        assert recorder.calls, "no property ran the kernel"
