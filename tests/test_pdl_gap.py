"""pdl_gap: reading a captured graph's edge types from the driver, and the per-case cold timer's launch gap
for a kernel that follows its flush over a programmatic edge: measured against CUPTI, not assumed."""

from __future__ import annotations

import ctypes

import pytest
import torch

from dskbench.measure import cupti_session
from dskbench.measure import pdl_gap as ge


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


def acts(pairs: list[tuple[int, list[tuple[int, int]]]]) -> list[tuple[str, int, int]]:
    """Activities of [flush, kernels...] pairs: (flush end, [(start, end) of each kernel]), in ns; each
    flush lasts 1000 ns."""
    out = []
    for flush_end, kernels in pairs:
        out.append(("flush", flush_end - 1000, flush_end))
        out += [("kernel", a, b) for a, b in kernels]
    return out


def test_a_pair_spans_from_the_cases_first_start_to_its_last_end():
    got = ge.pair_spans_us(acts([(1000, [(1300, 4300)]), (6000, [(5800, 8000)])]), 2)
    assert got == pytest.approx([3.0, 2.2])  # started after its flush; started during it and waited
    two = acts([(1000, [(1200, 2000), (2100, 3200)]), (5000, [(5300, 6000), (6100, 7000)])])
    assert ge.pair_spans_us(two, 2) == pytest.approx([2.0, 1.7])  # a case of two kernels: first to last


def test_activities_that_do_not_split_into_the_pairs_give_no_spans():
    one = acts([(1000, [(1300, 4300)]), (6000, [(6300, 9000)])])
    assert ge.pair_spans_us(one, 3) == []
    assert ge.pair_spans_us(one[:3], 2) == []  # a kernel missing: 3 activities for 2 pairs
    assert ge.pair_spans_us([], 1) == [] and ge.pair_spans_us(one, 0) == []


@pytest.mark.parametrize(
    ("pair_us", "expected"),
    [(3.42, 0.41), (3.25, 0.25), (2.92, 0.0), (3.90, 0.41)],  # capped by the calibrated gap; never < 0
)
def test_the_measured_gap_is_the_per_pair_time_less_the_cupti_span_between_0_and_the_calibrated(
    pair_us, expected
):
    assert ge.bounded_gap(pair_us, [2.9, 3.0, 3.1, 3.0, 5.0], 0.41) == pytest.approx(expected)


class FakeTimer:
    def __init__(self, n: int) -> None:
        self.launchers, self.n, self.graphs = [lambda: None], n, [self]
        self.replayed = 0

    def flush(self) -> None:
        pass

    def replay(self) -> None:
        self.replayed += 1


RAW = [3.0, 3.1, 3.2, 3.1, 3.1]  # uncorrected samples, median 3.1


def test_case_gap_keeps_the_calibrated_gap_for_a_plain_launch_without_profiling(monkeypatch):
    monkeypatch.setattr(ge, "follows_flush_programmatically", lambda launch, flush: False)
    monkeypatch.setattr(cupti_session, "profile", lambda queue: pytest.fail("profiled a plain launch"))
    assert ge.case_gap(FakeTimer(4), RAW, 0.41) == (0.41, [])


def test_case_gap_behind_a_programmatic_edge_is_its_samples_median_less_the_cupti_span(monkeypatch):
    timer = FakeTimer(2)
    monkeypatch.setattr(ge, "follows_flush_programmatically", lambda launch, flush: True)

    def profile(queue):
        queue()
        return acts([(1000, [(1700, 4700)]), (6000, [(6600, 9600)])])  # spans of 3.0 us

    monkeypatch.setattr(cupti_session, "profile", profile)
    gap, notes = ge.case_gap(timer, RAW, 0.41)
    assert gap == pytest.approx(0.1) and timer.replayed == 1
    assert notes == [ge.PDL_NOTE.format(gap=gap, calibrated=0.41)]
    gap, _ = ge.case_gap(timer, [x + 0.5 for x in RAW], 0.41)  # samples that pay more: capped
    assert gap == 0.41


def test_case_gap_without_samples_asks_nothing(monkeypatch):
    monkeypatch.setattr(ge, "follows_flush_programmatically", lambda *a: pytest.fail("read the edges"))
    assert ge.case_gap(FakeTimer(2), [], 0.41) == (0.41, [])


def test_case_gap_keeps_the_calibrated_gap_and_says_why_when_cupti_cannot_read_the_graph(monkeypatch):
    monkeypatch.setattr(ge, "follows_flush_programmatically", lambda launch, flush: True)
    monkeypatch.setattr(cupti_session, "profile", lambda queue: acts([(1000, [(1300, 2000)])]))  # 1 pair of 2
    gap, notes = ge.case_gap(FakeTimer(2), RAW, 0.41)
    assert gap == 0.41 and notes == [ge.UNMEASURED_NOTE.format(why="2 activities for 2 pairs")]

    def no_cupti(queue):
        raise RuntimeError("CUPTI unavailable")

    monkeypatch.setattr(cupti_session, "profile", no_cupti)
    gap, notes = ge.case_gap(FakeTimer(2), RAW, 0.41)
    assert gap == 0.41 and "RuntimeError: CUPTI unavailable" in notes[0]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="captures a CUDA graph")
def test_a_plain_torch_kernel_does_not_follow_the_flush_programmatically():  # (GPU)
    buf = torch.zeros(1 << 20, device="cuda")
    x = torch.zeros(1024, device="cuda")
    assert ge.follows_flush_programmatically(lambda: x.add_(1), buf.zero_) is False
