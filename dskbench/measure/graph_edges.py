"""Whether a case's kernel follows the cold flush over a programmatic edge of its CUDA graph.

Why: a kernel launched with programmatic dependent launch (sgl_kernel's RMSNorm kernels and FlashMLA's
decode kernels on Hopper, for example) is captured behind the flush over a programmatic edge: it is
launched while the flush finishes, so it pays no boundary between graph nodes. The per-case event
timer's calibrated launch gap is that boundary; subtracted from such a kernel it read it about the gap
(0.25-0.34 us on an H200) shorter than CUPTI and the batched timer did. The edges are read from the CUDA
driver (cuGraphGetEdges_v2) on a graph of [flush, launch] kept after capture.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import Any

PROGRAMMATIC = 1  # CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC
Edge = tuple[int, int, int]  # (from node, to node, dependency type)

_driver: Any = None


class _EdgeData(ctypes.Structure):  # CUgraphEdgeData
    _fields_ = [
        ("from_port", ctypes.c_ubyte),
        ("to_port", ctypes.c_ubyte),
        ("type", ctypes.c_ubyte),
        ("reserved", ctypes.c_ubyte * 5),
    ]


def follows_programmatically(edges: Sequence[Edge]) -> bool:
    """Whether an edge of programmatic type leaves a root of the graph (a node nothing precedes: in a
    captured [flush, launch] graph, the flush)."""
    targets = {b for _, b, _ in edges}
    return any(t == PROGRAMMATIC and a not in targets for a, _, t in edges)


def read_edges(graph: int) -> list[Edge]:
    """The edges of a cudaGraph_t (its handle as an int), from the driver."""
    global _driver
    if _driver is None:
        lib = ctypes.CDLL("libcuda.so.1")
        _driver = getattr(lib, "cuGraphGetEdges_v2", None) or lib.cuGraphGetEdges  # CUDA 13: one name
    n = ctypes.c_size_t(0)
    if _driver(ctypes.c_void_p(graph), None, None, None, ctypes.byref(n)) != 0:
        raise RuntimeError("cuGraphGetEdges failed")
    src, dst, data = (ctypes.c_void_p * n.value)(), (ctypes.c_void_p * n.value)(), (_EdgeData * n.value)()
    if _driver(ctypes.c_void_p(graph), src, dst, data, ctypes.byref(n)) != 0:
        raise RuntimeError("cuGraphGetEdges failed")
    return [(int(src[i] or 0), int(dst[i] or 0), int(data[i].type)) for i in range(n.value)]


def launch_follows_flush(launch: Callable[[], Any], flush: Callable[[], None]) -> bool | None:
    """Whether `launch`'s first kernel follows `flush` over a programmatic edge; None where this cannot be
    read (a torch without kept graphs, a driver without the call, a launch that cannot be captured)."""
    import torch

    stream = torch.cuda.current_stream()
    try:
        g = torch.cuda.CUDAGraph(keep_graph=True)
        with torch.cuda.graph(g, capture_error_mode="thread_local"):
            flush()
            launch()
        try:
            return follows_programmatically(read_edges(g.raw_cuda_graph()))
        finally:
            g.reset()
    except Exception:  # noqa: BLE001 - unknown: the timer keeps its calibrated gap
        torch.cuda.set_stream(stream)  # graph.__exit__ skips this when capture_end raises
        return None
