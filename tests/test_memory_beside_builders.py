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


def _out_of_memory_then_ok(monkeypatch) -> list:
    """case._run_once replaced: out of memory the first time, ok the next; returns the calls made."""
    outcomes = iter([{"status": "error", "reason": OOM}, {"status": "ok"}])
    calls: list = []

    def once(*args, **kwargs):
        calls.append(args)
        return next(outcomes)

    monkeypatch.setattr(case, "_run_once", once)
    return calls


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
    calls = _out_of_memory_then_ok(monkeypatch)
    monkeypatch.setattr(memory_retry, "_free_gpu_bytes", lambda: 2**40)
    got = case.run_one(_item(0, "k", 1), GPU, SweepOptions(), 0, None)
    assert len(calls) == (2 if builders else 1)
    assert got["status"] == ("ok" if builders else "error")


def _lock_is_free(path) -> bool:
    """Whether another process could take the GPU lock now (a second open file: flock is per file)."""
    import fcntl

    with open(path, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(fh, fcntl.LOCK_UN)
        return True


@pytest.mark.parametrize("builder", [False, True])
def test_a_builder_waits_and_runs_without_the_lock(builder, tmp_path, monkeypatch):
    """The measuring worker waits holding the lock (no builder makes inputs meanwhile); a builder must
    not: the memory it waits for may be the measuring worker's, freed only once that worker has the lock
    to finish its cases."""
    lock = tmp_path / "gpu.lock"
    monkeypatch.setenv(gpu_lock.LOCK_ENV, str(lock))
    free = iter([0, 0, 3 * 2**30])
    free_while_waiting, free_while_running = [], []

    def run():
        free_while_running.append(_lock_is_free(lock))
        return {"status": "ok"}

    got = memory_retry.again_beside_builders(
        {"status": "error", "reason": OOM},
        run,
        lambda: next(free),
        sleep=lambda _s: free_while_waiting.append(_lock_is_free(lock)),
        alive=lambda: None,
        builder=builder,
    )
    assert got["status"] == "ok"
    assert free_while_waiting == [builder, builder] and free_while_running == [builder]
    assert ("other processes of the run" in got["retried"]) == builder


@pytest.mark.parametrize("warm_only", [False, True])
def test_a_build_out_of_memory_is_tried_again_without_a_lock_named(warm_only, monkeypatch):
    """`dskbench warm`'s jobs share a GPU with no lock named: a build short of memory is still tried once
    more; a measured case without builders is not."""
    monkeypatch.delenv(gpu_lock.LOCK_ENV, raising=False)
    calls = _out_of_memory_then_ok(monkeypatch)
    monkeypatch.setattr(memory_retry, "_free_gpu_bytes", lambda: 2**40)
    got = case.run_one(_item(0, "k", 1), GPU, SweepOptions(warm_only=warm_only), 0, None)
    assert len(calls) == (2 if warm_only else 1)
    assert got["status"] == ("ok" if warm_only else "error")


def test_it_does_not_wait_for_memory_no_other_process_holds(tmp_path, monkeypatch):
    """A case too large for the GPU (the memory it lacks is not held by others) runs again at once: a
    wait could only end at its limit, the GPU lock held all the while."""
    monkeypatch.setenv(gpu_lock.LOCK_ENV, str(tmp_path / "gpu.lock"))
    slept = []
    got = memory_retry.again_beside_builders(
        {"status": "error", "reason": OOM},
        lambda: {"status": "error", "reason": OOM},
        lambda: 2**30,  # 1 GiB free of the 2 GiB asked for
        sleep=slept.append,
        alive=lambda: None,
        others_bytes=lambda: 2**29,  # others hold 0.5 GiB: their freeing it would not be enough
    )
    assert slept == [] and got["status"] == "error"
    free = iter([2**30, 2**30, 3 * 2**30])
    got = memory_retry.again_beside_builders(
        {"status": "error", "reason": OOM},
        lambda: {"status": "ok"},
        lambda: next(free),
        sleep=slept.append,
        alive=lambda: None,
        others_bytes=lambda: 4 * 2**30,  # others hold 4 GiB: worth waiting for
    )
    assert len(slept) == 2 and got["status"] == "ok"


@pytest.mark.parametrize("room", [True, False])
def test_a_case_short_of_memory_beside_held_cases_runs_again_once_they_are_timed(room, monkeypatch):
    """The measuring worker holds prepared cases for a batch; a large case after them can find the GPU
    full of theirs. make_room times and frees them (True when it held some) and the case runs again."""
    monkeypatch.delenv(gpu_lock.LOCK_ENV, raising=False)
    calls, made = _out_of_memory_then_ok(monkeypatch), []
    got = case.run_one(
        _item(0, "k", 1), GPU, SweepOptions(), 0, None, make_room=lambda: made.append(1) or room
    )
    assert made == [1] and len(calls) == (2 if room else 1)
    assert got["status"] == ("ok" if room else "error")
    assert ("beside held cases" in got.get("retried", "")) == room


def test_the_contexts_no_wait_frees_are_not_waited_for(tmp_path, monkeypatch):
    """Seen on an H100: 32 GiB asked for, 30.4 GiB free, and the rest held by CUDA contexts (the run's
    parent's 1 GiB, this process's own outside PyTorch's pool) that no wait frees: it must not wait."""
    monkeypatch.setenv(gpu_lock.LOCK_ENV, str(tmp_path / "gpu.lock"))
    oom = "out of memory: OutOfMemoryError: CUDA out of memory. Tried to allocate 32.00 GiB."
    slept = []
    got = memory_retry.again_beside_builders(
        {"status": "error", "reason": oom},
        lambda: {"status": "error", "reason": oom},
        lambda: int(30.43 * 2**30),
        sleep=slept.append,
        alive=lambda: None,
        others_bytes=lambda: int(1.7 * 2**30),
    )
    assert slept == [] and got["status"] == "error"


def test_it_gives_back_its_own_cached_memory_before_it_waits(tmp_path, monkeypatch):
    """Seen on an H100: a builder short of memory waited with its failed attempt's 37 GiB still cached by
    its allocator, while the measuring worker waited for that memory: neither got it until both limits."""
    monkeypatch.setenv(gpu_lock.LOCK_ENV, str(tmp_path / "gpu.lock"))
    order: list[str] = []
    monkeypatch.setattr(memory_retry, "release", lambda: order.append("release"))
    monkeypatch.setattr(memory_retry, "_free_gpu_bytes", lambda: order.append("free") or 3 * 2**30)
    monkeypatch.setattr(memory_retry, "_others_gpu_bytes", lambda: 0)
    got = memory_retry.again_beside_builders(
        {"status": "error", "reason": OOM}, lambda: {"status": "ok"}, alive=lambda: None, builder=True
    )
    assert got["status"] == "ok" and order[:2] == ["release", "free"]


def test_a_failed_attempt_s_tensors_are_gone_before_its_clean_up(monkeypatch):
    """The clean-up after a failure runs once the exception (whose traceback keeps the failed frames'
    locals, a KV cache among them) is gone, so the memory it frees is all the attempt's."""
    import weakref

    class Tensor:  # stands for a large GPU tensor the failed attempt made
        pass

    seen: list[bool] = []

    def prepare(*_args):
        kv_cache = Tensor()
        seen.append(weakref.ref(kv_cache))
        raise RuntimeError("CUDA out of memory. Tried to allocate 32.00 GiB")

    monkeypatch.setattr(case, "prepare_item", prepare)
    alive_at_clean_up: list[bool] = []
    monkeypatch.setattr(
        case, "free_memory", lambda *_a, **_k: alive_at_clean_up.append(seen[0]() is not None)
    )
    got = case._run_once(_item(0, "k", 1), GPU, SweepOptions(), 0, None)
    assert got["status"] == "error" and got["reason"].startswith("out of memory")
    assert alive_at_clean_up == [False]
