"""The library the property tests use, apart from the tests.

``strategies.py``, ``variant_problems.py`` and ``scale_problems.py`` draw problems;
``tolerance.py`` is the error budget; ``check.py`` runs a kernel and judges it (``run_kernel``,
``assert_close_to_golden``, ``run_property``); ``agreement.py`` compares two runs;
``long_references.py`` the golden and yardstick at long N; ``symptoms.py`` and ``diagnosis.py``
name what a failure looks like and what explains it, ``causes.py`` groups failures by cause;
``run_context.py`` is what a session runs under (the command line's options and the session's
tallies, time box and campaign state, built by the plugin and passed to ``run_property``: no
module holds run state); ``report.py`` keeps the per-property tallies; ``campaign.py`` the xdist
workers, shards and stop signals; ``timebox.py`` the time box; ``known_failures.py`` the
expected-failure file;
``compile_locks.py`` Triton's compile locks across processes; ``failures.py`` a failure's record.
(The one-call GPU checks on fixed cases are scripts: ``ci/fixed_cases.py``, ``ci/cuda_check.py``,
``ci/triton_check.py``.)
"""
