"""asv benchmark suite of dskbench (generated from the kernel registry; see bench_kernels.py).

asv imports only this package from the checkout. When dskbench itself is not installed in the
environment (`asv run -E existing` from a plain checkout), fall back to the checkout's copy.
"""

import importlib.util
import os
import sys

if importlib.util.find_spec("dskbench") is None:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
