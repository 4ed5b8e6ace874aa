"""pytest-benchmark suites for flashprop: kernel TFLOP/s and memory on a GPU, and the CPU gate
that times the suite's own hot paths against a fixed float64 calibration workload."""
