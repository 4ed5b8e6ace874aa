"""The contract between a kernel and the suite, apart from any kernel.

``capabilities.py``: what a kernel declares it supports (``Capabilities``, ``Limit``,
``KVCache``); ``problem.py``: an attention problem and its tensors, which declarations are read
against; ``registry.py``: kernels by name or spec (``load_kernel``, ``Kernel``, ``BUILTIN``);
``validate.py``: the input checks adapters share, so that what a kernel refuses it refuses with
the errors the contract names; ``masks.py``: which keys a query sees (causal alignment, the
window) and the score mods (softcap, ALiBi), which the references and the mask-based adapters
apply; ``entry_points.py``: the three entry points' signatures, written
once (``@entry_point("varlen", keywords=(...))`` gives flashprop's own adapters theirs);
``triton_interpreter.py``: what a Triton kernel's CPU run under ``TRITON_INTERPRET=1`` gets here
(two fixes to the interpreter, applied by the Triton kernels and the pytest plugin).

To add a kernel adapter:

1. Write the callable ``fn(q, k, v, *, causal=False, scale=None, ...) -> (o, lse)`` (or ``o``)
   in ``kernels/`` (layouts and conventions: README, ``docs/variants.md``), refusing what it
   cannot do with ``validate.py``'s checks.
2. Give it ``fn.capabilities = Capabilities(...)``: dtypes, head dims, devices, causal
   alignment, variants, ``Limit``s with their reasons; ``fn.varlen`` / ``fn.kvcache`` for the
   variant entry points.
3. Register it by name in ``registry.BUILTIN`` (with ``unavailable_reason`` when it cannot run
   everywhere) and in the purpose lists there (``GPU_PROPERTY_KERNELS``, ...).
4. Run the suite on it: ``flashprop fuzz NAME`` (``--device cuda`` on a GPU); what it fails is a
   finding to fix or to declare.
"""
