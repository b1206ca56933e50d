"""The front ends, thin over one run configuration (dskbench.execution.config.RunConfig):

cli/           the `dskbench` command line, one module per command
suite/         what the asv and pytest-benchmark suites share: their configuration, plan, measurements
asv/           asv's machine entry, benchmark settings and offline site (benchmarks/bench_kernels.py)
pytest_bench/  pytest-benchmark's replay clock (bench/conftest.py)
"""
