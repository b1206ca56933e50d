"""The CUDA timers run against a simulated GPU (torch.cuda patched): an in-order device timeline, a host
clock, events, a spin kernel, graph capture/replay and an L2 that a flush makes cold.

This checks the timers' own arithmetic and control flow on a CPU-only machine: the flush is excluded,
host launch overhead is hidden, every input set is used equally, capture failures fall back to eager,
and a host that cannot keep up is detected. It does not check real GPU timing (`dskbench selftest`
does that against the profiler).
"""

from __future__ import annotations

import contextlib
import random
import sys
import types
from collections import Counter

import pytest

torch = pytest.importorskip("torch")

from dskbench.measure import MeasureSettings, cuda, cuda_graph, cuda_timer, measure  # noqa: E402

KERNEL_US = 3.0  # kernel time with L2 warm
COLD_EXTRA_US = 1.5  # extra when L2 was just flushed
FLUSH_US = 40.0
HOST_LAUNCH_US = 8.0  # python + driver cost of one launch on the host (more than the kernel!)
GRAPH_LAUNCH_HOST_US = 4.0
GRAPH_START_DEVICE_US = 0.5  # device-side cost of starting a graph replay
SLEEP_CYCLES_PER_US = 1500.0


class Sim:
    def __init__(self, jitter: float = 0.0, seed: int = 0) -> None:
        self.host = 0.0  # us
        self.dev = 0.0  # end of the last queued device op, us
        self.capturing: list | None = None
        self.l2_cold = True
        self.launched: list = []  # set index of each kernel the device executed
        self.rng = random.Random(seed)
        self.jitter = jitter

    def j(self, us: float) -> float:
        return us * (1.0 + self.rng.uniform(-self.jitter, self.jitter)) if self.jitter else us

    def enqueue(self, op: tuple) -> None:
        if self.capturing is not None:
            self.capturing.append(op)
        else:
            self.run(op, self.host)

    def run(self, op: tuple, t_enq: float) -> None:
        start = max(self.dev, t_enq)
        kind = op[0]
        if kind == "event":
            op[1].t = start
            self.dev = start
        elif kind == "sleep":
            self.dev = start + op[1] / SLEEP_CYCLES_PER_US
        elif kind == "flush":
            self.dev = start + self.j(FLUSH_US)
            self.l2_cold = True
        elif kind == "kernel":
            self.dev = start + self.j(KERNEL_US) + (COLD_EXTRA_US if self.l2_cold else 0.0)
            self.l2_cold = False
            self.launched.append(op[1])
        elif kind == "graph_start":
            self.dev = start + GRAPH_START_DEVICE_US


class FakeEvent:
    def __init__(self, sim: Sim, enable_timing: bool = True) -> None:
        self.sim, self.t = sim, None

    def record(self, stream=None) -> None:
        self.sim.host += 0.5
        self.t = None
        self.sim.enqueue(("event", self))

    def query(self) -> bool:
        return self.t is not None and self.t <= self.sim.host

    def synchronize(self) -> None:
        self.sim.host = max(self.sim.host, self.t)

    def elapsed_time(self, other: FakeEvent) -> float:
        return (other.t - self.t) / 1000.0


class FakeGraph:
    def __init__(self, sim: Sim) -> None:
        self.sim, self.ops = sim, []

    def replay(self) -> None:
        self.sim.host += GRAPH_LAUNCH_HOST_US
        self.sim.run(("graph_start",), self.sim.host)
        for op in self.ops:
            self.sim.run(op, self.sim.host)

    def reset(self) -> None:
        self.ops = []


class FakeFlushBuffer:
    device = "cpu"

    def __init__(self, sim: Sim) -> None:
        self.sim = sim
        self.kinds: list[str] = []

    def zero_(self) -> None:
        self.sim.host += 2.0
        self.kinds.append("write")
        self.sim.enqueue(("flush",))

    def read(self) -> None:  # what torch.sum(buf, dim=0, out=sink) does to it
        self.sim.host += 2.0
        self.kinds.append("read")
        self.sim.enqueue(("flush",))


class FakeTime:
    def __init__(self, sim: Sim) -> None:
        self.sim = sim

    def perf_counter(self) -> float:
        return self.sim.host / 1e6


@pytest.fixture
def sim(monkeypatch) -> Sim:
    s = Sim(jitter=0.02)

    @contextlib.contextmanager
    def graph(g, pool=None, stream=None, capture_error_mode="global"):
        s.capturing = g.ops
        try:
            yield
        finally:
            s.capturing = None

    def synchronize(device=None) -> None:
        s.host = max(s.host, s.dev)

    tc = torch.cuda
    monkeypatch.setattr(tc, "Event", lambda enable_timing=False, **kw: FakeEvent(s, enable_timing))
    monkeypatch.setattr(tc, "_sleep", lambda cycles: s.enqueue(("sleep", cycles)))
    monkeypatch.setattr(tc, "CUDAGraph", lambda: FakeGraph(s))
    monkeypatch.setattr(tc, "graph", graph)
    monkeypatch.setattr(tc, "synchronize", synchronize)
    monkeypatch.setattr(tc, "current_stream", lambda device=None: "stream")
    monkeypatch.setattr(tc, "set_stream", lambda stream: None)
    monkeypatch.setattr(tc, "device", lambda index: contextlib.nullcontext())
    monkeypatch.setattr(tc, "current_device", lambda: 0)
    monkeypatch.setattr(tc, "get_device_properties", lambda i: types.SimpleNamespace(L2_cache_size=50 << 20))
    s.flush_buf = FakeFlushBuffer(s)
    monkeypatch.setattr(cuda, "flush_buffer", lambda index, nbytes: s.flush_buf)
    real_sum = torch.sum

    def fake_sum(x, *a, **kw):
        if isinstance(x, FakeFlushBuffer):
            return x.read()
        return real_sum(x, *a, **kw)

    monkeypatch.setattr(torch, "sum", fake_sum)
    monkeypatch.setattr(cuda_timer, "_sleep_rate", {})
    monkeypatch.setattr(cuda, "time", FakeTime(s))
    monkeypatch.setattr(cuda.nvml, "read_clocks", lambda index=0, lib=None: None)
    return s


def launchers(sim: Sim, n: int, fail_in_capture: bool = False):
    def make(i: int):
        def launch() -> None:
            if fail_in_capture and sim.capturing is not None:
                raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
            sim.host += HOST_LAUNCH_US
            sim.enqueue(("kernel", i))

        return launch

    return [make(i) for i in range(n)]


SETTINGS = MeasureSettings(
    min_samples=20, min_time_s=0.0, max_time_s=0.5, max_samples=400, target_noise=0.01, cooldown=0.0
)


def test_graph_hot_excludes_host_overhead(sim: Sim) -> None:
    m = measure(launchers(sim, 1), mode="hot", settings=SETTINGS)
    assert m.method == "cuda-graph" and m.mode == "hot" and m.fallback_reason is None
    # per launch: the kernel plus the graph start amortised over >= 200 us of launches
    assert m.median_us == pytest.approx(KERNEL_US, rel=0.03)
    assert m.launches_per_sample * KERNEL_US >= 0.5 * SETTINGS.replay_target_us
    assert m.flush_us is None and m.converged


def test_graph_cold_excludes_the_flush(sim: Sim) -> None:
    m = measure(launchers(sim, 1), mode="cold", settings=SETTINGS)
    assert m.method == "cuda-graph" and m.mode == "cold"
    # the flush (40 us, 10x the kernel) is subtracted; the cold-cache cost stays in
    assert m.median_us == pytest.approx(KERNEL_US + COLD_EXTRA_US, rel=0.05)
    assert m.flush_us == pytest.approx(FLUSH_US, rel=0.02)
    assert m.flush_bytes == 2 * (50 << 20)
    assert m.launches_per_sample >= cuda_graph.COLD_MIN_LAUNCHES


@pytest.mark.parametrize("mode", ["hot", "cold"])
def test_every_set_used_equally(sim: Sim, mode: str) -> None:
    m = measure(launchers(sim, 3), mode=mode, settings=SETTINGS)
    assert m.launches_per_sample % 3 == 0 and m.n_sets == 3
    counts = Counter(sim.launched)
    assert set(counts) == {0, 1, 2}
    assert len(set(counts.values())) == 1, counts


def test_capture_failure_falls_back_to_eager(sim: Sim) -> None:
    m = measure(launchers(sim, 2, fail_in_capture=True), mode="cold", settings=SETTINGS)
    assert m.method == "cuda-eager"
    assert "capture failed" in m.fallback_reason and "not permitted" in m.fallback_reason
    # eager timing still excludes the flush and hides the 8 us host launch cost behind the sleep
    assert m.median_us == pytest.approx(KERNEL_US + COLD_EXTRA_US, rel=0.05)
    assert m.launches_per_sample == 1


def test_eager_hot_hides_host_overhead(sim: Sim) -> None:
    m = measure(launchers(sim, 2), mode="hot", capturable=False, settings=SETTINGS)
    assert m.method == "cuda-eager" and m.fallback_reason == "capturable=False"
    # the host needs 8 us per launch, the kernel 3 us: a host-timed loop would report ~8.5
    assert m.median_us == pytest.approx(KERNEL_US, rel=0.03)
    assert m.launches_per_sample % 2 == 0
    counts = Counter(sim.launched)
    assert counts[0] == counts[1]


def test_eager_detects_a_sleep_too_short(sim: Sim, monkeypatch) -> None:
    # a launcher whose host cost grows after calibration: the sleep must be lengthened, and the
    # samples taken while the GPU waited for the host are thrown away
    calls = [0]

    def slow() -> None:
        calls[0] += 1
        sim.host += HOST_LAUNCH_US if calls[0] < 40 else 400.0
        sim.enqueue(("kernel", 0))

    m = measure([slow], mode="cold", capturable=False, settings=SETTINGS.with_(min_samples=100))
    assert calls[0] > 100
    assert m.median_us == pytest.approx(KERNEL_US + COLD_EXTRA_US, rel=0.05)
    assert m.max_us < KERNEL_US + COLD_EXTRA_US + 5.0  # no sample with the GPU waiting for the host


@pytest.mark.parametrize(("mode", "expect"), [("hot", KERNEL_US), ("cold", KERNEL_US + COLD_EXTRA_US)])
def test_graph_launch_gap_subtracted_and_raw_kept(sim: Sim, mode: str, expect: float) -> None:
    gap = {"hot": 0.5, "cold": 1.0}[mode]
    s = SETTINGS.with_(launch_gap_us={"hot": 0.5, "cold": 1.0, "eager_hot": 9.0})
    m = measure(launchers(sim, 2), mode=mode, settings=s)
    assert m.method == "cuda-graph" and m.launch_gap_us == gap
    assert m.raw_median_us == pytest.approx(expect, rel=0.05)
    assert m.median_us == pytest.approx(m.raw_median_us - gap, abs=0.02)
    assert m.p10_us <= m.median_us <= m.p90_us < m.raw_median_us
    assert min(m.samples_us) >= 0.0 and m.notes == []


def test_a_cold_graph_subtracts_the_gap_its_case_measured_and_notes_it(sim: Sim, monkeypatch) -> None:
    """measure() asks pdl_gap for each cold graph case's gap once it is sampled, with the uncorrected
    samples (a kernel behind a programmatic edge has its own gap, measured), corrects the samples by it and
    keeps its note; hot graphs keep the calibrated gap and are not asked."""
    asked = []

    def case_gap(timer, raw, calibrated):
        asked.append(calibrated)
        assert len(raw) >= 3 and min(raw) > calibrated  # the samples taken, before any correction
        return 0.25, ["measured gap"]

    monkeypatch.setattr(cuda, "case_gap", case_gap)
    s = SETTINGS.with_(launch_gap_us={"hot": 0.5, "cold": 1.0})
    m = measure(launchers(sim, 2), mode="cold", settings=s)
    assert m.method == "cuda-graph" and asked == [1.0]
    assert m.launch_gap_us == 0.25 and m.median_us == pytest.approx(m.raw_median_us - 0.25, abs=0.02)
    assert min(m.samples_us) > m.raw_median_us - 1.0  # every sample less 0.25, none less the calibrated 1.0
    assert m.notes == ["measured gap"]
    m = measure(launchers(sim, 2), mode="hot", settings=s)
    assert m.launch_gap_us == 0.5 and asked == [1.0]


def test_eager_without_its_calibration_is_not_corrected(sim: Sim) -> None:
    s = SETTINGS.with_(launch_gap_us={"hot": 0.5, "cold": 1.0})
    m = measure(launchers(sim, 1), mode="hot", capturable=False, settings=s)
    assert m.method == "cuda-eager" and m.launch_gap_us is None and m.raw_median_us is None
    assert m.median_us == pytest.approx(KERNEL_US, rel=0.03)
    assert any("no launch gap calibrated for cuda-eager hot" in n for n in m.notes)


def test_eager_with_its_calibration_is_corrected_and_clamped(sim: Sim) -> None:
    s = SETTINGS.with_(launch_gap_us={"eager_hot": 1.0, "eager_cold": 100.0})
    m = measure(launchers(sim, 1), mode="hot", capturable=False, settings=s)
    assert m.launch_gap_us == 1.0 and m.median_us == pytest.approx(KERNEL_US - 1.0, rel=0.05)
    m = measure(launchers(sim, 1), mode="cold", capturable=False, settings=s)
    assert m.median_us == 0.0 and max(m.samples_us) == 0.0  # a gap larger than the kernel: clamped
    assert m.raw_median_us == pytest.approx(KERNEL_US + COLD_EXTRA_US, rel=0.05)
    assert any("clamped at 0" in n for n in m.notes)


def test_calibration_pairs_each_op_and_mode_with_its_reference(sim: Sim, monkeypatch) -> None:
    """calibrate_launch_gap's glue on the simulated GPU, the profiler replaced by spans that are shorter
    than the simulated kernel by a known amount per mode: the gaps found must be those amounts."""
    from dskbench.measure import calibrate

    short = {"hot": 0.2, "cold": 0.4}
    seen = []

    def fake_profile(jobs, flush):
        seen.extend((len(j.launchers), j.cold) for j in jobs)
        out = []
        for j in jobs:
            us = KERNEL_US + (COLD_EXTRA_US if j.cold else 0.0) - short["cold" if j.cold else "hot"]
            out.append([calibrate.Span(0, int(us * 1000), 1, int(us * 1000), ("k",))] * j.iters)
        return out, "correlation"

    monkeypatch.setattr(calibrate, "profile_launches", fake_profile)
    s = SETTINGS.with_(launch_gap_us={"hot": 5.0})  # ignored: calibration is always uncorrected
    cal = calibrate.calibrate_launch_gap(
        0, settings=s, ops=[("one", launchers(sim, 1)), ("two", launchers(sim, 2))]
    )
    assert seen == [(1, True), (1, False), (2, True), (2, False)]
    assert [(r["op"], r["mode"]) for r in cal["ops"]] == [
        ("one", "cold"),
        ("one", "hot"),
        ("two", "cold"),
        ("two", "hot"),
    ]
    assert cal["hot_us"] == pytest.approx(0.2, abs=0.1) and cal["cold_us"] == pytest.approx(0.4, abs=0.15)
    assert cal["eager_hot_us"] == pytest.approx(0.2, abs=0.1)
    assert cal["grouping"] == "correlation" and cal["warnings"] == []
    tuned = calibrate.settings_with_gap(SETTINGS, {"launch_gap": cal})
    hot = measure(launchers(sim, 1), mode="hot", settings=tuned)
    assert hot.launch_gap_us is None  # hot stays raw: only the cold gap is applied (APPLIED_GAPS)
    m = measure(launchers(sim, 1), mode="cold", settings=tuned)
    assert m.launch_gap_us == pytest.approx(cal["cold_us"])
    assert m.median_us == pytest.approx(KERNEL_US + COLD_EXTRA_US - 0.4, abs=0.15)  # agrees with "CUPTI"


def test_cold_samples_of_long_kernels_take_few_launches(sim: Sim, monkeypatch) -> None:
    assert [cuda_graph.cold_min_launches(us) for us in (3.0, 125.0, 200.0, 4500.0)] == [16, 16, 10, 1]
    monkeypatch.setattr(sys.modules[__name__], "KERNEL_US", 3000.0)  # a ms-long attention or GEMM
    m = measure(launchers(sim, 1), mode="cold", settings=SETTINGS)
    assert m.launches_per_sample == 1  # 16 [flush, kernel] pairs would be 100 ms per sample
    assert m.median_us == pytest.approx(3000.0 + COLD_EXTRA_US, rel=0.02)


def test_a_read_flush_replaces_the_write_and_is_recorded(sim: Sim) -> None:
    m = measure(launchers(sim, 1), mode="cold", settings=SETTINGS.with_(flush_kind="read"))
    assert set(sim.flush_buf.kinds) == {"read"} and m.flush_kind == "read"
    assert m.median_us == pytest.approx(KERNEL_US + COLD_EXTRA_US, rel=0.05)  # still cold, flush excluded
    with pytest.raises(ValueError, match="flush_kind 'evict'"):
        measure(launchers(sim, 1), mode="cold", settings=SETTINGS.with_(flush_kind="evict"))
    hot = measure(launchers(sim, 1), mode="hot", settings=SETTINGS)
    assert hot.flush_kind is None
