"""measure()'s device-independent parts: rotation, launch counts, method selection, the CPU timer."""

from __future__ import annotations

import time

import pytest

from dskbench.measure import Measurement, MeasureSettings, measure
from dskbench.measure.sampling import (
    CaptureFailed,
    assemble,
    drive,
    gap_for,
    launches_for,
    rotation,
    select_timer,
    subtract_gap,
)


def test_rotation_round_robin() -> None:
    assert rotation(3, 7) == [0, 1, 2, 0, 1, 2, 0]
    assert rotation(1, 3) == [0, 0, 0]


@pytest.mark.parametrize(
    ("target", "per", "sets", "cap", "minimum", "want"),
    [
        (200.0, 1.0, 1, 1000, 1, 200),  # enough launches to last the target
        (200.0, 1.0, 3, 1000, 1, 201),  # rounded up to a multiple of the sets
        (200.0, 0.01, 4, 1000, 1, 1000),  # capped, cap kept a multiple of the sets
        (200.0, 0.01, 3, 1000, 1, 999),
        (200.0, 500.0, 1, 1000, 1, 1),  # a long kernel: one launch
        (200.0, 500.0, 5, 1000, 1, 5),  # ... but every set at least once
        (200.0, 500.0, 5, 3, 1, 5),  # even past the cap
        (200.0, 50.0, 1, 1000, 16, 16),  # the minimum
        (200.0, 0.0, 2, 100, 1, 100),  # unknown time: the cap
    ],
)
def test_launches_for(target, per, sets, cap, minimum, want) -> None:
    n = launches_for(target, per, sets, cap, minimum)
    assert n == want
    assert n % sets == 0


class FakeTimer:
    def __init__(self, method: str, fail: Exception | None = None, samples=(1.0,)) -> None:
        self.method = method
        self.launches_per_sample = 4
        self.notes: list[str] = []
        self.fail = fail
        self.samples = list(samples)
        self.prepared = self.closed = False
        self.batch_gpu_us = 0.0

    def prepare(self) -> None:
        if self.fail is not None:
            raise self.fail
        self.prepared = True

    def batch(self, busy) -> list[float]:
        busy()
        self.batch_gpu_us = 1000.0 * len(self.samples)
        return list(self.samples)

    @property
    def flush_us(self):
        return None

    def close(self) -> None:
        self.closed = True


def test_graph_chosen_when_capture_works() -> None:
    made = []

    def eager():
        made.append("eager")
        return FakeTimer("cuda-eager")

    timer, reason = select_timer(True, lambda: FakeTimer("cuda-graph"), eager)
    assert timer.method == "cuda-graph" and timer.prepared and reason is None
    assert made == []  # no eager timer was even built


def test_fallback_to_eager_on_capture_failure_records_why() -> None:
    graph = FakeTimer(
        "cuda-graph", fail=CaptureFailed("RuntimeError: operation not permitted when stream is capturing")
    )
    timer, reason = select_timer(True, lambda: graph, lambda: FakeTimer("cuda-eager"))
    assert timer.method == "cuda-eager" and timer.prepared
    assert graph.closed
    assert reason is not None and "capture failed" in reason and "not permitted" in reason


def test_not_capturable_never_tries_a_graph() -> None:
    def no_graph():
        raise AssertionError("graph timer must not be built for capturable=False")

    timer, reason = select_timer(False, no_graph, lambda: FakeTimer("cuda-eager"))
    assert timer.method == "cuda-eager" and reason == "capturable=False"


def test_other_errors_do_not_fall_back() -> None:
    boom = FakeTimer("cuda-graph", fail=RuntimeError("CUDA error: an illegal memory access was encountered"))
    with pytest.raises(RuntimeError, match="illegal memory access"):
        select_timer(True, lambda: boom, lambda: FakeTimer("cuda-eager"))


def test_drive_stops_and_calls_busy_and_cools_down() -> None:
    t = FakeTimer("cuda-graph", samples=[2.0, 2.0, 2.0])
    calls, naps = [], []
    s = MeasureSettings(min_samples=9, min_time_s=0.0, cooldown=0.5)
    st = drive(t, s, busy=lambda: calls.append(1), sleep=naps.append)
    assert st.converged and len(st.samples) == 9 and len(calls) == 3
    assert naps == [pytest.approx(0.0015)] * 2  # half of each 3 ms batch, none after the last
    naps.clear()
    drive(FakeTimer("cuda-graph"), s.with_(cooldown=0.0, min_samples=3), sleep=naps.append)
    assert naps == []


def test_cpu_timer_measures_a_sleep() -> None:
    def nap() -> None:
        time.sleep(0.002)

    m = measure([nap], device="cpu", mode="hot", settings=MeasureSettings.quick(max_time_s=0.5))
    assert isinstance(m, Measurement)
    assert m.method == "cpu-wall" and m.device == "cpu" and m.launches_per_sample == 1
    assert 2000.0 <= m.median_us < 4000.0  # sleep(2 ms) never returns early; a loaded box may add a little
    assert m.p10_us <= m.median_us <= m.p90_us
    assert m.n_samples == len(m.samples_us) >= 10
    assert m.wall_s >= m.n_samples * 0.002


def test_cpu_cold_is_reported_as_hot() -> None:
    m = measure([lambda: None], device="cpu", mode="cold", settings=MeasureSettings.quick(max_time_s=0.05))
    assert m.mode == "hot" and any("no cache flush" in n for n in m.notes)


def test_rotation_calls_every_launcher_equally_in_order() -> None:
    calls: list[int] = []
    launchers = [lambda i=i: calls.append(i) for i in range(3)]
    s = MeasureSettings.quick(warmup_launches=4, max_time_s=0.05, min_samples=10)
    m = measure(launchers, device="cpu", settings=s)
    assert calls[:9] == [0, 1, 2] * 3  # warm-up rounded up to whole rounds, then round robin
    assert calls == [0, 1, 2] * (len(calls) // 3)
    assert len(calls) == 6 + m.n_samples  # 6 warm-up calls, one sample per timed call


def test_argument_checks() -> None:
    with pytest.raises(ValueError, match="mode"):
        measure([lambda: None], device="cpu", mode="warm")
    with pytest.raises(ValueError, match="at least one"):
        measure([], device="cpu")
    with pytest.raises(TypeError):
        measure([42], device="cpu")  # type: ignore[list-item]


def test_measurement_round_trips_to_dict() -> None:
    m = measure([lambda: None], device="cpu", settings=MeasureSettings.quick(max_time_s=0.02))
    d = m.to_dict()
    for key in ("median_us", "p10_us", "p90_us", "mean_us", "cv", "noise", "n_samples", "launches_per_sample",
                "converged", "wall_s", "method", "mode", "flush_us", "samples_us", "clocks_before",
                "clocks_after", "throttled", "throttle_reasons", "fallback_reason"):  # fmt: skip
        assert key in d
    assert Measurement(**d) == m


def test_quick_settings_are_smaller() -> None:
    q, d = MeasureSettings.quick(), MeasureSettings()
    assert q.max_time_s < d.max_time_s and q.min_samples <= d.min_samples
    assert d.target_noise == 0.01 and d.flush_bytes is None
    assert MeasureSettings.quick(max_time_s=9.0).max_time_s == 9.0


def test_gap_for_picks_the_method_and_mode() -> None:
    s = MeasureSettings(launch_gap_us={"hot": 0.3, "cold": 0.36, "eager_cold": 3.0})
    assert gap_for(s, "cuda-graph", "hot") == 0.3 and gap_for(s, "cuda-graph", "cold") == 0.36
    assert gap_for(s, "cuda-eager", "cold") == 3.0
    assert gap_for(s, "cuda-eager", "hot") is None  # not calibrated: uncorrected
    assert gap_for(s, "cpu-wall", "hot") is None
    assert gap_for(MeasureSettings(), "cuda-graph", "hot") is None


def test_subtract_gap_shifts_and_clamps() -> None:
    assert subtract_gap([1.0, 0.5, 0.2, 2.0], 0.3) == pytest.approx([0.7, 0.2, 0.0, 1.7])
    assert subtract_gap([1.0, 0.2], None) == [1.0, 0.2]


def test_drive_and_assemble_report_corrected_and_raw() -> None:
    raw_batch = [1.0, 1.2, 1.1, 0.25, 1.4]
    t = FakeTimer("cuda-graph", samples=raw_batch)
    s = MeasureSettings(min_samples=10, min_time_s=0.0, max_samples=10, cooldown=0.0)
    raw: list[float] = []
    st = drive(t, s, gap_us=0.3, raw=raw)
    assert raw == raw_batch * 2
    assert st.samples == pytest.approx([0.7, 0.9, 0.8, 0.0, 1.1] * 2)  # the stopper saw corrected samples
    m = assemble(st, method="cuda-graph", mode="hot", device="cuda:0", n_sets=1, launches_per_sample=4,
                 wall_s=0.1, launch_gap_us=0.3, raw_samples=raw)  # fmt: skip
    assert m.launch_gap_us == 0.3
    assert m.raw_median_us == pytest.approx(1.1)
    assert m.median_us == pytest.approx(0.8)  # every statistic from the corrected samples
    assert m.mean_us == pytest.approx(sum([0.7, 0.9, 0.8, 0.0, 1.1]) / 5)
    assert m.min_us == 0.0 and m.max_us == pytest.approx(1.1)
    assert m.p10_us < m.median_us < m.p90_us
    assert m.samples_us == pytest.approx(st.samples)
    assert any("2 samples shorter than the launch gap" in n for n in m.notes)
    assert m.clamped == 2  # the count as a field too: the validity rule reads it
    assert Measurement(**m.to_dict()) == m
    plain = assemble(st, method="cuda-graph", mode="hot", device="cuda:0", n_sets=1, launches_per_sample=4,
                     wall_s=0.1)  # fmt: skip
    assert plain.raw_median_us is None and plain.launch_gap_us is None and plain.notes == []
    assert plain.clamped is None  # no gap subtracted: nothing clamped, nothing to count


def test_cpu_measurement_splits_warm_up_from_sampling() -> None:
    """stage_s: the warm-up launches and the sampling, each on the measurement's own clock."""
    from dskbench.measure.cpu import measure_cpu

    t = [0]

    def launch() -> None:
        t[0] += 1_000_000  # every launch takes 1 ms of the fake clock

    settings = MeasureSettings(warmup_launches=3, min_samples=5, min_time_s=0.0, max_time_s=1.0, cooldown=0)
    m = measure_cpu([launch], mode="hot", settings=settings, clock_ns=lambda: t[0], now=lambda: t[0] / 1e9)
    assert m.stage_s is not None
    assert m.stage_s["warmup_s"] == 0.003 and m.stage_s["prepare_s"] == 0.0
    assert m.stage_s["sampling_s"] == round(m.n_samples * 0.001, 4)
    assert abs(sum(m.stage_s.values()) - m.wall_s) < 1e-9
