"""The smallest Triton kernel, launched once to start Triton's runtime in a process (runtimes.py).

Imported only where Triton and a GPU are: it imports triton at module level, as its kernel needs."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_one(out_ptr):
    tl.store(out_ptr, 1)


def launch_once() -> None:
    """Compile (once per box: Triton's cache keeps it) and launch the kernel, and wait for it."""
    out = torch.zeros(1, dtype=torch.int32, device="cuda")
    _store_one[(1,)](out)
    torch.cuda.synchronize()
