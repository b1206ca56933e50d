"""A front end's plan: kernel -> its work items in a stable order, each addressed by its case key."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from dskbench.execution.config import RunConfig
from dskbench.frontends.suite.config import SuiteError

KEY_SEP = "|"


@dataclass
class Plan:
    """kernel -> its work items (the runner's WorkItem fields but the index), in a stable order."""

    config: RunConfig
    kernels: dict[str, list[dict[str, Any]]]
    skipped: list[dict[str, Any]]  # kernels the runner skipped at planning, with the reason

    def keys(self, kernel: str) -> list[str]:
        return [item_key(it) for it in self.kernels[kernel]]

    def items(self, kernel: str, keys: set[str] | None = None) -> list[dict[str, Any]]:
        return [it for it in self.kernels[kernel] if keys is None or item_key(it) in keys]

    def kernel_of(self) -> dict[str, str]:
        return {item_key(it): k for k, its in self.kernels.items() for it in its}

    def to_json(self) -> dict[str, Any]:
        return {"config": self.config.to_json(), "kernels": self.kernels, "skipped": self.skipped}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Plan:
        return cls(RunConfig.from_json(d["config"]), d["kernels"], d["skipped"])


def case_key(case_id: str, backend: str) -> str:
    return f"{case_id}{KEY_SEP}{backend}"


def item_key(item: dict[str, Any]) -> str:
    from dskbench.shapes.cases import Case

    return case_key(Case.from_json(item["case"]).id, item["backend"])


def make_plan(config: RunConfig) -> Plan:
    """Plan in this process: imports the registry and the adapters (and so torch)."""
    from dskbench import paths
    from dskbench.execution.config import plan_run
    from dskbench.execution.items import PlanError
    from dskbench.execution.selection import SelectionError
    from dskbench.registry.load import load_registry
    from dskbench.shapes.cases import default_shapes

    registry = load_registry(paths.REGISTRY_DIR)
    shapes = default_shapes()
    # the default tp as `dskbench run` takes it (the profile's degrees of 1, 4, 8); the plan keeps the
    # config it was made with, which the front ends then measure with (and record)
    config = config.with_swept_tp(shapes.values("tp", config.profile))
    try:
        items, skips = plan_run(config, registry, shapes)
    except (PlanError, SelectionError) as e:
        raise SuiteError(str(e)) from None
    kernels: dict[str, list[dict[str, Any]]] = {}
    seen: set[str] = set()
    for it in items:
        d = {k: v for k, v in dataclasses.asdict(it).items() if k != "index"}  # every WorkItem field
        key = item_key(d)
        if key not in seen:  # asv params must be unique
            seen.add(key)
            kernels.setdefault(it.kernel, []).append(d)
    return Plan(config, dict(sorted(kernels.items())), skips)
