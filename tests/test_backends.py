"""Backend resolution across package layouts (fake modules), fallbacks, gating messages."""

from __future__ import annotations

import sys
import types

import pytest

from dskbench.adapters.backends import (
    SM100,
    Backend,
    Requirement,
    Unavailable,
    distribution_of,
    import_target,
    resolve,
)
from dskbench.device.info import DeviceInfo

H100 = DeviceInfo("cuda", "NVIDIA H100 80GB HBM3", 90, 1)
B200 = DeviceInfo("cuda", "NVIDIA B200", 100, 8)
CPU = DeviceInfo("cpu")


def _bind(fn, inputs, case):
    return lambda: fn()


@pytest.fixture()
def fake_packages(monkeypatch):
    """new_pkg.ops.kernel exists (the kernel's current home); old_pkg.gemm has lost it."""
    new = types.ModuleType("new_pkg")
    ops = types.ModuleType("new_pkg.ops")
    ops.kernel = lambda: "new"
    ops.Namespace = types.SimpleNamespace(inner=lambda: "inner")
    new.ops = ops
    old = types.ModuleType("old_pkg")
    old_gemm = types.ModuleType("old_pkg.gemm")
    old.gemm = old_gemm
    for name, mod in {"new_pkg": new, "new_pkg.ops": ops, "old_pkg": old, "old_pkg.gemm": old_gemm}.items():
        monkeypatch.setitem(sys.modules, name, mod)


def test_resolves_the_target_and_records_what_loaded(fake_packages):
    b = Backend("x", "new_pkg.ops:kernel", "some-dist", "aot", _bind)
    r = resolve(b)
    assert r.fn() == "new" and r.target == "new_pkg.ops:kernel" and r.package == "some-dist"
    assert import_target("new_pkg.ops:Namespace.inner")() == "inner"  # dotted attribute paths


def test_a_moved_kernel_resolves_through_its_fallback(fake_packages):
    b = Backend("x", "old_pkg.gemm:kernel", None, "aot", _bind, fallbacks=("new_pkg.ops:kernel",))
    r = resolve(b)
    assert r.target == "new_pkg.ops:kernel" and r.fn() == "new"


def test_nothing_found_says_not_available_and_what_was_tried(fake_packages):
    b = Backend("x", "old_pkg.gemm:kernel", None, "aot", _bind, fallbacks=("missing_pkg_zz:kernel",))
    with pytest.raises(Unavailable) as e:
        resolve(b)
    msg = str(e.value)
    assert msg.startswith("not available in this install:")
    assert (
        "old_pkg.gemm:kernel: AttributeError" in msg and "missing_pkg_zz:kernel: ModuleNotFoundError" in msg
    )


def test_bad_target_strings_are_reported():
    with pytest.raises(Unavailable, match="expected 'module:attr'"):
        import_target("no_colon_here")


def test_torch_ops_targets_resolve_after_preload():
    import torch

    op = import_target("torch.ops.aten.add.Tensor")
    assert op(torch.ones(2), torch.ones(2)).tolist() == [2.0, 2.0]


def test_distribution_of_targets():
    assert distribution_of("sgl_kernel.gemm:bmm_fp8") == "sglang-kernel"
    assert distribution_of("torch.ops.sgl_kernel.rmsnorm.default") == "sglang-kernel"
    assert distribution_of("flashinfer.norm:rmsnorm") == "flashinfer-python"
    assert distribution_of("sglang.jit_kernel.norm:rmsnorm") == "sglang"
    assert distribution_of("somewhere_else:fn") is None


def test_gating_messages():
    assert SM100.reason_unmet(H100) == "needs sm100/sm103 (found sm90)"
    assert SM100.reason_unmet(B200) is None
    assert (
        Requirement(min_sm=90).reason_unmet(DeviceInfo("cuda", "A100", 80, 1)) == "needs sm90+ (found sm80)"
    )
    assert Requirement(gpus=8).reason_unmet(H100) == "needs 8 GPUs (found 1)"
    assert Requirement(gpus=8).reason_unmet(B200) is None
    assert Requirement().reason_unmet(CPU) == "needs a CUDA GPU (found no CUDA GPU)"
    assert Requirement(cuda=False).reason_unmet(CPU) is None
    assert SM100.reason_unmet(CPU) == "needs sm100 (found no CUDA GPU)"  # the first window, as before
    assert Requirement(min_sm=90).reason_unmet(CPU) == "needs sm90+ (found no CUDA GPU)"


def test_requirements_are_or_sets_of_capability_windows():
    either = Requirement(windows=((90, 90), (100, 103)))
    assert either.allows(90) and either.allows(101) and either.allows(103)
    assert not either.allows(89) and not either.allows(95) and not either.allows(120)
    assert either.reason_unmet(DeviceInfo("cuda", "RTX", 120, 1)) == "needs sm90/sm100-103 (found sm120)"
    assert either.reason_unmet(B200) is None
    # the shorthands become windows: an exact list is one window per capability, min_sm an open one
    assert SM100.windows == ((100, 100), (103, 103)) and not SM100.allows(101)
    assert Requirement(min_sm=89).windows == ((89, None),) and Requirement(min_sm=89).allows(121)
    assert Requirement(sm=(90, 100), min_sm=100).windows == ((100, 100),)
    assert Requirement().windows == () and Requirement().allows(75)
    with pytest.raises(ValueError, match="no capability"):
        Requirement(sm=(90,), min_sm=100)


def test_unknown_kind_is_rejected():
    with pytest.raises(ValueError, match="unknown kind"):
        Backend("x", "a:b", None, "magic", _bind)
