"""Fake kernels for runner tests: one that is right, one wrong, one that kills its process, one that
raises a context-poisoning CUDA error, one that raises an ordinary error. All run on the CPU.

Loaded in worker subprocesses through DSKBENCH_EXTRA_ADAPTERS=tests.fake_adapters.
"""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import CPU_OK, SM100, Backend
from dskbench.adapters.base import Adapter, Traffic


def registry_entry(name: str, status: str = "benchmark", reason: str = "") -> SimpleNamespace:
    """A registry entry for a fake kernel: what planning reads of dskbench.registry.load.KernelEntry."""
    return SimpleNamespace(
        name=name,
        status=status,
        status_reason=reason,
        op_names=["input_layernorm"],
        aliases=(),
        category="test",
    )


def _rms(x, w):
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).to(x.dtype)


class _FakeNorm(Adapter):
    role = "norm"

    def make_inputs(self, case, device, seed):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(case.dims["T"], case.dims["D"], generator=g).to(device)
        return {"x": x, "w": torch.rand(case.dims["D"], generator=g).to(device) + 0.5}

    def reference(self, inputs, case):
        return _rms(inputs["x"], inputs["w"])

    def traffic(self, case):
        return Traffic(bytes=2 * 4 * case.dims["T"] * case.dims["D"], flops=0)


def _bind_ok(fn, inputs, case):
    return lambda: _rms(inputs["x"], inputs["w"])


def _bind_wrong(fn, inputs, case):
    return lambda: _rms(inputs["x"], inputs["w"]) * 1.5


def _bind_crash(fn, inputs, case):
    def launch():
        os._exit(77)  # dies like a segfaulting kernel: no exception, no cleanup

    return launch


def _bind_poison(fn, inputs, case):
    def launch():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    return launch


def _bind_raise(fn, inputs, case):
    def launch():
        raise ValueError("shape mismatch in fake kernel")

    return launch


def _fake(name: str, binder) -> Backend:
    return Backend(
        name, "dskbench.shapes.cases:Case", None, "torch", binder, requires=CPU_OK, capturable=False
    )


@register
class FakeOk(_FakeNorm):
    kernel = "fake_ok"
    backends = [
        _fake("fake", _bind_ok),
        Backend("b200", "dskbench.shapes.cases:Case", None, "aot", _bind_ok, requires=SM100),
    ]


@register
class FakeWrong(_FakeNorm):
    kernel = "fake_wrong"
    backends = [_fake("fake", _bind_wrong)]


@register
class FakeCrash(_FakeNorm):
    kernel = "fake_crash"
    backends = [_fake("fake", _bind_crash)]


@register
class FakePoison(_FakeNorm):
    kernel = "fake_poison"
    backends = [_fake("fake", _bind_poison)]


@register
class FakeRaise(_FakeNorm):
    kernel = "fake_raise"
    backends = [
        _fake("fake", _bind_raise),
        Backend("missing", "no_such_module_xyz:fn", None, "aot", _bind_ok, requires=CPU_OK),
    ]


def _bind_abort(fn, inputs, case):
    def launch():
        # dies as a process does on an asynchronous CUDA fault: the error, then advice lines, then gone
        sys.stderr.write(
            'Traceback (most recent call last):\n  File "kernel.py", line 3, in launch\n'
            "RuntimeError: CUDA error: an illegal memory access was encountered\n"
            "CUDA kernel errors might be asynchronously reported at some other API call.\n"
            "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
        )
        sys.stderr.flush()
        os._exit(1)

    return launch


@register
class FakeAbort(_FakeNorm):
    kernel = "fake_abort"
    backends = [_fake("fake", _bind_abort)]


# Twins across kernels: two names of one implementation (the same call on the same inputs, checked the
# same way), each declaring it in its own body; a third inherits the claim's attribute but not the claim.
FAKE_TWIN_IMPLEMENTATION = {"fake": "tests.fake_adapters._rms"}


@register
class FakeTwinA(_FakeNorm):
    kernel = "fake_twin_a"
    backends = [_fake("fake", _bind_ok)]
    implementation = FAKE_TWIN_IMPLEMENTATION


@register
class FakeTwinB(FakeTwinA):
    kernel = "fake_twin_b"
    implementation = FAKE_TWIN_IMPLEMENTATION


@register
class FakeTwinHeir(FakeTwinA):
    kernel = "fake_twin_heir"  # inherits FakeTwinA's `implementation` attribute, declares none itself
