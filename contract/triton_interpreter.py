"""Fixes to Triton's interpreter (``TRITON_INTERPRET=1``) that every interpreted kernel gains:
flashprop's ``triton`` kernel and a kernel author's own Triton kernel fuzzed on the CPU alike.

:func:`apply_interpreter_fixes` makes both, once per process:

- numpy >= 2.4's scalar conversion (:func:`_fix_index_for_numpy_2_4`): without it every loop
  with a runtime bound fails on Triton 3.6;
- room on CPython's frame stack for each launch (:func:`_launch_with_stack_room`): the same
  results, about twice as fast under pytest and Hypothesis.

``kernels/triton_attention_kernels`` and ``kernels/triton_checks`` apply them when imported,
the pytest plugin at configuration when Triton is installed; under ``TRITON_INTERPRET=1`` only.
The module is in the contract, the layer both the kernels and the plugin may import
(``meta/test_meta_layers.py``): the CPU run of a Triton kernel is the interpreter's, and these
fixes are what that run means here. Neither fix changes what a launch computes.
"""

from __future__ import annotations

import os

#: Free slots (8 bytes each) of CPython's frame data stack that an interpreted launch starts
#: with: far more than the interpreter's deepest call chain within a kernel uses.
_LAUNCH_STACK_SLOTS = 8192


def apply_interpreter_fixes() -> None:
    """Both fixes when this process interprets Triton kernels (``TRITON_INTERPRET=1``, read as
    Triton reads it), each applied at most once however often this is called; nothing otherwise."""
    if os.environ.get("TRITON_INTERPRET", "0") != "1":
        return
    _fix_index_for_numpy_2_4()
    _launch_with_stack_room()


def _fix_index_for_numpy_2_4() -> None:
    """Triton 3.6's interpreter turns a scalar into a Python int with ``int(array_of_shape_1)``.
    numpy >= 2.4 refuses that ("only 0-dimensional arrays can be converted to Python scalars"),
    so every loop with a runtime bound fails (triton issue 9171, fixed upstream by PR 9172).
    Apply the upstream fix (squeeze first) on such a numpy."""
    import numpy as np
    from triton.runtime import interpreter

    try:
        int(np.ones(1, dtype=np.int32))
        return  # numpy < 2.4: nothing to fix
    except TypeError:
        pass
    original = interpreter._patch_lang_tensor
    if getattr(original, "_flashprop_fixed", False):
        return

    def patch_lang_tensor(tensor, scope) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patch_lang_tensor._flashprop_fixed = True
    interpreter._patch_lang_tensor = patch_lang_tensor


def _launch_with_stack_room() -> None:
    """Run each interpreted launch in a fresh chunk of CPython's frame data stack, so that the
    interpreter's calls never cross a chunk's end.

    CPython (3.11 on) keeps frames on a stack of 16 KiB chunks. A call that does not fit the
    current chunk maps a new one, and its return unmaps it (``_PyThreadState_BumpFramePointerSlow``,
    ``_PyThreadState_PopFrame``). Under pytest and Hypothesis a launch starts some way into a
    chunk, and the interpreter's calls for every ``tl`` operation crossed its end and came back.
    Each crossing was an mmap, four page faults and a munmap. flashprop's varlen-isolation
    property took 75 s for its 10 CI examples on ``triton``, 32 s of it system time, with 3.9
    million page faults (perf put 98% in ``_PyThreadState_BumpFramePointerSlow``).

    The fix: each launch runs inside a frame of ``_LAUNCH_STACK_SLOTS`` locals that are never
    bound. That frame is too big for the current chunk, so CPython maps one of twice its size
    for it (128 KiB), and the launch's calls run in the other half. The same property then took
    31 s, 0.3 s of it system time. What the launch computes is unchanged."""
    from triton.runtime import interpreter

    original = interpreter.GridExecutor.__call__
    if getattr(original, "_flashprop_room", False):
        return
    unbound = " = ".join(f"_{i}" for i in range(_LAUNCH_STACK_SLOTS))
    source = (f"def roomy(call, args, kwargs):\n    if False:\n        {unbound} = None\n"
              "    return call(*args, **kwargs)\n")
    scope: dict = {}
    exec(compile(source, "<flashprop launch frame>", "exec"), scope)
    roomy = scope["roomy"]

    def call(self, *args, **kwargs):
        return roomy(original, (self, *args), kwargs)

    call._flashprop_room = True
    interpreter.GridExecutor.__call__ = call
