"""Meta-tests of a kernel author's first minutes with the ``flashprop`` command: bad input to
flashprop itself is said in one line with exit status 2 before any test runs; a kernel that
cannot be loaded (its module fails to import, a package missing) is a row saying why, in
``flashprop kernels`` and in ``flashprop fuzz``, never a traceback; shrinking is bounded and the
report says when it was cut short.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from flashprop.contract.registry import load_kernel
from flashprop.harness.check import PropertyFailure, run_property
from flashprop.harness.failures import Failure
from flashprop.harness.run_context import RunContext
from flashprop.harness.strategies import Sizes, problems

from flashprop.cli import _plugin_args, main, property_names

pytestmark = pytest.mark.meta

ROOT = Path(__file__).resolve().parent.parent
GOOD = "from flashprop.refimpl.blocked import attention as attn\n"


@pytest.mark.parametrize(("args", "says"), [
    (["./nope.py:attn"], "file ./nope.py does not exist (", ),
    (["./good.py:nope"], "./good.py has no attribute 'nope'; its functions: attn"),
    (["nosuchmodule:attn"], "no module named 'nosuchmodule'"),
    (["./good.py"], "is neither a registered name"),
    (["./good.py:attn", "--max-examples", "-5"], "--max-examples: a whole number >= 1, not '-5'"),
    (["./good.py:attn", "--max-examples", "0"], "--max-examples: a whole number >= 1, not '0'"),
    (["./good.py:attn", "--properties", "nosuch"], "unknown property nosuch; the properties are: "),
    (["./good.py:attn", "--time", "10x"], "--time: not a duration: '10x'"),
    (["./good.py:attn", "--time", "0s"], "--time: a time box of '0s' is no time"),
    (["./sub:attn"], "./sub is a folder; a kernel file is named path/to/file.py:attr ("),
    (["./good:attn"], "./good is not a file; did you mean ./good.py:attn?"),
    (["./typo.py:attn"], "./typo.py does not compile: SyntaxError: "),
], ids=["no-file", "no-attribute", "no-module", "no-attr-part", "negative-examples", "zero-examples",
        "unknown-property", "bad-time", "zero-time", "a-folder", "no-py-suffix", "syntax-error"])
def test_bad_input_to_flashprop_fuzz_is_one_line_and_exit_2(
    args: list[str], says: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
):
    (tmp_path / "good.py").write_text(GOOD)
    (tmp_path / "typo.py").write_text("def attn(q, k, v)\n    return q\n")  # the colon missing
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path)
    try:
        status = main(["fuzz", *args, "--device", "cpu"])
    except SystemExit as done:  # argparse's usage errors
        status = done.code
    out, err = capsys.readouterr()
    assert status == 2, out + err
    assert out == "" and len(err.splitlines()) == 1, out + err
    assert err.startswith("flashprop fuzz: ") and says in err, err
    if args[0] == "./nope.py:attn":
        assert "holds good.py" in err, err  # what the folder holds
    if args[0] == "./typo.py:attn":
        assert "(typo.py, line 1)" in err, err


def test_properties_lists_only_real_modules():
    names = property_names()
    assert {"golden", "variants", "varlen", "kvcache", "gradcheck"} <= set(names), names
    assert all((ROOT / "properties" / f"test_{name}.py").is_file() for name in names), names


def test_a_kernel_that_cannot_import_is_an_unavailable_row(monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture):
    """``flashprop kernels`` without the triton package: triton's row says why, exit 0."""
    monkeypatch.setitem(sys.modules, "triton", None)  # import triton raises ImportError
    monkeypatch.delitem(sys.modules, "flashprop.kernels.triton_attention", raising=False)
    assert main(["kernels"]) == 0
    out = capsys.readouterr().out
    (row,) = [line for line in out.splitlines() if line.startswith("triton ")]
    assert "unavailable: importing flashprop.kernels.triton_attention failed: ModuleNotFoundError" in row, out
    assert any(line.startswith("ref-blocked ") and "bottom-right" in line for line in out.splitlines()), out


def test_fuzz_of_a_kernel_whose_module_fails_to_import_is_a_row_not_an_error(tmp_path: Path):
    (tmp_path / "needs.py").write_text("import flashprop_no_such_package\n" + GOOD)
    run = subprocess.run(
        [sys.executable, "-m", "flashprop.cli", "fuzz", "./needs.py:attn", "--device", "cpu",
         "--properties", "golden", "--max-examples", "2", "--tracebacks-file", "tb.txt"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stdout + run.stderr
    assert "ERROR" not in run.stdout and "Traceback" not in run.stdout + run.stderr, run.stdout + run.stderr
    words = " ".join(run.stdout.split())  # the reason wraps under its row
    assert ("skipped: unavailable: kernel ./needs.py:attn: importing ./needs.py failed: ModuleNotFoundError: "
            "No module named 'flashprop_no_such_package' (needs.py:1)") in words, run.stdout


#: A failure only from 9 keys up on more than one head: shrinking it takes many steps.
def _fails_from_nine_keys(kernel, problem) -> None:
    time.sleep(0.02)
    if problem.nk > 8 and problem.hq > 1:
        raise PropertyFailure(Failure(kernel.name, "meta-shrink", problem.describe()))


@pytest.mark.parametrize("limit", [0.3, 60.0], ids=["cut-short", "shrunk"])
def test_shrinking_is_bounded_and_says_when_it_was_cut(limit: float):
    """With a shrink limit shorter than the shrink takes, the report ends saying that shrinking
    stopped, within about the limit; with time enough, the problem is shrunk (one batch element,
    two heads, head dim 1) and the report says nothing of the kind. No example database: the
    shrunk problem a run saved would replay first in the next one, with nothing to shrink."""
    run = RunContext(shrink_seconds=limit, database=None)
    kernel = load_kernel("ref-blocked")
    sizes = Sizes(max_n=24, max_batch=2, max_kv_heads=2, max_group=2, max_head_dim=8, max_work=200_000)
    strategy = problems(kernel.capabilities, device="cpu", sizes=sizes, dtypes=[torch.float32])
    start = time.monotonic()
    with pytest.raises(PropertyFailure) as raised:
        run_property(run, kernel, "meta-shrink", strategy, _fails_from_nine_keys, weight=5)
    report = str(raised.value)
    if limit < 1:
        assert "shrinking stopped after 0 s (--shrink-seconds)" in report, report
        assert time.monotonic() - start < 30, "shrinking went on past its limit"
    else:
        assert "shrinking stopped" not in report, report
        assert "b=1, hq=2, hkv=1" in report and "d=1, dv=1" in report, report  # shrunk


def test_the_plugin_refuses_a_kernel_spec_naming_nothing(tmp_path: Path):
    """Plain pytest with a mistyped --kernel: a usage error naming it, no test run."""
    run = subprocess.run(
        [sys.executable, "-m", "pytest", *_plugin_args(), "-p", "no:cacheprovider", "--pyargs",
         "flashprop.properties.test_golden", "--kernel", "./typo.py:attn", "--device", "cpu"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 4, run.stdout + run.stderr
    assert "kernel ./typo.py:attn: file ./typo.py does not exist" in run.stderr, run.stdout + run.stderr
    assert "passed" not in run.stdout and "failed" not in run.stdout, run.stdout
