"""Statistics and the stopping rule of the measurement core, against numpy and synthetic streams."""

from __future__ import annotations

import math
import random
import statistics

import numpy as np
import pytest

from dskbench.measure.stats import median_ci, quantile, relative_noise, summarize
from dskbench.measure.stopping import Stopper


@pytest.mark.parametrize("n", [1, 2, 3, 10, 101, 1000])
def test_summary_matches_numpy(n: int) -> None:
    rng = random.Random(n)
    xs = [rng.lognormvariate(1.0, 0.4) for _ in range(n)]
    s = summarize(xs)
    assert s.n == n
    assert s.median == pytest.approx(float(np.median(xs)), rel=1e-12)
    assert s.p10 == pytest.approx(float(np.percentile(xs, 10)), rel=1e-12)
    assert s.p90 == pytest.approx(float(np.percentile(xs, 90)), rel=1e-12)
    assert s.mean == pytest.approx(statistics.fmean(xs), rel=1e-12)
    assert s.min == min(xs) and s.max == max(xs)
    if n > 1:
        assert s.cv == pytest.approx(float(np.std(xs, ddof=1) / np.mean(xs)), rel=1e-9)
    else:
        assert s.cv == 0.0


def test_known_values() -> None:
    xs = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert quantile(sorted(xs), 0.5) == 3.0
    assert quantile(sorted(xs), 0.1) == pytest.approx(1.4)
    assert quantile(sorted(xs), 0.9) == pytest.approx(4.6)
    assert summarize(xs).cv == pytest.approx(statistics.stdev(xs) / 3.0)
    assert math.isnan(summarize([]).median)


def test_median_ci_is_the_order_statistic_interval() -> None:
    xs = list(range(1, 101))  # x_(i) = i
    lo, hi = median_ci(xs)
    assert (lo, hi) == (40, 61)  # the textbook 95% interval for n = 100
    # coverage: the interval contains the true median about 95% of the time
    rng = random.Random(7)
    hits = 0
    trials = 400
    for _ in range(trials):
        sample = sorted(rng.gauss(10.0, 1.0) for _ in range(60))
        lo, hi = median_ci(sample)
        hits += lo <= 10.0 <= hi
    assert 0.90 <= hits / trials <= 0.995


def test_noise_shrinks_with_samples_and_tracks_spread() -> None:
    rng = random.Random(1)
    small = sorted(rng.gauss(100, 5) for _ in range(50))
    big = sorted(rng.gauss(100, 5) for _ in range(5000))
    assert relative_noise(big) < relative_noise(small) / 5
    tight = sorted(rng.gauss(100, 0.5) for _ in range(50))
    assert relative_noise(tight) < relative_noise(small) / 5
    assert relative_noise([1.0, 2.0]) == math.inf  # too few to say
    assert relative_noise([-1.0] * 10) == math.inf  # median <= 0


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _run(stream, clock: FakeClock, dt: float, batch: int = 10, **kw) -> Stopper:
    settings = dict(target_noise=0.01, min_samples=20, max_samples=1_000_000, min_time_s=0.1, max_time_s=1.5)
    settings.update(kw)
    st = Stopper(now=clock, **settings)
    while True:
        clock.t += dt
        if st.add([next(stream) for _ in range(batch)]):
            return st


def _gauss(mu: float, sigma: float, seed: int = 0):
    rng = random.Random(seed)
    while True:
        yield rng.gauss(mu, sigma)


def test_converges_on_low_noise_soon_after_min_time() -> None:
    clock = FakeClock()
    st = _run(_gauss(10.0, 0.05), clock, dt=0.01)
    assert st.converged and st.stopped
    assert st.noise <= 0.01
    assert 0.1 <= clock.t < 0.2  # stopped right after min_time, far before max_time
    assert len(st.samples) >= 20


def test_stops_at_time_budget_on_high_noise() -> None:
    clock = FakeClock()
    rng = random.Random(3)
    stream = iter(lambda: rng.lognormvariate(0.0, 1.5), None)
    st = _run(stream, clock, dt=0.01)
    assert st.stopped and not st.converged
    assert clock.t == pytest.approx(1.5, abs=0.011)
    assert st.noise > 0.01


def test_respects_min_samples_and_min_time() -> None:
    clock = FakeClock()
    st = _run(iter(lambda: 5.0, None), clock, dt=0.001, batch=1, min_samples=50, min_time_s=0.0)
    assert st.converged and len(st.samples) == 50  # zero noise, yet not before 50 samples
    clock = FakeClock()
    st = _run(iter(lambda: 5.0, None), clock, dt=0.001, batch=1, min_samples=5, min_time_s=0.2)
    assert st.converged and clock.t == pytest.approx(0.2, abs=0.0011)


def test_max_samples_caps_the_run() -> None:
    clock = FakeClock()
    rng = random.Random(5)
    stream = iter(lambda: rng.uniform(0.0, 100.0), None)
    st = _run(stream, clock, dt=0.0, batch=7, max_samples=300)
    assert st.stopped and not st.converged
    assert 300 <= len(st.samples) < 307


def test_converged_flag_honest_at_budget() -> None:
    # noise just under target is only checked every 10% growth; at the budget it is re-evaluated
    clock = FakeClock()
    st = _run(_gauss(10.0, 0.3, seed=9), clock, dt=0.05, batch=200, max_time_s=0.3, min_time_s=0.3)
    assert st.stopped
    assert st.converged == (relative_noise(sorted(st.samples)) <= 0.01)


def test_budget_never_ends_sampling_before_a_few_samples():
    """A kernel slower than the whole budget still gets a median (seen on an H200: 15 ms MoE cases
    under a 0.25 s budget came back with no samples)."""
    from dskbench.measure.stopping import Stopper

    clock = [0.0]
    s = Stopper(
        target_noise=0.01,
        min_samples=10,
        max_samples=1000,
        min_time_s=0.0,
        max_time_s=0.25,
        now=lambda: clock[0],
    )
    clock[0] = 1.0  # the first batch alone overran the budget and yielded nothing usable
    assert s.add([]) is False
    assert s.add([15000.0]) is False
    assert s.add([15100.0, 14900.0]) is True and len(s.samples) == 3
    # and a stream that never yields a sample still stops, at the hard limit
    clock2 = [0.0]
    s2 = Stopper(
        target_noise=0.01,
        min_samples=10,
        max_samples=1000,
        min_time_s=0.0,
        max_time_s=0.25,
        now=lambda: clock2[0],
    )
    clock2[0] = 100.0
    assert s2.add([]) is True and s2.samples == []


def test_samples_keep_five_significant_digits() -> None:
    from dskbench.measure.stats import round_sig

    assert round_sig(2.7850000858306885) == 2.785
    assert round_sig(1234.5678) == 1234.6
    assert round_sig(0.000123456789) == 0.00012346
    assert round_sig(0.0) == 0.0 and math.isnan(round_sig(float("nan")))
    assert abs(round_sig(3.14159265, 3) - 3.14) < 1e-12
