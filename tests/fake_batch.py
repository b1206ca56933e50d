"""A CPU stand-in for batched timing, for the engine's tests: with FAKE_BATCH=1 in a worker's environment,
the worker holds its prepared cases and "times" every three of them together (each launched, then timed
by the CPU timer); a batch holding a case of `fake_batch_crash` kills the worker while it is timed, as a
kernel that faults only when sampled beside others would. Loaded through DSKBENCH_EXTRA_ADAPTERS.
"""

from __future__ import annotations

import os

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import CPU_OK, Backend
from dskbench.execution import batching
from tests.fake_adapters import _bind_ok, _FakeNorm, _rms

BATCH_NOTE = "fake batch"


def _bind_dies_in_batch(fn, inputs, case):
    def launch():
        return _rms(inputs["x"], inputs["w"])

    launch.dies_in_batch = True
    return launch


@register
class FakeBatchCrash(_FakeNorm):
    kernel = "fake_batch_crash"
    backends = [
        Backend("fake", "dskbench.shapes.cases:Case", None, "torch", _bind_dies_in_batch, requires=CPU_OK)
    ]


class FakeOomOnce(_FakeNorm):
    """Its first case in a worker runs out of memory (as a large case can beside the cases its worker
    holds for a batch); once run again it is fine."""

    kernel = "fake_oom_once"
    backends = [Backend("fake", "dskbench.shapes.cases:Case", None, "torch", _bind_ok, requires=CPU_OK)]
    tried = False

    def make_inputs(self, case, device, seed):
        if not FakeOomOnce.tried:
            FakeOomOnce.tried = True
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")
        return super().make_inputs(case, device, seed)


register(FakeOomOnce)


def _timed_together(entries, settings):
    from dskbench.measure import measure

    if any(getattr(f, "dies_in_batch", False) for fns in entries for f in fns):
        os._exit(9)
    out = []
    for fns in entries:
        m = measure(fns, device="cpu", settings=settings)
        m.notes.append(BATCH_NOTE)
        out.append(m)
    return out


if os.environ.get("FAKE_BATCH") == "1":
    batching.enabled = lambda device, opts: True
    batching.eligible = lambda opts, prep: True
    batching.Batcher.full = lambda self: len(self.held) >= 3
    batching.timed_together = _timed_together
