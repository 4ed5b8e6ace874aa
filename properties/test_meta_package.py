"""Meta-tests of flashprop as a package: the wheel's contents and the ``flashprop`` command.

The wheel holds ``flashprop`` and nothing else at the top level (no ``kernels``: PyPI has a
package of that name), registers the pytest plugin (``pytest11``) and the ``flashprop`` script;
``flashprop fuzz`` prints the table, exits 0 on a correct kernel and 1 on a wrong one, and writes
JSON and JUnit XML when asked.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.meta

ROOT = Path(__file__).resolve().parent.parent


def test_the_wheel_installs_only_the_flashprop_namespace(tmp_path: Path):
    # built from a copy: an in-tree build leaves build/ and an egg-info (whose entry points other
    # processes running from the root would see) in the working tree
    source = tmp_path / "src"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".git", ".tox", "build", "*.egg-info",
                                                                 "__pycache__", ".hypothesis"))
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path),
         str(source)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    (wheel,) = tmp_path.glob("flashprop-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == {"flashprop"}, tops
    for module in ("flashprop/kernels/capabilities.py", "flashprop/refimpl/golden.py",
                   "flashprop/properties/test_variants.py", "flashprop/plugin.py", "flashprop/cli.py",
                   "flashprop/kernels/cuda/flash_fwd.cuh"):
        assert module in names, module
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry).decode()
    assert "[pytest11]" in text and "flashprop = flashprop.plugin" in text, text
    assert "[console_scripts]" in text and "flashprop = flashprop.cli:main" in text, text


WRONG = textwrap.dedent('''
    from flashprop.refimpl.blocked import attention as blocked


    def attn(q, k, v, *, causal=False, scale=None):
        o, lse = blocked(q, k, v, causal=causal, scale=scale)
        return 1.01 * o, lse
''')


@pytest.mark.parametrize("spec", ["ref-blocked", "wrong"])
def test_flashprop_fuzz_exit_status_and_reports(tmp_path: Path, spec: str):
    kernel = spec
    if spec == "wrong":
        (tmp_path / "wrong.py").write_text(WRONG)
        kernel = "./wrong.py:attn"
    run = subprocess.run(
        [sys.executable, "-m", "flashprop.cli", "fuzz", kernel, "--device", "cpu", "--max-examples", "5",
         "--properties", "golden", "--json", "t.json", "--junit-xml", "t.xml"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == (1 if kernel.endswith(":attn") else 0), run.stdout + run.stderr
    assert "examples per property" in run.stdout
    rows = {row["property"]: row for row in json.loads((tmp_path / "t.json").read_text())}
    assert set(rows) == {"forward", "backward"}, rows
    assert (rows["forward"]["failed"] > 0) == kernel.endswith(":attn"), rows
    assert "<testsuite" in (tmp_path / "t.xml").read_text()
