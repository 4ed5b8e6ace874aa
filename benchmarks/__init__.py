"""pytest-benchmark suites for flashprop: kernel TFLOP/s and memory on a GPU, and the CPU gate
that times the suite's own hot paths against a fixed float64 calibration workload.

``grid.py`` is the problem grid, ``timing.py`` the timing protocol, ``memory.py`` peak memory,
``calibration.py`` the CPU anchors, ``schema.py`` the row every benchmark records,
``plotting.py`` headless matplotlib, ``report.py`` the table and plot, ``gate.py`` the
comparison with a baseline (per-row noise bands);
``ab.py`` the A/B statistics, ``against.py`` ``flashprop bench --against`` (a kernel timed against
its version at a git revision, ``revision.py``, or another kernel), ``history.py`` the history and
its drift report, ``git_bisect.py`` ``flashprop bisect``; ``bench_*.py`` are the suites
(``bench_attention``: the kernel grid; ``bench_layer``: a transformer block; ``bench_memory``:
memory growth; ``bench_suite``: the CPU gate), ``conftest.py`` their options and shared state.

To add a benchmark:

1. A registered kernel needs nothing: ``bench_attention.py`` times every one on the grid
   (``--bench-kernels NAME``). A new problem shape is a value on an axis of ``grid.GPU_GRID`` /
   ``grid.CPU_GRID``, or a named subset in ``grid.SUBSETS``.
2. Anything else is a ``test_*`` function in a ``bench_<what>.py`` here, taking ``benchmark``
   (pytest-benchmark) and ``bench_state`` (``conftest.py``: the device, the loaded kernels, the
   round setup). It skips, saying why, what cannot run here.
3. Time with ``timing.py``'s protocol: mark it ``pytest.mark.benchmark(timer=CLOCKS[device].timer)``
   (CUDA events on CUDA, wall-clock on the CPU), warm up with ``warm_up`` and call
   ``benchmark.pedantic(call, setup=bench_state.setup, rounds=rounds_for(seconds, device))``.
4. Record one ``schema.Row``: ``benchmark.extra_info.update(Row(...).extra_info())``. A new
   quantity is a new field of ``Row`` (documented there), which ``report.py`` then shows.
5. To gate it, fill ``Row.ratios`` with each anchor's seconds over its own, measured in the
   same run (the anchors: ``contract.registry.BENCH_ANCHORS``; on the CPU gate,
   ``calibration.ANCHORS``), and ``Row.timing`` with ``timing.CLOCKS[device].protocol``; then record
   the baseline: ``python ci/bench_gate.py --update ci/baselines/<machine>.json RUN.json``.
"""
