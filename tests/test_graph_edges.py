"""graph_edges: reading a captured graph's edge types from the driver, and the per-case cold timer's launch
gap for a kernel that follows its flush over a programmatic edge (none subtracted, and a note)."""

from __future__ import annotations

import ctypes

import pytest
import torch

from dskbench.measure import graph_edges as ge


class FakeDriver:
    """libcuda's cuGraphGetEdges_v2: the count when the arrays are NULL, else the edges."""

    def __init__(self, edges: list[tuple[int, int, int]], rc: int = 0) -> None:
        self.edges, self.rc, self.calls = edges, rc, 0

    def cuGraphGetEdges_v2(self, graph, src, dst, data, n_ref) -> int:  # noqa: N802 - the driver's name
        self.calls += 1
        n = n_ref._obj
        if src is None:
            n.value = len(self.edges)
            return self.rc
        for i, (a, b, t) in enumerate(self.edges[: n.value]):
            src[i], dst[i] = a, b
            data[i].type = t
        return self.rc


def test_graph_edges_reads_the_count_then_the_edges_with_their_dependency_types(monkeypatch):
    fake = FakeDriver([(0x10, 0x20, 1), (0x20, 0x30, 0)])
    monkeypatch.setattr(ctypes, "CDLL", lambda name: fake)
    assert ge.graph_edges(0xABC) == [(0x10, 0x20, ge.PROGRAMMATIC), (0x20, 0x30, 0)]
    assert fake.calls == 2


def test_graph_edges_raises_when_the_driver_returns_an_error(monkeypatch):
    monkeypatch.setattr(ctypes, "CDLL", lambda name: FakeDriver([(1, 2, 1)], rc=400))
    with pytest.raises(RuntimeError, match="cuGraphGetEdges returned 400"):
        ge.graph_edges(0xABC)


@pytest.mark.parametrize(
    ("edges", "expected"),
    [
        ([(1, 2, ge.PROGRAMMATIC)], 1),  # flush -> kernel launched with PDL
        ([(1, 2, 0)], 0),  # a plain launch
        ([(1, 2, 0), (2, 3, ge.PROGRAMMATIC)], 0),  # PDL between the case's own kernels only
        ([(1, 2, ge.PROGRAMMATIC), (2, 3, ge.PROGRAMMATIC)], 1),
        ([], 0),
    ],
)
def test_only_programmatic_edges_out_of_the_flush_count(edges, expected):
    assert ge.programmatic_from_roots(edges) == expected


def test_no_gap_is_subtracted_behind_a_programmatic_edge_and_the_record_says_why():
    assert ge.gap_after_flush(0.41, True) == (0.0, [ge.PDL_NOTE])
    assert ge.gap_after_flush(0.41, False) == (0.41, [])
    assert ge.gap_after_flush(0.41, None) == (0.41, [])  # edges unreadable: the calibrated gap stays


@pytest.mark.skipif(not torch.cuda.is_available(), reason="captures a CUDA graph")
def test_a_plain_torch_kernel_does_not_follow_the_flush_programmatically():
    buf = torch.zeros(1 << 20, device="cuda")
    x = torch.zeros(1024, device="cuda")
    assert ge.follows_flush_programmatically(lambda: x.add_(1), buf.zero_) is False
