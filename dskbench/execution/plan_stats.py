"""How big a sweep is before it runs: the work items of each profile at the TP degrees asked, how many of
them are measured once twins share a measurement (dskbench.execution.twins), and how many of those a GPU
of each architecture runs (the rest it records as skipped, in moments).

    dskbench plan-stats [--profile full --profile quick] [--tp 1,4,8] [--gpu SM[:GIB]]... [--json OUT]

`--gpu 90:80` is a GPU of compute capability 9.0 with 80 GiB (an H100 shows about that); the memory is
what the gate's memory rule reads, omitted: not checked. Default: 90:80 and 100:180. Planning and gating
only: nothing is measured and no GPU is needed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dskbench.adapters import get_adapter
from dskbench.device.info import DeviceInfo
from dskbench.execution.gate import why_not
from dskbench.execution.items import SweepOptions, WorkItem
from dskbench.execution.runner import plan_sweep
from dskbench.execution.twins import measure_once
from dskbench.shapes.cases import Case, ModelShapes

DEFAULT_GPUS = ("90:80", "100:180")


def parse_gpu(spec: str) -> tuple[str, DeviceInfo]:
    """`SM[:GIB]` -> ("smSM", a one-GPU DeviceInfo of that architecture and memory)."""
    sm, _, gib = spec.partition(":")
    try:
        memory = int(float(gib) * 2**30) if gib else None
        return f"sm{int(sm)}", DeviceInfo("cuda", f"sm{int(sm)}", int(sm), 1, memory)
    except ValueError:
        raise ValueError(f"--gpu {spec!r}: expected SM[:GIB], e.g. 90:80") from None


def runs_on(item: WorkItem, device: DeviceInfo, adapters: dict[str, Any]) -> bool:
    """Whether the gate lets the item run on the device (dskbench.execution.gate.why_not)."""
    adapter = adapters.setdefault(item.kernel, get_adapter(item.kernel))
    backend = next(b for b in adapter.all_backends() if b.name == item.backend)
    return why_not(adapter, backend, Case.from_json(item.case), device) is None


def plan_rows(
    registry: Mapping[str, Any],
    shapes: ModelShapes,
    profiles: Sequence[str],
    tp: tuple[int, ...],
    gpus: Mapping[str, DeviceInfo],
) -> list[dict[str, Any]]:
    """One row per profile: items planned, items measured after twins, and of those, what each GPU runs."""
    adapters: dict[str, Any] = {}
    rows = []
    for profile in profiles:
        items, _ = plan_sweep(
            dict(registry), shapes, sorted(registry), None, SweepOptions(profile=profile, tp=tp)
        )
        measured, _ = measure_once(items)
        row: dict[str, Any] = {
            "profile": profile,
            "tp": list(tp),
            "items": len(items),
            "measured": len(measured),
        }
        row["runs_on"] = {
            name: sum(runs_on(it, dev, adapters) for it in measured) for name, dev in gpus.items()
        }
        rows.append(row)
    return rows


def line(row: Mapping[str, Any]) -> str:
    """One profile's row as printed."""
    gpus = ", ".join(f"{name} runs {n}" for name, n in row["runs_on"].items())
    tp = ",".join(map(str, row["tp"]))
    copied = row["items"] - row["measured"]
    return f"{row['profile']} tp {tp}: {row['items']} items, {row['measured']} measured ({copied} copy a twin); {gpus}"
