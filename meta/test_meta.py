"""Meta-tests: the suite's own helpers do what the properties rely on (kernel-independent).

The golden against a dense float64 autograd computation, its chunking, its memory; Problem
layouts and their NaN poison; the strategies' declared/undeclared split; the tolerance model's
verdicts on planted errors; the registry's three ways of naming a kernel; a known-failures
file turning a listed failure into an expected one and a listed pass into a failure; and the
error contract catching a kernel that silently answers undeclared problems wrongly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import flashprop.properties.test_error_contract as error_contract
import flashprop.properties.test_metamorphic as metamorphic
import pytest
import torch
from flashprop.contract.capabilities import FULL_SUPPORT, Capabilities, Limit
from flashprop.contract.problem import DISTRIBUTIONS, LAYOUTS, Problem
from flashprop.contract.registry import (
    CPU_KERNELS,
    Kernel,
    KernelSpecError,
    expand_specs,
    load_kernel,
    observe_outputs,
)
from flashprop.harness.check import (
    PropertyFailure,
    assert_close_to_golden,
    references,
    run_kernel,
    run_property,
)
from flashprop.harness.failures import Failure
from flashprop.harness.known_failures import KnownFailure, mark, parse
from flashprop.harness.report import Tallies
from flashprop.harness.run_context import RunContext
from flashprop.harness.strategies import Sizes, problems, undeclared_problems
from flashprop.harness.tolerance import RATIO, Comparison, budget, compare
from flashprop.kernels.sdpa import sdpa_flash
from flashprop.refimpl import attention_golden, attention_golden_backward, attention_yardstick
from flashprop.refimpl.blocked import attention as blocked_attention
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

pytestmark = pytest.mark.meta

F64 = torch.float64
META_SIZES = Sizes(max_n=24, max_head_dim=32, max_work=200_000)
ALIGNMENTS = ("bottom-right", "top-left")
GRADS = ("dq", "dk", "dv")

#: Declarations the strategies are checked against: full support, the built-ins, a narrow one.
DECLARATIONS = (
    FULL_SUPPORT,
    blocked_attention.capabilities,
    sdpa_flash.capabilities,
    Capabilities(dtypes=frozenset({torch.float16, torch.bfloat16}), head_dims=range(8, 129, 8),
                 dv_equals_d=True, causal=False, unequal_lengths=False, gqa=False, custom_scale=False,
                 any_strides=False, max_seqlen=32, block_m=(16, 32), block_n=(16,),
                 limits=(Limit("D > 64 with Nq > 16", lambda p: p.d > 64 and p.nq > 16),)),
)


def _device_for(caps: Capabilities) -> str:
    """A device the declaration claims (problems are only drawn, never run, off the CPU)."""
    return "cpu" if "cpu" in caps.devices else sorted(caps.devices)[0]


def _floor_check(name: str, actual: torch.Tensor, expected: torch.Tensor, magnitude: float | None,
                 logit_size: float) -> None:
    """float64 vs float64: within the tolerance model's float64 floor (yardstick error 0)."""
    result = compare(name, actual, expected, expected, F64, magnitude, logit_size)
    assert result.ok, result.describe()


def _magnitude(bound: torch.Tensor) -> float:
    """A gradient's floor magnitude: the max of its absolute-value bound (as harness.check)."""
    return float(bound.max()) if bound.numel() else 0.0


def _logit_size(lse: torch.Tensor) -> float:
    finite = lse[torch.isfinite(lse)]
    return float(finite.abs().max()) if finite.numel() else 0.0


# --------------------------------------------------------------------------- golden


@given(problems(FULL_SUPPORT, dtypes=(F64,), sizes=META_SIZES), st.sampled_from(ALIGNMENTS))
def test_golden_equals_dense_float64_autograd(p: Problem, alignment: str):
    """The streaming golden and its hand-written backward equal the dense computation
    (refimpl.yardstick on float64 inputs, gradients by autograd) within the float64 floor."""
    q, k, v = p.inputs(requires_grad=True)
    kw = dict(causal=p.causal, scale=p.scale, alignment=alignment)
    o, lse = attention_yardstick(q, k, v, **kw)
    dense = dict(zip(GRADS, torch.autograd.grad(o, (q, k, v), p.grad_output())))
    go, glse = attention_golden(q, k, v, **kw)
    *grads, dq_b, dk_b, dv_b = attention_golden_backward(q, k, v, p.grad_output(), bounds=True, **kw)
    size = _logit_size(glse)
    _floor_check("o", go, o, None, size)
    _floor_check("lse", glse, lse, None, size)
    for name, g, bound in zip(GRADS, grads, (dq_b, dk_b, dv_b)):
        _floor_check(name, g, dense[name], _magnitude(bound), size)


@given(problems(FULL_SUPPORT, dtypes=(F64,), sizes=META_SIZES), st.sampled_from(ALIGNMENTS), st.data())
def test_golden_chunk_invariance(p: Problem, alignment: str, data: st.DataObject):
    """The golden's key chunk size (1 .. Nk + 2) does not change o, lse or the gradients
    beyond float64 rounding (the floor)."""
    chunk = data.draw(st.integers(1, p.nk + 2), label="chunk")
    q, k, v = p.inputs()
    kw = dict(causal=p.causal, scale=p.scale, alignment=alignment)
    base = (*attention_golden(q, k, v, **kw), *attention_golden_backward(q, k, v, p.grad_output(), **kw))
    chunked = (*attention_golden(q, k, v, chunk=chunk, **kw),
               *attention_golden_backward(q, k, v, p.grad_output(), chunk=chunk, **kw))
    bounds = attention_golden_backward(q, k, v, p.grad_output(), bounds=True, **kw)[3:]
    size = _logit_size(base[1])
    for name, a, b, bound in zip(("o", "lse", *GRADS), chunked, base, (None, None, *bounds)):
        _floor_check(name, a, b, None if bound is None else _magnitude(bound), size)


class _LargestTensor(TorchDispatchMode):
    """Records the largest number of elements of any tensor an op produces."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        sizes = [t.numel() for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        self.largest = max([self.largest, *sizes])
        return out


def test_golden_memory_is_linear_in_n():
    """Golden forward and backward at N = 8192, D = 128, float64, chunk 1024 (B = H = 1) never
    create a tensor larger than N x chunk: no N x N buffer. Traced on the meta device (shapes
    only, instant); torch's CPU profiler would need a real 34 GFLOP run to say the same."""
    n, d, chunk = 8192, 128, 1024
    q, k, v, do = (torch.empty(1, 1, n, d, dtype=F64, device="meta") for _ in range(4))
    with _LargestTensor() as forward:
        attention_golden(q, k, v, causal=True, chunk=chunk)
    with _LargestTensor() as backward:
        attention_golden_backward(q, k, v, do, causal=True, chunk=chunk)
    assert forward.largest <= n * chunk, f"forward made a tensor of {forward.largest} elements"
    assert backward.largest <= n * chunk, f"backward made a tensor of {backward.largest} elements"


@pytest.mark.slow
def test_golden_runs_n8192_on_cpu():
    """The real float64 run at N = 8192, D = 128 (chunk 1024) completes with finite outputs, and
    a few rows agree with a dense computation of just those rows."""
    n, d = 8192, 128
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, n, d, generator=g, dtype=F64) for _ in range(3))
    o, lse = attention_golden(q, k, v, chunk=1024)
    assert torch.isfinite(o).all() and torch.isfinite(lse).all()
    rows = torch.tensor([0, 1, 4095, n - 1])
    s = (q[:, :, rows] @ k.transpose(-1, -2)) / d**0.5
    _floor_check("lse", lse[:, :, rows], torch.logsumexp(s, -1), None, _logit_size(lse))
    _floor_check("o", o[:, :, rows], torch.softmax(s, -1) @ v, None, _logit_size(lse))


# --------------------------------------------------------------------------- problems


@given(problems(FULL_SUPPORT, sizes=META_SIZES), st.sampled_from([None, 0.125, -1.5]))
def test_problems_parse_back_from_their_descriptions(p: Problem, scale: float | None):
    """--replay reads the problem a failure report printed: describe() and constructor() both
    parse back to the same problem."""
    p = p.replace(scale=scale)
    assert Problem.parse(p.describe()) == p
    assert Problem.parse(p.constructor()) == p
    with pytest.raises(ValueError):
        Problem.parse("__import__('os').system('true')")


@pytest.mark.parametrize("dist", DISTRIBUTIONS)
def test_inputs_are_reproducible(dist: str):
    """A problem's tensors are a function of the problem: the kernel's call and the golden's
    (harness.check.references) each build them, so any nondeterminism would compare the
    kernel with the golden of other inputs. Size of the H200 failures this caused (spikes drawn
    at repeated positions, where a threaded index_put keeps either value)."""
    p = Problem(b=2, hq=3, hkv=1, nq=127, nk=127, d=200, dv=200, dtype=torch.float16, dist=dist)
    first, again = p._values(), p._values()
    for name, a, b in zip(("q", "k", "v", "do"), first, again, strict=True):
        assert torch.equal(a, b), f"{dist}: {name} differs between two calls"
    if dist == "spikes":
        for name, t in zip(("q", "k"), first[:2]):
            spikes = int((t.abs() == 30).sum())
            assert spikes == t.numel() // 50, f"{name}: {spikes} spikes, expected {t.numel() // 50}"


@given(problems(FULL_SUPPORT, sizes=META_SIZES))
def test_layouts_hold_the_same_values_inside_nan(p: Problem):
    """Every layout holds the contiguous layout's values; the "contiguous", "sliced" and
    "strided" views sit in buffers whose every other element is NaN."""
    base = p.replace(layout="contiguous").inputs()
    for layout in LAYOUTS:
        for t, ref in zip(p.replace(layout=layout).inputs(), base):
            assert torch.equal(t, ref), f"{layout}: values differ from contiguous"
            if layout == "transposed":
                assert t.dim() == 4 and (t.shape[1] == 1 or t.shape[2] == 1 or not t.is_contiguous())
                continue
            buf = t._base
            assert buf is not None and not torch.isnan(t).any()
            assert int(torch.isnan(buf).sum()) == buf.numel() - t.numel(), f"{layout}: poison missing"
    strided = p.replace(layout="strided").inputs()
    assert all(t.stride(-1) == 2 for t in strided)


@given(st.data())
def test_strategies_draw_only_declared_problems(data: st.DataObject):
    """problems() draws only problems a declaration accepts (including its known limits)."""
    caps = data.draw(st.sampled_from(DECLARATIONS), label="caps")
    p = data.draw(problems(caps, device=_device_for(caps), sizes=META_SIZES), label="problem")
    assert caps.unsupported_reason(p) is None


@given(st.data())
def test_undeclared_problems_are_undeclared(data: st.DataObject):
    """undeclared_problems() draws only problems the declaration refuses and the error contract
    demands a clear error for."""
    caps = data.draw(st.sampled_from(DECLARATIONS), label="caps")
    p = data.draw(undeclared_problems(caps, device=_device_for(caps), sizes=META_SIZES), label="problem")
    assert caps.unsupported_reason(p) is not None and caps.must_raise(p)


# --------------------------------------------------------------------------- tolerance


@given(problems(FULL_SUPPORT, sizes=META_SIZES, dtypes=(torch.float16, torch.float32)))
def test_tolerance_verdicts(p: Problem):
    """compare() passes the golden against itself and flags an error of 10x the budget, a NaN
    and an -inf where the golden is finite."""
    golden, yard = references(p, "bottom-right", False, False)
    size = _logit_size(golden.lse)
    for name in ("o", "lse"):
        g, y = getattr(golden, name), getattr(yard, name)
        itself = compare(name, g, g, y, p.dtype, logit_size=size)
        assert itself.ok and itself.error == 0, itself.describe()
        planted = g.clone()
        finite = torch.isfinite(planted).nonzero()
        if not len(finite):
            continue
        at = tuple(finite[0].tolist())
        planted[at] += 10 * itself.budget
        assert not compare(name, planted, g, y, p.dtype, logit_size=size).ok, "10x budget not flagged"
        planted[at] = float("nan")
        assert not compare(name, planted, g, y, p.dtype, logit_size=size).ok, "NaN not flagged"
        planted[at] = float("-inf")
        assert not compare(name, planted, g, y, p.dtype, logit_size=size).ok, "-inf not flagged"


def test_tolerance_flags_finite_lse_on_empty_rows():
    """An empty row (bottom-right causal, Nq > Nk) must have lse = -inf: a finite value is flagged."""
    p = Problem(nq=5, nk=2, causal=True)
    golden, yard = references(p, "bottom-right", False, False)
    assert torch.isinf(golden.lse[..., :3]).all()
    wrong = golden.lse.clone()
    wrong[..., 0] = 0.0
    assert compare("lse", golden.lse, golden.lse, yard.lse, p.dtype).ok
    assert not compare("lse", wrong, golden.lse, yard.lse, p.dtype).ok


#: Entries that test compare()'s edges: ties, signed zeros, overflowing differences, non-finite.
EDGE_VALUES = (0.0, -0.0, 1.0, -1.0, 1e308, -1e308, float("inf"), float("-inf"), float("nan"))


def _plain_compare(name: str, a: torch.Tensor, g: torch.Tensor, y: torch.Tensor, dtype: torch.dtype,
                   magnitude: float | None) -> Comparison:
    """compare() by its definition (``docs/tolerance.md``), entry by entry in row-major order: the
    errors over the entries finite in both (the first largest), magnitude max|golden| over its
    finite entries, and the first NaN where the golden has none, else the first inf that differs,
    failing outright and pointed at."""
    cells = list(itertools.product(*map(range, g.shape)))
    av, gv, yv = ({i: float(t[i]) for i in cells} for t in (a, g, y))

    def diffs(u: dict) -> list[float]:
        return [abs(u[i] - gv[i]) if math.isfinite(u[i]) and math.isfinite(gv[i]) else 0.0 for i in cells]

    d = diffs(av)
    err, y_err = max(d, default=0.0), max(diffs(yv), default=0.0)
    if magnitude is None:
        magnitude = max((abs(x) for x in gv.values() if math.isfinite(x)), default=0.0)
    nan = [i for i in cells if math.isnan(av[i]) and not math.isnan(gv[i])]
    inf = [i for i in cells if (math.isinf(av[i]) or math.isinf(gv[i])) and av[i] != gv[i]]
    reason = (f"NaN in {len(nan)} elements where the golden is finite" if nan else
              f"inf pattern differs from the golden in {len(inf)} elements" if inf else "")
    where = (nan or inf or [cells[d.index(err)]])[0] if cells else None
    limit, floor = budget(name, dtype, y_err, magnitude)
    act, exp = (None, None) if where is None else (av[where], gv[where])
    return Comparison(name, not reason and err <= limit, err, where, act, exp, limit, y_err, floor,
                      RATIO[name][dtype], reason)


@settings(max_examples=300)
@given(st.lists(st.integers(0, 3), max_size=3), st.data())
def test_compare_is_its_definition(shape: list[int], data: st.DataObject):
    """compare()'s verdict, error, location, values there, budget and reason are those of its plain
    definition, on every shape (0-d and empty ones too), NaN and inf anywhere, ties and a
    non-contiguous kernel output."""
    n = math.prod(shape)
    values = st.lists(st.one_of(st.sampled_from(EDGE_VALUES), st.floats(-3, 3)), min_size=n, max_size=n)
    g, y, a = (torch.tensor(data.draw(values), dtype=F64).reshape(shape) for _ in range(3))
    if len(shape) >= 2 and data.draw(st.booleans()):
        a = a.mT.contiguous().mT
    a = a.to(data.draw(st.sampled_from((F64, torch.float32))))
    dtype = data.draw(st.sampled_from((torch.float16, F64)))
    magnitude = data.draw(st.one_of(st.none(), st.floats(0, 10)))
    want = _plain_compare("o", a.to(F64), g, y, dtype, magnitude)
    assert repr(compare("o", a, g, y, dtype, magnitude)) == repr(want)


# --------------------------------------------------------------------------- registry


USER_KERNEL = '''
from flashprop.contract.capabilities import Capabilities
from flashprop.refimpl import attention_golden


def plain(q, k, v, *, causal=False, scale=None):
    o, lse = attention_golden(q, k, v, causal=causal, scale=scale)
    return o.to(q.dtype), lse.float()


def only_o(q, k, v, *, causal=False, scale=None):
    return plain(q, k, v, causal=causal, scale=scale)[0]


def wrong_o(q, k, v, *, causal=False, scale=None):
    return only_o(q, k, v, causal=causal, scale=scale) + 1


only_o.capabilities = Capabilities(returns_lse=False)
wrong_o.capabilities = Capabilities(returns_lse=False)
'''


def test_registry_loads_names_modules_and_files(tmp_path: Path):
    """A registered name, a module:attr and a path/to/file.py:attr all load. A plain callable
    claims full support (an undeclared one returning only o is observed to return no lse); a
    kernel returning only o (declaring returns_lse=False) is checked on o alone, and a wrong o is
    still caught; full support declared but only o returned is a failure."""
    named, dotted = load_kernel("ref-blocked"), load_kernel("flashprop.refimpl.blocked:attention")
    assert named.fn is dotted.fn is blocked_attention
    assert named.capabilities == blocked_attention.capabilities
    path = tmp_path / "user_kernel.py"
    path.write_text(textwrap.dedent(USER_KERNEL))
    plain, only_o, wrong_o = (load_kernel(f"{path}:{attr}") for attr in ("plain", "only_o", "wrong_o"))
    assert plain.capabilities is FULL_SUPPORT
    assert observe_outputs(plain, "cpu") is plain
    plain_only_o = Kernel(name="meta-plain-only-o", fn=only_o.fn, capabilities=FULL_SUPPORT, declared=False)
    assert not observe_outputs(plain_only_o, "cpu").capabilities.returns_lse
    p = Problem(nq=7, nk=5, causal=True)
    assert_close_to_golden(plain, p, "meta", run_kernel(plain, p, "meta"), ("o", "lse"))
    out = run_kernel(only_o, p, "meta")
    assert out.lse is None
    assert_close_to_golden(only_o, p, "meta", out, ("o", "lse"))
    with pytest.raises(PropertyFailure, match="o: max"):
        assert_close_to_golden(wrong_o, p, "meta", run_kernel(wrong_o, p, "meta"), ("o", "lse"))
    lying = Kernel(name="meta-only-o-full-support", fn=only_o.fn, capabilities=FULL_SUPPORT)
    with pytest.raises(PropertyFailure, match="returns_lse"):
        run_kernel(lying, p, "meta")
    with pytest.raises(ValueError):
        load_kernel("no-such-kernel")


def test_a_kernel_file_runs_its_current_text(tmp_path: Path):
    """A kernel loaded from a file runs the file as it is now: edited to the same size within the
    same second (what a .pyc cache cannot tell apart), the edit runs; no __pycache__ is left."""
    import os

    path = tmp_path / "kern.py"
    path.write_text("def attn(q, k, v, **kw):\n    return 1\n")
    assert load_kernel(f"{path}:attn").fn(None, None, None) == 1
    stamp = path.stat().st_mtime_ns
    path.write_text("def attn(q, k, v, **kw):\n    return 2\n")
    os.utime(path, ns=(stamp, stamp))
    assert load_kernel(f"{path}:attn").fn(None, None, None) == 2
    assert not (tmp_path / "__pycache__").exists()


ROOT = Path(__file__).resolve().parent.parent


def test_a_kernel_set_names_a_runs_kernels_once():
    """``+cpu`` is the default CPU run's kernels (what tox and the mutants' baseline take), in
    order, a kernel named twice once; an unknown set is refused naming the known ones, by the
    plugin as a usage error in one line."""
    assert expand_specs(["+cpu"]) == list(CPU_KERNELS)
    assert expand_specs(["triton", "+cpu", "cuda"]) == ["triton", *(k for k in CPU_KERNELS if k != "triton"),
                                                        "cuda"]
    with pytest.raises(KernelSpecError, match=r"\+cpu, \+gpu"):
        expand_specs(["+nope"])
    def collect(spec: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pytest", "properties/test_golden.py", "-q", "-p",
                               "no:cacheprovider", "--kernel", spec, "--co", "-k", "forward_matches"],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)

    run = collect("+nope")
    assert run.returncode == 4 and "no kernel set '+nope'" in run.stderr, run.stdout + run.stderr
    listed = collect("+cpu").stdout
    assert all(f"[{name}]" in listed for name in CPU_KERNELS), listed


@pytest.mark.parametrize("entry", ["golden", "yardstick", "ref-blocked", "sdpa-math"])
def test_one_dense_validator_refuses_malformed_dense_inputs(entry: str):
    """The golden, the yardstick, ref-blocked and the SDPA adapters check the dense layout with
    ``contract.validate.check_dense``: the same clear error for each malformed call."""
    fn = {"golden": attention_golden, "yardstick": attention_yardstick}.get(entry) or load_kernel(entry).fn
    q = torch.randn(1, 4, 3, 8)
    kv = torch.randn(1, 2, 5, 8)
    cases = [((q[0], kv, kv), ValueError, "4-d"), ((q, kv.double(), kv), TypeError, "share a dtype"),
             ((q, kv, torch.randn(1, 2, 6, 8)), ValueError, "incompatible shapes"),
             ((q, torch.randn(1, 2, 5, 4), kv), ValueError, "head dim"),
             ((torch.randn(1, 3, 3, 8), kv, kv), ValueError, "multiple of Hkv"),
             ((q, [[0.0]], kv), TypeError, "torch.Tensor")]
    for args, error, words in cases:
        with pytest.raises(error, match=words):
            fn(*args)


# --------------------------------------------------------------------------- known failures

FORWARD = "properties/test_golden.py::test_forward_matches_golden"


class _FakeItem:
    def __init__(self, nodeid: str):
        self.nodeid, self.markers = nodeid, []

    def add_marker(self, marker) -> None:
        self.markers.append(marker)


def test_known_failures_file_parses_and_marks(tmp_path: Path):
    """Entries need a reason; an id without parameters covers every kernel; covered items get a
    strict xfail naming the entry; entries that cover nothing are returned."""
    known = tmp_path / "known.txt"
    known.write_text(f"# comment\n\n{FORWARD}  # o off by one\n{FORWARD}[k]x  # typo\n")
    entries = parse(known)
    assert entries == [KnownFailure(FORWARD, "o off by one", f"{known}:3"),
                       KnownFailure(f"{FORWARD}[k]x", "typo", f"{known}:4")]
    items = [_FakeItem(f"{FORWARD}[k]"), _FakeItem(f"{FORWARD}_too[k]"), _FakeItem(FORWARD)]
    assert mark(items, entries) == [entries[1]]
    (xfail,), none, (bare,) = (item.markers for item in items)
    assert not none and xfail.name == bare.name == "xfail" and xfail.kwargs["strict"]
    assert "o off by one" in xfail.kwargs["reason"] and f"{known}:3" in xfail.kwargs["reason"]
    known.write_text(f"{FORWARD}\n")
    with pytest.raises(ValueError, match="reason"):
        parse(known)


def test_known_failures_option_end_to_end(tmp_path: Path):
    """Through pytest itself: a listed failing test is an expected failure (exit 0), a listed
    passing test fails the run (XPASS(strict), exit 1). The kernels: USER_KERNEL's right and
    wrong o."""
    (tmp_path / "user_kernel.py").write_text(textwrap.dedent(USER_KERNEL))
    known = tmp_path / "known.txt"
    known.write_text(f"{FORWARD}  # o off by one (planted)\n")

    def run(kernel: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "pytest", FORWARD, "-p", "no:cacheprovider", "-q", "-rxX",
             "--hypothesis-profile", "ci", "--max-examples", "3", "--device", "cpu",
             "--kernel", f"{tmp_path / 'user_kernel.py'}:{kernel}", "--known-failures", str(known)],
            cwd=ROOT, capture_output=True, text=True, timeout=300,
        )

    wrong = run("wrong_o")
    assert wrong.returncode == 0 and "1 xfailed" in wrong.stdout, wrong.stdout
    assert "o off by one" in wrong.stdout
    right = run("only_o")
    assert right.returncode == 1 and "XPASS(strict)" in right.stdout, right.stdout


# --------------------------------------------------------------------------- error contract

_NARROW = Capabilities(dtypes=frozenset({torch.float32}), head_dims=range(1, 65))
#: Tiny problems: a failing property is shrunk, and every shrink step calls the references.
_TINY = Sizes(max_n=4, max_batch=1, max_kv_heads=1, max_group=1, max_head_dim=8, max_work=10_000)


def _narrow_kernel(*, refuse: bool):
    """A float32, D <= 64 kernel: undeclared input is refused (``refuse``) or answered wrongly."""

    def attention(q, k, v, *, causal=False, scale=None):
        o, lse = attention_golden(q, k, v, causal=causal, scale=scale)
        if q.dtype != torch.float32 or q.shape[-1] > 64:
            if refuse:
                raise NotImplementedError(f"dtype {q.dtype} / D={q.shape[-1]} not supported")
            o = o + 1
        return o.to(q.dtype), lse.float()

    return attention


@contextlib.contextmanager
def _quick_hypothesis() -> Iterator[None]:
    """Load a profile without shrinking or explaining (only the verdict matters here), then
    restore the one that was loaded; run_property reads ``settings.default``."""
    settings.register_profile("flashprop-meta-saved", settings.default)
    settings.register_profile("flashprop-meta-quick", settings.default, max_examples=10,
                              phases=[Phase.explicit, Phase.generate])
    settings.load_profile("flashprop-meta-quick")
    try:
        yield
    finally:
        settings.load_profile("flashprop-meta-saved")


@pytest.mark.parametrize("refuse", [True, False], ids=["refuses", "answers-wrongly"])
def test_error_contract_catches_silent_wrong_answers(refuse: bool):
    """The error-contract property passes a kernel that refuses undeclared input and fails one
    that silently answers it wrongly (in a run context of its own, out of the session's summary)."""
    name = f"meta-narrow-{'refuses' if refuse else 'lies'}"
    kernel = Kernel(name=name, fn=_narrow_kernel(refuse=refuse), capabilities=_NARROW)
    prop = error_contract.test_undeclared_problem_raises_clear_error_or_is_correct
    with _quick_hypothesis():
        if refuse:
            prop(RunContext(), kernel, "cpu", _TINY)
        else:
            with pytest.raises(PropertyFailure, match="error-contract"):
                prop(RunContext(), kernel, "cpu", _TINY)


def test_a_property_the_declarations_rule_out_skips_naming_them():
    """A kernel that declares GQA but a limit refusing every GQA problem: gqa-consistency draws
    nothing it may run, so it skips naming the limit (Hypothesis's Unsatisfiable is not the
    kernel's failure); a property whose own condition, or a filter after the declaration,
    leaves nothing still fails (a defect of the property, not a declaration)."""
    caps = dataclasses.replace(blocked_attention.capabilities,
                               limits=(Limit("no grouped heads in this build", lambda p: p.hq > p.hkv),))
    kernel = Kernel(name="meta-no-gqa", fn=blocked_attention, capabilities=caps)
    sizes = Sizes(max_n=4, max_batch=1, max_kv_heads=2, max_group=2, max_head_dim=8, max_work=10_000)
    run = RunContext()
    with _quick_hypothesis():
        with pytest.raises(pytest.skip.Exception, match=r"declares none of the problems gqa-consistency "
                           r"needs \(all \d+ drawn problems are undeclared: .*no grouped heads"):
            metamorphic.test_gqa_consistency(run, kernel, "cpu", sizes)
        never = problems(caps, device="cpu", sizes=sizes, where=lambda p: False)
        with pytest.raises((Unsatisfiable, pytest.skip.Exception)) as raised:  # a skip would hide it
            run_property(run, kernel, "meta-never", never, lambda kernel, p: None)
        assert raised.type is Unsatisfiable, raised.value
        # declared draws (no GQA) that a later filter drops: not the declaration's doing
        dropped = problems(caps, device="cpu", sizes=sizes).filter(lambda p: False)
        with pytest.raises((Unsatisfiable, pytest.skip.Exception)) as raised:  # a skip would hide it
            run_property(run, kernel, "meta-dropped", dropped, lambda kernel, p: None)
        assert raised.type is Unsatisfiable, raised.value


def test_a_run_context_sets_the_settings_and_keeps_its_own_tallies():
    """The command line's settings reach Hypothesis through the run context, over the loaded
    profile (none set: the profile's); what one context's property runs is in its tallies only,
    with the examples its settings asked for."""
    profile = settings.default
    assert (RunContext().hypothesis_settings().max_examples, RunContext().hypothesis_settings().database) == (
        profile.max_examples, profile.database)
    run = RunContext(max_examples=3, database=None, phases=(Phase.generate,))
    given = run.hypothesis_settings()
    assert (given.max_examples, given.database, given.phases) == (3, None, (Phase.generate,))
    kernel = Kernel(name="meta-context", fn=blocked_attention, capabilities=blocked_attention.capabilities)
    seeds = st.integers(0, 10**6).map(lambda seed: Problem(nq=2, nk=2, d=4, dv=4, seed=seed))
    other = RunContext()
    run_property(run, kernel, "meta-context", seeds, lambda kernel, p: None, weight=2)
    tally = run.tallies["meta-context", "meta-context"]
    assert (tally.run, tally.passed, tally.asked) == (6, 6, 6)
    assert not other.tallies.by_property and not other.tallies.examples


def test_tallies_merge_across_processes(tmp_path: Path):
    """Tallies of several processes (xdist workers, ci/gpu_check.py's calls) add up exactly."""
    import flashprop.harness.report as report

    first, second = Tallies(), Tallies()
    first.record("k", "forward", "passed", 1.0)
    failure = Failure("k", "forward", Problem().describe(), ("the failure",), replay="flashprop replay")
    first.record("k", "forward", "failed", 0.5, failure)
    first.dump(str(tmp_path / "a.json"))
    second.record("k", "forward", "refused", 0.25)
    second.record("k", "backward", "passed", 0.25)
    second.dump(str(tmp_path / "b.json"))
    assert report.main([str(tmp_path / "b.json")]) == 0
    assert report.main([str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 1
    merged = Tallies()
    merged.merge([str(tmp_path / "a.json"), str(tmp_path / "b.json")])
    forward = merged["k", "forward"]
    assert (forward.passed, forward.refused, forward.failed) == (1, 1, 1)
    assert forward.seconds == 1.75 and forward.last_failure == failure  # the record, whole
    assert merged["k", "backward"].run == 1


def test_tallies_are_saved_while_the_session_runs(tmp_path: Path):
    """With --tally-json the tallies are also saved during the run: at the first example, at a
    property's first failure, else every AUTOSAVE_SECONDS, each time whole. A process killed before its
    summary (a time limit, a crash) leaves them."""
    import json

    report = Tallies()
    path = tmp_path / "tally.json"
    report.autosave(str(path))

    def saved() -> tuple[int, int]:
        (row,) = json.loads(path.read_text())
        return row["passed"], row["failed"]

    report.record("k", "forward", "passed", 1.0)
    assert saved() == (1, 0)
    report.record("k", "forward", "passed", 1.0)
    assert saved() == (1, 0)  # within AUTOSAVE_SECONDS of the last save
    report.record("k", "forward", "failed", 1.0, Failure("k", "forward", "the failure"))
    assert saved() == (2, 1)
    report.record("k", "forward", "failed", 1.0, Failure("k", "forward", "a shrinking step"))
    assert saved() == (2, 1)  # not at each failure
    assert [p.name for p in tmp_path.iterdir()] == ["tally.json"]


def _lock_taken(path: Path) -> bool:
    """Whether another open file description holds the flock of ``path``."""
    import fcntl
    import os

    fd = os.open(path, os.O_CREAT | os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def test_compile_locks_hold_one_variant_until_compiled(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch):
    """A variant's lock is held from before its compilation until after it; a compilation that
    raised releases at the next one; a waiter gives up after WAIT_SECONDS."""
    import flashprop.harness.compile_locks as locks

    monkeypatch.setattr(locks, "WAIT_SECONDS", 0.2)
    a = {"specialization_data": '{"name": "k", "constants": {"BLOCK_M": 64}}'}
    b = {"specialization_data": '{"name": "k", "constants": {"BLOCK_M": 128}}'}
    path_a, path_b = (tmp_path / locks.variant_hash(x) for x in (a, b))
    assert path_a != path_b
    held = locks.CompileLocks(str(tmp_path))
    held.before_compile(a)
    assert _lock_taken(path_a) and not _lock_taken(path_b)
    held.after_compile(a)
    assert not _lock_taken(path_a)
    assert (held.stats.variants, held.stats.waited) == (1, 0)
    assert held.stats.line().startswith("Triton: 1 kernel variants compiled or loaded in ")
    held.before_compile(a)  # its compilation raises: no after_compile
    held.before_compile(b)
    assert not _lock_taken(path_a) and _lock_taken(path_b)
    held.after_compile(b)
    import fcntl
    import os

    holder = os.open(path_a, os.O_RDWR)  # another process compiling a, never finishing
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        held.before_compile(a)  # waits 0.2 s, then goes on without the lock
        assert locks.variant_hash(a) not in held.held
        assert held.stats.waited == 1 and held.stats.wait_seconds >= 0.2
    finally:
        os.close(holder)


def test_compile_stats_lines_read_back_and_sum():
    """ci/gpu_check.py sums its runs' compile lines (each the sum of the run's xdist workers):
    the parser reads back what ``line()`` prints, and logs without a line are left out."""
    from flashprop.harness.compile_locks import CompileStats, summary

    a = CompileStats(variants=12, waited=2, compile_seconds=30.4, wait_seconds=5.6)
    b = CompileStats(variants=3, waited=0, compile_seconds=7.0, wait_seconds=0.0)
    assert CompileStats.parse(f"... flashprop: {a.line()}\n") == CompileStats(12, 2, 30.0, 6.0)
    assert CompileStats.parse("no line here") is None
    logs = [f"flashprop: {a.line()}", "killed before its summary", f"x\nflashprop: {b.line()}\n"]
    assert summary(logs) == ("Triton in 2 processes: 15 kernel variants compiled or loaded in "
                             "37 s, 6 s waiting for other processes (2 variants)")
    assert summary(["nothing"]) == ""
