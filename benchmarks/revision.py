"""A kernel as it is at a git revision of the working folder's repository, imported into this
process next to the working tree's, for ``flashprop bench --against REV`` and ``flashprop bisect``.

:func:`worktree` checks the revision out into a temporary ``git worktree`` (the user's own tree
and index are not touched) and removes it afterwards. :func:`import_kernel_at` imports a kernel
spec (a registered name, ``module:attr`` or ``path/to/file.py:attr``) from that tree:

1. every module already imported from the repository (the candidate's: its files lie under the
   repository's root, and the tree has them too) leaves ``sys.modules`` for the time of the
   import, and each ``sys.path`` entry inside the repository (the working folder among them) is
   moved to the same place in the tree, as is a file spec's path; what the tree lacks (a
   virtual environment inside the repository, with its torch and flashprop) stays shared;
2. the spec is imported there, so the revision's kernel imports the revision's helpers;
3. the modules it loaded from the tree are moved in ``sys.modules`` under ``ALIAS.<name>``
   (a file spec's module is named ``ALIAS_<stem>`` from the start), and the candidate's modules,
   ``sys.path`` and the import caches are put back.

So ``flashprop.kernels.triton_attention`` of a flashprop checkout at ``HEAD~1`` and of its
working tree live side by side, as two modules with their own functions, Triton kernels and
autotuners. A module outside the repository (torch, triton, an installed flashprop) is shared.
A spec whose module resolves outside the tree (a package outside the repository, or one an
editable install's finder maps to fixed paths) is refused: it would compare a kernel with itself.

Limits, said in ``docs/benchmarks.md``: state registered under a fixed global name at import
(``torch.library`` ops such as the ``cuda`` kernel's, a C++ extension's module name) is shared by
the two versions, and an import done lazily inside a function at call time resolves to the
working tree's module.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from flashprop.contract.capabilities import FULL_SUPPORT
from flashprop.contract.registry import BUILTIN, Kernel, KernelSpecError, KernelUnavailable, import_file


class RevisionError(ValueError):
    """A revision or repository that cannot be used (not a git repository, an unknown revision, a
    kernel with no version in the repository), said in one line."""


def git(args: list[str], cwd: Path) -> str:
    """``git ARGS`` in ``cwd``: its stdout, stripped; a failure raises :class:`RevisionError`
    with git's message."""
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)
    except FileNotFoundError as err:
        raise RevisionError("git is not installed") from err
    if done.returncode != 0:
        message = (done.stderr or done.stdout).strip().splitlines()
        raise RevisionError(f"git {' '.join(args)}: {message[-1] if message else 'failed'}")
    return done.stdout.strip()


def repository_root(path: Path) -> Path | None:
    """The top folder of the git repository holding ``path``, or ``None``."""
    try:
        return Path(git(["rev-parse", "--show-toplevel"], path)).resolve()
    except RevisionError:
        return None


def commit_of(rev: str, repo: Path) -> str:
    """The full hash of the commit ``rev`` names in ``repo``."""
    try:
        return git(["rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], repo)
    except RevisionError:
        raise RevisionError(f"{rev!r} names no commit of the repository {repo}") from None


def describe(repo: Path, rev: str = "HEAD") -> str | None:
    """``git describe --always --dirty`` of the working tree (``rev`` HEAD), or of ``rev``;
    ``None`` outside a repository."""
    args = ["describe", "--always", "--tags", *(["--dirty"] if rev == "HEAD" else [rev])]
    try:
        return git(args, repo)
    except RevisionError:
        return None


@contextlib.contextmanager
def worktree(repo: Path, rev: str) -> Iterator[Path]:
    """``rev`` of ``repo`` checked out (detached) in a temporary ``git worktree``, removed on exit."""
    commit = commit_of(rev, repo)
    parent = Path(tempfile.mkdtemp(prefix="flashprop-rev-"))
    tree = parent / commit[:12]
    git(["worktree", "add", "--detach", "--quiet", str(tree), commit], repo)
    try:
        yield tree
    finally:
        with contextlib.suppress(RevisionError):
            git(["worktree", "remove", "--force", str(tree)], repo)
        shutil.rmtree(parent, ignore_errors=True)
        with contextlib.suppress(RevisionError):
            git(["worktree", "prune"], repo)


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _module_paths(module: ModuleType) -> list[Path]:
    """Where a module was loaded from: its file, or a package's folders."""
    file = getattr(module, "__file__", None)
    entries = [file] if isinstance(file, str) else []
    try:
        entries += list(getattr(module, "__path__", None) or [])
    except TypeError:  # a module-like object with a __path__ that is not a list (torch.ops)
        pass
    return [Path(entry).resolve() for entry in entries if isinstance(entry, str)]


def modules_under(root: Path) -> dict[str, ModuleType]:
    """The imported modules loaded from files under ``root``."""
    return {name: module for name, module in list(sys.modules.items())
            if module is not None and any(_inside(p, root) for p in _module_paths(module))}


def _versioned(path: Path, repo: Path, tree: Path) -> bool:
    """Whether ``path`` lies in the repository and the tree has it too: a file or folder of the
    revision, not an untracked one (a virtual environment inside the repository, whose torch
    and flashprop must stay shared)."""
    return _inside(path, repo) and (tree / path.relative_to(repo)).exists()


def _revision_modules(repo: Path, tree: Path) -> dict[str, ModuleType]:
    """The imported modules the tree has a version of (:func:`_versioned`)."""
    return {name: module for name, module in modules_under(repo).items()
            if any(_versioned(p, repo, tree) for p in _module_paths(module))}


def _moved(entry: str, repo: Path, tree: Path) -> str:
    """A ``sys.path`` entry moved from the repository to the same place in the tree (one the
    tree lacks, such as a virtual environment's, stays)."""
    path = Path(entry or os.getcwd()).resolve()
    return str(tree / path.relative_to(repo)) if _versioned(path, repo, tree) else entry


def _spec_target(spec: str, repo: Path, tree: Path) -> tuple[str, str]:
    """The module (a name, or a ``.py`` path moved into the tree) and attribute ``spec`` names."""
    target, sep, attr = BUILTIN.get(spec, spec).rpartition(":")
    if not sep or not target or not attr:
        raise KernelSpecError(f"kernel {spec!r}: neither a registered name nor module:attr / file.py:attr")
    if target.endswith(".py"):
        path = Path(target).resolve()
        if not _inside(path, repo):
            raise RevisionError(f"kernel {spec}: {path} lies outside the repository {repo}, so a "
                                "revision of the repository has no version of it")
        target = str(tree / path.relative_to(repo))
    return target, attr


def _import(target: str, alias: str) -> ModuleType:
    """Import a module name, or a ``.py`` file as module ``ALIAS_<stem>``."""
    if not target.endswith(".py"):
        return importlib.import_module(target)
    path = Path(target)
    if not path.is_file():
        raise KernelSpecError(f"{path.name} does not exist at that revision ({path})")
    return import_file(f"{alias}_{path.stem}", path)


def import_kernel_at(spec: str, tree: Path, repo: Path, alias: str, label: str) -> Kernel:
    """The kernel ``spec`` as it is in ``tree`` (a checkout of ``repo`` at another revision),
    imported next to the working tree's (module docstring); its name is ``label``. Raises
    :class:`RevisionError` when its module would not come from the tree, ``KernelSpecError``
    when the tree lacks it, ``KernelUnavailable`` when it cannot run here."""
    repo, tree = repo.resolve(), tree.resolve()
    target, attr = _spec_target(spec, repo, tree)
    saved = _revision_modules(repo, tree)
    old_path = sys.path[:]
    for name in saved:
        del sys.modules[name]
    before = set(sys.modules)
    sys.path[:] = [_moved(entry, repo, tree) for entry in sys.path]
    importlib.invalidate_caches()
    try:
        module = _import(target, alias)
        fn = getattr(module, attr, None)
    except (KernelSpecError, RevisionError):
        raise
    except ModuleNotFoundError as err:
        raise KernelSpecError(f"kernel {spec} at {label}: no module named {err.name!r}") from None
    except Exception as err:
        raise KernelUnavailable(f"kernel {label}: importing it failed: {type(err).__name__}: {err}") from err
    finally:
        loaded = {name: sys.modules[name] for name in set(sys.modules) - before}
        leaked = sorted(name for name, m in loaded.items()
                        if any(_versioned(p, repo, tree) for p in _module_paths(m)))
        for name, mod in loaded.items():
            if name.startswith(alias):
                continue  # a file spec's module, named apart from the start
            if any(_inside(p, tree) for p in _module_paths(mod)) or name in leaked:
                del sys.modules[name]
                sys.modules[f"{alias}.{name}"] = mod
        sys.modules.update(saved)
        sys.path[:] = old_path
        importlib.invalidate_caches()
    where = _module_paths(module)
    if leaked or not where or not any(_inside(p, tree) for p in where):
        found = where[0] if where else "no file"
        raise RevisionError(
            f"kernel {spec}: its module at {label} was found at {found}"
            + (f" (and {', '.join(leaked[:3])} from the working tree)" if leaked else "")
            + f", not in the checkout of {label}: only a kernel whose code lies in the repository "
            f"{repo}, imported through sys.path (not an editable install's finder), has a version there")
    if fn is None or not callable(fn):
        raise KernelSpecError(f"kernel {spec}: {target} at {label} has no callable {attr!r}")
    reason_fn = getattr(fn, "unavailable_reason", None) or getattr(module, "unavailable_reason", None)
    reason = reason_fn() if callable(reason_fn) else None
    if reason:
        raise KernelUnavailable(f"kernel {label}: {reason}")
    caps = getattr(fn, "capabilities", None)
    return Kernel(name=label, fn=fn, capabilities=caps or FULL_SUPPORT, declared=caps is not None)
