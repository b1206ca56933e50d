"""How long a case may run before its worker is killed as hung.

A case's limit is scaled from its expected time (cost.item_cost): FACTOR times it, never below
FLOOR_S. The first item of a (kernel, backend, variant) in a worker process gets a first-use
allowance more (FIRST_USE_S by default: imports, Triton compilation and autotuning in the process,
in-process JIT compilers such as CuTe DSL's, which start no child process to be seen). A JIT build that
runs compilers (nvcc, ninja: child processes of the worker) does not count against any limit, up to a
build grace past it (CaseLimits.build_grace): a hung kernel starts no compiler. Starting a worker (imports, CUDA context)
has its own limit. `--case-timeout S` (or DSKBENCH_CASE_TIMEOUT_S) replaces the scaled limit by a
flat one, S seconds for every case, first uses included, unless `--first-use-allowance S` is given
too; 0 turns the watch off.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from dskbench.execution.items import WorkItem

CASE_TIMEOUT_ENV = "DSKBENCH_CASE_TIMEOUT_S"  # seconds; 0 disables
CASE_TIMED_OUT = "timed out: no result within"  # how the reason of a case killed at its limit begins
FLOOR_S = 60.0
FACTOR = 10.0
FIRST_USE_S = 120.0
STARTUP_S = 300.0
BUILD_GRACE_S = 900.0  # past its limit, a case may go on at least this long while its worker runs compilers
BUILD_GRACE_FACTOR = 3.0  # ... and this many times its (kernel, backend)'s recorded build seconds


class LimitError(ValueError):
    """A case time-out that is not a number of seconds >= 0."""


def parse_timeout(raw: str, what: str) -> float:
    """Seconds >= 0 from a flag or an environment variable; a one-line error otherwise."""
    try:
        value = float(raw)
    except ValueError:
        raise LimitError(f"{what}: expected seconds (a number >= 0, 0 = no limit), got {raw!r}") from None
    if not math.isfinite(value) or value < 0:
        raise LimitError(f"{what}: expected seconds (a number >= 0, 0 = no limit), got {raw!r}")
    return value


def timeout_from_env(environ: Mapping[str, str] | None = None) -> float | None:
    """DSKBENCH_CASE_TIMEOUT_S when set (a flat limit, 0 = off), else None (scaled limits)."""
    raw = (os.environ if environ is None else environ).get(CASE_TIMEOUT_ENV, "").strip()
    return parse_timeout(raw, CASE_TIMEOUT_ENV) if raw else None


@dataclass(frozen=True)
class CaseLimits:
    """Per-case hang limits. `flat_s`: a flat limit replacing the scaled one (0 = no watch at all)."""

    expected_s: Callable[[WorkItem], float] = lambda item: 0.0
    flat_s: float | None = None
    startup_s: float = STARTUP_S
    first_use_s: float = FIRST_USE_S  # added to the first item of a (kernel, backend, variant)
    build_s: Callable[[WorkItem], float] = lambda item: 0.0  # recorded build seconds of its (kernel, backend)

    @property
    def off(self) -> bool:
        return self.flat_s == 0

    def for_item(self, item: WorkItem, first_use: bool) -> float:
        """Seconds `item` may take from its start to its result."""
        first = self.first_use_s if first_use else 0.0
        if self.flat_s is not None:
            return self.flat_s + first
        try:
            expected = max(0.0, float(self.expected_s(item)))
        except Exception:  # noqa: BLE001 - an estimate: a broken one must not stop the sweep
            expected = 0.0
        return max(FLOOR_S, FACTOR * expected) + first

    def build_grace(self, item: WorkItem) -> float:
        """How long past its limit `item` may go on while its worker runs compilers: BUILD_GRACE_S, or
        BUILD_GRACE_FACTOR times its (kernel, backend)'s recorded build seconds where that is longer.
        FlashInfer's CUTLASS fused-MoE module alone compiled for more than 18 minutes on a busy host: a fixed
        grace would kill it every time, and the sweep would never measure it."""
        try:
            recorded = max(0.0, float(self.build_s(item)))
        except Exception:  # noqa: BLE001 - an estimate: a broken one must not stop the sweep
            recorded = 0.0
        return max(BUILD_GRACE_S, BUILD_GRACE_FACTOR * recorded)

    def describe(self) -> str:
        if self.off:
            return "off"
        first = f", +{self.first_use_s:g} s for a first use" if self.first_use_s else ""
        if self.flat_s is not None:
            return f"{self.flat_s:g} s per case{first}"
        return f"max({FLOOR_S:g} s, {FACTOR:g} x expected) per case{first}"


def first_use_allowance(flat_s: float | None, asked_s: float | None) -> float:
    """The first-use allowance of a run: as asked (--first-use-allowance), else FIRST_USE_S with scaled
    limits and none with a flat one (--case-timeout S means S)."""
    if asked_s is not None:
        return asked_s
    return 0.0 if flat_s is not None else FIRST_USE_S
