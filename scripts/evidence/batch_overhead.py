"""Where the batched cold timer's wall time goes, on synthetic cases (one GPU, torch only).

Times dskbench.measure.batch.measure_batch on three batches (48 tiny in-place multiplies of about
1 us, 48 bf16 GEMMs of about 25 us, 16 of about 1.4 ms), with and without the events cross-check, and
splits each batch's wall: profiler sessions (CUPTI through torch's profiler, the device work inside
them), turning activities into (name, start, end), queueing the graph replays, cooldown sleeps. Prints
one line per batch: cases, wall, median samples per case and noise, and those parts.

    python scripts/evidence/batch_overhead.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dskbench.measure import batch  # noqa: E402
from dskbench.measure.settings import MeasureSettings  # noqa: E402

parts: dict[str, float] = {}


def _add(key: str, value: float) -> None:
    parts[key] = parts.get(key, 0.0) + value


def _instrument() -> None:
    """Wrap the timer's profiler session, activity reading and sleeps to add up their wall time."""
    session, profile, sleep = batch._session, batch._profile, time.sleep

    def timed_session(queue: Any) -> Any:
        t = time.perf_counter()

        def timed_queue() -> None:
            q = time.perf_counter()
            queue()
            _add("queue", time.perf_counter() - q)

        out = session(timed_queue)
        _add("session", time.perf_counter() - t)
        _add("chunks", 1)
        return out

    def timed_profile(queue: Any) -> Any:
        t = time.perf_counter()
        out = profile(queue)
        _add("profile", time.perf_counter() - t)
        _add("activities", len(out))
        return out

    def timed_sleep(s: float) -> None:
        _add("sleep", s)
        sleep(s)

    batch._session, batch._profile = timed_session, timed_profile
    batch.time.sleep = timed_sleep


def _entries(kind: str) -> list[list[Any]]:
    out: list[list[Any]] = []
    for _ in range(16 if kind == "1.4 ms GEMM" else 48):
        if kind == "1 us multiply":
            x = torch.randn(4096, device="cuda")
            out.append([lambda x=x: x.mul_(1.0001)])
        else:
            n = 2048 if kind == "25 us GEMM" else 8192
            a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
            out.append([lambda a=a: a @ a])
    return out


def main() -> None:
    print(torch.cuda.get_device_name(0), "torch", torch.__version__, "CUPTI", batch.cupti_available())
    t = time.perf_counter()
    for _ in range(20):
        batch._session(lambda: None)
    print(f"an empty profiler session: {(time.perf_counter() - t) / 20 * 1e3:.2f} ms")
    _instrument()
    for kind in ("1 us multiply", "1 us multiply", "25 us GEMM", "1.4 ms GEMM"):
        for cross in (True, False):
            parts.clear()
            settings = MeasureSettings(cross_check=cross, launch_gap_us={"cold": 0.35})
            t = time.perf_counter()
            got = [
                m
                for m in batch.measure_batch(_entries(kind), device="cuda", settings=settings)
                if not isinstance(m, str)
            ]
            wall = time.perf_counter() - t
            print(
                f"{kind}, cross-check {'on' if cross else 'off'}: {len(got)} cases, wall {wall:.3f} s, "
                f"median {statistics.median(m.median_us for m in got):.2f} us, "
                f"samples {statistics.median(m.n_samples for m in got):.0f}, "
                f"noise {statistics.median(m.noise for m in got):.4f}; "
                + ", ".join(
                    f"{k} {v:.3f}" if k not in ("chunks", "activities") else f"{k} {v:.0f}"
                    for k, v in parts.items()
                )
            )


if __name__ == "__main__":
    main()
