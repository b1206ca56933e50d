"""Fake kernels for the sharded sweep's tests: one right, on the CPU, whose check says which GPU its
worker was given and whether multicast was off there (the environment a shard's worker runs in); one
that never returns (a hung kernel).

Loaded in worker subprocesses through DSKBENCH_EXTRA_ADAPTERS=...,tests.fake_shard_adapters.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from dskbench.adapters import register
from dskbench.adapters.backends import CPU_OK, Backend
from dskbench.adapters.base import Check
from tests.fake_adapters import _bind_ok, _FakeNorm


@register
class FakeEnv(_FakeNorm):
    kernel = "fake_env"
    backends = [
        Backend(
            "fake", "dskbench.shapes.cases:Case", None, "torch", _bind_ok, requires=CPU_OK, capturable=False
        )
    ]

    def check(self, out, ref, case):
        chk = super().check(out, ref, case)
        seen = " ".join(
            f"{k}={os.environ.get(k)}"
            for k in ("CUDA_VISIBLE_DEVICES", "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST")
        )
        return Check(chk.ok, chk.error, chk.tolerance, seen)


HANG_DIR_ENV = "DSKBENCH_TEST_HANG_DIR"


def hang_marker(folder, visible: str | None):
    """The file a hung launch leaves for the test's clock: one per CUDA_VISIBLE_DEVICES value (a slot)."""
    return Path(folder) / f"hung-{visible or '-'}"


def _bind_hang(fn, inputs, case):
    def launch():
        folder = os.environ.get(HANG_DIR_ENV)
        if folder:  # tell the test (pid inside) that this worker now hangs
            hang_marker(folder, os.environ.get("CUDA_VISIBLE_DEVICES")).write_text(str(os.getpid()))
        time.sleep(900)  # a kernel (or collective) that never returns (not forever: a safety net)

    return launch


@register
class FakeHang(_FakeNorm):
    kernel = "fake_hang"
    backends = [
        Backend(
            "fake", "dskbench.shapes.cases:Case", None, "torch", _bind_hang, requires=CPU_OK, capturable=False
        )
    ]
