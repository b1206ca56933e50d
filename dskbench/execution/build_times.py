"""Build seconds: the ones shipped with dskbench (data/build_seconds.json) and those an earlier
`dskbench warm --out` recorded. They order the builds (longest first), set a build's grace and, with
`--defer-builds-over`, leave out the longest (deferred_by, deferred_builds)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dskbench.execution.items import WorkItem


class WarmError(ValueError):
    """Bad input to warm; the message is one line for the user."""


def read_build_times(path: Path) -> dict[tuple[str, str], float]:
    """(kernel, backend) -> the longest first-launch seconds in an earlier `dskbench warm --out` file."""
    import json

    try:
        doc = json.loads(path.read_text())
        rows = doc["results"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise WarmError(f"{path}: not a `dskbench warm --out` file ({e})") from e
    out: dict[tuple[str, str], float] = {}
    for r in rows:
        if not isinstance(r, dict):
            continue
        took = r.get("build_s") if isinstance(r.get("build_s"), int | float) else r.get("first_launch_s")
        if isinstance(took, int | float):
            key = (str(r.get("kernel")), str(r.get("backend")))
            out[key] = max(out.get(key, 0.0), float(took))
    return out


def packaged_build_times() -> dict[tuple[str, str], float]:
    """(kernel, backend) -> build seconds as shipped with dskbench (data/build_seconds.json: one
    measured warm-up's long builds), the order for a box with no warm-up of its own yet."""
    import json

    from dskbench.paths import PACKAGE_DIR

    doc = json.loads((PACKAGE_DIR / "data" / "build_seconds.json").read_text())
    return {(r["kernel"], r["backend"]): float(r["seconds"]) for r in doc["seconds"]}


def deferred_by(seconds: float, over_s: float | None) -> bool:
    """Whether a build recorded at `seconds` is left out by `--defer-builds-over over_s` (`run` and
    `warm`; None: none is)."""
    return bool(over_s) and seconds >= over_s


def deferred_builds(
    picked: Sequence[WorkItem], build_s: dict[tuple[str, str], float], over_s: float | None
) -> dict[str, str]:
    """Build key (each item's `build`) -> why it is left out: its (kernel, backend) recorded as building
    for `over_s` seconds or more. A fresh box's first run then ends when the rest is measured, not when
    the one build that alone outlasts it does; `dskbench warm` makes those builds later, and a box
    remembers them. The reason is the one `run` and `warm` both record for a deferred build."""
    from dskbench.results.io import DEFERRED

    if not over_s:
        return {}
    why: dict[str, str] = {}
    for it in picked:
        took = build_s.get((it.kernel, it.backend), 0.0)
        if deferred_by(took, over_s) and it.build:
            why[it.build] = (
                f"{DEFERRED}{it.kernel} · {it.backend} builds for {took / 60:.0f} min or more (recorded), "
                f"past this run's --defer-builds-over {over_s:g} s; "
                f"`dskbench warm --kernel {it.kernel} --backend {it.backend}` builds it"
            )
    return why
