"""The run configuration of the asv and pytest-benchmark front ends, from the strings environment
variables and pytest options give (asv has no way to pass options to a benchmark)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from dskbench.execution.config import RunConfig
from dskbench.execution.items import DEFAULT_TP, SweepOptions

SWEEPS = ("decode", "prefill", "decode_graph")
MODES = ("cold", "hot", "rotate")
DEVICES = ("cuda", "cpu")

# The asv suite reads its selection from these.
ASV_ENV = {
    "device": "DSKBENCH_DEVICE",  # cuda | cpu | auto (default auto: cuda when NVML sees a GPU)
    "kernels": "DSKBENCH_ASV_KERNELS",  # comma-separated kernel names or aliases (default: all)
    "backends": "DSKBENCH_ASV_BACKENDS",  # comma-separated backend names (default: the runner's)
    "models": "DSKBENCH_ASV_MODEL",  # comma-separated models, e.g. deepseek-v3.2 (default: every op)
    "sweep": "DSKBENCH_ASV_SWEEP",  # decode, prefill, decode_graph or all (default decode,prefill)
    "quick": "DSKBENCH_ASV_QUICK",  # 1: the quick sweep points and time budget
    "tp": "DSKBENCH_ASV_TP",  # comma-separated tensor-parallel degrees (default: `dskbench run`'s)
    "mode": "DSKBENCH_ASV_MODE",  # cold | hot | rotate (default cold)
    "budget": "DSKBENCH_ASV_BUDGET",  # time budget per case, seconds
}


class SuiteError(RuntimeError):
    """A selection that cannot be planned, or a plan that cannot be made (the message says why)."""


def parse_config(
    *,
    device: str | None = None,
    kernels: str | list[str] | None = None,
    backends: str | list[str] | None = None,
    models: str | list[str] | None = None,
    sweep: str | list[str] | None = None,
    quick: str | bool | None = None,
    tp: str | list[int] | None = None,
    mode: str | None = None,
    budget: str | float | None = None,
    all_backends: bool = False,
) -> RunConfig:
    """A run configuration from strings as environment variables or command lines give them (the knobs
    of `dskbench run`; every case isolated in a worker)."""
    dev = (device or "auto").strip().lower()
    if dev == "auto":
        dev = detect_device()
    if dev not in DEVICES:
        raise SuiteError(f"device {dev!r}: choose from {', '.join(DEVICES)} or auto")
    phases = list(dict.fromkeys(_words(sweep) or ["decode", "prefill"]))
    if "all" in phases:
        phases = list(SWEEPS)
    bad = [p for p in phases if p not in SWEEPS]
    if bad:
        raise SuiteError(f"sweep {','.join(bad)}: choose from {', '.join(SWEEPS)} or all")
    try:
        tps = tuple(int(x) for x in _words(tp)) or DEFAULT_TP  # cut to the profile's at planning
    except ValueError:
        raise SuiteError(f"tp {tp!r}: expected comma-separated integers") from None
    try:
        budget_s = float(budget) if budget not in (None, "") else None
    except ValueError:
        raise SuiteError(f"budget {budget!r}: expected seconds") from None
    if budget_s is None and dev == "cpu":
        budget_s = 0.2  # as `dskbench run` on a CPU: the sweep ends in minutes
    from dskbench.shapes.models import ModelError, parse_model

    try:
        model_names = tuple(dict.fromkeys(parse_model(m) for m in _words(models)))
    except ModelError as e:
        raise SuiteError(f"model: {e}") from None
    l2_mode = (mode or "cold").strip()
    if l2_mode not in MODES:
        raise SuiteError(f"mode {l2_mode!r}: choose from {', '.join(MODES)}")
    options = SweepOptions(
        device=dev,
        phases=tuple(phases),
        profile="cpu" if dev == "cpu" else ("quick" if _truthy(quick) else "full"),
        tp=tps,
        mode=l2_mode,
        isolate=True,
        budget_s=budget_s,
    )
    return RunConfig(
        options=options,
        kernels=tuple(_words(kernels)),
        backends=tuple(_words(backends)),
        models=model_names,
        all_backends=all_backends,
    )


def config_from_env(environ: Mapping[str, str] | None = None) -> RunConfig:
    env = os.environ if environ is None else environ
    return parse_config(**{k: env.get(v) for k, v in ASV_ENV.items()})


def label(config: RunConfig) -> str:
    """How a reader should take the numbers (CPU runs time the torch reference, not a GPU kernel)."""
    if config.device == "cpu":
        return "CPU: torch reference timed on the host (plumbing check, not GPU kernel timings)"
    return f"GPU: {config.profile} sweep, {config.options.mode} L2"


def selection_info(config: RunConfig) -> dict[str, Any]:
    """The selection as the front ends' outputs record it (pytest-benchmark's machine_info)."""
    return {
        "device": config.device,
        "kernels": list(config.kernels),
        "backends": list(config.backends),
        "models": list(config.models),
        "phases": list(config.phases),
        "quick": config.profile == "quick",
        "tp": list(config.tp),
        "mode": config.options.mode,
        "budget_s": config.options.budget_s,
        "all_backends": config.all_backends,
    }


def _words(x: str | list | tuple | None) -> list[str]:
    if x is None:
        return []
    items = x.split(",") if isinstance(x, str) else [str(i) for i in x]
    return [s.strip() for s in items if s.strip()]


def _truthy(x: str | bool | None) -> bool:
    if isinstance(x, bool):
        return x
    return (x or "").strip().lower() in ("1", "true", "yes", "on")


def detect_device() -> str:
    """cuda when NVML sees a GPU, else cpu. NVML, not torch: asv processes must stay import-light."""
    from dskbench.frontends.asv.machine import read_gpus

    try:
        return "cuda" if read_gpus() else "cpu"
    except Exception:  # no NVML library, no driver
        return "cpu"
