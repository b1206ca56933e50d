"""A second timer's view of each measurement, and the rule for when the two timers disagree.

Why: a sweep times a case with one timer, either CUPTI's kernel records (batched cold cases,
`cupti-graph`) or CUDA events around graph replays or eager launches (`cuda-graph`, `cuda-eager`). Each
has its own ways of going wrong (a span that picks up another activity, an event pair that picks up
host idle time or a flush's write-back), and one timer cannot see its own fault. So each measured case
is also read, briefly, by the other timer:

- timed by CUPTI (batched): a few event-timed replays of the case's own [flush, launch] graph, the one
  the batch captured, each paired with a replay of the flush alone (the per-case timer's scheme); a
  sample is their difference.
- timed by events: a short CUPTI pass over the case's launch captured behind the batched timer's flush
  (cold) or behind a tiny marker kernel (hot, rotate), each launch's span read as batch_spans does.

Both medians are compared before any launch-gap correction (`raw_median_us`), so the correction, which is
itself measured against CUPTI, can neither hide nor cause a disagreement.

The rule (`event_band`): an event timer reads a launch as the kernel plus a per-launch overhead CUPTI
leaves out: the boundary to the next graph node (about 0.3 us, calibrated per run as the launch gap), or
for eager launches the event and launch latency (about 1 us hot, 3 us cold). So, with c the CUPTI median
and e the event median, the two agree when

    c - T  <=  e  <=  c + g + T,    T = ABS_TOL_US + REL_TOL * c

where g is the event timer's calibrated gap for its method and mode (DEFAULT_OVERHEAD_US when the run
has none). The band is asymmetric (events may read longer by the gap, never shorter by more than the
tolerance) and depends on the kernel's length: on a 1 us kernel events may read 1.8x CUPTI, on a 1 ms one
5% either way. T is wider than `dskbench fidelity`'s target (3% or 0.3 us, met by 13 of 15 kernels on
4 x H200) because the second timer takes only a few samples, and the known per-kernel residuals between
the timers reach 0.6 us (docs/measurement.md). A record outside the band keeps its status and says so
(`timing.cross_check.agrees` false, with a note); one also outside GROSS_RATIO (one timer reads more than
twice the other) is an impossible measurement (dskbench.measure.validity): timed again alone, then
`unstable`.

Cost: at most MAX_DEVICE_US of device time per case (more only for kernels so long that MIN_SAMPLES
exceed it), plus the host's queueing and, for the CUPTI pass, one profiler session.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

EVENTS = "cuda-events"
CUPTI = "cupti"
ABS_TOL_US = 0.5
REL_TOL = 0.05
# The event timer's per-launch overhead over CUPTI when the run calibrated none (docs/measurement.md)
DEFAULT_OVERHEAD_US = {"cuda-graph": 0.3, "cuda-eager-cold": 3.0, "cuda-eager-hot": 1.0}
GROSS_RATIO = (0.5, 2.0)  # main / cross outside this (and outside the band): an impossible measurement
MAX_DEVICE_US = 2000.0  # device time the second timer may take per case
MIN_SAMPLES = 5  # the median's interval needs 5 (dskbench.measure.stats)
# Eight pairs: on an H200 sixteen cost 9-10% of a sweep's item time, most of it the host queueing the
# replays and waiting for each case, not the device.
MAX_EVENT_PAIRS = 8
# Host time to queue one pair (two graph replays, two event records) that the lead sleep must cover, so
# the first replay does not start before the last is queued (a late queue is run again behind 4x the sleep).
QUEUE_US_PER_PAIR = 60.0
MAX_CUPTI_LAUNCHES = 32
SKIPPED_BY_OPTION = "turned off (--no-cross-check)"


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def overhead_us(method: str, mode: str, gaps: Mapping[str, float] | None) -> float:
    """The per-launch overhead the event timer `method` reads over CUPTI in `mode`: the run's calibrated
    launch gap for it (MeasureSettings.launch_gap_us) when there is one, else DEFAULT_OVERHEAD_US."""
    from dskbench.measure.sampling import GAP_KEYS

    key = GAP_KEYS.get(method, "{mode}").format(mode="hot" if mode == "rotate" else mode)
    if gaps and _finite(gaps.get(key)):
        return max(0.0, float(gaps[key]))
    if method == "cuda-eager":
        return DEFAULT_OVERHEAD_US[f"cuda-eager-{'cold' if mode == 'cold' else 'hot'}"]
    return DEFAULT_OVERHEAD_US["cuda-graph"]


def event_band(cupti_us: float, overhead: float) -> tuple[float, float]:
    """The event median's normal range around a CUPTI median of `cupti_us` (see the module's rule)."""
    tol = ABS_TOL_US + REL_TOL * cupti_us
    return cupti_us - tol, cupti_us + overhead + tol


def judge(
    main_method: str, main_us: float, cross_method: str, cross_us: float, overhead: float
) -> dict[str, Any]:
    """The cross-check of a main median against the second timer's (both before any gap correction):
    ratio main/cross, the ratio's normal band [lo, hi] (None: unbounded), agrees, and a note when not."""
    cupti_main = cross_method == EVENTS
    c, e = (main_us, cross_us) if cupti_main else (cross_us, main_us)
    lo_e, hi_e = event_band(c, overhead)
    agrees = lo_e <= e <= hi_e
    ratio = main_us / cross_us if cross_us > 0 else math.inf
    if cupti_main:  # ratio c / e: the band's ends swap
        band = [_r(c / hi_e), _r(c / lo_e) if lo_e > 0 else None]
    else:
        band = [_r(lo_e / c) if c > 0 else None, _r(hi_e / c) if c > 0 else None]
    out: dict[str, Any] = {
        "method": cross_method,
        "median_us": _r(cross_us),
        "main_us": _r(main_us),
        "ratio": _r(ratio) if math.isfinite(ratio) else None,
        "band": band,
        "overhead_us": _r(overhead),
        "agrees": agrees,
    }
    if not agrees:
        who = "events" if cupti_main else "CUPTI"
        side = "longer" if (cross_us > main_us) else "shorter"
        out["note"] = (
            f"{who} read {_r(cross_us)} us against {_r(main_us)} us ({side}; ratio {out['ratio']} outside "
            f"{_band_text(band)})"
        )
    return out


def _band_text(band: Sequence[float | None]) -> str:
    lo, hi = band
    return f"[{'0' if lo is None else lo}, {'inf' if hi is None else hi}]"


def _r(x: float) -> float:
    return float(f"{x:.5g}")


def skipped(reason: str) -> dict[str, Any]:
    """A record's cross-check when none was made: why."""
    return {"method": None, "agrees": None, "skipped": reason}


def gross(cc: Any) -> str | None:
    """Why a cross-check makes the measurement impossible (outside its band and beyond GROSS_RATIO), or
    None. `cc`: a timing's cross_check, a dict or a CrossCheck."""
    get = cc.get if isinstance(cc, Mapping) else (lambda k: getattr(cc, k, None))
    ratio = get("ratio")
    if get("agrees") is not False or not _finite(ratio):
        return None
    lo, hi = GROSS_RATIO
    if lo <= ratio <= hi:
        return None
    return f"timers disagree: {get('method')} read {get('median_us')} us against {get('main_us')} us"


def cross_of(measured: Mapping[str, Any], cross_method: str, cross_raw: Sequence[float], gaps, mode: str):
    """The cross-check of a measurement (a Measurement's dict) given the second timer's raw samples."""
    if len(cross_raw) < MIN_SAMPLES:
        return skipped(f"the second timer gave {len(cross_raw)} samples")
    main = measured.get("raw_median_us")
    if not _finite(main):
        main = measured.get("median_us")
    if not _finite(main):
        return skipped("no median to compare")
    event_method = measured.get("method") if cross_method == CUPTI else "cuda-graph"
    cross_us = statistics.median(cross_raw)
    out = judge(
        str(measured.get("method")),
        float(main),
        cross_method,
        cross_us,
        overhead_us(event_method, mode, gaps),
    )
    out["samples"] = len(cross_raw)
    return out


def count_for(est_us: float, minimum: int = MIN_SAMPLES, maximum: int = MAX_EVENT_PAIRS) -> int:
    """Samples the second timer takes of one case: as many as fit MAX_DEVICE_US, between the bounds."""
    if not (est_us > 0):
        return minimum
    return max(minimum, min(maximum, int(MAX_DEVICE_US // est_us)))


# ---- GPU side ----


class CudaClock:
    """What the second timers need of the device: timing events and a GPU sleep (a simulated device in
    the tests stands in for it)."""

    def __init__(self, index: int) -> None:
        from dskbench.measure.cuda_timer import sleep_rate

        self.rate = sleep_rate(index)

    def events(self, n: int) -> list[Any]:
        from dskbench.measure.cuda_timer import events

        return events(n)

    def sleep(self, us: float) -> None:
        import torch

        from dskbench.measure.cuda_timer import MAX_SLEEP_US

        torch.cuda._sleep(int(min(us, MAX_SLEEP_US) * self.rate))

    @staticmethod
    def elapsed(a: Any, b: Any) -> float:
        return a.elapsed_time(b) * 1000.0


def event_pairs(
    cases: Sequence[tuple[Any, float]], flush_graph: Any, clock: Any, lead_us: float = 200.0
) -> list[list[float]]:
    """Event samples of batched cases: per case (its [flush, launch] graph, one replay's estimate in us),
    adjacent replays of that graph and of `flush_graph` ([flush] alone), each timed with events behind a
    GPU sleep; a sample is their difference (us, uncorrected). Replays queued while the device had
    caught up with the host would include host time: such a case is queued again once behind a longer
    sleep, else it gets no samples."""
    out: list[list[float]] = []
    for graph, est in cases:
        n = count_for(est + est)  # a pair: the case's replay and the flush's
        got: list[float] = []
        lead = lead_us + QUEUE_US_PER_PAIR * n
        for _ in range(2):
            evs = clock.events(2 * n + 1)
            clock.sleep(lead)
            evs[0].record()
            for i in range(n):
                graph.replay()
                evs[2 * i + 1].record()
                flush_graph.replay()
                evs[2 * i + 2].record()
            late = evs[0].query()
            evs[-1].synchronize()
            if not late:
                t = [clock.elapsed(evs[j], evs[j + 1]) for j in range(2 * n)]
                got = [t[2 * i] - t[2 * i + 1] for i in range(n)]
                break
            lead *= 4
        out.append(got)
    return out
