"""The asv front end: the machine entry from NVML (machine.py), what the generated benchmark classes of
benchmarks/bench_kernels.py need (benchmarks.py), and the published site made to work offline
(offline.py)."""
