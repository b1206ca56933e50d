"""pytest-benchmark front end of dskbench: one test per (kernel case, backend), statistics from GPU samples.

Run it explicitly (pyproject's testpaths keeps it out of the unit tests, which must stay fast):

    pytest bench --dskbench-sweep decode --dskbench-kernel rmsnorm --benchmark-json out.json
    pytest bench --benchmark-autosave ...; later: pytest bench --benchmark-compare --benchmark-compare-fail=median:5%

Tests are parametrised from the same plan as the asv suite (dskbench.frontends.suite). The first test of a kernel
measures all of that kernel's selected cases in one isolated worker through the runner (the one
measurement core); each test then replays its case's samples into pytest-benchmark
(dskbench.frontends.pytest_bench.replay), so
min/median/IQR/compare are statistics of GPU time, not of the host. Without a GPU it times the torch
reference on the CPU, says so in the header, the machine info and every extra_info, and the GPU
backends are skipped with the runner's reason.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import pytest

if importlib.util.find_spec("dskbench") is None:  # plain `pytest bench` in a checkout, not installed
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dskbench.execution.config import RunConfig  # noqa: E402
from dskbench.frontends.suite.config import SuiteError, label, parse_config, selection_info  # noqa: E402
from dskbench.frontends.suite.measure import measure_kernel  # noqa: E402
from dskbench.frontends.suite.plan import Plan  # noqa: E402
from dskbench.frontends.suite.plan_cache import load_plan  # noqa: E402


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("dskbench", "dskbench case selection")
    g.addoption("--dskbench-kernel", action="append", help="kernel name or alias (repeatable; default all)")
    g.addoption("--dskbench-backend", action="append", help="backend name (repeatable)")
    g.addoption("--dskbench-model", action="append", help="only ops this model runs, e.g. deepseek-v3.2")
    g.addoption("--dskbench-sweep", action="append", help="decode, prefill, decode_graph or all")
    g.addoption("--dskbench-device", default=os.environ.get("DSKBENCH_DEVICE"), help="cuda, cpu or auto")
    g.addoption("--dskbench-quick", action="store_true", help="quick sweep points and time budget")
    g.addoption("--dskbench-tp", help="tensor-parallel degrees, e.g. 1,8")
    g.addoption("--dskbench-mode", help="cold (default), hot or rotate")
    g.addoption("--dskbench-budget", help="time budget per case, seconds")
    g.addoption(
        "--dskbench-jsonl-dir",
        type=Path,
        help="keep each kernel's JSON lines here (default results/pytest-jsonl/)",
    )


class _Session:
    """The plan and the per-kernel measurements of one pytest session."""

    def __init__(self, config: pytest.Config):
        opt = config.getoption
        config = parse_config(
            device=opt("dskbench_device"),
            kernels=opt("dskbench_kernel"),
            backends=opt("dskbench_backend"),
            models=opt("dskbench_model"),
            sweep=opt("dskbench_sweep"),
            quick=opt("dskbench_quick"),
            tp=opt("dskbench_tp"),
            mode=opt("dskbench_mode"),
            budget=opt("dskbench_budget"),
        )
        # On a CPU, plan the GPU backends too: they show up as skipped tests with the runner's reason.
        self.config = dataclasses.replace(config, all_backends=config.device == "cpu")
        self._plan: Plan | None = None
        self._kernel_of: dict[str, str] = {}
        self.selected: dict[str, set[str]] = {}
        self.measured: dict[str, dict[str, Any]] = {}
        from dskbench import paths

        self.keep_dir = opt("dskbench_jsonl_dir") or paths.RESULTS_DIR / "pytest-jsonl"

    @property
    def plan(self) -> Plan:
        if self._plan is None:
            self._plan = load_plan(self.config)
            self._kernel_of = self._plan.kernel_of()
        return self._plan

    def kernel_of(self, key: str) -> str | None:
        self.plan  # noqa: B018 - loads the plan and its key index
        return self._kernel_of.get(key)

    def result(self, key: str) -> dict[str, Any]:
        kernel = self.kernel_of(key)
        if kernel not in self.measured:
            keys = self.selected.get(kernel) or {key}
            # the plan's config: the default tp cut to the profile's degrees, as `dskbench run` does
            planned = self.plan.config
            self.measured[kernel] = measure_kernel(
                kernel, self.plan.items(kernel, keys), planned, keep_dir=self.keep_dir
            )
        rec = self.measured[kernel]["cases"].get(key)
        if rec is None:
            pytest.fail(f"{key}: the runner returned no result for this case")
        return {**rec, "jsonl": self.measured[kernel]["jsonl"]}


def _session(config: pytest.Config) -> _Session:
    s = getattr(config, "_dskbench", None)
    if s is None:
        s = config._dskbench = _Session(config)
    return s


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "dsk_case" in metafunc.fixturenames:
        plan = _session(metafunc.config).plan
        keys = [k for kernel in plan.kernels for k in plan.keys(kernel)]
        metafunc.parametrize("dsk_case", keys, ids=keys)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Measure only the cases that survived -k/deselection, a kernel at a time."""
    s = getattr(session.config, "_dskbench", None)
    if s is None:
        return
    for item in session.items:
        callspec = getattr(item, "callspec", None)
        key = callspec.params.get("dsk_case") if callspec else None
        kernel = s.kernel_of(key) if key else None
        if kernel:
            s.selected.setdefault(kernel, set()).add(key)


@pytest.fixture
def dsk_result(request: pytest.FixtureRequest, dsk_case: str) -> dict[str, Any]:
    return _session(request.config).result(dsk_case)


@pytest.fixture
def dsk_config(request: pytest.FixtureRequest) -> RunConfig:
    return _session(request.config).config


def pytest_report_header(config: pytest.Config) -> str:
    run = _session(config).config
    return f"dskbench: {label(run)}; sweeps {','.join(run.phases)}, profile {run.profile}"


def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict[str, Any]) -> None:
    """GPU identity next to pytest-benchmark's host info (its machine_id has no GPU in it)."""
    from dskbench.frontends.asv.machine import read_gpus

    s = _session(config)
    try:
        run = s.plan.config  # the tp degrees measured (the same whenever this runs: save or compare)
    except SuiteError:
        run = s.config  # the selection cannot be planned: collection says why
    try:
        gpus = read_gpus()
    except Exception as e:  # no NVML on this box
        gpus, machine_info["nvml_error"] = [], f"{type(e).__name__}: {e}"
    machine_info["gpu"] = gpus[0] if gpus else None
    machine_info["gpu_count"] = len(gpus)
    machine_info["dskbench"] = {"device": run.device, "label": label(run), "selection": selection_info(run)}
