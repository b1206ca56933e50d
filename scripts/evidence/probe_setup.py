"""What the one-process GPU probes (timer_probe.py, neighbor_probe.py, placement_probe.py) share: the
GPU, the shapes and registry, timing settings with this GPU's calibrated launch gap, each case's seed,
and preparing their named cases."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def seeds_from(path: Path | None) -> dict[str, int]:
    """case id -> the seed its record ran with (a results file's records); {} without a file."""
    if path is None:
        return {}
    from dskbench.results.io import read_runs

    seeds: dict[str, int] = {}
    for run in read_runs([path]):
        for r in run.results:
            if isinstance(r.get("seed"), int):
                seeds.setdefault(str(r.get("case_id")), r["seed"])
    return seeds


@dataclass
class Probe:
    device: Any
    shapes: Any
    registry: Any
    settings: Any  # MeasureSettings with the calibrated launch gap
    gap: dict[str, Any]
    seeds: dict[str, int] = field(default_factory=dict)

    def prepare(self, spec: tuple) -> tuple[str, Any]:
        """(case id, Prepared) of a case named as (kernel, op[:variant], phase, point, backend), with its
        seed; (why not, None) when it does not prepare."""
        from dskbench.execution.fidelity import prepare_named

        return prepare_named(self.shapes, self.registry, spec, self.device, self.seeds)

    def per_case(self, prep: Any) -> Any:
        """The case timed cold by the per-case event timer: its Measurement, or why not."""
        from dskbench import measure as core

        return core.measure(
            [prep.launch], device="cuda", mode="cold", capturable=True, settings=self.settings
        )

    def batched(self, preps: list[Any]) -> list[Any]:
        """The cases sampled together by the batched timer: a Measurement, or why not, for each."""
        from dskbench.measure import batch

        return batch.measure_batch([[p.launch] for p in preps], device="cuda", settings=self.settings)

    def prepare_all(self, specs: list[tuple]) -> list[tuple[str, Any]]:
        """(case id, Prepared) of each case that prepares; why not, printed, for the others."""
        out = []
        for spec in specs:
            case_id, prep = self.prepare(spec)
            if prep is None:
                print(case_id)
            else:
                out.append((case_id, prep))
        return out


def setup(script: str, seeds: Path | None = None) -> Probe | None:
    """The probe's set-up on a CUDA GPU; None after one line on stderr naming the script when there is no
    GPU or the seeds' results file cannot be read."""
    from dskbench import measure as core
    from dskbench.device.info import DeviceInfo
    from dskbench.registry.load import load_registry
    from dskbench.results.io import ResultsError
    from dskbench.shapes.cases import default_shapes

    try:
        case_seeds = seeds_from(seeds)
    except (OSError, ValueError, ResultsError) as e:
        print(f"{script}: {e}", file=sys.stderr)
        return None
    device = DeviceInfo.detect("cuda")
    if device.kind != "cuda":
        print(f"{script}: needs a CUDA GPU", file=sys.stderr)
        return None
    gap = core.calibrate_launch_gap()
    settings = core.settings_with_gap(core.MeasureSettings(), {"launch_gap": gap})
    return Probe(device, default_shapes(), load_registry(), settings, gap, case_seeds)


def setup_from_argv(script: str, doc: str) -> Probe | None:
    """A probe's command line parsed (`--seeds-from RESULTS`, its docstring's first line as help), then
    setup(): how each probe that times a sweep's cases starts."""
    import argparse

    ap = argparse.ArgumentParser(prog=script, description=doc.splitlines()[0])
    ap.add_argument("--seeds-from", type=Path, help="results file whose records give each case's seed")
    return setup(script, ap.parse_args().seeds_from)
