"""The house's layers: which folder may import which (issue 31's layering, checked on every run).

The installed package maps the root folders onto ``flashprop.*`` (``flashprop/__init__.py``), so
import-graph tools that follow file paths draw the tree as one room. This test reads every
module's imports itself (``ast``: absolute ``flashprop.X`` and relative ``..X`` alike, at module
level and inside functions) and holds each folder to the folders below it:

    contract                     the contract: imports no other folder of the tree
    refimpl, kernels             the references and the kernels: the contract only (not each other)
    harness                      the contract and the references (never a kernel: kernels are
                                 loaded by name through ``contract.registry``)
    properties                   the harness, the contract and the references
    benchmarks                   the above and the kernels (``bench_suite`` times the harness)
    flashprop                    the plugin and the CLI: the contract, the harness, the benchmarks
    ci, mutants, meta            tools and tests on top: anything

To add a folder: give it its row in :data:`ALLOWED`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.meta

ROOT = Path(__file__).resolve().parent.parent
#: Per root folder: the other root folders its modules may import (None: any).
ALLOWED: dict[str, frozenset[str] | None] = {
    "contract": frozenset(),
    "refimpl": frozenset({"contract"}),
    "kernels": frozenset({"contract"}),
    "harness": frozenset({"contract", "refimpl"}),
    "properties": frozenset({"contract", "refimpl", "harness"}),
    "benchmarks": frozenset({"contract", "refimpl", "harness", "kernels"}),
    "flashprop": frozenset({"contract", "harness", "benchmarks"}),
    "ci": None,
    "mutants": None,
    "meta": None,
}


def imported_folders(path: Path, folder: str) -> dict[str, int]:
    """The root folders (of :data:`ALLOWED`) that module ``path`` of ``folder`` imports, each
    with the first line that does."""
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:
                continue  # its own folder
            parts = (node.module or "").split(".")
            if node.level == 0 and parts[0] == "flashprop" and len(parts) > 1:
                parts = parts[1:]
            elif node.level == 0:
                continue  # a third-party module (or a root module, such as conftest)
            names = [parts[0]] if parts[0] else [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name.split(".")[1] for a in node.names
                     if a.name.startswith("flashprop.") and a.name.count(".") >= 1]
        else:
            continue
        for name in names:
            if name in ALLOWED and name != folder:
                found.setdefault(name, node.lineno)
    return found


def _modules() -> list[tuple[str, Path]]:
    return [(folder, path) for folder in ALLOWED for path in sorted((ROOT / folder).rglob("*.py"))]


def test_every_folder_imports_only_the_layers_below_it():
    crossings = []
    for folder, path in _modules():
        allowed = ALLOWED[folder]
        if allowed is None:
            continue
        for name, line in imported_folders(path, folder).items():
            if name not in allowed:
                may = ", ".join(sorted(allowed)) or "nothing of the tree"
                where = f"{path.relative_to(ROOT)}:{line}"
                crossings.append(f"{where} imports {name}/ ({folder}/ may import {may})")
    assert not crossings, "\n".join(crossings)


def test_the_reader_sees_crossings(tmp_path: Path):
    """The reader finds each form of import that crosses a layer (so the test above can fail)."""
    module = tmp_path / "m.py"
    module.write_text("from flashprop.harness.check import run\nfrom ..refimpl import golden\n"
                      "import flashprop.kernels.sdpa\n\ndef f():\n    from .. import benchmarks\n"
                      "from . import sibling\nimport torch\n")
    assert imported_folders(module, "contract") == {"harness": 1, "refimpl": 2, "kernels": 3,
                                                    "benchmarks": 6}
