"""Sampling kernels: top-k / top-p renormalisation and min-p / top-k-top-p sampling on probs [B, V]."""
