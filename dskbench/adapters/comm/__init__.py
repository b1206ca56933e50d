"""Tensor-parallel communication: the hidden states' all-reduce, alone or fused with residual + RMSNorm."""
