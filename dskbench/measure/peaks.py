"""Datasheet peaks per GPU: HBM bandwidth and dense (no 2:4 sparsity) tensor-core rates.

They are the denominator of every "% of peak" (metrics.py): a fixed number per GPU model, so that a %
means the same on every run and every host. The run's measured ceilings (ceilings.py) are reported beside
them; they vary with clocks, heat and other tenants, and a kernel can beat a ceiling measured on a bad day.

The numbers live in dskbench/data/peaks/datasheet.yaml, one entry per GPU model with the NVIDIA document
each figure comes from; this module only reads that file and matches device names against it.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

PEAKS_FILE = Path(__file__).resolve().parent.parent / "data" / "peaks" / "datasheet.yaml"
RATES = ("fp64", "tf32", "bf16", "fp16", "fp8", "int8", "fp4")


class PeaksError(ValueError):
    """The peaks file breaks its layout (the message names the entry and key)."""


@functools.lru_cache(maxsize=4)
def load_peaks(path: Path = PEAKS_FILE) -> tuple[tuple[tuple[re.Pattern[str], ...], dict[str, Any]], ...]:
    """((compiled name patterns, flat peaks), ...) in file order, checked."""
    import yaml

    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise PeaksError(f"{path}: cannot read the datasheet peaks: {e}") from None
    gpus = doc.get("gpus") if isinstance(doc, dict) else None
    if not isinstance(gpus, list) or not gpus:
        raise PeaksError(f"{path}: expected a non-empty list under 'gpus'")
    return tuple(_entry(path, i, g) for i, g in enumerate(gpus))


def _entry(path: Path, i: int, g: Any) -> tuple[tuple[re.Pattern[str], ...], dict[str, Any]]:
    where = f"{path}: gpus[{i}]"
    if not isinstance(g, dict) or not isinstance(g.get("name"), str):
        raise PeaksError(f"{where}: expected a mapping with a 'name'")
    where = f"{path}: gpus[{i}] ({g['name']})"
    for key in ("match", "source", "hbm_gbps", "tflops"):
        if key not in g:
            raise PeaksError(f"{where}: missing '{key}'")
    if not isinstance(g["match"], list) or not g["match"]:
        raise PeaksError(f"{where}: 'match' must be a list of regular expressions")
    try:
        patterns = tuple(re.compile(p) for p in g["match"])
    except (re.error, TypeError) as e:
        raise PeaksError(f"{where}: bad 'match' pattern: {e}") from None
    tflops = g["tflops"]
    if not isinstance(tflops, dict) or set(tflops) - set(RATES):
        raise PeaksError(f"{where}: 'tflops' keys must be among {', '.join(RATES)}")
    flat: dict[str, Any] = {"name": g["name"], "hbm_gbps": _number(where, "hbm_gbps", g["hbm_gbps"])}
    for rate in RATES:
        flat[f"{rate}_tflops"] = _number(where, f"tflops.{rate}", tflops.get(rate))
    flat["source"] = str(g["source"]).strip()
    return patterns, flat


def _number(where: str, key: str, v: Any) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or v <= 0:
        raise PeaksError(f"{where}: '{key}' must be a positive number or null, got {v!r}")
    return float(v)


def datasheet_peaks(gpu_name: str | None) -> dict[str, Any] | None:
    """Dense datasheet peaks for a device name as torch/NVML report it ("NVIDIA H100 80GB HBM3",
    "NVIDIA H200", "NVIDIA B200", "NVIDIA GB200"): {name, hbm_gbps, <rate>_tflops for each of RATES,
    source}; None for a name not in the file, and for a MIG slice (no datasheet gives a slice's peaks)."""
    if not gpu_name:
        return None
    low = " ".join(gpu_name.lower().split())
    if re.search(r"\bmig\b", low):
        return None
    for patterns, peaks in load_peaks():
        if any(p.search(low) for p in patterns):
            return dict(peaks)
    return None
