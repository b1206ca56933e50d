"""When to stop sampling: stopping criteria as named policies with parameters (nvbench's model), chosen by
name in MeasureSettings.stopping and recorded with every result (Measurement.stopping).

Every policy shares the budget: sampling ends, not converged, after ``max_time_s`` of sampling (but never
before a few samples exist; ``hard_stop_s`` bounds that) or ``max_samples`` samples. Policies differ in
what "converged" means:

* ``median-ci`` (the default): the relative half-width of the median's distribution-free 95% confidence
  interval is at most ``max_noise``, after ``min_samples`` samples and ``min_time_s`` of sampling. It
  shrinks as 1/sqrt(n), so a spread-out kernel still converges; see stats.py for why it is the default.
* ``stdrel``: nvbench's criterion, the samples' relative standard deviation (CV) at most ``max_noise``,
  after ``min_samples`` and ``min_time_s``. A CV does not shrink with more samples: a noisy kernel runs
  to its budget.
* ``fixed``: exactly ``n`` samples (MeasureSettings.min_samples), whatever their spread; only the hard
  stop ends it sooner.

``resolution_us`` is the step of the clock the samples are read from, when they are whole steps of it
(CUPTI's device timestamps; batch.py reads the step off the samples): a median's interval no wider than
one step is as narrow as such samples can make it, so it counts as converged whatever its relative
width. Without it a kernel of about one microsecond, whose samples fall on two or three levels 32 ns
apart, could meet a 1% target only once both ends of its interval fell on one level, which took it
hundreds to thousands of samples.

``band_noise`` sets the noise target by latency band: pairs (from_us, max_noise), the band with the
largest from_us at or under the samples' median setting the target (``target_noise`` below every band,
and until the median is known). A kernel's verdicts in `compare` are bounded by its run-to-run floor, not
by the interval of one run; where that floor is several percent (kernels under 5 us, and from 100 us
up), sampling to 1% only costs time: for a 2 ms GEMM the 1% interval takes about four times the samples
of a 2% one.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from dskbench.measure.stats import CI_MIN_SAMPLES, median_ci, relative_noise, summarize


class Stopper:
    """The median-ci policy over a growing sample stream, and the base of the others.

    The noise is re-evaluated only when the sample count grew by 10% since the last evaluation, so a long
    run costs O(n log^2 n). Elapsed time counts from construction."""

    name: ClassVar[str] = "median-ci"

    def __init__(
        self,
        *,
        target_noise: float,
        min_samples: int,
        max_samples: int,
        min_time_s: float,
        max_time_s: float,
        band_noise: Sequence[tuple[float, float]] = (),
        now: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.target_noise = target_noise
        self.band_noise = tuple(sorted((float(lo), float(noise)) for lo, noise in band_noise))
        self.median_us = math.nan
        self.min_samples = max(1, min_samples)
        self.max_samples = max(self.min_samples, max_samples)
        self.min_time_s = min_time_s
        self.max_time_s = max(min_time_s, max_time_s)
        # The budget never ends sampling before a few samples exist: a kernel slower than the budget
        # (a 15 ms MoE prefill under a 0.25 s quick budget) still gets a median. hard_stop_s bounds that.
        self.floor = min(3, self.min_samples)
        self.hard_stop_s = 10 * self.max_time_s + 5.0
        self._now = now
        self._t0 = now()
        self.samples: list[float] = []
        self.noise = math.inf
        self.ci_width_us = math.inf  # hi - lo of the median's interval at the last evaluation
        # the step of the clock the samples are whole multiples of, plus its jitter (None: unknown or
        # none): an interval this narrow is converged (the module's docstring says why)
        self.resolution_us: float | None = None
        self._next_eval = self.min_samples
        self.converged = False
        self.stopped = False

    def params(self) -> dict[str, Any]:
        """The policy's parameters, as recorded with each result."""
        out: dict[str, Any] = {
            "max_noise": self.target_noise,
            "min_samples": self.min_samples,
            "max_samples": self.max_samples,
            "min_time_s": self.min_time_s,
            "max_time_s": self.max_time_s,
        }
        if self.band_noise:
            out["band_noise"] = [list(b) for b in self.band_noise]
        if self.resolution_us is not None:
            out["resolution_us"] = self.resolution_us
        return out

    def target(self) -> float:
        """The noise that stops sampling now: that of the band holding the median seen at the last
        evaluation (band_noise), else target_noise."""
        t = self.target_noise
        for lo, noise in self.band_noise:  # sorted by lo
            if self.median_us >= lo:
                t = noise
        return t

    def _evaluate(self) -> None:
        ordered = sorted(self.samples)
        self.noise = self.measure_noise(ordered)
        if self.band_noise:
            self.median_us = ordered[len(ordered) // 2]
        if len(ordered) >= CI_MIN_SAMPLES:
            lo, hi = median_ci(ordered)
            self.ci_width_us = hi - lo

    def target_met(self) -> bool:
        """The noise is within the target, or the median's interval within one clock step."""
        if self.noise <= self.target():
            return True
        return self.resolution_us is not None and self.ci_width_us <= self.resolution_us

    def describe(self) -> dict[str, Any]:
        """{"name": ..., <params>}: what a result records of how its sampling was stopped."""
        return {"name": self.name, **self.params()}

    def measure_noise(self, samples: Sequence[float]) -> float:
        """The quantity compared with `target_noise`."""
        return relative_noise(sorted(samples))

    def elapsed(self) -> float:
        return self._now() - self._t0

    def add(self, batch: Sequence[float]) -> bool:
        """Append a batch of samples; returns True once sampling should stop."""
        if self.stopped:
            return True
        self.samples.extend(float(x) for x in batch)
        n = len(self.samples)
        elapsed = self.elapsed()
        if n >= self._next_eval:
            self._evaluate()
            self._next_eval = max(n + 1, math.ceil(n * 1.1))
        if n >= self.min_samples and elapsed >= self.min_time_s and self.target_met():
            self.converged = self.stopped = True
        elif (
            (elapsed >= self.max_time_s and n >= self.floor)
            or n >= self.max_samples
            or elapsed >= self.hard_stop_s
        ):
            self._evaluate()
            self.converged = n >= self.min_samples and self.target_met()
            self.stopped = True
        return self.stopped


class StdRelStopper(Stopper):
    """nvbench's stdrel: the samples' relative standard deviation is the noise."""

    name: ClassVar[str] = "stdrel"

    def measure_noise(self, samples: Sequence[float]) -> float:
        return summarize(samples).cv if len(samples) > 1 else math.inf

    def target_met(self) -> bool:
        """The spread alone: a clock step bounds the median's interval, not the samples' CV."""
        return self.noise <= self.target()


class FixedStopper(Stopper):
    """Exactly `min_samples` samples (a batch that overshoots is cut), or fewer at the hard stop."""

    name: ClassVar[str] = "fixed"

    def params(self) -> dict[str, Any]:
        return {"n": self.min_samples}

    def add(self, batch: Sequence[float]) -> bool:
        if self.stopped:
            return True
        room = self.min_samples - len(self.samples)
        self.samples.extend(float(x) for x in list(batch)[:room])
        n = len(self.samples)
        if n >= self.min_samples or self.elapsed() >= self.hard_stop_s:
            self.noise = self.measure_noise(self.samples)
            self.converged = n >= self.min_samples
            self.stopped = True
        return self.stopped


POLICIES: dict[str, type[Stopper]] = {p.name: p for p in (Stopper, StdRelStopper, FixedStopper)}
DEFAULT = Stopper.name


def stopper_for(
    name: str,
    *,
    target_noise: float,
    min_samples: int,
    max_samples: int,
    min_time_s: float,
    max_time_s: float,
    band_noise: Sequence[tuple[float, float]] = (),
    now: Callable[[], float] = time.perf_counter,
) -> Stopper:
    """A fresh stopper of the policy `name` (one of POLICIES)."""
    if name not in POLICIES:
        raise ValueError(f"unknown stopping policy {name!r}; known: {', '.join(POLICIES)}")
    return POLICIES[name](
        target_noise=target_noise,
        min_samples=min_samples,
        max_samples=max_samples,
        min_time_s=min_time_s,
        max_time_s=max_time_s,
        band_noise=band_noise,
        now=now,
    )
