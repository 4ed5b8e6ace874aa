"""The property suite: problems, strategies, the tolerance model, the harness and the tests.

``problem.py`` is a drawn problem and its tensors; ``strategies.py`` and ``variant_problems.py``
draw them; ``tolerance.py`` is the error budget; ``check.py`` the harness (``run_kernel``,
``assert_close_to_golden``, ``run_property``); ``diagnosis.py`` names what a failing output
looks like; ``report.py`` keeps the per-property tallies. ``test_*.py`` are the properties,
``test_meta*.py`` the suite's tests of itself.

To add a property:

1. Write a ``test_<what>`` function in the ``test_*.py`` file of its theme (or a new
   ``properties/test_<theme>.py``) that takes the ``kernel``, ``device`` and ``sizes`` fixtures
   (the plugin, ``flashprop/plugin.py``, runs it once per ``--kernel``).
2. Skip, saying why, when the kernel does not declare what the property needs
   (``kernel.capabilities``: ``pytest.skip(f"kernel {kernel.name} does not declare backward")``).
3. Write ``check(kernel, problem)``: call the kernel through ``check.run_kernel`` and judge the
   outputs with ``check.assert_close_to_golden`` (the float64 golden of ``refimpl`` within the
   tolerance model), or compare two runs with ``agreement.py``; anything else that fails raises
   ``check.PropertyFailure`` with ``check.failure``'s message (problem, details, repro).
4. Hand ``check`` to ``check.run_property`` with a short property name (the tables, ``--replay``
   and campaigns know it by that name) and the problems, from ``strategies.problems`` (or
   ``variant_problems``) for the kernel's capabilities, ``device`` and ``sizes``; ``weight``
   scales the profile's examples for an expensive property.
5. List it in ``docs/properties.md``, and run the planted bugs it should catch:
   ``python -m mutants.run --only NAME`` (``mutants/catalogue.py``; add a mutant for a bug class
   no property caught before).
"""
