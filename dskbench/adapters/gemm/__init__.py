"""GEMM kernels."""
