"""The properties: each ``test_*.py`` here is a theme of properties every kernel is run
through. The library they use is ``flashprop.harness`` (``harness/``); the problem and the
declarations they are read against are ``flashprop.contract``; the suite's tests of itself are
in ``meta/``.

To add a property:

1. Write a ``test_<what>`` function in the ``test_*.py`` file of its theme (or a new
   ``properties/test_<theme>.py``) that takes the ``run``, ``kernel``, ``device`` and ``sizes``
   fixtures (the plugin, ``flashprop/plugin.py``, runs it once per ``--kernel``; ``run`` is the
   session's ``harness.run_context.RunContext``: the command line's settings, time box and tallies).
2. Skip, saying why, when the kernel does not declare what the property needs
   (``kernel.capabilities``: ``pytest.skip(f"kernel {kernel.name} does not declare backward")``).
3. Write ``check(kernel, problem)``: call the kernel through ``harness.check.run_kernel`` and judge the
   outputs with ``check.assert_close_to_golden`` (the float64 golden of ``refimpl`` within the
   tolerance model), or compare two runs with ``agreement.py``; anything else that fails raises
   ``check.PropertyFailure`` with ``check.failure``'s record (``harness/failures.py``: the
   problem, the detail lines, and what names the cause where the property knows it: an
   ``error=``, a ``symptom=`` of a comparison with the golden, a ``relation=`` of two runs; the
   repro and replay command are added).
4. Hand ``run`` and ``check`` to ``check.run_property`` with a short property name (the tables, ``--replay``
   and campaigns know it by that name) and the problems, from ``strategies.problems`` (or
   ``variant_problems``) for the kernel's capabilities, ``device`` and ``sizes``; ``weight``
   scales the profile's examples for an expensive property. Every problem the property runs
   must be declared: give what it makes of a draw as ``derive=`` (the problem it runs), its own
   condition on that problem as ``where=`` and the problems it derives and runs too as
   ``related=`` (not a ``.map`` or ``.filter`` after the draw, nor a check inside ``check``):
   when a kernel's declarations rule out every problem that meets ``where``, the property then
   skips naming them, instead of failing with Hypothesis's ``Unsatisfiable``, and
   ``meta/test_meta_derived.py`` fails on a problem run without being declared.
5. List it in ``docs/properties.md``, and run the planted bugs it should catch:
   ``python -m mutants.run --only NAME`` (``mutants/catalogue.py``; add a mutant for a bug class
   no property caught before).
"""
