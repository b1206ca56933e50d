"""The one rule that says whether a case got slower: `dskbench compare`, the report's marks, pick's ties.

For two measured sides (old, new) of a case:

* ``change``: how far the median moved, relative to the old kernel time (lower is better for times;
  for throughputs such as GB/s higher is better).
* ``shift``: how far the p10 (the fast end of the samples) moved; the median when a side has no p10.
* ``floor``: how far that statistic moves between runs of unchanged code (dskbench.analysis.noise: the case's
  history, else the band prior, else the timer's resolution).

The verdict is ``slower`` only when all of these hold:

1. the median moved by more than ``threshold`` (default 5%) the bad way;
2. the shift is beyond the floor, the same way (the effect's interval, shift ± floor, excludes zero);
3. with at least 8 raw samples on both sides, a two-sided Mann-Whitney U test on them gives
   p < 0.001 (the within-run test stays as a second condition, never the only one).

Sides timed by two different timers (per-case events against batched CUPTI) are judged with a floor no
finer than what each timer is held to against CUPTI (3%, or 0.3 us under 5 us: dskbench fidelity): a
smaller difference between two timers is not a change the comparison can see.

Mirrored for ``faster``. Beyond the threshold but failing 2 or 3 is ``~slower``/``~faster``, never a
failure; beyond it with no floor to judge it by (a device the prior was not measured on, one run per
side) is ``not judged``, never a failure. Status changes: ok -> wrong/error is ``broke`` (a
regression), the reverse ``fixed``; ok -> skipped ``now skipped``, skipped -> wrong/error ``now
failing``, skipped -> ok ``now measured`` (shown, not failing: a skip is decided by the machine or the
install). A side whose timing is impossible (status ``unstable``, dskbench.measure.validity) is
``invalid``: not comparable, listed with its reason, never a regression or an improvement.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from dskbench.analysis.noise import Floor, Prior, floor_for, half_spread, load_prior
from dskbench.measure.stats import FIDELITY_FROM_US, FIDELITY_REL, FIDELITY_US, fidelity_tolerance_us

MIN_SAMPLES = 8  # both sides need this many raw samples before the rank test is used
P_THRESHOLD = 0.001
MAX_TEST_SAMPLES = 4000  # larger sample lists are thinned to evenly spaced order statistics
DEFAULT_THRESHOLD = 0.05

NOT_JUDGED = "not judged"  # beyond the threshold, but no noise floor to judge it by
REGRESSIONS = frozenset({"slower", "broke"})
IMPROVEMENTS = frozenset({"faster", "fixed"})


@dataclass(frozen=True)
class Stat:
    """One side of a comparison: a median with its spread and fast end, or a status without numbers.

    Times are kernel times in microseconds, with the run's calibrated launch gap (``gap_us``) already
    subtracted; comparisons across runs add it back. A side of several runs keeps each run's raw
    (gap included) median and p10 in ``runs``: their spread is that case's own run-to-run noise.
    """

    status: str = "ok"  # ok | wrong | skipped | error | unstable (no numbers then)
    value: float | None = None  # median
    lo: float | None = None
    hi: float | None = None
    spread: str = ""  # what lo-hi is: p10-p90 | q25-q75 | ci99
    samples: tuple[float, ...] = ()
    unit: str = "us"
    higher_is_better: bool = False
    reason: str = ""
    throttled: bool = False
    commit: str = ""
    p10: float | None = None  # the fast end of the samples
    p90: float | None = None
    gap_us: float = 0.0
    runs: tuple[tuple[float, float | None], ...] = ()  # (raw median, raw p10) per run, oldest first
    disagree: str = ""  # its second timer read it outside the normal band: why (dskbench.measure.cross_check)
    early: int = 0  # samples that began during their flush (programmatic dependent launch; batch_spans)

    @property
    def n_runs(self) -> int:
        return max(len(self.runs), 1)

    def run_values(self, statistic: str) -> list[float]:
        """Raw run-level values of `statistic` (one per run)."""
        if not self.runs:
            v = self.p10 if statistic == "p10" else self.value
            return [] if v is None else [v + self.gap_us]
        i = 1 if statistic == "p10" else 0
        return [r[i] for r in self.runs if r[i] is not None]  # type: ignore[misc]


@dataclass(frozen=True)
class Verdict:
    verdict: str
    change: float | None = None  # median: new/old - 1 (launch gaps taken out)
    shift: float | None = None  # the judged statistic's change
    statistic: str = ""  # p10 | median
    floor: Floor | None = None
    p: float | None = None  # U test p-value, when both sides kept samples
    note: str = ""

    @property
    def interval(self) -> tuple[float, float] | None:
        if self.shift is None or self.floor is None:
            return None
        return self.shift - self.floor.rel, self.shift + self.floor.rel

    @property
    def is_regression(self) -> bool:
        return self.verdict in REGRESSIONS

    @property
    def is_improvement(self) -> bool:
        return self.verdict in IMPROVEMENTS

    def effect(self) -> str:
        """`p10 +21.0% ±8.5%` (the judged shift and its floor), or ''."""
        if self.shift is None or self.floor is None:
            return ""
        return f"{self.statistic} {self.shift:+.1%} ±{self.floor.rel:.1%}"


_prior_cache: dict[str, Prior] = {}


def default_prior() -> Prior:
    """The prior shipped with dskbench (read once)."""
    if "default" not in _prior_cache:
        _prior_cache["default"] = load_prior()
    return _prior_cache["default"]


def judge(
    old: Stat | None,
    new: Stat | None,
    threshold: float = DEFAULT_THRESHOLD,
    prior: Prior | None = None,
    history: Iterable[Stat] = (),
    own_prior: bool = True,
    timers_apart: bool = False,
) -> Verdict:
    """The verdict on one case (see the module docstring). `history`: the case's earlier runs on the
    same GPU model, oldest first (each a Stat; their run-level values make the case's own floor).
    `own_prior` False: the prior was measured on another device and is not used (noise.own_floor).
    `timers_apart`: the sides were timed by different timers (the floor is then at least the timers'
    fidelity target)."""
    if old is None and new is None:
        raise ValueError("nothing to judge")
    if old is None:
        return Verdict("added")
    if new is None:
        return Verdict("missing", note="not in the new results")
    status = _status_verdict(old, new)
    if status is not None:
        return status
    assert old.value is not None and new.value is not None
    change = _rel(old, new, "median")
    worse = -change if new.higher_is_better else change
    statistic = "p10" if old.p10 and new.p10 is not None and not new.higher_is_better else "median"
    shift = _rel(old, new, statistic)
    latency = old.value if old.unit == "us" else None
    # run-level values in series: the history then the old side (the baseline is the latest of that
    # code's runs), and the new side's own runs
    before = [v for h in history if h.status == "ok" for v in h.run_values(statistic)]
    groups = [before + old.run_values(statistic), new.run_values(statistic)]
    floor = floor_for(
        latency,
        statistic,
        prior or default_prior(),
        [g for g in groups if len(g) > 1],
        old.n_runs,
        new.n_runs,
        half_spread(old, new),
        own_prior,
    )
    if timers_apart and floor is not None and latency:
        floor = _timers_floor(floor, latency)
    notes = []
    if new.throttled or old.throttled:
        notes.append("throttled " + ("new" if new.throttled else "old") + " run")
    if bool(new.early) != bool(old.early):  # a kernel that began during its flush on one side only
        notes.append("started during its flush in the " + ("new" if new.early else "old") + " run only")
    if abs(worse) <= threshold:
        return Verdict("same", change, shift, statistic, floor, note="; ".join(notes))
    if floor is None:
        why = "no noise floor: a device without a prior, one run per side"
        return Verdict(NOT_JUDGED, change, shift, statistic, None, note="; ".join([why, *notes]))
    direction = "slower" if worse > 0 else "faster"
    worse_shift = -shift if new.higher_is_better else shift
    beyond = worse_shift > floor.rel if worse > 0 else -worse_shift > floor.rel
    p = None
    if len(old.samples) >= MIN_SAMPLES and len(new.samples) >= MIN_SAMPLES:
        p = mann_whitney_p([x + old.gap_us for x in old.samples], [x + new.gap_us for x in new.samples])
    why = ("beyond" if beyond else "inside") + f" the noise floor ({floor.describe()})"
    if p is not None:
        why += f"; U test p={p:.1g}"
    notes.insert(0, why)
    real = beyond and (p is None or p < P_THRESHOLD)
    return Verdict(
        direction if real else "~" + direction, change, shift, statistic, floor, p, "; ".join(notes)
    )


def _timers_floor(floor: Floor, latency_us: float) -> Floor:
    """The floor between two timers: at least what either is held to against CUPTI at this latency."""
    agree = fidelity_tolerance_us(latency_us) / latency_us
    if agree <= floor.rel:
        return floor
    held = f"{FIDELITY_US:g} us" if latency_us < FIDELITY_FROM_US else f"{FIDELITY_REL:.0%}"
    return Floor(agree, "timers", f"(each held within {held} of CUPTI)")


def _status_verdict(old: Stat, new: Stat) -> Verdict | None:
    invalid = [(side, s) for side, s in (("old", old), ("new", new)) if s.status == "unstable"]
    if invalid:  # an impossible timing is no number to compare: neither a regression nor a fix
        side, s = invalid[-1]
        return Verdict("invalid", note=f"{side}: {s.reason}"[:200])
    failing = ("wrong", "error")
    if old.status == "ok" and new.status in failing:
        return Verdict("broke", note=f"{new.status}: {new.reason}"[:200])
    if old.status in failing and new.status == "ok":
        return Verdict("fixed", note=f"was {old.status}")
    if old.status in failing and new.status in failing:
        return Verdict("still failing", note=f"{new.status}: {new.reason}"[:200])
    if old.status == "ok" and new.status == "skipped":
        return Verdict("now skipped", note=new.reason[:200])
    if old.status == "skipped" and new.status in failing:
        return Verdict("now failing", note=f"{new.status}: {new.reason}"[:200])
    if old.status == "skipped" and new.status == "ok":
        return Verdict("now measured")
    if new.status != "ok" or old.status != "ok" or not old.value or new.value is None:
        return Verdict("skipped")
    return None


def _rel(old: Stat, new: Stat, statistic: str) -> float:
    """Relative change of the side-level (median over runs) raw value, over the old kernel value."""
    a, b = _side_value(old, statistic), _side_value(new, statistic)
    kernel = a - old.gap_us
    return (b - a) / kernel if kernel else 0.0


def _side_value(s: Stat, statistic: str) -> float:
    vals = s.run_values(statistic)
    return _median(vals) if vals else float("nan")


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def mann_whitney_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p-value of the Mann-Whitney U test (normal approximation with tie correction)."""
    a, b = _thin(a), _thin(b)
    n1, n2 = len(a), len(b)
    pooled = sorted([(x, 0) for x in a] + [(x, 1) for x in b])
    rank_sum_a = 0.0
    tie_term = 0.0
    i = 0
    while i < len(pooled):
        j = i
        while j + 1 < len(pooled) and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        avg_rank = (i + j) / 2 + 1
        t = j - i + 1
        tie_term += t**3 - t
        rank_sum_a += avg_rank * sum(1 for k in range(i, j + 1) if pooled[k][1] == 0)
        i = j + 1
    u = rank_sum_a - n1 * (n1 + 1) / 2
    n = n1 + n2
    var = n1 * n2 / 12 * ((n + 1) - tie_term / (n * (n - 1)))
    if var <= 0:
        return 1.0
    z = (abs(u - n1 * n2 / 2) - 0.5) / math.sqrt(var)
    return math.erfc(max(z, 0.0) / math.sqrt(2))


def _thin(xs: Sequence[float]) -> list[float]:
    s = sorted(float(x) for x in xs if x == x)
    if len(s) <= MAX_TEST_SAMPLES:
        return s
    step = (len(s) - 1) / (MAX_TEST_SAMPLES - 1)
    return [s[round(i * step)] for i in range(MAX_TEST_SAMPLES)]
