"""Attention kernels: MLA decode, MHA prefill, attention-state merges, MLA concatenations."""
