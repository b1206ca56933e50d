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
