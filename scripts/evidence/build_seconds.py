"""Refresh dskbench/data/build_seconds.json, the build order a box with no warm-up of its own uses, from
the logs of warm-ups and runs that built ahead.

    python3 scripts/evidence/build_seconds.py LOG [LOG ...] [--out dskbench/data/build_seconds.json]

A log line `warm: ok 12.3 s kernel · backend` (dskbench warm) or `build: ok 12.3 s kernel · backend ...`
(dskbench run --build-ahead) gives one build's first-launch seconds; `.gz` logs are read as they are.
Each (kernel, backend) keeps the longest of the file's entry and every log's; an entry marked `unfinished` (a bound: the build
had not ended then) stays unless a log shows the build finishing after longer. Builds under MIN_S seconds are left out (plan order serves
them). Lines that two processes wrote into each other do not match and are skipped.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from pathlib import Path

MIN_S = 5.0
NAME = r"[A-Za-z0-9_.\-]+"
LINE = re.compile(rf"^(?:warm|build): ok\s+([0-9.]+) s\s+({NAME}) · ({NAME})(?:\s|$)")
ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "dskbench" / "data" / "build_seconds.json"


def read_lines(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as fh:
        return fh.read().splitlines()


def logged_builds(paths: list[Path]) -> dict[tuple[str, str], float]:
    """(kernel, backend) -> the longest ok first launch in these logs."""
    out: dict[tuple[str, str], float] = {}
    for path in paths:
        for line in read_lines(path):
            m = LINE.match(line)
            if m:
                key = (m.group(2), m.group(3))
                out[key] = max(out.get(key, 0.0), float(m.group(1)))
    return out


def merged(doc: dict, logged: dict[tuple[str, str], float], sources: list[str]) -> dict:
    rows: dict[tuple[str, str], dict] = {}
    for r in doc.get("seconds", []):
        if re.fullmatch(NAME, str(r.get("kernel"))) and re.fullmatch(NAME, str(r.get("backend"))):
            rows[(r["kernel"], r["backend"])] = dict(r)
    for key, s in logged.items():
        old = rows.get(key)
        if old is None or s > old["seconds"]:  # a longer build, finished: it replaces an `unfinished` bound
            rows[key] = {"kernel": key[0], "backend": key[1], "seconds": round(s)}
    kept = [r for r in rows.values() if r["seconds"] >= MIN_S]
    kept.sort(key=lambda r: (-r["seconds"], r["kernel"], r["backend"]))
    about = doc.get("about", "")
    return {"about": about, "sources": sorted(set(doc.get("sources", [])) | set(sources)), "seconds": kept}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("logs", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    for p in args.logs:
        if not p.is_file():
            print(f"build_seconds: {p}: no such file", file=sys.stderr)
            return 2
    try:
        doc = json.loads(args.out.read_text()) if args.out.exists() else {}
    except ValueError as e:
        print(f"build_seconds: {args.out}: not JSON ({e})", file=sys.stderr)
        return 2
    root = ROOT
    names = [
        str(p.resolve().relative_to(root)) if p.resolve().is_relative_to(root) else p.name for p in args.logs
    ]
    new = merged(doc, logged_builds(args.logs), names)
    args.out.write_text(json.dumps(new, indent=1) + "\n")
    print(f"{args.out}: {len(new['seconds'])} builds of {MIN_S:.0f} s or more")
    return 0


if __name__ == "__main__":
    sys.exit(main())
