"""Pack a results file for committing: samples to 5 significant digits, compact JSON, gzip.

    python3 scripts/pack_results.py RUN.jsonl results/<box>-<date>/RUN.jsonl.gz

Why: committed results should stay small enough to clone and read, and a full sweep written before
samples were rounded at the source (dskbench.measure.stats.round_sig) is 22 MB, half of it sample digits
past the timer's resolution. Only `timing.samples_us` is rounded (the same rule the core now applies
when it writes); every other field is kept as measured.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dskbench.measure.stats import round_sig  # noqa: E402


def pack_line(line: str) -> str:
    rec = json.loads(line)
    timing = rec.get("timing")
    if isinstance(timing, dict) and isinstance(timing.get("samples_us"), list):
        timing["samples_us"] = [round_sig(x) if isinstance(x, float) else x for x in timing["samples_us"]]
    return json.dumps(rec, separators=(",", ":"))


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not argv[1].endswith(".gz"):
        print("usage: pack_results.py IN.jsonl OUT.jsonl.gz", file=sys.stderr)
        return 2
    src, dst = Path(argv[0]), Path(argv[1])
    opener = gzip.open if src.suffix == ".gz" else open
    n = 0
    with opener(src, "rt") as f, gzip.open(dst, "wt", compresslevel=9) as out:
        for line in f:
            if line.strip():
                out.write(pack_line(line) + "\n")
                n += 1
    print(f"{dst}: {n} records, {dst.stat().st_size / 1e6:.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
