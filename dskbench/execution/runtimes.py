"""A backend kind's runtime, started once per process before that process's first case of the kind.

Why: the first Triton kernel a process launches also starts Triton itself (its driver's CUDA utilities,
the compiler backend's modules, the cache manager), a cost of the process, not of the kernel. Started
here, that cost is charged to the case's resolve stage with the backend's imports, so the first-launch
stage holds what belongs to the kernel: its own binary's load, and any compile the warm-up missed.
"""

from __future__ import annotations

from collections.abc import Callable


def _start_triton() -> None:
    from dskbench.execution import triton_start

    triton_start.launch_once()


# kind -> what starts its runtime (kinds not named need nothing beyond their imports)
STARTERS: dict[str, Callable[[], None]] = {"triton": _start_triton}
_started: set[str] = set()


def start(kind: str, device: str) -> None:
    """Start the runtime of a backend kind on the GPU, once per process (a CPU run needs none). A start
    that fails is not retried and fails nothing: the case's own launch meets the same cause and says it."""
    if device != "cuda" or kind in _started or kind not in STARTERS:
        return
    _started.add(kind)
    try:
        STARTERS[kind]()
    except Exception:  # noqa: BLE001 - the kernel's own first launch reports what is wrong
        pass
