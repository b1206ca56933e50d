"""The per-case cold timer's launch gap for a kernel that follows its flush over a programmatic edge.

Why: a sample of the cold graph timer is ([flush, launch] x n less [flush] x n) / n, which holds the
kernel and the graph-node boundary after the flush; the launch gap calibrated on plain kernels removes
that boundary. A kernel launched with programmatic dependent launch (PDL) is captured behind the flush
over an edge of programmatic type, and whether it still pays the boundary depends on the kernel:
FlashInfer's norm kernels (what sgl-kernel's rmsnorm runs) do not, so the calibrated gap read them short
of CUPTI, while SGLang's JIT rotary embedding and FlashInfer's MoE gate can. So for such a case
the gap is measured, not assumed: once the case is sampled, the median of its own uncorrected samples
less CUPTI's span of the case's activities in one replay of the same graph (its first start to its last
end, the span `dskbench fidelity` holds the timers to), kept between 0 and the calibrated gap. A kernel
that starts during the flush and waits (FlashMLA's decode) spans more than the pair then, and gets no
gap: its start was hidden by the flush. The gap comes from the samples themselves, not from replays
timed apart from them, because how much of such a kernel's start the flush hides can differ between
those replays and the sampling.

The edge types come from the CUDA driver (`cuGraphGetEdges_v2`; CUDA 13 keeps only that signature, as
`cuGraphGetEdges`), read from a throwaway capture of one [flush, launch] pair.
"""

from __future__ import annotations

import ctypes
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from dskbench.measure import cupti_session
from dskbench.measure.batch_spans import device_activities

PROGRAMMATIC = 1  # CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC

Edge = tuple[int, int, int]  # (from node, to node, dependency type)
Activity = tuple[str, int, int]  # (name, start_ns, end_ns)
PDL_NOTE = (
    "launched while its flush ran (programmatic dependent launch): launch gap {gap:.3f} us, measured "
    "against CUPTI (calibrated {calibrated:.3f} us)"
)
UNMEASURED_NOTE = (
    "launched while its flush ran (programmatic dependent launch): its launch gap could not be measured "
    "({why}); the calibrated one subtracted"
)


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


def flush_launch_edges(launch: Callable[[], Any], flush: Callable[[], None]) -> list[Edge]:
    """The edges of a throwaway capture of [flush, launch], read from the driver; raises where the graph or
    the driver cannot say (an older torch, a driver without the call, a failed capture)."""
    import torch

    stream = torch.cuda.current_stream()
    g = None
    try:
        g = torch.cuda.CUDAGraph(keep_graph=True)  # the graph stays readable after capture
        with torch.cuda.graph(g, capture_error_mode="thread_local"):
            flush()
            launch()
        return graph_edges(g.raw_cuda_graph())
    except Exception:
        torch.cuda.set_stream(stream)  # a failed capture_end leaves the capture stream current
        raise
    finally:
        if g is not None:
            g.reset()


def follows_flush_programmatically(launch: Callable[[], Any], flush: Callable[[], None]) -> bool | None:
    """True when `launch`, captured behind `flush`, starts over a programmatic edge; None when the graph
    or the driver cannot say (the caller then keeps the calibrated gap)."""
    try:
        return programmatic_from_roots(flush_launch_edges(launch, flush)) > 0
    except (OSError, RuntimeError, AttributeError, TypeError):
        return None


def pair_spans_us(acts: Sequence[Activity], pairs: int) -> list[float]:
    """Each pair's span in us, from the device activities of one replay of [flush, launch] x `pairs` (in
    start order, the profiler's own removed): the case's first start to its last end. [] when the
    activities do not split into `pairs` equal groups of a flush and the case's own."""
    if pairs < 1 or not acts or len(acts) % pairs:
        return []
    per = len(acts) // pairs
    if per < 2:
        return []
    out = []
    for k in range(pairs):
        own = acts[k * per + 1 : (k + 1) * per]
        out.append(max(0, max(a[2] for a in own) - min(a[1] for a in own)) / 1000.0)
    return out


def bounded_gap(pair_us: float, spans_us: Sequence[float], calibrated: float) -> float:
    """The boundary a case's samples carry: their per-pair time less CUPTI's median span, in
    [0, calibrated]."""
    return min(max(pair_us - statistics.median(spans_us), 0.0), calibrated)


def case_gap(timer: Any, raw_samples: Sequence[float], calibrated: float) -> tuple[float, list[str]]:
    """The launch gap to subtract from a sampled cold GraphTimer's uncorrected samples, and the record's
    notes: the calibrated gap unless the case follows its flush over a programmatic edge."""
    if not raw_samples or not follows_flush_programmatically(timer.launchers[0], timer.flush):
        return calibrated, []
    try:
        acts = device_activities(cupti_session.profile(lambda: timer.graphs[0].replay()))
        spans = pair_spans_us(acts, timer.n)
    except Exception as e:  # noqa: BLE001 - no CUPTI on this box: keep the calibrated gap, and say so
        return calibrated, [UNMEASURED_NOTE.format(why=f"{type(e).__name__}: {e}"[:200])]
    if not spans:
        return calibrated, [UNMEASURED_NOTE.format(why=f"{len(acts)} activities for {timer.n} pairs")]
    gap = bounded_gap(statistics.median(raw_samples), spans, calibrated)
    return gap, [PDL_NOTE.format(gap=gap, calibrated=calibrated)]
