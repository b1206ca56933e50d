"""dskbench: microbenchmarks for the GPU kernels DeepSeek-V3/R1 calls under SGLang."""

__version__ = "0.1.0"
