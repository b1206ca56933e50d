"""EAGLE / NextN (MTP) speculative decoding: draft top-k, tree building, greedy and sampling verify."""
