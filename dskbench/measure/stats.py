"""Sample statistics, pure Python so they are testable without a GPU (the stopping rules that use them:
stopping.py).

Noise is the relative half-width of the distribution-free 95% confidence interval of the median (order
statistics of a binomial(n, 1/2)). Why this and not the samples' CV (nvbench's stdrel): the CV of the
samples does not shrink with more samples, so a kernel whose per-sample spread is 5% would never meet a
1% target however long it ran; the median's interval does shrink (as 1/sqrt(n)), says how well the
reported number is known, and is insensitive to the occasional outlier (a host hiccup, a clock step).
The CV is still reported, as a description of the spread.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

Z95 = 1.959963984540054


SAMPLE_DIGITS = 5  # significant digits a sample keeps in results files
CI_MIN_SAMPLES = 5  # fewer samples leave the median's interval (and so the noise) undefined: inf


def round_sig(x: float, digits: int = SAMPLE_DIGITS) -> float:
    """x to `digits` significant digits. Why: a sample is an event-timer difference (about 0.5 us
    resolution) over n launches, so digits past the fifth are noise, and writing full doubles made half
    of a 6000-case sweep's file (22 MB) samples. Statistics are computed before rounding."""
    if x == 0 or not math.isfinite(x):
        return x
    return float(f"{x:.{digits}g}")


def quantile(sorted_x: Sequence[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default 'linear' method)."""
    n = len(sorted_x)
    if n == 0:
        return math.nan
    h = (n - 1) * q
    lo = math.floor(h)
    hi = min(lo + 1, n - 1)
    return sorted_x[lo] + (h - lo) * (sorted_x[hi] - sorted_x[lo])


def median_ci(sorted_x: Sequence[float], z: float = Z95) -> tuple[float, float]:
    """Distribution-free confidence interval of the median: order statistics at ranks n/2 -+ z*sqrt(n)/2."""
    n = len(sorted_x)
    if n == 0:
        return math.nan, math.nan
    half = z * math.sqrt(n) / 2.0
    lo = max(0, math.floor(n / 2.0 - half) - 1)  # 1-based rank floor(n/2 - half) -> 0-based
    hi = min(n - 1, math.ceil(n / 2.0 + half))  # 1-based rank ceil(1 + n/2 + half) -> 0-based
    return sorted_x[lo], sorted_x[hi]


def relative_noise(sorted_x: Sequence[float]) -> float:
    """Half-width of the median's 95% interval over the median; inf when undefined (too few, median <= 0)."""
    if len(sorted_x) < CI_MIN_SAMPLES:
        return math.inf
    med = quantile(sorted_x, 0.5)
    if not med > 0:
        return math.inf
    lo, hi = median_ci(sorted_x)
    return (hi - lo) / 2.0 / med


@dataclass(frozen=True)
class Summary:
    median: float
    p10: float
    p90: float
    mean: float
    min: float
    max: float
    cv: float  # sample standard deviation (n-1) over the mean
    noise: float  # relative half-width of the median's 95% CI
    n: int


def summarize(samples: Sequence[float]) -> Summary:
    xs = sorted(float(x) for x in samples)
    n = len(xs)
    if n == 0:
        nan = math.nan
        return Summary(nan, nan, nan, nan, nan, nan, nan, math.inf, 0)
    mean = math.fsum(xs) / n
    if n > 1:
        var = math.fsum((x - mean) ** 2 for x in xs) / (n - 1)
        cv = math.sqrt(var) / mean if mean != 0 else math.inf
    else:
        cv = 0.0
    return Summary(
        median=quantile(xs, 0.5),
        p10=quantile(xs, 0.1),
        p90=quantile(xs, 0.9),
        mean=mean,
        min=xs[0],
        max=xs[-1],
        cv=cv,
        noise=relative_noise(xs),
        n=n,
    )


FIDELITY_REL = 0.03  # a timer's reading against a profiler's: within 3% from FIDELITY_FROM_US up...
FIDELITY_US = 0.3  # ...and within 0.3 us below it
FIDELITY_FROM_US = 5.0


def fidelity_tolerance_us(ref: float) -> float:
    """How far a timer may read from a profiler's reading `ref` (us) and still be within target."""
    return FIDELITY_REL * ref if ref >= FIDELITY_FROM_US else FIDELITY_US


def within_target(measured: float, ref: float) -> bool:
    """Our timer's reading against a profiler's: within 3% of it from 5 us up, within 0.3 us below (the
    fidelity target of `dskbench selftest` and `dskbench fidelity`)."""
    return abs(measured - ref) <= fidelity_tolerance_us(ref)
