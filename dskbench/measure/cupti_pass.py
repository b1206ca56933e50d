"""The CUPTI pass that cross-checks a case the event timers measured (dskbench.measure.cross_check has the
rule): a few launches of the case, each behind the batched timer's flush (cold) or a tiny marker kernel
(hot, rotate), replayed from graphs of [flush, launch] where the launch can be captured, else launched
eagerly, and each launch's span read from CUPTI's activity records as the batched timer reads them
(batch_spans). Called by the engine after the per-case timer, when the sweep asks for cross-checks."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dskbench.measure import batch
from dskbench.measure.batch_spans import ChunkMismatch, split_groups
from dskbench.measure.cross_check import (
    CUPTI,
    MAX_CUPTI_LAUNCHES,
    CudaClock,
    count_for,
    cross_of,
    skipped,
)

_markers: dict[int, Any] = {}


def marker_buffer(index: int) -> Any:
    """A tiny complex64 buffer: zeroing it is the batched timer's flush kernel (batch_spans.MARKER)
    without the flush, to mark where each hot launch begins."""
    import torch

    buf = _markers.get(index)
    if buf is None:
        buf = torch.zeros(16, dtype=torch.complex64, device=f"cuda:{index}")
        _markers[index] = buf
    return buf


def cupti_spans(
    launchers: Sequence[Callable[[], Any]],
    *,
    cold: bool,
    capturable: bool,
    index: int,
    flush_bytes: int | None,
    clock: Any = None,
) -> tuple[list[float], str]:
    """CUPTI spans (us) of a few launches, each behind the batched timer's flush (cold) or the marker
    (hot), replayed from graphs of [flush, launch] where the launch can be captured, else launched
    eagerly; and how ("graph" or "eager"). Raises batch_spans.ChunkMismatch when the activities do not
    split into one group per launch."""
    from dskbench.measure.cuda_timer import l2_bytes

    clock = clock or CudaClock(index)
    launchers = list(launchers)[:MAX_CUPTI_LAUNCHES]  # rotate mode: many sets, each captured here

    buf = batch.flush_buffer(index, flush_bytes or 2 * l2_bytes(index)) if cold else marker_buffer(index)

    def mark() -> None:
        buf.zero_()

    steps: list[Callable[[], Any]] = []
    how = "eager"
    graphs = []
    if capturable:
        try:
            graphs = [batch._capture(f, mark) for f in launchers]
            steps = [g.replay for g in graphs]
            how = "graph"
        except Exception:  # noqa: BLE001 - eager launches serve
            graphs = []
    if not steps:

        def eager(f: Callable[[], Any]) -> Callable[[], None]:
            def step() -> None:
                mark()
                f()

            return step

        steps = [eager(f) for f in launchers]
    try:
        for s in steps:  # upload the graphs, off the profile
            s()
        a, b = clock.events(2)
        a.record()
        steps[0]()
        b.record()
        b.synchronize()
        n = count_for(max(clock.elapsed(a, b), 1.0), maximum=MAX_CUPTI_LAUNCHES)
        n = math.ceil(n / len(steps)) * len(steps)

        def queue() -> None:
            for i in range(n):
                steps[i % len(steps)]()

        groups = split_groups(batch._profile(queue), n)
    finally:
        for g in graphs:
            g.reset()
    return [g.span_us for g in groups if g is not None], how


def per_case_check(
    measured: Mapping[str, Any],
    launchers: Sequence[Callable[[], Any]],
    *,
    mode: str,
    capturable: bool,
    index: int,
    flush_bytes: int | None,
    gaps: Mapping[str, float] | None,
    clock: Any = None,
) -> dict[str, Any]:
    """The CUPTI cross-check of a measurement the event timers made (a Measurement's dict), or why
    there is none."""
    if measured.get("flush_kind") == "read":
        return skipped("the read flush has no CUPTI counterpart")
    if not batch.cupti_available():
        return skipped("CUPTI unavailable: torch.profiler records no CUDA kernels here")
    try:
        spans, how = cupti_spans(
            launchers,
            cold=mode == "cold",
            capturable=capturable,
            index=index,
            flush_bytes=flush_bytes,
            clock=clock,
        )
    except ChunkMismatch as e:
        return skipped(f"CUPTI activities did not add up ({e})")
    except Exception as e:  # noqa: BLE001 - the measurement stands without its cross-check
        return skipped(f"the CUPTI pass failed: {type(e).__name__}: {e}"[:300])
    out = cross_of(measured, CUPTI, spans, gaps, mode)
    if how == "eager" and out.get("method"):
        out["via"] = "eager launches"
    return out
