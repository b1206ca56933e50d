"""pytest-benchmark's statistics computed from the measurement core's samples: a replay clock."""

from __future__ import annotations

from typing import Any


class ReplayClock:
    """A pytest-benchmark timer that reports pre-measured GPU samples instead of host time.

    pytest-benchmark times a round as ``start = timer(); target(); end = timer()`` and stores
    ``end - start`` (fixture.py `_make_runner`; `benchmark.pedantic` with iterations=1 does exactly
    this once per round). With this clock as the timer and `step` as the target, the clock reads 0.0
    at the start of a round and the next sample at its end, so round i stores sample i exactly; every
    pytest-benchmark statistic, `--benchmark-compare(-fail)` included, is then computed from the
    measurement core's samples. Use through `replay`.
    """

    def __init__(self) -> None:
        self.__name__ = "dskbench_gpu_replay_clock"  # what pytest-benchmark prints as the timer
        self._samples: list[float] = []
        self._next = 0
        self._pending: float | None = None

    def load(self, samples_s: list[float]) -> None:
        self._samples, self._next, self._pending = [float(s) for s in samples_s], 0, None

    def step(self) -> None:
        if self._next >= len(self._samples):
            raise RuntimeError("ReplayClock: more rounds than samples")
        self._pending = self._samples[self._next]
        self._next += 1

    def __call__(self) -> float:
        value, self._pending = self._pending, None
        return 0.0 if value is None else value


REPLAY_CLOCK = ReplayClock()


def replay(benchmark: Any, samples_s: list[float], clock: ReplayClock = REPLAY_CLOCK) -> None:
    """Feed `samples_s` into pytest-benchmark's statistics, one round per sample.

    The test must carry ``@pytest.mark.benchmark(timer=clock)`` (the fixture takes its timer from the
    marker when it is created).
    """
    if not samples_s:
        raise ValueError("no samples to replay")
    timer = getattr(benchmark, "_timer", clock)
    if timer is not clock:
        raise RuntimeError("the test needs @pytest.mark.benchmark(timer=REPLAY_CLOCK)")
    clock.load(samples_s)
    benchmark.pedantic(clock.step, rounds=len(samples_s), warmup_rounds=0, iterations=1)
