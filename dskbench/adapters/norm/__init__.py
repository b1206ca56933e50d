"""Normalisation kernels: RMSNorm, RMSNorm fused with the residual add, LayerNorm (DeepSeek-V3.2)."""
