"""Launch-gap calibration, CPU side: the CUPTI parser (grouping device activities into launch spans) on a
synthetic kineto-like event list, the gap summary, and the plumbing into MeasureSettings. The GPU side
(profiling and timing real ops) is checked by `dskbench selftest`."""

from __future__ import annotations

import math

import pytest

from dskbench.measure import MeasureSettings, settings_with_gap
from dskbench.measure.calibrate import (
    PREFIX,
    Span,
    gap_settings,
    keys_by_correlation,
    keys_by_order,
    kineto_tuples,
    launch_spans,
    resolve_spans,
    span_summary,
    summarize_gaps,
    with_reference,
)


class Trace:
    """A kineto-like event list as the profiler gives it for a loop of [flush?, annotated launch]:
    host events (name, start, end, correlation id) and device activities (name, start, end, linked
    correlation id). Times in ns; the device runs behind the host."""

    def __init__(self) -> None:
        self.cpu: list[tuple[str, int, int, int]] = []
        self.device: list[tuple[str, int, int, int]] = []
        self.host = 1_000_000
        self.gpu = 5_000_000
        self.corr = 0
        self.labels: list[str] = []
        self.want: dict[str, tuple[int, int, int]] = {}  # label -> (start, end, activities)

    def _op(self, name: str, kernels: list[tuple[str, int]], gap_ns: int = 300) -> int:
        """A host op at the current host time that launches `kernels` (name, duration ns)."""
        self.corr += 1
        start = self.host
        self.host += 4_000
        self.cpu.append((name, start, self.host, self.corr))
        self.host += 500
        for kname, dur in kernels:
            self.gpu += gap_ns
            self.device.append((kname, self.gpu, self.gpu + dur, self.corr))
            self.gpu += dur
        return self.corr

    def flush(self) -> None:
        self._op("aten::fill_", [("void at::native::vectorized_elementwise_kernel<FillFunctor>", 28_000)])

    def launch(self, kernels: list[tuple[str, int]], op: str = "aten::mm", direct: bool = False) -> str:
        label = f"{PREFIX}{len(self.labels)}"
        self.corr += 1
        ann_corr, a0 = self.corr, self.host
        self.host += 1_000
        g0 = self.gpu
        if direct:  # launched straight from the annotation (no aten op): linked to the annotation
            for kname, dur in kernels:
                self.gpu += 300
                self.device.append((kname, self.gpu, self.gpu + dur, ann_corr))
                self.gpu += dur
        else:
            self._op(op, kernels)
        self.host += 1_000
        self.cpu.append((label, a0, self.host, ann_corr))
        first = g0 + 300
        self.want[label] = (first, self.gpu, len(kernels))
        # the profiler's device-side copy of the annotation, and some profiler overhead
        self.device.append((label, first, self.gpu, 0))
        self.labels.append(label)
        return label

    def overhead(self) -> None:
        self.device.append(("Activity Buffer Request", self.gpu, self.gpu + 5_000, 0))


def splitk_trace(cold: bool = True) -> Trace:
    t = Trace()
    for i in range(6):
        if cold:
            t.flush()
        if i % 2:
            t.launch([("nvjet_splitK", 7_000), ("cublasLt::splitKreduce_kernel", 1_500)])
        else:
            t.launch([("elementwise_add", 1_300)], op="aten::add")
    t.overhead()
    return t


def test_launch_spans_first_start_to_last_end() -> None:
    acts = [
        ("k1", 100, 200, "a"),
        ("k2", 500, 900, "a"),
        ("k1", 250, 300, "a"),
        ("flush", 0, 90, None),
        ("k3", 1000, 1300, "b"),
    ]
    spans = launch_spans(acts)
    assert set(spans) == {"a", "b"}  # None: not one of ours
    a = spans["a"]
    assert (a.start_ns, a.end_ns, a.activities, a.busy_ns) == (100, 900, 3, 100 + 400 + 50)
    assert a.names == ("k1", "k2")
    assert a.span_us == pytest.approx(0.8) and a.busy_us == pytest.approx(0.55)
    assert spans["b"].span_us == pytest.approx(0.3)


@pytest.mark.parametrize("cold", [True, False])
def test_correlation_groups_each_launch_and_drops_the_flush(cold: bool) -> None:
    t = splitk_trace(cold)
    acts = keys_by_correlation(t.device, t.cpu)
    # every real activity appears once; annotation copies are not activities
    assert not any(a[0].startswith(PREFIX) for a in acts)
    flushes = [a for a in acts if "FillFunctor" in a[0]]
    assert len(flushes) == (6 if cold else 0) and all(a[3] is None for a in flushes)
    assert all(a[3] is None for a in acts if a[0] == "Activity Buffer Request")
    spans = launch_spans(acts)
    assert set(spans) == set(t.labels)
    for label, (start, end, n) in t.want.items():
        s = spans[label]
        assert (s.start_ns, s.end_ns, s.activities) == (start, end, n)
    two = spans[t.labels[1]]  # splitK + reduce: the span covers the gap between them
    assert two.span_us == pytest.approx((7_000 + 300 + 1_500) / 1000)
    assert two.busy_us == pytest.approx(8.5)


def test_correlation_through_the_annotation_itself() -> None:
    t = Trace()
    label = t.launch([("triton_kernel", 2_000)], direct=True)
    spans, how = resolve_spans(t.device, t.cpu, t.labels)
    assert how == "correlation" and spans[label].span_us == pytest.approx(2.0)


def test_activity_of_an_op_outside_every_annotation_is_not_ours() -> None:
    t = Trace()
    t.launch([("k", 1_000)])
    t._op("aten::copy_", [("stray", 1_000)])  # after the annotation closed
    keyed = {a[0]: a[3] for a in keys_by_correlation(t.device, t.cpu)}
    assert keyed["k"] == t.labels[0] and keyed["stray"] is None


def test_resolve_falls_back_to_device_annotations_then_order() -> None:
    t = splitk_trace(cold=True)
    unlinked = [(n, s, e, 0) for n, s, e, _ in t.device]  # a profiler that links nothing
    spans, how = resolve_spans(unlinked, t.cpu, t.labels)
    assert how == "gpu_user_annotation"
    assert {k: (v.start_ns, v.end_ns) for k, v in spans.items()} == {
        k: (s, e) for k, (s, e, _) in t.want.items()
    }
    # no annotation copies either: order, which needs the same number of activities per launch
    bare = [a for a in unlinked if not a[0].startswith(PREFIX)]
    spans, how = resolve_spans(bare, t.cpu, t.labels)
    assert how == "none" and spans == {}  # 9 activities over 6 launches: cannot cut evenly
    u = Trace()
    for _ in range(4):
        u.flush()
        u.launch([("splitK", 7_000), ("reduce", 1_000)])
    u.overhead()
    bare = [(n, s, e, 0) for n, s, e, _ in u.device if not n.startswith(PREFIX)]
    spans, how = resolve_spans(bare, u.cpu, u.labels)
    assert how == "order"
    assert {k: (v.start_ns, v.end_ns, v.activities) for k, v in spans.items()} == u.want


def test_keys_by_order_skips_flush_and_overhead() -> None:
    acts = [("flush FillFunctor", 0, 10, 0), ("b", 30, 40, 0), ("a", 15, 20, 0), ("Activity Buffer", 5, 6, 0)]
    assert keys_by_order(acts, ["x"]) == [("a", 15, 20, "x"), ("b", 30, 40, "x")]
    assert keys_by_order(acts, ["x", "y"]) == [("a", 15, 20, "x"), ("b", 30, 40, "y")]
    assert keys_by_order(acts, ["x", "y", "z"]) is None
    assert keys_by_order(acts, []) is None


def test_span_summary_medians() -> None:
    spans = [
        Span(0, 1000, 1, 1000, ("k",)),
        Span(0, 3000, 2, 2000, ("k", "r")),
        Span(0, 1200, 1, 1200, ("k",)),
    ]
    s = span_summary(spans)
    assert s["median_us"] == pytest.approx(1.2) and s["busy_us"] == pytest.approx(1.2)
    assert s["launches"] == 3 and s["per_launch"] == 1 and s["names"] == ["k", "r"]
    empty = span_summary([])
    assert math.isnan(empty["median_us"]) and empty["launches"] == 0


def rows(hot: list[float | None], cold: list[float | None], eager_hot: float = 1.0) -> list[dict]:
    out = [{"op": f"op{i}", "mode": "hot", "gap_us": g, "eager_gap_us": eager_hot} for i, g in enumerate(hot)]
    out += [
        {"op": f"op{i}", "mode": "cold", "gap_us": g, "eager_gap_us": 3.0, "batch_gap_us": 0.5 + i / 10}
        for i, g in enumerate(cold)
    ]
    return out


def test_summarize_gaps_median_over_ops() -> None:
    s = summarize_gaps(rows([0.29, 0.22, 0.40], [0.36, 0.38, math.nan]))
    assert s["hot_us"] == pytest.approx(0.29)  # median of three
    assert s["cold_us"] == pytest.approx(0.37)  # NaN ignored: median of two
    assert s["eager_hot_us"] == 1.0 and s["eager_cold_us"] == 3.0
    assert s["batch_cold_us"] == pytest.approx(0.6)  # the batched timer's own gap, cold only
    assert s["spread_us"]["hot"] == pytest.approx(0.18)
    assert s["warnings"] == []


def test_summarize_gaps_warns() -> None:
    s = summarize_gaps(rows([0.1, 0.9, 3.0], [None, None], eager_hot=0.5))
    assert s["hot_us"] == pytest.approx(0.9) and s["cold_us"] is None
    text = " ".join(s["warnings"])
    assert "hot: ops disagree by 2.90 us" in text and "cold: no op gave a gap" in text
    s = summarize_gaps(rows([2.5, 2.6, 2.7], [0.3]))
    assert any("hot: gap 2.600 us outside" in w for w in s["warnings"])


def test_gap_settings_keys_bounds_and_clamp() -> None:
    cal = {"hot_us": 0.29, "cold_us": -0.05, "eager_hot_us": 1.0, "eager_cold_us": 12.0}
    assert gap_settings(cal) == {"cold": 0.0}  # clamped; only the cold graph gap is applied
    assert gap_settings({**cal, "cold_us": 0.31}) == {"cold": 0.31}
    assert gap_settings({**cal, "batch_cold_us": 0.45}) == {"cold": 0.0, "batch_cold": 0.45}
    assert gap_settings({"cold_us": 2.5}) is None  # out of bounds
    assert gap_settings({"hot_us": -0.8, "cold_us": math.nan, "eager_hot_us": None}) is None
    assert gap_settings({"error": "RuntimeError: no CUPTI", "hot_us": 0.3}) is None
    assert gap_settings(None) is None


def test_settings_with_gap_plumbing() -> None:
    base = MeasureSettings.quick()
    ceilings = {"bandwidth_gbps": 4000.0, "launch_gap": {"hot_us": 0.3, "cold_us": 0.36}}
    s = settings_with_gap(base, ceilings)
    assert s.launch_gap_us == {"cold": 0.36}  # hot stays raw (PDL overlap hides the gap, see APPLIED_GAPS)
    assert s.with_(launch_gap_us=None) == base  # nothing else changed
    assert settings_with_gap(base, None) is base
    assert settings_with_gap(base, {"launch_gap": {"error": "boom"}}) is base
    assert settings_with_gap(base, {"bandwidth_gbps": 1.0}) is base
    assert MeasureSettings().launch_gap_us is None  # off unless a calibration is passed in


class FakeKinetoEvent:
    def __init__(self, name: str, dev: str, start: int, dur: int, corr: int, linked: int) -> None:
        self._v = (name, dev, start, dur, corr, linked)

    def name(self) -> str:
        return self._v[0]

    def device_type(self) -> str:
        return self._v[1]

    def start_ns(self) -> int:
        return self._v[2]

    def duration_ns(self) -> int:
        return self._v[3]

    def correlation_id(self) -> int:
        return self._v[4]

    def linked_correlation_id(self) -> int:
        return self._v[5]


def test_kineto_tuples_leaves_out_runtime_calls() -> None:
    evs = [
        FakeKinetoEvent(f"{PREFIX}0", "cpu", 100, 50, 1, 0),
        FakeKinetoEvent("aten::add", "cpu", 110, 20, 2, 0),
        # cudaLaunchKernel: CUPTI correlation 1 collides with the annotation's id, linked to aten::add
        FakeKinetoEvent("cudaLaunchKernel", "cpu", 500, 5, 1, 2),
        FakeKinetoEvent("add_kernel", "cuda", 9000, 1300, 1, 2),
    ]
    device, host = kineto_tuples(evs, cuda="cuda", cpu="cpu")
    assert device == [("add_kernel", 9000, 10300, 2)]
    assert host == [(f"{PREFIX}0", 100, 150, 1), ("aten::add", 110, 130, 2)]
    spans, how = resolve_spans(device, host, [f"{PREFIX}0"])
    assert how == "correlation" and spans[f"{PREFIX}0"].span_us == pytest.approx(1.3)


def test_kineto_tuples_on_a_real_cpu_profile() -> None:
    """The host side of the parser against torch's real profiler output (CPU only here): annotation
    events carry the label, ops nested in them carry the correlation ids CUPTI links kernels to."""
    torch = pytest.importorskip("torch")
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function

    a = torch.ones(8)
    labels = [f"{PREFIX}{i}" for i in range(3)]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for label in labels:
            torch.neg(a)  # like the flush: outside every annotation
            with record_function(label):
                torch.add(a, a)
    device, host = kineto_tuples(prof.profiler.kineto_results.events(), DeviceType.CUDA, DeviceType.CPU)
    assert device == []
    adds = [h for h in host if h[0] == "aten::add"]
    negs = [h for h in host if h[0] == "aten::neg"]
    assert len(adds) == len(negs) == 3 and all(h[3] > 0 for h in adds + negs)
    # one kernel per op, linked as CUPTI links them: to the op's correlation id
    fake = [("add_kernel", 10_000 * i, 10_000 * i + 1_500, h[3]) for i, h in enumerate(adds)]
    fake += [("fill_kernel", 10_000 * i + 5_000, 10_000 * i + 9_000, h[3]) for i, h in enumerate(negs)]
    spans, how = resolve_spans(fake, host, labels)
    assert how == "correlation" and set(spans) == set(labels)
    assert all(s.names == ("add_kernel",) and s.span_us == pytest.approx(1.5) for s in spans.values())
    assert [spans[label].start_ns for label in labels] == [0, 10_000, 20_000]  # each launch its own add


def test_with_reference_gaps_per_row() -> None:
    spans = [
        Span(0, 1310, 1, 1310, ("add",)),
        Span(0, 1290, 1, 1290, ("add",)),
        Span(0, 1400, 1, 1400, ("add",)),
    ]
    row = {"op": "add", "mode": "cold", "graph_method": "cuda-graph", "graph_us": 1.67, "eager_us": 4.3}
    r = with_reference(row, spans)
    assert r["cupti_median_us"] == pytest.approx(1.31) and r["cupti_launches"] == 3
    assert r["gap_us"] == pytest.approx(0.36) and r["eager_gap_us"] == pytest.approx(2.99)
    assert "gap_us" not in row  # the input row is not modified
    fell_back = with_reference({**row, "graph_method": "cuda-eager"}, spans)
    assert fell_back["gap_us"] is None and fell_back["eager_gap_us"] == pytest.approx(2.99)
    none = with_reference(row, [])
    assert none["cupti_median_us"] is None and none["gap_us"] is None and none["eager_gap_us"] is None
    s = summarize_gaps([r, none])
    assert s["cold_us"] == pytest.approx(0.36) and s["eager_cold_us"] == pytest.approx(2.99)
