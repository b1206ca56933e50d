"""Does a case's kernel follow the cold flush over a programmatic edge? Read from the CUDA driver.

Why: a kernel launched with programmatic dependent launch (PDL; several sgl-kernel and FlashMLA kernels)
is captured behind the flush over an edge of programmatic type, so it is launched while the flush still
runs and pays no launch gap at that boundary. The per-case cold timer's sample, [flush, launch] x n less
[flush] x n over n, then holds no gap for the calibrated one to remove: subtracting it read such kernels
0.3-0.5 us short of their CUPTI span counted from the flush's end (what the batched timer reads). The
edge types are the driver's (`cuGraphGetEdges_v2`; CUDA 13 keeps only that signature under
`cuGraphGetEdges`), read from a throwaway capture of one [flush, launch] pair.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import Any

PROGRAMMATIC = 1  # CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC

Edge = tuple[int, int, int]  # (from node, to node, dependency type)
PDL_NOTE = "launched while its flush ran (programmatic dependent launch): no launch gap subtracted"


class _EdgeData(ctypes.Structure):  # CUgraphEdgeData
    _fields_ = [
        ("from_port", ctypes.c_ubyte),
        ("to_port", ctypes.c_ubyte),
        ("type", ctypes.c_ubyte),
        ("reserved", ctypes.c_ubyte * 5),
    ]


def graph_edges(graph: int) -> list[Edge]:
    """Each edge of a cudaGraph_t (a captured graph kept alive), from the driver; OSError or RuntimeError
    where the driver cannot say."""
    lib = ctypes.CDLL("libcuda.so.1")
    get = getattr(lib, "cuGraphGetEdges_v2", None) or lib.cuGraphGetEdges
    n = ctypes.c_size_t(0)
    if (rc := get(ctypes.c_void_p(graph), None, None, None, ctypes.byref(n))) != 0:
        raise RuntimeError(f"cuGraphGetEdges returned {rc}")
    src, dst, data = (ctypes.c_void_p * n.value)(), (ctypes.c_void_p * n.value)(), (_EdgeData * n.value)()
    if (rc := get(ctypes.c_void_p(graph), src, dst, data, ctypes.byref(n))) != 0:
        raise RuntimeError(f"cuGraphGetEdges returned {rc}")
    return [(int(src[i] or 0), int(dst[i] or 0), int(data[i].type)) for i in range(n.value)]


def programmatic_from_roots(edges: Sequence[Edge]) -> int:
    """Programmatic edges out of a root node: in a [flush, launch] capture the flush is the only root."""
    targets = {b for _, b, _ in edges}
    return sum(1 for a, _, t in edges if t == PROGRAMMATIC and a not in targets)


def follows_flush_programmatically(launch: Callable[[], Any], flush: Callable[[], None]) -> bool | None:
    """True when `launch`, captured behind `flush`, starts over a programmatic edge; None when the graph
    or the driver cannot say (the caller then keeps the calibrated gap)."""
    import torch

    stream = torch.cuda.current_stream()
    g = None
    try:
        g = torch.cuda.CUDAGraph(keep_graph=True)  # the graph stays readable after capture
        with torch.cuda.graph(g, capture_error_mode="thread_local"):
            flush()
            launch()
        return programmatic_from_roots(graph_edges(g.raw_cuda_graph())) > 0
    except (OSError, RuntimeError, AttributeError, TypeError):  # an older torch, a driver without the call
        torch.cuda.set_stream(stream)  # a failed capture_end leaves the capture stream current
        return None
    finally:
        if g is not None:
            g.reset()


def gap_after_flush(gap: float, programmatic: bool | None) -> tuple[float, list[str]]:
    """The per-case cold graph timer's launch gap for a case, and the record's note: none behind a
    programmatic edge, the calibrated one otherwise (and where the edge could not be read)."""
    if programmatic:
        return 0.0, [PDL_NOTE]
    return gap, []
