"""A GPU run's worker caps torch's CPU threads; a CPU run, which times the references themselves, does not."""

from __future__ import annotations

import torch

from dskbench.device.info import usable_cores
from dskbench.execution import host_threads


def test_a_gpu_run_caps_torch_threads_and_a_cpu_run_keeps_them():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(max(1, usable_cores()))
        assert host_threads.limit_for_gpu_run("cpu") is None
        assert torch.get_num_threads() == max(1, usable_cores())
        want = max(1, min(host_threads.GPU_RUN_THREADS, usable_cores()))
        assert host_threads.limit_for_gpu_run("cuda") == want == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def test_a_builder_asks_for_fewer_threads_than_a_measuring_worker():
    before = torch.get_num_threads()
    try:
        want = max(1, min(host_threads.BUILDER_THREADS, usable_cores()))
        assert host_threads.limit_for_gpu_run("cuda", host_threads.BUILDER_THREADS) == want
        assert torch.get_num_threads() == want
    finally:
        torch.set_num_threads(before)
    assert host_threads.BUILDER_THREADS < host_threads.GPU_RUN_THREADS


def test_the_builders_plan_names_their_thread_cap():
    from dskbench.execution import warm
    from dskbench.execution.items import SweepOptions

    opts = SweepOptions(device="cpu", phases=("decode",), profile="cpu", seed=0, measure_ceilings=False)
    pool = warm.warm_pool([], opts, 2, lambda item, fields: None)
    assert {s.plan["threads"] for s in pool.slots} == {host_threads.BUILDER_THREADS}
    assert {s.plan["nice"] for s in pool.slots} == {warm.BUILD_NICE}
