"""The batched timer's sampling loop on the CPU: graphs and the profiler replaced by a simulated device
that lays each replay's flush and kernel on a clock, so chunking, quotas, stopping, the launch gap and a
chunk that does not add up are checked without a GPU."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("torch")

from dskbench.measure import batch  # noqa: E402
from dskbench.measure.batch_spans import MARKER  # noqa: E402
from dskbench.measure.settings import MeasureSettings  # noqa: E402

FLUSH = f"vectorized_elementwise_kernel<{MARKER}>>"


class Device:
    """Activities of the replays queued since the profiler session began, in device time (ns)."""

    def __init__(self) -> None:
        self.t = 0
        self.acts: list[tuple[str, int, int]] = []
        self.drop_flush_every = 0  # >0: every n-th replay loses its flush (a chunk that does not add up)
        self.replays = 0

    def profile(self, queue) -> list[tuple[str, int, int]]:
        self.acts = []
        queue()
        return list(self.acts)


class Graph:
    def __init__(self, dev: Device, kernel_ns: int, jitter_ns: int, seed: int) -> None:
        self.dev, self.kernel_ns, self.jitter_ns = dev, kernel_ns, jitter_ns
        self.rng = random.Random(seed)

    def replay(self) -> None:
        d = self.dev
        d.replays += 1
        if not (d.drop_flush_every and d.replays % d.drop_flush_every == 0):
            d.acts.append((FLUSH, d.t, d.t + 27_000))
        d.t += 27_500
        k = self.kernel_ns + self.rng.randint(-self.jitter_ns, self.jitter_ns)
        d.acts.append(("my_kernel", d.t, d.t + k))
        d.t += k + 1_000

    def reset(self) -> None:
        pass


def cases(dev: Device, kernels_ns: list[int], settings: MeasureSettings) -> dict[int, batch.BatchCase]:
    out = {}
    for i, ns in enumerate(kernels_ns):
        c = batch.BatchCase([Graph(dev, ns, ns // 50, i)])
        c.est_us = (27_500 + ns + 1_000) / 1000
        c.start(settings)
        out[i] = c
    return out


@pytest.fixture()
def device(monkeypatch):
    dev = Device()
    monkeypatch.setattr(batch, "_profile", dev.profile)
    return dev


def test_every_case_is_sampled_until_its_rule_stops_it_with_the_gap_taken_off(device):
    s = MeasureSettings(cooldown=0.0)
    kernels = [1_500, 14_000, 150_000, 4_000_000]  # 1.5 us to 4 ms
    got = cases(device, kernels, s)
    notes: list[str] = []
    batch.sample_rounds(got, lambda: None, s, notes, gap=0.4)
    assert notes == []
    for ns, c in zip(kernels, got.values(), strict=True):
        st = c.stopper
        assert st.stopped and st.converged
        assert len(st.samples) >= st.min_samples >= s.min_samples
        # each sample is the kernel's own span less the gap: never the flush, never the gap to the next
        assert abs(sorted(st.samples)[len(st.samples) // 2] - (ns / 1000 - 0.4)) < ns / 1000 * 0.03 + 0.05
        assert c.raw[0] - st.samples[0] == pytest.approx(0.4)
        assert c.flushes and all(f == pytest.approx(27.0) for f in c.flushes)
    short, long_ = got[0].stopper, got[3].stopper
    assert short.min_samples == batch.MAX_MIN_SAMPLES  # a short kernel: more one-launch samples
    assert long_.min_samples == s.min_samples  # a 4 ms kernel: 2 ms of samples is one launch


def test_a_chunk_whose_flushes_do_not_add_up_is_retried_then_given_up(device):
    s = MeasureSettings(cooldown=0.0)
    device.drop_flush_every = 7
    got = cases(device, [2_000, 3_000], s)
    notes: list[str] = []
    batch.sample_rounds(got, lambda: None, s, notes, gap=None)
    assert any("CUPTI activities did not add up" in n for n in notes)
    assert all(c.done for c in got.values())
    assert all(not c.stopper.samples for c in got.values())  # nothing from an untrusted chunk
