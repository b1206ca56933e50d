"""MoE kernels."""
