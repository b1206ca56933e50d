"""The batched timer's sampling loop on the CPU: graphs and the profiler replaced by a simulated device
that lays each replay's flush and kernel on a clock, so chunking, quotas, stopping, the launch gap and a
chunk that does not add up are checked without a GPU; and the second timer of each record (CUDA events
for a batched case, CUPTI for an event-timed one, dskbench.measure.cross_check) on the same device."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

pytest.importorskip("torch")

from dskbench.execution.case import measure_valid  # noqa: E402
from dskbench.measure import batch, cross_check, cupti_pass  # noqa: E402
from dskbench.measure.batch_spans import MARKER  # noqa: E402
from dskbench.measure.sampling import assemble  # noqa: E402
from dskbench.measure.settings import MeasureSettings  # noqa: E402
from dskbench.measure.validity import problem  # noqa: E402

FLUSH = f"vectorized_elementwise_kernel<{MARKER}>>"


class Device:
    """Activities of the replays queued since the profiler session began, in device time (ns)."""

    def __init__(self) -> None:
        self.t = 0
        self.acts: list[tuple[str, int, int]] = []
        self.drop_flush_every = 0  # >0: every n-th replay loses its flush (a chunk that does not add up)
        self.replays = 0
        self.late = False  # events: the device had caught up with the host (queued replays saw idle)

    def profile(self, queue) -> list[tuple[str, int, int]]:
        self.acts = []
        queue()
        return list(self.acts)


class Graph:
    """One case's [flush, launch] graph. `hidden_ns`: device time after the kernel that CUPTI's records
    do not show but events do (a timer that is not timing the kernel alone)."""

    def __init__(self, dev: Device, kernel_ns: int, jitter_ns: int, seed: int, hidden_ns: int = 0) -> None:
        self.dev, self.kernel_ns, self.jitter_ns, self.hidden_ns = dev, kernel_ns, jitter_ns, hidden_ns
        self.rng = random.Random(seed)

    def replay(self) -> None:
        d = self.dev
        d.replays += 1
        if not (d.drop_flush_every and d.replays % d.drop_flush_every == 0):
            d.acts.append((FLUSH, d.t, d.t + 27_000))
        d.t += 27_500
        k = self.kernel_ns + self.rng.randint(-self.jitter_ns, self.jitter_ns)
        d.acts.append(("my_kernel", d.t, d.t + k))
        d.t += k + 1_000 + self.hidden_ns

    def reset(self) -> None:
        pass


class FlushGraph:
    """The graph of the flush alone."""

    def __init__(self, dev: Device) -> None:
        self.dev = dev

    def replay(self) -> None:
        d = self.dev
        d.acts.append((FLUSH, d.t, d.t + 27_000))
        d.t += 27_500

    def reset(self) -> None:
        pass


class Event:
    def __init__(self, dev: Device) -> None:
        self.dev, self.ns = dev, None

    def record(self) -> None:
        self.ns = self.dev.t

    def query(self) -> bool:
        return self.dev.late

    def synchronize(self) -> None:
        pass


class Clock:
    """Timing events and the GPU sleep on the simulated device."""

    def __init__(self, dev: Device) -> None:
        self.dev = dev

    def events(self, n: int) -> list[Event]:
        return [Event(self.dev) for _ in range(n)]

    def sleep(self, us: float) -> None:
        self.dev.t += int(us * 1000)

    @staticmethod
    def elapsed(a: Event, b: Event) -> float:
        return (b.ns - a.ns) / 1000.0


def cases(
    dev: Device,
    kernels_ns: list[int],
    settings: MeasureSettings,
    hidden_ns: list[int] | None = None,
    graph: Callable[[Device, int, int], Graph] | None = None,
) -> dict[int, batch.BatchCase]:
    """A started BatchCase for each kernel time, its graph `graph(dev, ns, i)` (a jittered Graph by
    default), its estimate the replay of flush, kernel and gap."""
    out = {}
    for i, ns in enumerate(kernels_ns):
        g = (
            graph(dev, ns, i)
            if graph
            else Graph(dev, ns, ns // 50, i, (hidden_ns or [0] * len(kernels_ns))[i])
        )
        c = batch.BatchCase([g])
        c.est_us = (27_500 + ns + 1_000) / 1000
        c.start(settings)
        out[i] = c
    return out


@pytest.fixture()
def device(monkeypatch):
    dev = Device()
    monkeypatch.setattr(batch, "_profile", dev.profile)
    monkeypatch.setattr(batch, "_flush_graph", lambda flush: FlushGraph(dev))
    monkeypatch.setattr(batch, "_clock", lambda index: Clock(dev))
    return dev


def test_every_case_is_sampled_until_its_rule_stops_it_with_the_gap_taken_off(device):
    s = MeasureSettings(cooldown=0.0)
    kernels = [1_500, 14_000, 150_000, 4_000_000]  # 1.5 us to 4 ms
    got = cases(device, kernels, s)
    notes: list[str] = []
    batch.sample_rounds(got, lambda: None, s, notes, gap=0.4)
    assert notes == []
    for ns, c in zip(kernels, got.values(), strict=True):
        st = c.stopper
        assert st.stopped and st.converged
        assert len(st.samples) >= st.min_samples >= s.min_samples
        # each sample is the kernel's own span less the gap: never the flush, never the gap to the next
        assert abs(sorted(st.samples)[len(st.samples) // 2] - (ns / 1000 - 0.4)) < ns / 1000 * 0.03 + 0.05
        assert c.raw[0] - st.samples[0] == pytest.approx(0.4)
        assert c.flushes and all(f == pytest.approx(27.0) for f in c.flushes)
    short, long_ = got[0].stopper, got[3].stopper
    assert short.min_samples == batch.MAX_MIN_SAMPLES  # a short kernel: more one-launch samples
    assert long_.min_samples == s.min_samples  # a 4 ms kernel: 2 ms of samples is one launch


class NeighbourGraph(Graph):
    """A kernel that runs `penalty_ns` longer when the replay before it was another case's (its code out of
    the caches, the clocks lowered by a heavy neighbour)."""

    penalty_ns = 2_000

    def replay(self) -> None:
        if getattr(self.dev, "last", None) is not self:
            self.kernel_ns += self.penalty_ns
            super().replay()
            self.kernel_ns -= self.penalty_ns
        else:
            super().replay()
        self.dev.last = self


def test_a_case_is_sampled_back_to_back_so_its_reading_does_not_depend_on_its_neighbours(device):
    s = MeasureSettings(cooldown=0.0)
    kernels = [3_000, 9_000, 150_000]  # 3 us, 9 us, 150 us
    got = cases(device, kernels, s, graph=lambda dev, ns, i: NeighbourGraph(dev, ns, 0, i))
    batch.sample_rounds(got, lambda: None, s, [], gap=None)
    for ns, c in zip(kernels, got.values(), strict=True):
        # the first replay after another case's is dropped: every sample is the kernel after itself
        assert c.stopper.samples and all(x == pytest.approx(ns / 1000) for x in c.stopper.samples)
    # a case of two input sets: the replays not counted take no turn, so its samples use both sets alike
    few = MeasureSettings(cooldown=0.0, max_samples=200)
    two = batch.BatchCase([Graph(device, 4_000, 0, 7), Graph(device, 6_000, 0, 8)])
    two.est_us = 34.0
    two.start(few)
    batch.sample_rounds({0: two}, lambda: None, few, [], gap=None)
    fours = sum(1 for x in two.stopper.samples if x == pytest.approx(4.0))
    assert fours and abs(2 * fours - len(two.stopper.samples)) <= 1  # 4 us and 6 us, one sample each way
    replays, buckets = batch.contiguous([0, 1, 2, 0, 1, 0], [528.5, 31.5, 37.5])
    assert replays == [1, 1, 1, 2, 2, 0, 0, 0]  # lightest first, each short case's run one replay longer
    assert buckets == [3, 1, 1, 3, 2, 0, 0, 0]  # that leading replay goes to no case; the long case has none


class PowerGraph(Graph):
    """A light kernel that runs `penalty_ns` longer while a heavy one (HEAVY_FROM_US or more) ended within
    the last `window_ns` of device time: the clocks a heavy GEMM's power draw lowered."""

    penalty_ns, window_ns = 2_000, 5_000_000

    def replay(self) -> None:
        d = self.dev
        heavy = (27_500 + self.kernel_ns + 1_000) / 1000 >= batch.HEAVY_FROM_US
        slowed = not heavy and d.t - getattr(d, "heavy_end", -(10**12)) < self.window_ns
        self.kernel_ns += self.penalty_ns if slowed else 0
        super().replay()
        self.kernel_ns -= self.penalty_ns if slowed else 0
        if heavy:
            d.heavy_end = d.t


def test_a_batchs_light_cases_are_sampled_before_its_heavy_ones_never_beside_them(device, monkeypatch):
    monkeypatch.setattr(batch, "SETTLE_S", 0.0)
    s = MeasureSettings(cooldown=0.0)
    kernels = [3_000, 9_000, 1_500_000, 900_000]  # 3 us, 9 us beside two prefill-sized GEMMs

    def fresh() -> dict[int, batch.BatchCase]:
        return cases(device, kernels, s, graph=lambda dev, ns, i: PowerGraph(dev, ns, 0, i))

    got = fresh()
    batch.sample_by_weight(got, lambda: None, s, [], gap=None)
    for ns, c in zip(kernels, got.values(), strict=True):
        assert c.stopper.stopped and all(x == pytest.approx(ns / 1000) for x in c.stopper.samples)
    device.heavy_end = -(10**12)
    mixed = fresh()  # all in one stream of chunks: the light cases' later chunks follow the GEMMs
    batch.sample_rounds(mixed, lambda: None, s, [], gap=None)
    assert any(x == pytest.approx(5.0) for x in mixed[0].stopper.samples)


def test_a_chunk_whose_flushes_do_not_add_up_is_retried_then_given_up(device):
    s = MeasureSettings(cooldown=0.0)
    device.drop_flush_every = 7
    got = cases(device, [2_000, 3_000], s)
    notes: list[str] = []
    batch.sample_rounds(got, lambda: None, s, notes, gap=None)
    assert any("CUPTI activities did not add up" in n for n in notes)
    assert all(c.done for c in got.values())
    assert all(not c.stopper.samples for c in got.values())  # nothing from an untrusted chunk


# -- the second timer: events for a batched case ---------------------------------------------------------

CHECK = MeasureSettings(cooldown=0.0, cross_check=True, launch_gap_us={"batch_cold": 0.0, "cold": 1.0})


def batched(dev: Device, kernels_ns: list[int], hidden_ns: list[int]) -> list[dict]:
    """The batch's cases sampled, then read by events: each case's Measurement dict with its cross-check."""
    got = cases(dev, kernels_ns, CHECK, hidden_ns)
    batch.sample_rounds(got, lambda: None, CHECK, [], gap=0.0)
    t0, replays0 = dev.t, dev.replays
    checks = batch.cross_checks(got, lambda: None, 0, CHECK)
    dev.check_ns, dev.check_replays = dev.t - t0, dev.replays - replays0
    out = []
    for i, c in got.items():
        m = assemble(
            c.stopper,
            method=batch.METHOD,
            mode="cold",
            device="cuda:0",
            n_sets=1,
            launches_per_sample=1,
            wall_s=0.0,
            launch_gap_us=0.0,
            raw_samples=c.raw,
        )
        m.cross_check = cross_check.cross_of(
            m.to_dict(), cross_check.EVENTS, checks.get(i, []), CHECK.launch_gap_us, "cold"
        )
        out.append(m.to_dict())
    return out


def test_batched_cases_are_read_by_events_too_and_agree_within_the_calibrated_gap(device):
    # events read each kernel 1 us longer than CUPTI (the node boundary, the run's calibrated gap)
    short, long_ = batched(device, [2_000, 200_000], [0, 0])
    for m, cupti_us in ((short, 2.0), (long_, 200.0)):
        cc = m["cross_check"]
        assert cc["method"] == "cuda-events" and cc["agrees"] is True and "note" not in cc
        assert cc["median_us"] == pytest.approx(cupti_us + 1.0, rel=0.02)
        assert cc["ratio"] == pytest.approx(m["median_us"] / cc["median_us"], rel=1e-4)
        assert cc["band"][0] <= cc["ratio"] <= cc["band"][1]
        assert (
            cc["overhead_us"] == 1.0
            and cross_check.MIN_SAMPLES <= cc["samples"] <= cross_check.MAX_EVENT_PAIRS
        )
        assert problem(m) is None
    # the band is asymmetric and widest for the short kernel: events may read 1.8x a 2 us kernel's time
    assert (
        short["cross_check"]["band"][0]
        < long_["cross_check"]["band"][0]
        < 1
        < long_["cross_check"]["band"][1]
    )
    # bounded: at most MAX_DEVICE_US of [case, flush] pairs per case (a few replays over for a 200 us one)
    assert device.check_replays == short["cross_check"]["samples"] + long_["cross_check"]["samples"]
    assert device.check_ns < 2 * (cross_check.MAX_DEVICE_US + 1_000) * 1_000


def test_a_disagreement_flags_the_record_and_a_gross_one_makes_it_impossible(device):
    # events see 3 us (on a 20 us kernel) and 6 us (on a 2 us one) that CUPTI's records do not hold
    flagged, gross = batched(device, [20_000, 2_000], [3_000, 6_000])
    cc = flagged["cross_check"]
    assert cc["agrees"] is False and cc["ratio"] == pytest.approx(20 / 24, rel=0.02)
    assert "events read" in cc["note"] and "outside" in cc["note"]
    assert problem(flagged) is None  # flagged, not impossible: the record stays ok
    cc = gross["cross_check"]
    assert cc["agrees"] is False and cc["ratio"] < cross_check.GROSS_RATIO[0]
    assert "timers disagree: cuda-events read" in problem(gross)


def test_events_that_saw_the_device_idle_give_no_cross_check(device):
    device.late = True  # the host never got ahead of the device, even behind the longer sleep
    (m,) = batched(device, [2_000], [0])
    assert m["cross_check"] == {"method": None, "agrees": None, "skipped": "the second timer gave 0 samples"}
    assert problem(m) is None


# -- the second timer: CUPTI for an event-timed case -----------------------------------------------------


class Buffer:
    """A flush (or marker) buffer: zeroing it lays the flush kernel on the device."""

    def __init__(self, dev: Device, ns: int) -> None:
        self.dev, self.ns = dev, ns

    def zero_(self) -> None:
        d = self.dev
        d.acts.append((FLUSH, d.t, d.t + self.ns))
        d.t += self.ns + 500


class StepGraph:
    def __init__(self, launch, mark) -> None:
        self.launch, self.mark = launch, mark

    def replay(self) -> None:
        self.mark()
        self.launch()

    def reset(self) -> None:
        pass


@pytest.fixture()
def cupti(device, monkeypatch):
    monkeypatch.setattr(batch, "_cupti_ok", True)
    monkeypatch.setattr(batch, "_capture", lambda f, mark: StepGraph(f, mark))
    monkeypatch.setattr(batch, "flush_buffer", lambda index, nbytes: Buffer(device, 27_000))
    monkeypatch.setattr(cupti_pass, "marker_buffer", lambda index: Buffer(device, 300))
    return device


def launcher(dev: Device, kernel_ns: int):
    def launch() -> None:
        dev.acts.append(("my_kernel", dev.t, dev.t + kernel_ns))
        dev.t += kernel_ns + 1_000

    return launch


def per_case(dev: Device, raw_us: float, kernel_ns: int, method="cuda-graph", mode="cold", capturable=True):
    measured = {"method": method, "median_us": raw_us - 0.3, "raw_median_us": raw_us, "flush_kind": "write"}
    if mode != "cold":
        measured.update(median_us=raw_us, raw_median_us=None, flush_kind=None)
    cc = cupti_pass.per_case_check(
        measured,
        [launcher(dev, kernel_ns)],
        mode=mode,
        capturable=capturable,
        index=0,
        flush_bytes=1 << 20,
        gaps={"cold": 0.3},
        clock=Clock(dev),
    )
    return {**measured, "n_samples": 100, "noise": 0.01, "cross_check": cc}


def test_event_timed_cases_are_read_by_cupti_and_agree(cupti):
    m = per_case(cupti, raw_us=2.3, kernel_ns=2_000)  # events: the kernel and the 0.3 us calibrated gap
    cc = m["cross_check"]
    assert cc["method"] == "cupti" and cc["agrees"] is True and cc["median_us"] == pytest.approx(2.0)
    assert cc["main_us"] == 2.3 and cc["ratio"] == pytest.approx(1.15) and cc["overhead_us"] == 0.3
    assert cross_check.MIN_SAMPLES <= cc["samples"] <= cross_check.MAX_CUPTI_LAUNCHES and "via" not in cc
    # hot, launched eagerly (not capturable): behind the tiny marker, the eager timer's 1 us overhead allowed
    hot = per_case(cupti, raw_us=2.8, kernel_ns=2_000, method="cuda-eager", mode="hot", capturable=False)
    cc = hot["cross_check"]
    assert cc["agrees"] is True and cc["via"] == "eager launches" and cc["overhead_us"] == 1.0
    assert cc["median_us"] == pytest.approx(2.0) and problem(hot) is None


def test_event_timed_disagreements_flag_then_gross_ones_end_unstable(cupti):
    flagged = per_case(cupti, raw_us=25.0, kernel_ns=20_000)
    assert flagged["cross_check"]["agrees"] is False and "CUPTI read 20" in flagged["cross_check"]["note"]
    assert problem(flagged) is None
    # events read 9 us of a 2 us kernel: measured again, then kept as impossible (unstable)
    runs = []

    def measure_once():
        runs.append(1)
        return per_case(cupti, raw_us=9.0, kernel_ns=2_000)

    measured, why = measure_valid(measure_once)
    assert len(runs) == 2 and "timers disagree: cupti read 2.0 us against 9.0 us" in why
    assert "measured twice" in measured["notes"][0]


def test_without_cupti_an_event_timed_case_is_recorded_as_not_cross_checked(cupti, monkeypatch):
    monkeypatch.setattr(batch, "_cupti_ok", False)
    m = per_case(cupti, raw_us=2.3, kernel_ns=2_000)
    assert m["cross_check"]["method"] is None and m["cross_check"]["agrees"] is None
    assert "CUPTI unavailable" in m["cross_check"]["skipped"]
    assert cupti.acts == []  # nothing was launched for it


def test_a_cupti_pass_that_does_not_add_up_is_no_cross_check(cupti, monkeypatch):
    class Lossy(Buffer):  # every third marker missing from CUPTI's records
        n = 0

        def zero_(self) -> None:
            Lossy.n += 1
            if Lossy.n % 3:
                super().zero_()

    monkeypatch.setattr(cupti_pass, "marker_buffer", lambda index: Lossy(cupti, 300))
    m = per_case(cupti, raw_us=2.3, kernel_ns=2_000, mode="hot")
    assert m["cross_check"]["method"] is None and "did not add up" in m["cross_check"]["skipped"]
    assert problem(m) is None


def test_the_band_rule():
    lo, hi = cross_check.event_band(2.0, 0.3)
    assert (lo, hi) == (pytest.approx(1.4), pytest.approx(2.9))  # 2 us -T, +gap +T (T = 0.5 + 5%)
    lo, hi = cross_check.event_band(1000.0, 0.3)
    assert (lo, hi) == (pytest.approx(949.5), pytest.approx(1050.8))
    ok = cross_check.judge("cuda-graph", 2.8, "cupti", 2.0, 0.3)
    assert ok["agrees"] and ok["band"] == [0.7, 1.45]
    short = cross_check.judge("cupti-graph", 2.0, "cuda-events", 1.3, 0.3)
    assert not short["agrees"] and "shorter" in short["note"]  # events never read much under CUPTI
    assert cross_check.gross(short) is None  # ratio 1.54: flagged only
    assert cross_check.gross({"agrees": False, "ratio": 2.5, "method": "cupti"})
    assert cross_check.gross({"agrees": True, "ratio": 2.5}) is None  # a 1 us eager kernel may read 3x
    assert cross_check.overhead_us("cuda-eager", "cold", {"cold": 0.2}) == 3.0
    assert cross_check.overhead_us("cuda-eager", "cold", {"eager_cold": 2.5}) == 2.5
    assert cross_check.overhead_us("cuda-graph", "rotate", None) == 0.3


def test_the_clock_step_is_read_off_levels_blurred_by_a_nanosecond_or_two():
    from dskbench.measure.batch_spans import clock_step_ns

    rng = random.Random(1)
    on_levels = [27_008 + 32 * rng.randint(-8, 8) + rng.choice((-1, 0, 1, 2)) for _ in range(500)]
    assert clock_step_ns(on_levels) == 32
    assert clock_step_ns([27_000 + rng.randint(-300, 300) for _ in range(500)]) is None  # ns steps
    assert clock_step_ns([27_000, 27_001, 27_032]) is None  # too few levels to tell
    assert clock_step_ns([27_000, 27_050, 27_177, 27_260, 27_391, 27_520, 27_601]) is None  # scattered


class QuantisedGraph(Graph):
    """A graph on a device whose timestamps are whole 32 ns steps blurred by a nanosecond: a ~1.2 us
    kernel between two levels, and a flush that varies over many of them."""

    def replay(self) -> None:
        d = self.dev
        d.replays += 1
        step = 32
        blur = self.rng.choice((-1, 0, 1))
        f = step * (843 + self.rng.randint(-6, 6)) + blur
        d.acts.append((FLUSH, d.t, d.t + f))
        d.t += f + 500
        k = step * (38 + self.rng.randint(0, 1)) + blur
        d.acts.append(("my_kernel", d.t, d.t + k))
        d.t += k + 1_000


def test_a_kernel_of_one_microsecond_stops_once_its_interval_is_one_clock_step(device):
    s = MeasureSettings(cooldown=0.0)
    got = {}
    for i in range(3):
        c = batch.BatchCase([QuantisedGraph(device, 0, 0, i)])
        c.est_us = 29.0
        c.start(s)
        got[i] = c
    batch.sample_rounds(got, lambda: None, s, [], gap=0.4)
    for c in got.values():
        st = c.stopper
        assert st.converged and st.resolution_us == pytest.approx((32 + 6) / 1000)
        assert len(st.samples) < 2 * batch.MAX_MIN_SAMPLES  # not the thousands a 1% interval needs here


def test_a_batched_case_notes_its_batch_and_place():
    """Cases sampled together carry the same batch number, each its own place, so a record's neighbours
    in the replays can be found again."""
    from dskbench.measure.batch import batch_note

    assert batch_note(3, 0, 38) == "sampled in a batch of 38 cases (batch 3 of this worker, case 1)"
    assert batch_note(3, 37, 38).endswith("(batch 3 of this worker, case 38)")
