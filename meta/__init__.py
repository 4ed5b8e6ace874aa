"""The suite's tests of itself (marked ``meta``): the golden against loop-by-loop definitions,
the strategies, the harness, the reports, campaigns, the time box and the package. Run by the
default ``tox``; not installed.
"""
