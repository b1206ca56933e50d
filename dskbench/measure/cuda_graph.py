"""The CUDA-graph timer ("cuda-graph"): n launches captured in one graph, replayed behind a GPU sleep;
cold mode subtracts a graph of flushes alone (see cuda.py's docstring for the scheme and its reasons).

Its public steps (capture, capture_graphs, build, per_launch) and `discard_replays` are what a variant
changes: the collective timer (collective.py) agrees on the graph size and capture across ranks and
drops the first replay of every batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from dskbench.measure.cuda_timer import CALIBRATION_LAUNCHES, CudaTimer, elapsed_us
from dskbench.measure.sampling import CaptureFailed, launches_for

COLD_MIN_LAUNCHES = 16  # cold graphs: at least this many [flush, launch] pairs, to average flush noise
# ...unless the pairs last this long anyway: a 4 ms attention kernel needs no 16 launches per sample to
# drown ~1 us of flush jitter, and 16-launch cold samples of ms-long kernels made a few cases take much
# of a sweep's measuring time (results/h200x2-2026-11-21/README.md).
COLD_MIN_SPAN_US = 2000.0
MAX_REPLAYS_PER_BATCH = 64


def cold_min_launches(pair_us: float) -> int:
    """[flush, kernel] pairs per cold sample: COLD_MIN_LAUNCHES, fewer once they span COLD_MIN_SPAN_US."""
    if pair_us <= 0:
        return COLD_MIN_LAUNCHES
    return max(1, min(COLD_MIN_LAUNCHES, math.ceil(COLD_MIN_SPAN_US / pair_us)))


def replays_for(batch_target_ms: float, pair_us: float) -> int:
    """Replays per batch: enough to fill `batch_target_ms` of GPU time, at most MAX_REPLAYS_PER_BATCH."""
    return max(1, min(MAX_REPLAYS_PER_BATCH, math.ceil(batch_target_ms * 1000 / pair_us)))


class GraphTimer(CudaTimer):
    method = "cuda-graph"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.graphs: list[torch.cuda.CUDAGraph] = []
        self.n = 0
        self.replays = 1
        self.discard_replays = 0  # replays at the start of each batch that are not samples

    def capture(self, n: int, launches: bool) -> torch.cuda.CUDAGraph:
        """One graph of n [flush (cold), launch] steps; `launches` False: the flushes alone."""
        g = torch.cuda.CUDAGraph()
        stream = torch.cuda.current_stream()
        try:
            with torch.cuda.graph(g, capture_error_mode="thread_local"):
                for i in range(n):
                    if self.cold:
                        self.flush()
                    if launches:
                        self.launchers[i % self.n_sets]()
        except Exception as e:
            # graph.__exit__ skips restoring the stream when capture_end raises: restore it here
            torch.cuda.set_stream(stream)
            try:
                torch.cuda.synchronize()
            except Exception as sticky:  # the context is broken: no fallback can help
                raise RuntimeError(f"CUDA error after a failed graph capture: {sticky}") from e
            raise CaptureFailed(f"{type(e).__name__}: {e}") from e
        return g

    def capture_graphs(self, n: int) -> list[torch.cuda.CUDAGraph]:
        """The graphs a batch replays: launches, and (cold) the flushes alone."""
        graphs = [self.capture(n, launches=True)]
        if self.cold:
            graphs.append(self.capture(n, launches=False))
        return graphs

    def build(self, n: int) -> None:
        """Capture the graphs of n launches (dropping earlier ones) and upload them."""
        self.close()
        graphs = self.capture_graphs(n)
        for g in graphs:  # first replay uploads the graph: keep it out of any timing
            g.replay()
        torch.cuda.synchronize()
        self.graphs, self.n = graphs, n

    def _time_replays(self, reps: int) -> list[list[float]]:
        """Per-replay times (us) of each graph, replayed in turn `reps` times behind a sleep."""
        evs = self.timing_events(reps * len(self.graphs) + 1)
        self.gpu_sleep(self.lead_us)
        evs[0].record()
        j = 1
        for _ in range(reps):
            for g in self.graphs:
                g.replay()
                evs[j].record()
                j += 1
        evs[-1].synchronize()
        times = [elapsed_us(evs[i], evs[i + 1]) for i in range(len(evs) - 1)]
        k = len(self.graphs)
        return [times[g::k] for g in range(k)]

    def per_launch(self) -> tuple[float, float]:
        """(launch incl. flush, flush) per launch in us, from the fastest of 3 replays."""
        times = self._time_replays(3)
        total = min(times[0]) / self.n
        flush = min(times[1]) / self.n if self.cold else 0.0
        return total, flush

    def prepare(self) -> None:
        s = self.settings
        target, cap = s.replay_target_us, s.max_graph_launches
        n = launches_for(0.0, 1.0, self.n_sets, cap, minimum=CALIBRATION_LAUNCHES)
        for _ in range(3):  # calibrate, resize, until a replay lasts between 0.5x and 10x the target
            self.build(n)
            total, flush = self.per_launch()
            minimum = cold_min_launches(total) if self.cold else 1
            want = launches_for(target, total, self.n_sets, cap, minimum)
            if n < minimum:  # too few pairs to average the flush: resize whatever the replay length
                n = want
                continue
            if want == n or 0.5 * target <= n * total <= 10 * target:
                break
            n = want
        if n != self.n:  # the last resize was not built yet
            self.build(n)
        self.launches_per_sample = self.n
        self.replays = replays_for(s.batch_target_ms, self.n * (total + flush))

    def batch(self, busy: Callable[[], None]) -> list[float]:
        k = len(self.graphs)
        reps = self.replays + self.discard_replays
        evs = self.timing_events(reps * k + 1)
        self.gpu_sleep(self.lead_us)
        evs[0].record()
        j = 1
        late = False
        for r in range(reps):
            for g in self.graphs:
                g.replay()
                evs[j].record()
                j += 1
            if r == 0:
                late = evs[0].query()  # the GPU was already past the sleep: replay 0 may include idle
        busy()
        evs[-1].synchronize()
        self.batch_gpu_us = elapsed_us(evs[0], evs[-1])
        times = [elapsed_us(evs[i], evs[i + 1]) for i in range(len(evs) - 1)]
        start = self.discard_replays
        if late:
            self.fell_behind()
            start = max(start, 1)
        out = []
        for r in range(start, reps):
            t_k = times[r * k]
            if self.cold:
                t_f = times[r * k + 1]
                out.append((t_k - t_f) / self.n)
                self.flush_samples.append(t_f / self.n)
            else:
                out.append(t_k / self.n)
        return out

    def close(self) -> None:
        for g in self.graphs:
            g.reset()
        self.graphs = []
