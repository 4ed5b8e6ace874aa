"""Planted-bug kernels: a catalogue of mutants of the reference kernels, and the runner that
proves the property suite catches every one of them (``python -m mutants.run``).

Each mutant is a one-snippet source edit of ``refimpl/blocked.py`` (plain PyTorch, fast on CPU)
or of the ``triton`` kernel's modules ``kernels/triton_attention*.py`` (Triton, run by the interpreter
on CPU) that reproduces a bug class real fused-attention kernels shipped. Load one as a kernel with
``--kernel mutants.catalogue:NAME``.
"""
