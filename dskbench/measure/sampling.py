"""The device-independent half of a measurement: the timer interface, launch counts, method selection
(graph, else eager with the reason), the sampling loop under a stopping policy, and the Measurement of
the samples. The CUDA and CPU timers (cuda.py, cpu.py) and the collective ones (collective.py) build on
it; `measure()` (core.py) picks among them. Testable with fake timers.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from dskbench.measure.settings import Measurement, MeasureSettings
from dskbench.measure.stats import quantile, round_sig, summarize
from dskbench.measure.stopping import Stopper, stopper_for

MODES = ("cold", "hot")
GAP_KEYS = {
    "cuda-graph": "{mode}",
    "cuda-eager": "eager_{mode}",
    "cupti-graph": "batch_{mode}",
}  # MeasureSettings.launch_gap_us keys


class CaptureFailed(RuntimeError):
    """CUDA graph capture of the launchers raised; the caller falls back to eager timing."""


class Timer(Protocol):
    method: str
    launches_per_sample: int
    notes: list[str]
    batch_gpu_us: float  # device time the last batch took (for the cooldown)

    def prepare(self) -> None:
        """Calibrate and (for graphs) capture. May raise CaptureFailed."""

    def batch(self, busy: Callable[[], None]) -> list[float]:
        """Queue one batch, call `busy` while the device works, wait, return per-launch samples (us)."""
        ...

    @property
    def flush_us(self) -> float | None: ...

    def close(self) -> None: ...


def rotation(n_sets: int, n_launches: int) -> list[int]:
    """Input-set index of each launch: round robin, so every set is used and used equally."""
    return [i % n_sets for i in range(n_launches)]


def launches_for(target_us: float, per_launch_us: float, n_sets: int, cap: int, minimum: int = 1) -> int:
    """Launches in one replay/sample: enough to last `target_us`, at least `minimum`, a multiple of
    `n_sets` (every set used equally), at most `cap` rounded down to a multiple (but never fewer than
    one launch per set)."""
    n = math.ceil(target_us / per_launch_us) if per_launch_us > 0 else cap
    n = max(n, minimum, 1)
    n = math.ceil(n / n_sets) * n_sets
    cap_rounded = max(n_sets, (cap // n_sets) * n_sets)
    return min(n, cap_rounded)


def select_timer(
    capturable: bool, make_graph: Callable[[], Timer], make_eager: Callable[[], Timer]
) -> tuple[Timer, str | None]:
    """A prepared graph timer, or an eager one with the reason. Only a capture failure falls back:
    any other error (a bad launch, an illegal address) propagates."""
    if capturable:
        graph = make_graph()
        try:
            graph.prepare()
            return graph, None
        except CaptureFailed as e:
            graph.close()
            reason = f"graph capture failed: {e}"
    else:
        reason = "capturable=False"
    eager = make_eager()
    eager.prepare()
    return eager, reason


def gap_for(settings: MeasureSettings, method: str, mode: str) -> float | None:
    """The launch gap to subtract for this method and mode, or None (not calibrated, or cpu-wall)."""
    key = GAP_KEYS.get(method)
    gaps = settings.launch_gap_us
    if key is None or not gaps:
        return None
    gap = gaps.get(key.format(mode=mode))
    return None if gap is None else float(gap)


def subtract_gap(samples: Sequence[float], gap_us: float | None) -> list[float]:
    """Samples less the per-launch gap, clamped at 0 (a sample shorter than the gap is noise, not a
    negative kernel time)."""
    if gap_us is None:
        return [float(x) for x in samples]
    return [max(0.0, float(x) - gap_us) for x in samples]


def make_stopper(settings: MeasureSettings, now: Callable[[], float] = time.perf_counter) -> Stopper:
    """A fresh stopper of the settings' stopping policy, with their budget."""
    return stopper_for(
        settings.stopping,
        target_noise=settings.target_noise,
        min_samples=settings.min_samples,
        max_samples=settings.max_samples,
        min_time_s=settings.min_time_s,
        max_time_s=settings.max_time_s,
        band_noise=settings.band_noise,
        now=now,
    )


def take(stopper: Stopper, batch: Sequence[float], gap_us: float | None, raw: list[float] | None) -> bool:
    """Give the stopper a batch, less the launch gap; the uncorrected samples it kept (a policy may cut
    a batch: fixed) go to `raw`. True once sampling should stop."""
    before = len(stopper.samples)
    done = stopper.add(subtract_gap(batch, gap_us))
    if raw is not None:
        raw.extend(batch[: len(stopper.samples) - before])
    return done


def drive(
    timer: Timer,
    settings: MeasureSettings,
    busy: Callable[[], None] = lambda: None,
    now: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], None] = time.sleep,
    gap_us: float | None = None,
    raw: list[float] | None = None,
) -> Stopper:
    """Take batches until the stopping policy says so, idling `cooldown` x each batch's device time.

    With `gap_us`, the stopping rule sees the corrected samples (so the noise target holds for the
    number reported); the uncorrected ones are appended to `raw` when it is given."""
    stopper = make_stopper(settings, now)
    while True:
        batch = timer.batch(busy)
        if take(stopper, batch, gap_us, raw):
            break
        if settings.cooldown > 0 and timer.batch_gpu_us > 0:
            sleep(settings.cooldown * timer.batch_gpu_us * 1e-6)
    return stopper


def assemble(
    stopper: Stopper,
    *,
    method: str,
    mode: str,
    device: str,
    n_sets: int,
    launches_per_sample: int,
    wall_s: float,
    flush_us: float | None = None,
    flush_bytes: int | None = None,
    flush_kind: str | None = None,
    fallback_reason: str | None = None,
    clocks_before: dict[str, Any] | None = None,
    clocks_after: dict[str, Any] | None = None,
    clocks_during: dict[str, Any] | None = None,
    throttled: bool | None = None,
    throttle_reasons: Sequence[str] = (),
    notes: Sequence[str] = (),
    launch_gap_us: float | None = None,
    raw_samples: Sequence[float] = (),
    stage_s: dict[str, float] | None = None,
) -> Measurement:
    """The Measurement of the stopper's samples. With `launch_gap_us`, those samples are already
    corrected (see drive) and `raw_samples` are the uncorrected ones, whose median is reported too."""
    s = summarize(stopper.samples)
    notes = list(notes)
    raw_median = clamped = None
    if launch_gap_us is not None:
        raw_sorted = sorted(raw_samples)
        raw_median = quantile(raw_sorted, 0.5)
        clamped = sum(1 for x in raw_sorted if x < launch_gap_us)
        if clamped:
            notes.append(
                f"{clamped} samples shorter than the launch gap ({launch_gap_us:.3f} us), clamped at 0"
            )
    return Measurement(
        median_us=s.median,
        p10_us=s.p10,
        p90_us=s.p90,
        mean_us=s.mean,
        min_us=s.min,
        max_us=s.max,
        cv=s.cv,
        noise=s.noise,
        n_samples=s.n,
        launches_per_sample=launches_per_sample,
        converged=stopper.converged,
        wall_s=wall_s,
        method=method,
        mode=mode,
        device=device,
        n_sets=n_sets,
        samples_us=[round_sig(x) for x in stopper.samples],  # stats above use the exact ones
        raw_median_us=raw_median,
        launch_gap_us=launch_gap_us,
        clamped=clamped,
        flush_us=flush_us,
        flush_bytes=flush_bytes,
        flush_kind=flush_kind,
        fallback_reason=fallback_reason,
        clocks_before=clocks_before,
        clocks_after=clocks_after,
        clocks_during=clocks_during,
        throttled=throttled,
        throttle_reasons=list(throttle_reasons),
        notes=notes,
        stopping=stopper.describe(),
        stage_s={k: round(v, 4) for k, v in stage_s.items()} if stage_s else None,
    )
