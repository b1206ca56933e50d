"""What a measurement is asked to do (MeasureSettings) and what it returns (Measurement)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from dskbench.measure.stopping import DEFAULT, POLICIES


@dataclass(frozen=True)
class MeasureSettings:
    """Sampling budget and batching. Times are per case; the budget covers sampling only (warm-up,
    JIT compilation, calibration and graph capture come before it and are not charged)."""

    target_noise: float = 0.01  # relative half-width of the median's 95% CI (see stats.py)
    min_samples: int = 20
    max_samples: int = 10_000  # also bounds the samples_us list written to results
    # Sampling lasts at least this long before the noise target may stop it: one or two batches
    # (batch_target_ms), so the stopping rule, not the clock, ends most cases. At 0.1 s the floor held
    # cases of 5 us to 1 ms for twice the samples their noise target needed, a quarter of a sweep's
    # sampling time, with no better run-to-run agreement (results/h100-2026-11-26/README.md).
    min_time_s: float = 0.03
    max_time_s: float = 1.5
    replay_target_us: float = 200.0  # one graph replay (or one eager hot sample) lasts at least this
    warmup_launches: int = 10  # eager launches before anything is timed (at least one per input set)
    flush_bytes: int | None = None  # cold-mode flush buffer; None = 2 x the device's L2
    # "write": zero_ the buffer (what Triton's do_bench does); "read": sum it into a scalar. A written
    # flush leaves L2 full of dirty lines whose write-back may land in the timed kernel by varying
    # amounts; a read flush avoids that but costs several times longer per flush, so "write" stays the
    # default (results/h200x4-2026-11-21/README.md compares the two run to run).
    flush_kind: str = "write"
    max_graph_launches: int = 1000  # cap on launches captured in one graph (capture time, memory)
    batch_target_ms: float = 20.0  # GPU time queued between two host synchronisations
    # Idle after each batch, as a fraction of the batch's GPU time: keeps average power under what
    # back-to-back replays of a large GEMM draw for seconds, so the power cap does not hold the clocks
    # down for the whole case (FlashInfer's sleep_after_run does the same). 0 disables.
    cooldown: float = 0.25
    # Per-launch gap (us) to subtract from every sample, by method and mode: keys "hot" / "cold" for
    # cuda-graph, "eager_hot" / "eager_cold" for cuda-eager (see calibrate.py, which measures them
    # against CUPTI). A missing key leaves that method/mode uncorrected. None: no correction.
    launch_gap_us: dict[str, float] | None = None
    # The stopping policy (stopping.py): "median-ci" (target_noise on the median's CI), "stdrel"
    # (target_noise on the samples' CV) or "fixed" (min_samples samples). Recorded with each result.
    stopping: str = DEFAULT
    # Noise targets by latency band, (from_us, max_noise) (stopping.py). Under 5 us the medians of two
    # runs of one case differ by up to 17-29%, from 100 us up by up to about 5% (the run-to-run floors
    # `compare` judges against: dskbench/analysis/noise_prior.json), so there a 2% interval leaves its
    # verdicts as they are while a 1% one costs up to four times the samples; 5-100 us keeps 1%.
    # () keeps target_noise everywhere.
    band_noise: tuple[tuple[float, float], ...] = ((0.0, 0.02), (5.0, 0.01), (100.0, 0.02))
    # Read each measured case briefly with the other timer too (dskbench.measure.cross_check): the
    # batched timer does it itself, the engine after a per-case measurement (cupti_pass). A sweep turns
    # it on (`--no-cross-check` leaves it off); asv, calibration and the ceilings do not.
    cross_check: bool = False

    def __post_init__(self) -> None:
        if self.flush_kind not in ("write", "read"):
            raise ValueError(f"flush_kind {self.flush_kind!r}: expected 'write' or 'read'")
        if self.stopping not in POLICIES:
            raise ValueError(f"stopping {self.stopping!r}: expected one of {', '.join(POLICIES)}")

    @classmethod
    def quick(cls, **overrides: Any) -> MeasureSettings:
        """Smoke-test budget: a few tenths of a second per case, 2% noise target."""
        base = cls(
            target_noise=0.02,
            min_samples=10,
            min_time_s=0.02,
            max_time_s=0.3,
            warmup_launches=3,
            batch_target_ms=10.0,
            band_noise=(),  # its 2% target already is the long kernels' band
        )
        return replace(base, **overrides)

    def with_(self, **overrides: Any) -> MeasureSettings:
        return replace(self, **overrides)


@dataclass
class Measurement:
    """One timed case. All times are per launch, in microseconds of GPU (or CPU wall) time."""

    median_us: float
    p10_us: float
    p90_us: float
    mean_us: float
    min_us: float
    max_us: float
    cv: float  # spread of the samples: stdev / mean
    noise: float  # relative half-width of the median's 95% CI (the stopping criterion)
    n_samples: int
    launches_per_sample: int  # each sample is the mean over this many launches
    converged: bool  # the stopping policy's criterion was met within the budget
    wall_s: float  # whole measure() call: warm-up, capture, sampling
    method: str  # cuda-graph | cuda-eager | cpu-wall
    mode: str  # cold | hot
    device: str
    n_sets: int  # input sets rotated through
    samples_us: list[float] = field(default_factory=list)  # after subtracting launch_gap_us, if any
    raw_median_us: float | None = None  # the median before the launch gap was subtracted
    launch_gap_us: float | None = None  # the per-launch gap subtracted from every sample (None: none)
    clamped: int | None = None  # samples shorter than the gap, clamped at 0 (None: no gap subtracted)
    flush_us: float | None = None  # cold: median time of one flush (excluded from the samples)
    flush_bytes: int | None = None
    flush_kind: str | None = None  # cold: "write" or "read" (MeasureSettings.flush_kind)
    fallback_reason: str | None = None  # why the eager method was used, when it was
    clocks_before: dict[str, Any] | None = None
    clocks_after: dict[str, Any] | None = None
    clocks_during: dict[str, Any] | None = None  # summary of NVML reads taken while the GPU was busy
    throttled: bool | None = None  # None: unknown (no NVML)
    throttle_reasons: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    stopping: dict[str, Any] | None = None  # the stopping policy: {"name": ..., <its parameters>}
    # wall seconds of the measurement's stages: warmup_s, prepare_s (calibration, graph capture), sampling_s
    stage_s: dict[str, float] | None = None
    # the second timer's view (dskbench.measure.cross_check): {method, median_us, ratio, agrees, ...}
    cross_check: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
