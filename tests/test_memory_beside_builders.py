"""A case that runs out of memory while the run's builders share its GPU is run once more under the GPU
lock, once the memory it asked for is free; without builders an out-of-memory error stands."""

from __future__ import annotations

import pytest

from dskbench.device.info import DeviceInfo
from dskbench.execution import case, gpu_lock, memory_retry
from dskbench.execution.items import SweepOptions
from tests.test_shard import _item

OOM = (
    "out of memory: OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
    "capacity of 139.80 GiB of which 1.10 GiB is free."
)
GPU = DeviceInfo("cuda", "NVIDIA H200", 90, 1)


def test_the_failed_allocation_is_read_from_the_error():
    assert memory_retry.allocation_bytes(OOM) == 2 * 2**30
    assert memory_retry.allocation_bytes("Tried to allocate 512.00 MiB") == 512 * 2**20
    assert memory_retry.allocation_bytes("out of memory: cudaMalloc failed") is None


def test_it_waits_for_the_memory_then_runs_again_holding_the_lock(tmp_path, monkeypatch):
    monkeypatch.setenv(gpu_lock.LOCK_ENV, str(tmp_path / "gpu.lock"))
    free = iter([2**30, 1.5 * 2**30, 3 * 2**30])
    slept, held, said = [], [], []

    def run():
        held.append(gpu_lock._depth)
        return {"status": "ok"}

    got = memory_retry.again_beside_builders(
        {"status": "error", "reason": OOM},
        run,
        lambda: next(free),
        sleep=slept.append,
        alive=lambda: said.append("WAIT"),
    )
    assert got["status"] == "ok" and "out of memory beside the run's builders" in got["retried"]
    assert len(slept) == 2 and held == [1]  # ran once the 2 GiB were free, the lock held
    assert len(said) == 2  # the hang watch heard from it each second it waited


def test_it_gives_up_waiting_after_the_limit(tmp_path, monkeypatch):
    monkeypatch.setenv(gpu_lock.LOCK_ENV, str(tmp_path / "gpu.lock"))
    slept = []
    got = memory_retry.again_beside_builders(
        {"status": "error", "reason": OOM},
        lambda: {"status": "error", "reason": OOM},
        lambda: 0,
        wait_s=5,
        sleep=slept.append,
        alive=lambda: None,
    )
    assert len(slept) == 5 and got["status"] == "error"  # still short: the second error stands


@pytest.mark.parametrize("builders", [True, False])
def test_run_one_retries_only_beside_builders(builders, tmp_path, monkeypatch):
    if builders:
        monkeypatch.setenv(gpu_lock.LOCK_ENV, str(tmp_path / "gpu.lock"))
    else:
        monkeypatch.delenv(gpu_lock.LOCK_ENV, raising=False)
    outcomes = iter([{"status": "error", "reason": OOM}, {"status": "ok"}])
    calls = []

    def once(*args, **kwargs):
        calls.append(args)
        return next(outcomes)

    monkeypatch.setattr(case, "_run_once", once)
    monkeypatch.setattr(memory_retry, "_free_gpu_bytes", lambda: 2**40)
    got = case.run_one(_item(0, "k", 1), GPU, SweepOptions(), 0, None)
    assert len(calls) == (2 if builders else 1)
    assert got["status"] == ("ok" if builders else "error")
