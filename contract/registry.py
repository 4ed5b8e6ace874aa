"""Kernel registry and loader.

A kernel is named by a registered name (``triton``, ``cuda``, ``ref-blocked``, ``ref-reordered``,
``sdpa-math``, ``sdpa-flash``, ``sdpa-efficient``, ``sdpa-cudnn``, ``flex``, ``flash-attn``), by
``module:attr`` or by ``path/to/file.py:attr``. A kernel callable or its module may define
``unavailable_reason()`` returning why the kernel cannot run here (``None`` when it can); the
loader then raises :class:`KernelUnavailable` and the suite skips the kernel with that reason.
Which registered kernels each run takes (the CPU run, the GPU property, fuzz and benchmark
runs, the benchmarks' anchors) is said once, below :data:`BUILTIN`.

To add a kernel adapter:

1. Write ``attention(q, k, v, *, causal=False, scale=None)`` to the contract (README's
   conventions: (B, H, N, D) layout, GQA, bottom-right causal, empty rows): it returns
   ``(o, lse)``, or ``o`` alone, and refuses what it cannot do with ValueError, TypeError or
   NotImplementedError naming it. ``block_m`` / ``block_n`` keywords if it takes tile sizes.
2. Declare what it supports: ``attention.capabilities = Capabilities(...)``
   (``contract/capabilities.py``: dtypes, devices, head dims, tiles, backward, variants, and each
   known limit as a ``Limit`` with its reason). Variants are keywords of ``attention`` and the
   entry points ``attention.varlen`` / ``attention.kvcache`` (``docs/variants.md``); check their
   inputs with ``contract/validate.py`` (``check_dense``, ``check_variants``, ``check_varlen``,
   ``check_decode``).
3. Give the callable or its module ``unavailable_reason()`` when it cannot run everywhere (no
   GPU, a package or a build missing).
4. Register a name for it in :data:`BUILTIN` and add the name to the runs below that should
   take it. (Unregistered, ``--kernel module:attr`` or ``--kernel path/file.py:attr`` load it.)
5. Run the suite on it: ``python -m pytest properties --kernel NAME [--device cuda]``; every
   failure prints its problem and a repro.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from .capabilities import FULL_SUPPORT, Capabilities

#: Registered names and the ``module:attr`` each stands for.
BUILTIN: dict[str, str] = {
    "triton": "flashprop.kernels.triton_attention:attention",
    "cuda": "flashprop.kernels.cuda_attention:attention",
    "ref-blocked": "flashprop.refimpl.blocked:attention",
    "ref-reordered": "flashprop.refimpl.reordered:attention",
    "sdpa-math": "flashprop.kernels.sdpa:sdpa_math",
    "sdpa-flash": "flashprop.kernels.sdpa:sdpa_flash",
    "sdpa-efficient": "flashprop.kernels.sdpa:sdpa_efficient",
    "sdpa-cudnn": "flashprop.kernels.sdpa:sdpa_cudnn",
    "flex": "flashprop.kernels.flex:attention",
    "flash-attn": "flashprop.kernels.flash_attn_adapter:attention",
}

# Which registered kernels each run takes, per purpose (the CI scripts, tox.ini and the benchmark
# suites read these; a new kernel joins a run by being added here).
#: The default CPU run (tox's ``py`` environment, ``mutants.run``'s correct kernels among them):
#: the kernels that run on a machine without a GPU. ``ref-reordered`` (float64 only) is the
#: float64 floor's check: ``ref-blocked`` in another summation order.
CPU_KERNELS: tuple[str, ...] = ("ref-blocked", "ref-reordered", "sdpa-math", "triton")
#: The property suite on a GPU (``ci/gpu_check.py``), slowest to compile first.
GPU_PROPERTY_KERNELS: tuple[str, ...] = (
    "triton", "cuda", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "flex",
)
#: The long fuzz runs on a GPU: the fused kernels written here.
GPU_FUZZ_KERNELS: tuple[str, ...] = ("triton", "cuda")
#: Anchors per device: what every benchmarked kernel's speed is compared with, in the same run
#: (``extra_info["ratios"]``, which ``ci/bench_gate.py`` gates).
BENCH_ANCHORS: dict[str, tuple[str, ...]] = {"cuda": ("sdpa-flash", "sdpa-cudnn"), "cpu": ("sdpa-math",)}
#: The GPU benchmark grid: the fused kernels and the CUDA anchors.
GPU_BENCH_KERNELS: tuple[str, ...] = ("triton", "cuda", *BENCH_ANCHORS["cuda"])
#: The runs by name: ``--kernel +cpu`` (pytest, ``flashprop fuzz``, ``mutants.run --kernels``)
#: names every kernel of :data:`CPU_KERNELS`, and so on (:func:`expand_specs`).
KERNEL_SETS: dict[str, tuple[str, ...]] = {
    "cpu": CPU_KERNELS, "gpu": GPU_PROPERTY_KERNELS, "gpu-fuzz": GPU_FUZZ_KERNELS,
    "gpu-bench": GPU_BENCH_KERNELS,
}


def expand_specs(specs: list[str]) -> list[str]:
    """``specs`` with each ``+NAME`` replaced by the kernels of run ``NAME`` (:data:`KERNEL_SETS`),
    in order, each kernel once; an unknown set raises :class:`KernelSpecError` naming the known."""
    out: list[str] = []
    for spec in specs:
        if spec.startswith("+"):
            if spec[1:] not in KERNEL_SETS:
                known = ", ".join("+" + name for name in KERNEL_SETS)
                raise KernelSpecError(f"no kernel set {spec!r}: known {known}")
            names = KERNEL_SETS[spec[1:]]
        else:
            names = (spec,)
        out += [name for name in names if name not in out]
    return out


class KernelUnavailable(RuntimeError):
    """The kernel cannot run on this machine (no GPU, package missing, build failed)."""


@dataclass(frozen=True)
class Kernel:
    """A loaded kernel: its name, the callable and its declared capabilities."""

    name: str
    fn: Callable
    capabilities: Capabilities
    #: Whether ``fn`` carried its own ``capabilities`` (False: full support is assumed).
    declared: bool = True

    def __call__(self, q, k, v, *, causal=False, scale=None, block_m=None, block_n=None, **variants):
        """Call the dense entry point; returns ``(o, lse)`` with ``lse=None`` when it returns only
        ``o``. ``variants`` (``window_size``, ``softcap``, ``alibi_slopes``, ``sinks``) are passed
        as given: callers pass only those in use."""
        return self.call("dense", (q, k, v), variants, causal=causal, scale=scale, block_m=block_m,
                         block_n=block_n)

    def entry(self, mode: str) -> Callable:
        """The entry point of ``mode``: ``dense`` (the kernel itself), ``varlen`` (``fn.varlen``)
        or ``kvcache`` (``fn.kvcache``). A missing one raises ``NotImplementedError``."""
        if mode == "dense":
            return self.fn
        fn = getattr(self.fn, mode, None)
        if not callable(fn):
            raise NotImplementedError(f"kernel {self.name} has no {mode} entry point (fn.{mode})")
        return fn

    def call(self, mode: str, args: tuple, kwargs: dict, *, causal=False, scale=None, block_m=None,
             block_n=None) -> tuple:
        """Call the ``mode`` entry point with positional ``args`` and keywords ``kwargs``; returns
        ``(o, lse)``, ``lse=None`` when the kernel returns only ``o``."""
        kw = dict(kwargs)
        for name, val in (("block_m", block_m), ("block_n", block_n), ("scale", scale)):
            if val is not None:
                kw[name] = val
        out = self.entry(mode)(*args, causal=causal, **kw)
        if isinstance(out, tuple | list):
            if len(out) != 2:
                raise TypeError(f"kernel {self.name} returned {len(out)} values; expected o or (o, lse)")
            return out[0], out[1]
        return out, None


class KernelSpecError(ValueError):
    """A kernel spec that names no kernel (no such file, module or attribute; not a registered
    name) or a kernel whose declaration is malformed: the user's input to fix, said in one line."""


def _folder_listing(folder: Path, suffix: str = ".py") -> str:
    """What ``folder`` holds that a spec could name: its ``*.py`` files, a few of them."""
    names = sorted(p.name for p in folder.glob(f"*{suffix}")) if folder.is_dir() else []
    if not names:
        return f"{folder} holds no {suffix} file" if folder.is_dir() else f"{folder} is not a folder"
    shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
    return f"{folder} holds {shown}"


class SourceLoader(importlib.machinery.SourceFileLoader):
    """Runs a kernel file's current text, never a cached ``.pyc``, and writes none: the cache is
    keyed by the file's mtime in whole seconds and its size, so a file edited within the second
    it was cached, to the same size (``REPEAT = 1`` made ``REPEAT = 2``, a bisect's next
    revision), would run its old code; and a user's folder gets no ``__pycache__``."""

    def get_code(self, fullname: str):
        return compile(self.get_data(self.path), self.path, "exec", dont_inherit=True)


def import_file(name: str, path: Path):
    """Module ``name`` from the file ``path`` (by :class:`SourceLoader`), in ``sys.modules``
    while it runs; an error leaves no module behind."""
    mod_spec = importlib.util.spec_from_file_location(name, path, loader=SourceLoader(name, str(path)))
    module = importlib.util.module_from_spec(mod_spec)
    sys.modules[name] = module
    try:
        mod_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _import_module(spec: str, target: str):
    """Import ``target`` (a module name, or a path ending in ``.py``). A target that does not exist
    (or a path without ``.py``: a folder's, say) or does not compile (a ``SyntaxError``: the run
    would test nothing, and must not pass) raises :class:`KernelSpecError`; one that compiles but
    fails to import (a package it needs is missing, an error in its module code) raises
    :class:`KernelUnavailable` with the error."""
    if target.endswith(".py"):
        path = Path(target).resolve()
        if not path.is_file():
            listing = _folder_listing(path.parent)
            raise KernelSpecError(f"kernel {spec}: file {target} does not exist ({listing})")
        try:
            return import_file(f"flashprop_user_{path.stem}", path)
        except SyntaxError as err:
            raise KernelSpecError(f"kernel {spec}: {target} does not compile: {_syntax_line(err)}") from None
        except Exception as err:
            raise KernelUnavailable(f"kernel {spec}: importing {target} failed: {_error_line(err)}") from err
    if "/" in target or "\\" in target or target.startswith("."):  # a path, not a module name
        path = Path(target).resolve()
        if path.with_name(path.name + ".py").is_file():
            raise KernelSpecError(f"kernel {spec}: {target} is not a file; did you mean "
                                  f"{target}.py:{spec.rpartition(':')[2]}?")
        what = "is a folder" if path.is_dir() else "does not exist"
        raise KernelSpecError(f"kernel {spec}: {target} {what}; a kernel file is named path/to/file.py:attr "
                              f"({_folder_listing(path if path.is_dir() else path.parent)})")
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as err:
        if err.name is not None and (target == err.name or target.startswith(f"{err.name}.")):
            raise KernelSpecError(f"kernel {spec}: no module named {err.name!r} (not importable from "
                                  f"{Path.cwd()}: a file is named path/to/file.py:attr)") from None
        raise KernelUnavailable(f"kernel {spec}: importing {target} failed: {_error_line(err)}") from err
    except Exception as err:
        raise KernelUnavailable(f"kernel {spec}: importing {target} failed: {_error_line(err)}") from err


def _syntax_line(err: SyntaxError) -> str:
    """``SyntaxError: message (file.py, line N)``."""
    where = f" ({Path(err.filename).name}, line {err.lineno})" if err.filename else ""
    return f"{type(err).__name__}: {err.msg}{where}"


def _error_line(err: BaseException) -> str:
    """``Type: message`` of ``err``, its first line, and where it was raised (file:line)."""
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    where = f" ({Path(tb.tb_frame.f_code.co_filename).name}:{tb.tb_lineno})" if tb is not None else ""
    text = str(err).splitlines()[0] if str(err) else ""
    return f"{type(err).__name__}: {text}{where}"


def _import_target(spec: str) -> tuple[object, Callable]:
    """The module and the callable ``spec`` names (a registered name stands for its module:attr)."""
    target, sep, attr = BUILTIN.get(spec, spec).rpartition(":")
    if not sep or not target or not attr:
        hint = f"; or a file: {spec}:ATTR" if spec.endswith(".py") else ""
        raise KernelSpecError(f"kernel {spec!r} is neither a registered name ({', '.join(BUILTIN)}) nor "
                              f"module:attr / path/to/file.py:attr{hint}")
    module = _import_module(spec, target)
    try:
        fn = getattr(module, attr)
    except AttributeError:
        public = sorted(n for n, v in vars(module).items()
                        if callable(v) and not isinstance(v, type) and not n.startswith("_"))
        holds = f"; its functions: {', '.join(public[:8])}" if public else "; it defines no function"
        raise KernelSpecError(f"kernel {spec}: {target} has no attribute {attr!r}{holds}") from None
    return module, fn


def load_kernel(spec: str) -> Kernel:
    """Resolve a kernel name or spec. Raises :class:`KernelSpecError` when the spec names no
    kernel or its declaration is malformed, :class:`KernelUnavailable` when it cannot run here
    (its ``unavailable_reason()``, or its module failed to import)."""
    module, fn = _import_target(spec)
    reason_fn = getattr(fn, "unavailable_reason", None) or getattr(module, "unavailable_reason", None)
    reason = reason_fn() if callable(reason_fn) else None
    if reason:
        raise KernelUnavailable(f"kernel {spec}: {reason}")
    caps = getattr(fn, "capabilities", FULL_SUPPORT)
    if not isinstance(caps, Capabilities):
        raise KernelSpecError(f"kernel {spec}: .capabilities must be a flashprop.Capabilities, "
                              f"got {type(caps)}")
    for mode, declared in (("varlen", caps.varlen), ("kvcache", caps.kvcache is not None)):
        if declared and not callable(getattr(fn, mode, None)):
            raise KernelSpecError(f"kernel {spec} declares {mode} but has no entry point fn.{mode}")
    return Kernel(name=spec, fn=fn, capabilities=caps, declared=hasattr(fn, "capabilities"))


def spec_problem(specs: list[str]) -> str | None:
    """What is wrong with the first of ``specs`` that names no kernel (no such file, module or
    attribute) or declares itself wrongly, in one line, or ``None``: what ``flashprop fuzz`` and
    ``bench`` and the pytest plugin refuse before any test runs. A kernel that exists but cannot
    run here is not wrong: its row says why."""
    for spec in specs:
        if spec in BUILTIN:
            continue
        try:
            load_kernel(spec)
        except KernelSpecError as err:
            return str(err)
        except KernelUnavailable:
            pass
    return None


def observe_outputs(kernel: Kernel, device: str) -> Kernel:
    """An undeclared kernel claims full support, but whether it returns ``(o, lse)`` or only
    ``o`` is what it does: one tiny call on ``device`` decides, and a kernel returning only
    ``o`` is then checked on ``o``. Declared kernels (and ones that fail the probe, which the
    properties then report) come back unchanged."""
    if kernel.declared:
        return kernel
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 4, 8, generator=g).to(device) for _ in range(3))
    try:
        out = kernel.fn(q, k, v, causal=False)
    except Exception:  # the properties report a kernel that cannot run
        return kernel
    if isinstance(out, tuple | list):
        return kernel
    return replace(kernel, capabilities=replace(kernel.capabilities, returns_lse=False))


def default_kernel(device: str) -> str:
    """The best built-in kernel for ``device``: the fused Triton kernel (the interpreter on CPU)."""
    if device == "cuda" and not torch.cuda.is_available():
        raise KernelUnavailable("--device cuda asked for but torch sees no CUDA device")
    return "triton"
