"""DeepSeek-V3.2 sparse-attention (NSA/DSA) indexer kernels."""
