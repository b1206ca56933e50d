"""Test helper, not a product backend: adds a known extra delay to chosen cases' timed launches, so a
real run on a GPU can check that dskbench compare catches a slowdown of known size.

Loaded in the runner's processes through ``DSKBENCH_EXTRA_ADAPTERS=tests.delay_adapters``. It reads
``DSKBENCH_TEST_DELAYS``, a JSON file::

    {"delays": [{"kernel": "rmsnorm", "backend": "sgl_kernel", "case_id": "...", "cycles": 1234,
                 "us": 0.5}, ...],
     "bound_log": "/path/bound.jsonl"}

and wraps the named backends' binders of the real adapters: after the kernel, the launcher runs
``torch.cuda._sleep(cycles)`` on the same stream (captured into the case's CUDA graph with the kernel),
or on a CPU run spins ``us`` microseconds. Backend and case names are unchanged, so the delayed run
compares case by case with an undelayed one. Each delayed launcher, when bound, appends a line to
``bound_log`` (when given): proof that the delay reached the measuring process. tests/gpu_delay_check.py
writes the file (cycles from a calibration of the sleep on the GPU) and runs both.
"""

from __future__ import annotations

import importlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import dskbench.adapters as registry
from dskbench.adapters.backends import Backend

ENV = "DSKBENCH_TEST_DELAYS"


def spin(us: float) -> None:
    """Busy-wait `us` microseconds on the host (the CPU run's delay)."""
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def gpu_sleep(cycles: int) -> None:
    import torch

    torch.cuda._sleep(int(cycles))


def delayed(bind: Callable, delays: dict[str, dict[str, Any]], log: str | None = None) -> Callable:
    """`bind` whose launcher, for a case in `delays`, adds that case's delay after the kernel."""

    def bound(fn: Any, inputs: dict[str, Any], case: Any) -> Callable[[], Any]:
        launch = bind(fn, inputs, case)
        d = delays.get(case.id)
        if not d:
            return launch
        on_gpu = str(getattr(next(iter(_tensors(inputs)), None), "device", "cpu")).startswith("cuda")
        if log:
            with open(log, "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"case_id": case.id, "gpu": on_gpu, "pid": os.getpid()}) + "\n")

        def run() -> Any:
            out = launch()
            if on_gpu:
                gpu_sleep(d["cycles"])
            else:
                spin(d["us"])
            return out

        return run

    return bound


def _tensors(inputs: dict[str, Any]):
    for v in inputs.values():
        if hasattr(v, "device") and hasattr(v, "dtype"):
            yield v


def install(spec: dict[str, Any]) -> list[str]:
    """Wrap the binders named in `spec`; returns 'kernel/backend' of each wrapped backend."""
    for mod in registry.adapter_modules():
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError:
            continue
    by_backend: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for d in spec.get("delays") or []:
        by_backend.setdefault((d["kernel"], d["backend"]), {})[d["case_id"]] = d
    log = spec.get("bound_log")
    done = []
    for (kernel, backend), cases in by_backend.items():
        cls = registry._REGISTRY.get(kernel)
        if cls is None:
            continue
        cls.backends = [
            replace(b, bind=delayed(b.bind, cases, log)) if b.name == backend else b for b in cls.backends
        ]
        if backend == "torch-ref":
            ref = cls.reference_backend

            def reference_backend(self: Any, _ref: Callable = ref, _cases: dict = cases) -> Backend:
                b = _ref(self)
                return replace(b, bind=delayed(b.bind, _cases, log))

            cls.reference_backend = reference_backend  # type: ignore[method-assign]
        done.append(f"{kernel}/{backend}")
    return done


if os.environ.get(ENV):
    with open(os.environ[ENV], encoding="utf-8") as fh:
        install(json.load(fh))
