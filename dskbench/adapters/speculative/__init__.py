"""EAGLE / NextN (MTP) speculative-decoding kernels: draft top-k, tree building, greedy and sampling verify."""
