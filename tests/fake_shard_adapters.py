"""Fake kernels for the sharded sweep's tests: one right, on the CPU, whose check says which GPU its
worker was given and whether multicast was off there (the environment a shard's worker runs in); one
that never returns (a hung kernel).

Loaded in worker subprocesses through DSKBENCH_EXTRA_ADAPTERS=...,tests.fake_shard_adapters.
"""

from __future__ import annotations

import os
import time

from dskbench.adapters import register
from dskbench.adapters.base import Check
from dskbench.backends import CPU_OK, Backend
from tests.fake_adapters import _bind_ok, _FakeNorm


@register
class FakeEnv(_FakeNorm):
    kernel = "fake_env"
    backends = [
        Backend("fake", "dskbench.shapes:Case", None, "torch", _bind_ok, requires=CPU_OK, capturable=False)
    ]

    def check(self, out, ref, case):
        chk = super().check(out, ref, case)
        seen = " ".join(
            f"{k}={os.environ.get(k)}"
            for k in ("CUDA_VISIBLE_DEVICES", "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST")
        )
        return Check(chk.ok, chk.error, chk.tolerance, seen)


def _bind_hang(fn, inputs, case):
    def launch():
        time.sleep(3600)  # a kernel (or collective) that never returns

    return launch


@register
class FakeHang(_FakeNorm):
    kernel = "fake_hang"
    backends = [
        Backend("fake", "dskbench.shapes:Case", None, "torch", _bind_hang, requires=CPU_OK, capturable=False)
    ]
