"""The suite's tests of itself (marked ``meta``): the golden against loop-by-loop definitions,
the strategies, the harness, the reports, campaigns, the time box, the package, and the tools
(``ci/``'s GPU driver, gate, time limit and scaling script; the benchmarks' helpers). Run by the
default ``tox``; not installed.
"""
