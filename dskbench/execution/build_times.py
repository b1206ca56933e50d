"""Build seconds: the ones shipped with dskbench (data/build_seconds.json) and those an earlier
`dskbench warm --out` recorded. They order the builds (longest first) and set a build's grace."""

from __future__ import annotations

from pathlib import Path


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
    """Whether a build recorded at `seconds` is left out by `run --defer-builds-over over_s` (None: none is)."""
    return bool(over_s) and seconds >= over_s
