"""How much a case's timing moves between runs of unchanged code: the floor every verdict must clear.

A change counts only when it is larger than what unchanged code produces for that case between runs.
The floor comes from, in order of preference:

1. **history**: earlier runs of the same case on the same GPU model (``dskbench compare --history``, a
   side given as several runs, the report's earlier commits). The spread of their run-level values is
   the case's own noise; with few runs it is blended with the band prior (below), so that two runs that
   happened to agree do not make a floor of zero.
2. **band prior**: without history, the largest run-to-run change (a high quantile, see ``Prior``)
   measured between committed pairs of back-to-back runs of unchanged code, per latency band; for a
   case whose within-run spread (p10-p90) is wider than that, a measured multiple of its spread (the
   quantiles of a wide, often two-mode distribution move more between runs). ``noise_prior.json``,
   written by ``dskbench noise-prior`` from the committed pairs: data, not hand-typed numbers.
3. **absolute**: never below the event timer's resolution per launch.

A band prior holds for the device its pairs ran on. On another device (a CPU, another GPU model) it is
not used: the case's own history alone sets the floor, and with too little of it (one run per side) a
change beyond the threshold is not judged.

Changes are relative to the old kernel time and are taken before the calibrated launch gap is
subtracted (a run's gap calibration moves every cold graph timing of that run by the same microseconds,
which is not the kernel's doing). Two statistics have floors: the median (what dskbench reports) and
the p10, the fast end of the samples. Below ~5 us the median jumps between two modes from run to run
(by up to ~30% between the committed H200 runs) while the p10 moves far less; a real slowdown moves both.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dskbench.analysis.verdict import Stat

PRIOR_FILE = Path(__file__).with_name("noise_prior.json")
PRIOR_SCHEMA = "dskbench.analysis.noise-prior/1"
BAND_EDGES_US = (0.0, 2.0, 3.0, 5.0, 10.0, 20.0, 50.0, 100.0, 1000.0, math.inf)
STATISTICS = ("median", "p10")
QUANTILE = 0.999  # of |change| between unchanged runs: about the largest move, not a typical one
MIN_BAND_CASES = 10  # fewer measured cases in a band: it takes the nearest measured band's floors
EVENT_RESOLUTION_US = 0.5  # CUDA documents cudaEventElapsedTime's resolution as about 0.5 us
Z = 3.29  # two-sided 99.9% of a normal: converts a floor to a standard deviation when blending history
PRIOR_WEIGHT = 2.0  # the band prior counts as this many degrees of freedom against a case's history
MIN_OWN_STEPS = 2  # run-to-run steps a case needs for a floor of its own where no prior covers its device


class PriorError(ValueError):
    """A noise prior file that cannot be used (the message names the file and what is wrong)."""


@dataclass(frozen=True)
class Band:
    lo_us: float
    hi_us: float
    median_floor: float  # relative: 0.05 = 5%
    p10_floor: float
    cases: int  # measured (case, backend) pairs behind the floors
    from_band: str = ""  # set when too few cases: the band whose floors were taken
    median_spread_factor: float = 0.0  # floor >= factor x the case's relative half p10-p90 spread
    p10_spread_factor: float = 0.0

    @property
    def label(self) -> str:
        hi = "" if math.isinf(self.hi_us) else f"{self.hi_us:g}"
        return f"{self.lo_us:g}-{hi} us" if hi else f">={self.lo_us:g} us"

    def floor(self, statistic: str) -> float:
        return self.p10_floor if statistic == "p10" else self.median_floor

    def spread_factor(self, statistic: str) -> float:
        return self.p10_spread_factor if statistic == "p10" else self.median_spread_factor


@dataclass(frozen=True)
class Prior:
    bands: tuple[Band, ...]
    abs_floor_us: float
    measured_on: tuple[str, ...] = ()  # GPU names of the pairs
    settings: str = ""  # e.g. "mode cold, flush write"
    source: str = ""  # the file it was read from
    measured_with: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # "mode"/"flush" -> values

    def covers(self, device: str) -> bool:
        """Whether the pairs were measured on this device (GPU model; `NVIDIA H200` and `H200` alike): a
        prior says nothing about another device's noise. A prior naming no device covers every one."""
        return not self.measured_on or _model(device) in {_model(d) for d in self.measured_on}

    def unmeasured(self, setting: str, value: str) -> bool:
        """True when the pairs never ran with this value of a setting ('' and 'unrecorded' pass)."""
        seen = self.measured_with.get(setting)
        return bool(seen) and value not in ("", "unrecorded") and value not in seen

    def band(self, latency_us: float) -> Band:
        for b in self.bands:
            if b.lo_us <= latency_us < b.hi_us:
                return b
        return self.bands[-1] if latency_us >= self.bands[-1].lo_us else self.bands[0]

    def widest(self, statistic: str) -> Band:
        return max(self.bands, key=lambda b: b.floor(statistic))

    def describe(self) -> str:
        gpus = ", ".join(self.measured_on) or "unknown GPUs"
        return f"measured on {gpus}" + (f", {self.settings}" if self.settings else "")


@dataclass(frozen=True)
class Floor:
    """The relative change unchanged code stays within for this comparison, and what set it."""

    rel: float
    source: str  # history | band prior | absolute | timers (between two timers: analysis.verdict)
    detail: str = ""

    def describe(self) -> str:
        return self.source + (f" {self.detail}" if self.detail else "")


def _model(device: str) -> str:
    """A device name compared without case, spacing or the vendor's prefix."""
    name = " ".join(device.lower().split())
    return name.removeprefix("nvidia ").strip()


# -- the prior ---------------------------------------------------------------------------------------------


def load_prior(path: str | Path | None = None) -> Prior:
    """The band prior from its JSON file (default: the one shipped with dskbench)."""
    p = Path(path) if path is not None else PRIOR_FILE
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise PriorError(f"{p}: cannot read the noise prior ({e.strerror or e})") from None
    except json.JSONDecodeError as e:
        raise PriorError(f"{p}: not JSON ({e.msg})") from None
    if not isinstance(doc, dict) or doc.get("schema") != PRIOR_SCHEMA:
        raise PriorError(f"{p}: not a noise prior (expected schema {PRIOR_SCHEMA!r})")
    try:
        bands = tuple(
            Band(
                float(b["lo_us"]),
                math.inf if b["hi_us"] is None else float(b["hi_us"]),
                float(b["median_floor"]),
                float(b["p10_floor"]),
                int(b["cases"]),
                str(b.get("from_band") or ""),
                float(b.get("median_spread_factor") or 0.0),
                float(b.get("p10_spread_factor") or 0.0),
            )
            for b in doc["bands"]
        )
        abs_floor = float(doc["abs_floor_us"])
    except (KeyError, TypeError, ValueError) as e:
        raise PriorError(f"{p}: malformed band entry ({type(e).__name__}: {e})") from None
    if not bands or any(b.median_floor < 0 or b.p10_floor < 0 for b in bands):
        raise PriorError(f"{p}: needs at least one band with non-negative floors")
    settings = doc.get("settings") or {}
    text = ", ".join(f"{k} {'/'.join(map(str, v))}" for k, v in settings.items() if v)
    seen = {str(k): tuple(str(x) for x in v) for k, v in settings.items() if isinstance(v, list)}
    return Prior(bands, abs_floor, tuple(doc.get("measured_on") or ()), text, str(p), seen)


def band_index(latency_us: float) -> int:
    for i in range(len(BAND_EDGES_US) - 1):
        if BAND_EDGES_US[i] <= latency_us < BAND_EDGES_US[i + 1]:
            return i
    return 0


@dataclass
class PairChanges:
    """Run-to-run changes of one pair of unchanged runs, per case: (old kernel us, d median, d p10,
    the larger relative half p10-p90 spread of the two runs or None)."""

    name: str
    gpus: set[str] = field(default_factory=set)
    rows: list[tuple[float, float, float | None, float | None]] = field(default_factory=list)
    launches: list[int] = field(default_factory=list)


def pair_changes(
    name: str, old: Mapping[Any, Stat], new: Mapping[Any, Stat], launches: Mapping[Any, int] | None = None
) -> PairChanges:
    """Changes of every case measured ok in both runs of an unchanged pair (measured ones only: the
    caller leaves out ``shared_with`` copies, which would count one measurement twice)."""
    out = PairChanges(name)
    for key in sorted(old.keys() & new.keys(), key=str):
        a, b = old[key], new[key]
        if a.status != "ok" or b.status != "ok" or not a.value or b.value is None or a.unit != "us":
            continue
        d_med = rel_change(a.value, a.gap_us, b.value, b.gap_us)
        d_p10 = None
        if a.p10 and b.p10 is not None:
            d_p10 = rel_change(a.p10, a.gap_us, b.p10, b.gap_us)
        out.rows.append((a.value, d_med, d_p10, half_spread(a, b)))
        out.gpus.add(getattr(key, "machine", ""))
        if launches and key in launches:
            out.launches.append(launches[key])
    return out


def half_spread(*stats: Stat) -> float | None:
    """The larger relative half-width (p90 - p10) / 2 / median of the sides, or None without one."""
    vals = [
        (s.p90 - s.p10) / 2 / s.value
        for s in stats
        if s.p10 is not None and s.p90 is not None and s.value and s.p90 >= s.p10
    ]
    return max(vals) if len(vals) == len(stats) else None


def rel_change(old: float, old_gap: float, new: float, new_gap: float) -> float:
    """(new - old) / old, taken before each run's launch gap was subtracted."""
    return ((new + new_gap) - (old + old_gap)) / old


def fit_prior(pairs: Sequence[PairChanges], quantile: float = QUANTILE) -> dict[str, Any]:
    """The prior document. Per band and statistic (median, p10): the floor is the `quantile` of
    |change| over every pair's cases; the spread factor is the `quantile` of |change| / half-spread over
    the band's wide cases, those whose relative half p10-p90 spread is at least the floor (0 when
    fewer than MIN_BAND_CASES are that wide). A band with fewer than MIN_BAND_CASES cases takes the
    nearest measured band's numbers."""
    per_band: list[list[tuple[float, float, float | None]]] = [[] for _ in BAND_EDGES_US[:-1]]
    for pair in pairs:
        for t, d_med, d_p10, spread in pair.rows:
            d_fast = d_p10 if d_p10 is not None else d_med
            per_band[band_index(t)].append((abs(d_med), abs(d_fast), spread))
    measured = [i for i, rows in enumerate(per_band) if len(rows) >= MIN_BAND_CASES]
    if not measured:
        raise PriorError(f"no latency band has {MIN_BAND_CASES} measured cases: nothing to fit")
    bands = []
    for i, rows in enumerate(per_band):
        src = i if i in measured else min(measured, key=lambda j: (abs(j - i), -j))
        entry: dict[str, Any] = {"lo_us": BAND_EDGES_US[i]}
        entry["hi_us"] = None if math.isinf(BAND_EDGES_US[i + 1]) else BAND_EDGES_US[i + 1]
        for col, name in ((0, "median"), (1, "p10")):
            changes = [r[col] for r in per_band[src]]
            floor = _quantile(changes, quantile)
            wide = [r[col] / r[2] for r in per_band[src] if r[2] and r[2] >= floor]
            entry[f"{name}_floor"] = round(floor, 4)
            entry[f"{name}_spread_factor"] = (
                round(_quantile(wide, quantile), 3) if len(wide) >= MIN_BAND_CASES else 0.0
            )
        entry["cases"] = len(rows)
        entry["from_band"] = "" if src == i else _label(src)
        bands.append(entry)
    launches = [n for pair in pairs for n in pair.launches if n > 0]
    per_launch = statistics.median(launches) if launches else 1
    return {
        "schema": PRIOR_SCHEMA,
        "quantile": quantile,
        "statistics": list(STATISTICS),
        "measured_on": sorted({g for pair in pairs for g in pair.gpus if g}),
        "abs_floor_us": round(EVENT_RESOLUTION_US / per_launch, 5),
        "abs_floor_note": (
            f"event timer resolution {EVENT_RESOLUTION_US} us / {per_launch:g} launches per sample "
            "(median over the pairs' cases)"
        ),
        "pairs": [{"name": p.name, "cases": len(p.rows)} for p in pairs],
        "bands": bands,
    }


def _label(i: int) -> str:
    lo, hi = BAND_EDGES_US[i], BAND_EDGES_US[i + 1]
    return f">={lo:g} us" if math.isinf(hi) else f"{lo:g}-{hi:g} us"


def _quantile(xs: Iterable[float], q: float) -> float:
    s = sorted(xs)
    if not s:
        return 0.0
    h = (len(s) - 1) * q
    lo = math.floor(h)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (h - lo)


# -- a comparison's floor ----------------------------------------------------------------------------------


def history_spread(groups: Iterable[Sequence[float]], ref: float) -> tuple[float, int]:
    """(sum of squared successive differences / 2, degrees of freedom) of run-level values, relative to
    `ref`. Each group is one series of runs in time order (a side, the history); successive differences
    keep a step (a real change in the history) from counting as spread more than once."""
    ss, df = 0.0, 0
    for g in groups:
        xs = [x for x in g if x is not None and math.isfinite(x)]
        for a, b in zip(xs, xs[1:], strict=False):
            ss += ((b - a) / ref) ** 2 / 2
            df += 1
    return ss, df


def floor_for(
    latency_us: float | None,
    statistic: str,
    prior: Prior,
    history: Iterable[Sequence[float]] = (),
    runs_old: int = 1,
    runs_new: int = 1,
    spread: float | None = None,
    own_prior: bool = True,
) -> Floor | None:
    """The floor of one comparison. `latency_us` is the old kernel time (None: not a time, the widest
    band applies); `history` holds the case's run-level values (same statistic, raw microseconds) in
    series; runs_old/runs_new: how many runs each side's value is the median of; `spread`: the larger
    relative half p10-p90 spread of the two sides (half_spread). `own_prior` False: the prior was
    measured on another device, so the case's own history alone sets the floor (own_floor), None
    without enough of it."""
    if not own_prior:
        return own_floor(latency_us, history, runs_old, runs_new, prior.abs_floor_us)
    if latency_us is None or latency_us <= 0:
        band = prior.widest(statistic)
        prior_rel, where = band.floor(statistic), f"not a time: widest band, {band.label}"
    else:
        band = prior.band(latency_us)
        prior_rel = band.floor(statistic)
        where = band.label + (f", taken from {band.from_band}" if band.from_band else "")
    factor = band.spread_factor(statistic)
    if factor and spread and factor * spread > prior_rel:
        prior_rel = factor * spread
        where += f": {factor:g} x within-run half-spread {spread:.1%}"
    ss, df = history_spread(history, latency_us) if latency_us else (0.0, 0)
    scale = math.sqrt(1 / max(runs_old, 1) + 1 / max(runs_new, 1))
    if df:
        sigma0 = prior_rel / (Z * math.sqrt(2))  # one run's sd, as the prior states it
        sigma = math.sqrt((PRIOR_WEIGHT * sigma0**2 + ss) / (PRIOR_WEIGHT + df))
        rel = Z * sigma * scale
        source = "history" if df >= PRIOR_WEIGHT else "band prior"
        detail = f"({df} run-to-run step{'s' if df != 1 else ''}, blended with the {where} prior)"
    else:
        rel = prior_rel * scale / math.sqrt(2)
        source, detail = "band prior", where
    if latency_us and latency_us > 0 and prior.abs_floor_us / latency_us > rel:
        return Floor(prior.abs_floor_us / latency_us, "absolute", f"{prior.abs_floor_us:g} us")
    return Floor(rel, source, detail)


def own_floor(
    latency_us: float | None,
    history: Iterable[Sequence[float]],
    runs_old: int,
    runs_new: int,
    abs_floor_us: float,
) -> Floor | None:
    """The floor from the case's own run-to-run steps alone (no band prior to blend with: a device
    without a prior of its own), or None with fewer than MIN_OWN_STEPS of them (one run per side)."""
    if not latency_us or latency_us <= 0:
        return None
    ss, df = history_spread(history, latency_us)
    if df < MIN_OWN_STEPS:
        return None
    scale = math.sqrt(1 / max(runs_old, 1) + 1 / max(runs_new, 1))
    rel = Z * math.sqrt(ss / df) * scale
    if abs_floor_us / latency_us > rel:
        return Floor(abs_floor_us / latency_us, "absolute", f"{abs_floor_us:g} us")
    return Floor(rel, "history", f"({df} run-to-run steps; no band prior of this device)")
