"""Faulty backends beside rmsnorm's real ones, for the fault-injection run on a GPU box (a test
helper, never a product backend). Loaded with DSKBENCH_EXTRA_ADAPTERS=tests.gpu_faults:

    fault_oob    a Triton kernel that stores far out of bounds (illegal address: poisons the context)
    fault_spin   a Triton kernel that spins forever (a hung kernel: the host blocks in a sync)
    fault_alloc  an impossible allocation (4 TB) while binding
    fault_die    the process dies on a signal (SIGSEGV) in the first launch

Each is a backend of the real rmsnorm adapter, so it meets the same inputs, reference and check.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import torch

from dskbench.adapters.backends import Backend
from dskbench.adapters.norm.rmsnorm import RMSNormAdapter

_kernels: dict[str, Any] = {}


def _triton_kernels() -> dict[str, Any]:
    if _kernels:
        return _kernels
    import triton
    import triton.language as tl

    @triton.jit
    def oob_store(out_ptr, n):
        offs = tl.arange(0, 128).to(tl.int64)
        tl.store(out_ptr + offs + (1 << 40), tl.zeros([128], dtype=tl.float32))  # 4 TiB past the buffer

    @triton.jit
    def spin(flag_ptr, out_ptr):
        i = 0
        while tl.load(flag_ptr, volatile=True) == 0:  # nobody ever sets it
            i += 1
        tl.store(out_ptr, i)

    _kernels.update(oob_store=oob_store, spin=spin)
    return _kernels


def _bind_oob(fn: Any, inputs: dict[str, Any], case: Any):
    out = torch.empty(128, dtype=torch.float32, device=inputs["x"].device)

    def launch():
        _triton_kernels()["oob_store"][(1,)](out, 128)
        return inputs["x"]

    return launch


def _bind_spin(fn: Any, inputs: dict[str, Any], case: Any):
    flag = torch.zeros(1, dtype=torch.int32, device=inputs["x"].device)
    out = torch.zeros(1, dtype=torch.int32, device=inputs["x"].device)

    def launch():
        _triton_kernels()["spin"][(1,)](flag, out)
        return inputs["x"]

    return launch


def _bind_alloc(fn: Any, inputs: dict[str, Any], case: Any):
    huge = torch.empty(4 * 2**40, dtype=torch.uint8, device=inputs["x"].device)  # 4 TB
    return lambda: huge


def _bind_die(fn: Any, inputs: dict[str, Any], case: Any):
    def launch():
        os.kill(os.getpid(), signal.SIGSEGV)

    return launch


FAULT_POINTS = (1, 64)  # tokens: each fault is injected at these decode points of input_layernorm only


def _only_some_cases(case: Any) -> str | None:
    if case.op == "input_layernorm" and case.point.get("T") in FAULT_POINTS:
        return None
    return f"fault injected at T in {FAULT_POINTS} of input_layernorm only"


def _fault(name: str, bind: Any) -> Backend:
    return Backend(
        name,
        "torch:empty",
        None,
        "triton",
        bind,
        capturable=False,
        skip=_only_some_cases,
        note="fault injection",
    )


FAULTS = {
    "fault_oob": _bind_oob,
    "fault_spin": _bind_spin,
    "fault_alloc": _bind_alloc,
    "fault_die": _bind_die,
}

if not any(b.name in FAULTS for b in RMSNormAdapter.backends):
    RMSNormAdapter.backends = [*RMSNormAdapter.backends, *(_fault(n, b) for n, b in FAULTS.items())]
