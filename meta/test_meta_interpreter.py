"""Meta-tests of the interpreter's fixes (``contract/triton_interpreter.py``): the pytest plugin
gives them to a kernel author's own Triton kernel under ``TRITON_INTERPRET=1`` (flashprop's
``triton`` kernel never imported), and applying them again wraps nothing twice.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from flashprop.cli import _plugin_args

pytestmark = pytest.mark.meta

ROOT = Path(__file__).resolve().parent.parent

#: A test file of a kernel author's: its own interpreted kernel, a loop with a runtime bound
#: (the loop numpy >= 2.4 broke), launched from a pytest test.
OWN_KERNEL_TEST = '''
import sys

import torch
import triton
import triton.language as tl


@triton.jit
def _row_sums(X, Out, n, BLOCK: tl.constexpr):
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        acc += tl.load(X + tl.program_id(0) * n + cols, mask=cols < n, other=0.0)
    tl.store(Out + tl.program_id(0), tl.sum(acc, 0))


def test_own_kernel_runs_with_the_fixes():
    from triton.runtime import interpreter

    assert "flashprop.kernels.triton_attention_kernels" not in sys.modules
    assert getattr(interpreter.GridExecutor.__call__, "_flashprop_room", False)
    x = torch.arange(3 * 40, dtype=torch.float32).reshape(3, 40)
    out = torch.empty(3)
    _row_sums[(3,)](x, out, 40, BLOCK=16)
    assert torch.equal(out, x.sum(1))
'''


def test_the_plugin_fixes_the_interpreter_for_a_kernel_authors_own_kernel(tmp_path: Path):
    (tmp_path / "test_own.py").write_text(OWN_KERNEL_TEST)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", *_plugin_args(), "-p", "no:cacheprovider", "-q", "test_own.py",
         "--kernel", "ref-blocked", "--device", "cpu"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1"})
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout, run.stdout


def test_applying_the_fixes_again_wraps_nothing_twice():
    pytest.importorskip("triton", reason="the interpreter's fixes need Triton")
    from flashprop.contract.triton_interpreter import apply_interpreter_fixes
    from triton.runtime import interpreter

    apply_interpreter_fixes()
    launch, lang = interpreter.GridExecutor.__call__, interpreter._patch_lang_tensor
    apply_interpreter_fixes()
    assert interpreter.GridExecutor.__call__ is launch and interpreter._patch_lang_tensor is lang
    assert launch._flashprop_room
