"""A case's torch reference is computed once for all its backends: they get the same inputs (one seed per
case), and a kept copy of the reference serves the next backend, unharmed by a backend that writes its
inputs in place."""

from __future__ import annotations

import torch

import tests.fake_adapters  # noqa: F401 - registers fake_ok
from dskbench.adapters import get_adapter
from dskbench.adapters.backends import CPU_OK, Backend
from dskbench.device.info import DeviceInfo
from dskbench.execution import case as case_mod
from dskbench.execution.items import case_seed
from dskbench.execution.reference_cache import REFERENCES, ReferenceCache
from dskbench.shapes.cases import Case
from tests.fake_adapters import _rms

CPU = DeviceInfo("cpu")


def _case(t: int) -> Case:
    return Case("fake_ok", "input_layernorm", "decode", {"T": t}, {"T": t, "D": 64})


def test_one_seed_per_case_whatever_the_backend():
    assert case_seed(7, "k/op/decode/T=1") == case_seed(7, "k/op/decode/T=1")
    assert case_seed(7, "k/op/decode/T=1") != case_seed(7, "k/op/decode/T=2")
    assert case_seed(7, "k/op/decode/T=1") != case_seed(8, "k/op/decode/T=1")


def test_the_cache_keeps_a_copy_of_the_last_reference_only():
    cache = ReferenceCache(limit_bytes=1 << 20)
    ref = {"out": torch.ones(4), "lse": (torch.zeros(2), 3)}
    cache.put("a", ref)
    ref["out"].mul_(5)  # the original written after it was kept (a backend's in-place write to a view)
    kept = cache.get("a")
    assert torch.equal(kept["out"], torch.ones(4)) and kept["lse"][1] == 3
    assert cache.get("b") is None
    cache.put("b", torch.ones(2))
    assert cache.get("a") is None and cache.get("b") is not None and cache.hits == 2
    cache.put("big", torch.ones(1 << 19))  # 2 MiB of fp32: over the limit, not kept
    assert cache.get("big") is None and cache.get("b") is None


def test_the_backends_of_a_case_share_its_reference(monkeypatch):
    adapter = get_adapter("fake_ok")
    calls = []
    real = type(adapter).reference

    def counting(self, inputs, case):
        calls.append(case.id)
        return real(self, inputs, case)

    def bind_in_place(fn, inputs, case):  # the kernel overwrites its input, as in-place kernels do
        def launch():
            out = _rms(inputs["x"], inputs["w"])
            inputs["x"].zero_()
            return out

        return launch

    in_place = Backend("inplace", "dskbench.shapes.cases:Case", None, "torch", bind_in_place, requires=CPU_OK)
    fake = next(b for b in adapter.all_backends() if b.name == "fake")
    monkeypatch.setattr(type(adapter), "reference", counting)
    monkeypatch.setattr(adapter, "all_backends", lambda: [in_place, fake])
    monkeypatch.setattr(case_mod, "get_adapter", lambda name: adapter)
    REFERENCES.clear()
    one, two = _case(4), _case(8)
    seed = case_seed(7, one.id)
    for backend in ("inplace", "fake"):
        fields, prep = case_mod.prepare_case("fake_ok", one, backend, CPU, seed)
        assert prep is not None and fields["check"]["error"] < 1e-6, fields
    assert calls == [one.id]  # computed for the first backend, kept for the second
    case_mod.prepare_case("fake_ok", two, "fake", CPU, case_seed(7, two.id))
    assert calls == [one.id, two.id]  # another case: its own reference
