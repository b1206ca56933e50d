"""Traced names that are not GPU kernels and belong to no kernel family."""
