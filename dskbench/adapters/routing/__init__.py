"""MoE routing (top-k gating) kernels."""
