"""Pack a results file for committing: samples to 5 significant digits, compact JSON, gzip.

    dskbench pack RUN.jsonl results/<box>-<date>/RUN.jsonl.gz

Why: committed results should stay small enough to clone and read, and a full sweep written before
samples were rounded at the source (dskbench.measure.stats.round_sig) is 22 MB, half of it sample digits
past the timer's resolution. Only `timing.samples_us` is rounded (the same rule the core now applies
when it writes); every other field is kept as measured.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from dskbench.measure.stats import round_sig
from dskbench.results.io import ResultsError


def pack_line(line: str) -> str:
    rec = json.loads(line)
    timing = rec.get("timing")
    if isinstance(timing, dict) and isinstance(timing.get("samples_us"), list):
        timing["samples_us"] = [round_sig(x) if isinstance(x, float) else x for x in timing["samples_us"]]
    return json.dumps(rec, separators=(",", ":"))


def pack(src: Path, dst: Path) -> int:
    """Write `src` (.jsonl or .jsonl.gz) packed to `dst` (.gz); the records written. Raises ResultsError
    naming the file and line for input that is not JSON lines, or a file that cannot be read or written."""
    if not dst.name.endswith(".gz"):
        raise ResultsError(f"{dst}: the packed file is gzipped: give a name ending in .gz")
    opener = gzip.open if src.suffix == ".gz" else open
    n = 0
    try:
        with opener(src, "rt", encoding="utf-8") as f, gzip.open(dst, "wt", compresslevel=9) as out:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    out.write(pack_line(line) + "\n")
                except json.JSONDecodeError as e:
                    raise ResultsError(f"{src}:{lineno}: not JSON: {e.msg}") from None
                n += 1
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise ResultsError(f"cannot pack {src} into {dst}: {getattr(e, 'strerror', None) or e}") from None
    return n
