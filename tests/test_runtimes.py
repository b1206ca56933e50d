"""A backend kind's runtime starts once per process, before its first case, and is charged to that case's
resolve stage, not to its kernel's first launch."""

from __future__ import annotations

import time

import tests.fake_adapters  # noqa: F401 - registers fake_ok
from dskbench.device.info import DeviceInfo
from dskbench.execution import case as case_mod
from dskbench.execution import runtimes
from dskbench.shapes.cases import Case


def test_a_kind_starts_once_per_process_and_only_on_a_gpu(monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(runtimes, "_started", set())
    monkeypatch.setattr(runtimes, "STARTERS", {"triton": lambda: calls.append("triton")})
    runtimes.start("triton", "cpu")
    assert calls == []  # a CPU run starts no GPU runtime
    runtimes.start("triton", "cuda")
    runtimes.start("triton", "cuda")
    runtimes.start("jit", "cuda")  # a kind with nothing to start
    assert calls == ["triton"]


def test_a_start_that_fails_fails_nothing_and_is_not_tried_again(monkeypatch):
    calls: list[int] = []

    def broken() -> None:
        calls.append(1)
        raise RuntimeError("no driver")

    monkeypatch.setattr(runtimes, "_started", set())
    monkeypatch.setattr(runtimes, "STARTERS", {"triton": broken})
    runtimes.start("triton", "cuda")
    runtimes.start("triton", "cuda")
    assert calls == [1]


def test_the_start_is_charged_to_resolve_not_to_the_first_launch(monkeypatch):
    started: list[tuple[str, str]] = []

    def slow_start(kind: str, device: str) -> None:
        started.append((kind, device))
        time.sleep(0.2)

    monkeypatch.setattr(runtimes, "start", slow_start)
    case = Case("fake_ok", "input_layernorm", "decode", {"T": 4}, {"T": 4, "D": 64})
    fields, prep = case_mod.prepare_case("fake_ok", case, "fake", DeviceInfo("cpu"), 1)
    assert prep is not None, fields
    assert started == [(prep.backend.kind, "cpu")]
    assert fields["stages"]["resolve_s"] >= 0.2
