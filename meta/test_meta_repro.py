"""Meta-tests of the failure reports' repros (``Problem.repro``, ``harness.repro.show``).

For each kind of failure (a wrong o, a base-2 lse, a varlen boundary leak, a window off by one,
a paged cache read wrongly under split-KV, a wrong dV, a wrong dsinks, ALiBi's sign, a bug only
explicit tiles reach, a view past 2^31 elements, a kernel that raises) a planted-bug kernel
(``mutants.catalogue``, or a file written here) fails a golden property (or the spread one) run
by ``run_property``; the repro printed in its
report, saved as a file and run by a fresh python from a folder that holds nothing but the
kernel's file (flashprop importable, as in a checkout), calls the same entry point with the same
keywords, prints the failing output with FAIL (the others with PASS) and exits with status 1.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from flashprop.contract.outputs import expected_shapes, lse_dtype
from flashprop.contract.problem import Problem
from flashprop.contract.registry import Kernel, load_kernel
from flashprop.harness.check import (
    GRADIENTS,
    PropertyFailure,
    assert_close_to_golden,
    judge,
    run_kernel,
    run_property,
)
from flashprop.harness.failures import REPLAY_HEADER, REPRO_HEADER
from flashprop.harness.run_context import RunContext
from flashprop.harness.scale_problems import SPREAD_LAYOUTS, host_reserve_limit, spread_span_bytes
from flashprop.harness.strategies import Sizes
from flashprop.properties import test_error_contract, test_huge
from hypothesis import Phase
from hypothesis import strategies as st

pytestmark = pytest.mark.meta

ROOT = Path(__file__).resolve().parent.parent
PROP = "meta-repro"
FORWARD = ("o", "lse")
BACKWARD = ("o", "dq", "dk", "dv")

#: File kernels (written to the user's folder, named by a path relative to it).
LSE_BASE2 = '''
import math
from dataclasses import replace
from flashprop.refimpl.blocked import attention as blocked

def attn(q, k, v, **kw):
    o, lse = blocked(q, k, v, **kw)
    return o, lse / math.log(2)

attn.capabilities = replace(blocked.capabilities, varlen=False, kvcache=None)  # dense only
'''
WRONG_DV = '''
import torch
from dataclasses import replace
from flashprop.refimpl.blocked import attention as blocked

class _TwiceDv(torch.autograd.Function):
    """The identity, whose backward doubles the gradient: dV comes out 2x, o, dQ, dK right."""

    @staticmethod
    def forward(ctx, v):
        return v.clone()

    @staticmethod
    def backward(ctx, grad):
        return 2 * grad

def attn(q, k, v, **kw):
    return blocked(q, k, _TwiceDv.apply(v), **kw)

attn.capabilities = replace(blocked.capabilities, varlen=False, kvcache=None)  # dense only
'''
SPREAD_BUG = '''
from dataclasses import replace
from flashprop.contract.validate import extent
from flashprop.refimpl.blocked import attention as blocked

def attn(q, k, v, **kw):
    """Right, except o is off by 1 where q spans past 2^31 elements (32-bit offsets)."""
    o, lse = blocked(q, k, v, **kw)
    return (o + 1 if extent(q) > 2**31 - 1 else o), lse

attn.capabilities = replace(blocked.capabilities, varlen=False, kvcache=None)  # dense only
'''
#: A kernel that declares a window and answers a side below -1 (it reads it as -1, unbounded);
#: CHECKED refuses it (contract.validate.check_window).
UNCHECKED_WINDOW = '''
from dataclasses import replace
from flashprop.contract.validate import check_window
from flashprop.refimpl.blocked import attention as blocked

def attn(q, k, v, *, window_size=None, **kw):
    if window_size is not None:
        window_size = tuple(max(side, -1) for side in window_size)
    return blocked(q, k, v, window_size=window_size, **kw)

attn.capabilities = replace(blocked.capabilities, varlen=False, kvcache=None)  # dense only
'''
CHECKED = "window_size = check_window(window_size)"
RAISES = '''
from dataclasses import replace
from flashprop.refimpl.blocked import attention as blocked

def attn(q, k, v, **kw):
    raise RuntimeError(f"no kernel compiled for head dim {q.shape[-1]}")

attn.capabilities = replace(blocked.capabilities, varlen=False, kvcache=None)  # dense only
'''


@dataclass(frozen=True)
class Case:
    """A planted bug, the problem it fails on, the names the property judges, what the repro
    must call (``calls``: text of its call) and print (``fails``: FAIL lines, ``passes``: PASS
    lines; ``raises``: the kernel's error on stderr)."""

    kernel: str
    problem: Problem
    judged: tuple[str, ...]
    calls: tuple[str, ...]
    fails: tuple[str, ...] = ()
    passes: tuple[str, ...] = ()
    raises: str | None = None
    source: str | None = field(default=None, repr=False)


def _mutant(name: str) -> str:
    return f"mutants.catalogue:{name}"


CASES = {
    "dense-o": Case(_mutant("blocked_scale_ignored"), Problem(nq=8, nk=8, d=8, dv=8, scale=0.5), FORWARD,
                    ("o, lse = attn(q, k, v, causal=False, scale=0.5)",), fails=("o",)),
    "lse-base2": Case("./lse_base2.py:attn", Problem(nq=6, nk=6, d=8, dv=8), FORWARD,
                      ("o, lse = attn(q, k, v, causal=False)",), fails=("lse",), passes=("o",),
                      source=LSE_BASE2),
    "varlen": Case(_mutant("blocked_varlen_key_leak"),
                   Problem(b=2, nq=3, nk=4, d=8, dv=8, seqlens=((3, 4), (2, 3))), FORWARD,
                   ("attn.varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, "
                    "causal=False)",), fails=("o",)),
    "window": Case(_mutant("blocked_window_left_off_by_one"),
                   Problem(nq=8, nk=8, d=8, dv=8, causal=True, window=(2, 0)), FORWARD,
                   ("attn(q, k, v, causal=True, window_size=(2, 0))",), fails=("o",)),
    "paged-splits": Case(_mutant("blocked_paged_last_page"),
                         Problem(b=2, nq=1, nk=32, d=8, dv=8, cache=(20, 27), page_size=8, num_splits=2),
                         FORWARD, ("attn.kvcache(", "cache_seqlens=cache_seqlens, num_splits=2, "
                                   "block_table=block_table"), fails=("o",)),
    "wrong-dv": Case("./wrong_dv.py:attn", Problem(nq=6, nk=6, d=8, dv=8), BACKWARD,
                     ("torch.autograd.grad(o, (q, k, v), p.grad_output()",), fails=("dv",),
                     passes=("o", "dq", "dk"), source=WRONG_DV),
    "dsinks": Case(_mutant("blocked_dsinks_sign"), Problem(nq=6, nk=6, d=8, dv=8, sinks="positive"),
                   (*BACKWARD, "dsinks"), ("attn(q, k, v, causal=False, sinks=sinks)",
                                          "torch.autograd.grad(o, (q, k, v, sinks)"),
                   fails=("dsinks",), passes=("o", "dq", "dk", "dv")),
    "alibi": Case(_mutant("blocked_alibi_sign"), Problem(hq=2, hkv=2, nq=6, nk=6, d=8, dv=8,
                                                         alibi=("head", 1.0)), FORWARD,
                  ("alibi_slopes = inp.kwargs['alibi_slopes']",
                   "attn(q, k, v, causal=False, alibi_slopes=alibi_slopes)"), fails=("o",)),
    "tiles": Case(_mutant("blocked_tail_skipped"), Problem(nq=4, nk=64, d=8, dv=8, block_m=3, block_n=3),
                  FORWARD, ("attn(q, k, v, causal=False, block_m=3, block_n=3)",), fails=("o",)),
    "spread": Case("./spread_bug.py:attn", Problem(b=2, nq=4, nk=4, d=8, dv=8, layout="spread-batch",
                                                   dtype=torch.float16), ("o", "lse", "dq", "dk", "dv"),
                   ("inp, do = spread_inputs(p, requires_grad=True)", "o, lse = attn(q, k, v, causal=False)",
                    "torch.autograd.grad(o, (q, k, v), do"), fails=("o",), passes=("lse", "dq", "dk", "dv"),
                   source=SPREAD_BUG),
    "raises": Case("./raises.py:attn", Problem(nq=4, nk=4, d=8, dv=8), FORWARD, ("attn(q, k, v",),
                   raises="RuntimeError: no kernel compiled for head dim 8", source=RAISES),
}


def _quick() -> RunContext:
    """One example, no database, no shrinking (the problem is given): the report is the point; in
    a run context of its own."""
    return RunContext(database=None, phases=(Phase.explicit, Phase.generate))


def _report(kernel: Kernel, problem: Problem, judged: tuple[str, ...]) -> str:
    """The report of a golden property (run_kernel, then assert_close_to_golden on ``judged``;
    a spread problem: the spread property's check) failing on ``problem``."""

    def golden_check(kernel: Kernel, p: Problem) -> None:
        out = run_kernel(kernel, p, PROP, backward=any(n in GRADIENTS for n in judged))
        assert_close_to_golden(kernel, p, PROP, out, judged)

    spread = problem.layout in SPREAD_LAYOUTS
    with pytest.raises(PropertyFailure) as failed:
        check = test_huge.spread_check(PROP) if spread else golden_check
        run_property(_quick(), kernel, PROP, st.just(problem), check)
    return str(failed.value)


def _repro(report: str) -> str:
    """The script between the report's repro header and its replay header."""
    lines = report.splitlines()
    start = lines.index(REPRO_HEADER)
    return textwrap.dedent("\n".join(lines[start + 1 : lines.index(REPLAY_HEADER, start)]))


def _run(script: str, folder: Path, scripts: Path) -> subprocess.CompletedProcess:
    """Run ``script`` (saved under ``scripts``) by a fresh python with ``folder`` as its working
    folder, flashprop importable from the checkout and nothing else added."""
    path = scripts / "repro.py"
    path.write_text(script + "\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(path)], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("kind", sorted(CASES))
def test_the_repro_reproduces_the_failure(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    case = CASES[kind]
    if case.problem.layout in SPREAD_LAYOUTS and host_reserve_limit() < spread_span_bytes(case.problem):
        pytest.skip(f"the spread case's views reserve {spread_span_bytes(case.problem) / 2**30:.0f} GiB "
                    "of address space each; this host cannot reserve that much")
    folder, scripts = tmp_path / "user", tmp_path / "scripts"
    folder.mkdir()
    scripts.mkdir()
    if case.source is not None:  # the user's kernel file, named relative to the folder the run starts in
        (folder / case.kernel.split(":")[0]).write_text(textwrap.dedent(case.source))
    monkeypatch.chdir(folder)
    report = _report(load_kernel(case.kernel), case.problem, case.judged)
    script = _repro(report)
    for text in case.calls:
        assert text in script, script
    run = _run(script, folder, scripts)
    output = run.stdout + run.stderr
    assert run.returncode == 1, output
    if case.raises is not None:
        assert case.raises in run.stderr and "PASS" not in run.stdout, output
        return
    verdicts = {line.split()[1].rstrip(":"): line.split()[0] for line in run.stdout.splitlines()
                if line.startswith(("  PASS ", "  FAIL "))}
    assert set(verdicts) == set(case.judged), output
    assert all(verdicts[n] == "FAIL" for n in case.fails), output
    assert all(verdicts[n] == "PASS" for n in case.passes), output
    assert f"FAIL: {', '.join(n for n in case.judged if verdicts[n] == 'FAIL')} off the golden" in run.stdout
    for line in run.stdout.splitlines():
        if line.startswith("  FAIL "):
            assert "max|err| = " in line and "budget " in line, line


def test_explicit_tiles_are_what_fails():
    """The tiles case is a bug that only the tiles the suite passed reach: the same problem with
    the kernel's default tiles passes (so a repro that dropped them would show no failure)."""
    case = CASES["tiles"]
    kernel = load_kernel(case.kernel)
    plain = case.problem.replace(block_m=None, block_n=None)
    assert all(r.ok for r in judge(kernel, plain, run_kernel(kernel, plain, PROP), FORWARD))


#: Problems using every keyword of every entry point.
KEYWORD_PROBLEMS = (
    Problem(causal=True, scale=0.25, block_m=16, block_n=32, window=(3, 1), softcap=20.0,
            alibi=("batch", 0.5), sinks="mixed", b=2, hq=2, hkv=1),
    Problem(b=2, nq=5, nk=7, seqlens=((5, 7), (2, 3)), causal=True, window=(-1, 0), sinks="negative",
            alibi=("head", 1.0), softcap=5.0, block_m=3, block_n=16),
    Problem(b=2, hq=2, hkv=1, nq=2, nk=32, cache=(17, 32), page_size=16, num_splits=3, scale=0.5,
            window=(4, 0), causal=True, alibi=("head", 1.0), sinks="positive", softcap=3.0),
    Problem(b=1, nq=1, nk=16, cache=(9,)),
)


class _Recorder:
    """A kernel that records the keywords of its calls (every entry point) and returns zeros
    of the contract's shapes and dtypes (``contract.outputs``)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []

    def _record(self, mode: str, q: torch.Tensor, v: torch.Tensor, kw: dict) -> tuple[torch.Tensor, ...]:
        self.calls.append((mode, kw))
        shapes = expected_shapes(mode, q, v)
        return torch.zeros(shapes["o"], dtype=q.dtype), torch.zeros(shapes["lse"], dtype=lse_dtype(q.dtype))

    def __call__(self, q, k, v, **kw):
        return self._record("dense", q, v, kw)

    def varlen(self, q, k, v, cu_q, cu_k, max_q, max_k, **kw):
        return self._record("varlen", q, v, kw)

    def kvcache(self, q, k_cache, v_cache, **kw):
        return self._record("kvcache", q, v_cache, kw)


def _written_call(script: str) -> tuple[str, int, dict[str, object]]:
    """The entry point the repro calls, its number of positional arguments and its keywords
    (literals as values, names as ``str``)."""
    for node in ast.walk(ast.parse(script)):
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("attn", "attn.varlen", "attn.kvcache"):
            mode = ast.unparse(node.func).removeprefix("attn").removeprefix(".") or "dense"
            keywords = {kw.arg: kw.value.id if isinstance(kw.value, ast.Name) else ast.literal_eval(kw.value)
                        for kw in node.keywords}
            return mode, len(node.args), keywords
    raise AssertionError(f"no kernel call in\n{script}")


@pytest.mark.parametrize("p", KEYWORD_PROBLEMS, ids=lambda p: p.mode)
def test_the_repro_passes_what_the_suite_passes(p: Problem):
    """The call written in the repro is the call run_kernel makes: the same entry point and the
    same keywords, literal values equal and tensors named by their keyword."""
    recorder = _Recorder()
    run_kernel(Kernel("meta-recorder", recorder, load_kernel("ref-blocked").capabilities), p, PROP)
    (mode, passed), = recorder.calls
    written_mode, positional, written = _written_call(p.repro("meta-recorder"))
    assert written_mode == mode == p.mode and positional == len(p.kernel_inputs().args)
    assert set(written) == set(passed), (written, passed)
    for name, value in passed.items():
        expected = name if isinstance(value, torch.Tensor) else value
        assert written[name] == expected, (name, written[name], value)


#: A kernel within budget of the golden on every call, but not the same on two calls.
NOISY = """
import torch
from flashprop import Capabilities
from flashprop.refimpl.blocked import attention


CALLS = [0]


def attn(q, k, v, *, causal=False, scale=None):
    o, lse = attention(q, k, v, causal=causal, scale=scale)
    CALLS[0] += 1  # every other call one ulp up: two calls never agree, each is within budget
    return (torch.nextafter(o, torch.full_like(o, float("inf"))) if CALLS[0] % 2 else o), lse


attn.capabilities = Capabilities(dtypes=frozenset({torch.float32}), backward=False,
                                 devices=frozenset({"cpu"}))
"""


def test_a_repro_whose_one_call_passes_runs_the_property(tmp_path: Path):
    """deterministic-forward fails a kernel whose every call is within budget of the golden: the
    repro's call passes, so the script runs the failure's replay command, which fails, and exits
    with its status 1 (the failure reproduced from the user's folder, not a PASS)."""
    folder, scripts = tmp_path / "user", tmp_path / "scripts"
    folder.mkdir()
    scripts.mkdir()
    (folder / "noisy.py").write_text(NOISY)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    fuzz = subprocess.run([sys.executable, "-m", "flashprop.cli", "fuzz", "./noisy.py:attn", "--device",
                           "cpu", "--properties", "determinism", "--max-examples", "3"],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=300)
    assert fuzz.returncode == 1, fuzz.stdout + fuzz.stderr
    printed = [line.strip() and line[4:] for line in fuzz.stdout.splitlines()]  # the causes' indent
    run = _run(_repro("\n".join(printed)), folder, scripts)
    output = run.stdout + run.stderr
    assert "PASS: o, lse within budget on this one call" in run.stdout, output
    assert "running it on this problem alone" in run.stdout and "1 failed" in run.stdout, output
    assert run.returncode == 1, output


def test_a_malformed_input_repro_makes_the_malformed_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The error contract's malformed-inputs failure (a window side of -2 answered): its repro
    rebuilds the corrupted inputs (``malformed_inputs``) and makes that call, not the well-formed
    one, under ``must_refuse``: FAIL and status 1 while the kernel answers it; with the kernel
    fixed to refuse it, PASS and status 0."""
    folder, scripts = tmp_path / "user", tmp_path / "scripts"
    folder.mkdir()
    scripts.mkdir()
    source = folder / "unchecked.py"
    source.write_text(textwrap.dedent(UNCHECKED_WINDOW))
    monkeypatch.chdir(folder)
    kernel = load_kernel("./unchecked.py:attn")
    sizes = Sizes(max_n=8, max_batch=1, max_kv_heads=1, max_group=1, max_head_dim=8, max_work=10_000)
    corruption = "window_size below -1"
    with pytest.raises(PropertyFailure) as failed:
        test_error_contract.test_malformed_variant_inputs_raise_clear_error(_quick(), kernel, "cpu", sizes,
                                                                            corruption)
    script = _repro(str(failed.value))
    assert f"inp = malformed_inputs(p, {corruption!r})" in script, script
    assert "window_size = inp.kwargs['window_size']" in script, script
    assert "attn(q, k, v, causal=False, window_size=window_size" in script, script
    run = _run(script, folder, scripts)
    assert run.returncode == 1, run.stdout + run.stderr
    answered = (f"FAIL: malformed input ({corruption}) was answered instead of refused with a clear error "
                "(ValueError, TypeError, NotImplementedError)")
    assert run.stdout.strip() == answered, run.stdout
    source.write_text(source.read_text().replace(
        "window_size = tuple(max(side, -1) for side in window_size)", CHECKED))
    run = _run(script, folder, scripts)
    assert run.returncode == 0, run.stdout + run.stderr
    refused = f"PASS: malformed input ({corruption}) refused: ValueError: window_size"
    assert run.stdout.startswith(refused), run.stdout
