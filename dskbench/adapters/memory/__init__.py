"""KV-cache bookkeeping kernels of every step: the MLA KV-cache write and the paged token allocator."""
