"""Quantisation kernels."""
