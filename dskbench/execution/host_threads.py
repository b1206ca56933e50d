"""A GPU run's host-side torch work (routing drawn on the CPU, small copies) on a few threads.

torch splits a CPU op over every core once a tensor is large enough (about 32k elements). In a GPU run
those ops are small, and on a host whose cores run compilers (a run that builds ahead) a parallel region
waits for its slowest thread, so a few milliseconds of routing can take a hundred times longer. A CPU run
(`--device cpu`) times the references themselves and keeps torch's default."""

from __future__ import annotations

from dskbench.device.info import usable_cores

GPU_RUN_THREADS = 8
# A builder (warm.py) makes inputs and launches once; its CPU belongs to the compilers, and several
# builders with eight threads each oversubscribe a box many times over.
BUILDER_THREADS = 2


def limit_for_gpu_run(device_kind: str, cap: int | None = None) -> int | None:
    """Cap torch's intra-op threads in a GPU run's worker (at `cap`, default GPU_RUN_THREADS); the count
    set, or None (a CPU run: unchanged)."""
    if device_kind != "cuda":
        return None
    import torch

    n = max(1, min(cap or GPU_RUN_THREADS, usable_cores()))
    torch.set_num_threads(n)
    return n
